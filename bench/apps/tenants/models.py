"""The model every tenant database holds (Django's table ``tenants_item``); ``.venv-apps`` only."""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """A row of the workload: a unique key, a counter it increments, a text payload it rewrites."""

    key = models.CharField(max_length=64, unique=True)
    counter = models.IntegerField(default=0)
    payload = models.TextField()

    class Meta:
        app_label = "tenants"
