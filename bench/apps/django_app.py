"""The Django application beside smoosh: Django at its defaults, one database alias per tenant.

Runs in ``.venv-apps`` (``python -m bench.apps.django_app``; see :func:`bench.apps.workload.main`
for the commands). Django is configured in code (``settings.configure``) as
``django-admin startproject`` would leave a SQLite project: each alias has only ``ENGINE``
and ``NAME``, no ``OPTIONS``, so Python's ``sqlite3`` default busy timeout (5 s) and Django's
deferred ``BEGIN`` (``transaction_mode`` unset) hold; the table is created by Django's own
schema editor. ``CONN_MAX_AGE`` is Django's default (0), and each operation is framed as
Django's request handler frames a request (``close_old_connections()`` at its start and end,
the ``request_started``/``request_finished`` handlers), so as in a site each operation opens
its connection and closes it.

The operations, as Django's documentation writes them:

* ``create``: ``Item.objects.using(t).create(...)``;
* ``get_or_create``: ``Item.objects.using(t).get_or_create(key=..., defaults={...})``;
* ``read_modify_write``: in ``transaction.atomic(using=t)``: ``get(pk=...)``, change, ``save()``
  (a deferred transaction that reads, then writes);
* ``f_update``: ``filter(pk=...).update(counter=F("counter") + 1)``;
* ``bulk_delete``: ``filter(pk__in=[...]).delete()``;
* ``read``: ``list(filter(pk__in=[...]))``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench.apps.workload import App, main  # noqa: E402

#: The table Django names the model's (app label ``tenants``, model ``Item``).
TABLE = "tenants_item"


def _alias(tenant: int) -> str:
    return f"tenant{tenant:03d}"


def configure(paths: Sequence[str]) -> None:
    """``settings.configure`` with one alias per tenant database, then ``django.setup()``."""
    import django
    from django.conf import settings

    databases: dict[str, Any] = {"default": {}}  # Django's dummy backend: every query names its tenant
    for i, path in enumerate(paths):
        databases[_alias(i)] = {"ENGINE": "django.db.backends.sqlite3", "NAME": path}
    settings.configure(DATABASES=databases, INSTALLED_APPS=["bench.apps.tenants"], USE_TZ=True,
                       DEFAULT_AUTO_FIELD="django.db.models.BigAutoField")
    django.setup()


class DjangoApp(App):
    """The workload's operations through Django's ORM (see the module docstring)."""

    def __init__(self, paths: Sequence[str]) -> None:
        configure(paths)
        from django.db import DatabaseError, close_old_connections, transaction
        from django.db.models import F

        from bench.apps.tenants.models import Item

        self.db_errors = (DatabaseError,)
        self._does_not_exist = Item.DoesNotExist
        self._close_old_connections = close_old_connections
        self._atomic = transaction.atomic
        self._F = F
        self._items = [Item.objects.using(_alias(i)) for i in range(len(paths))]
        self._aliases = [_alias(i) for i in range(len(paths))]

    def start_request(self) -> None:
        self._close_old_connections()

    def end_request(self) -> None:
        self._close_old_connections()

    def ids(self, tenant: int) -> list[int]:
        return list(self._items[tenant].values_list("id", flat=True))

    def create(self, tenant: int, key: str, payload: str) -> int:
        return int(self._items[tenant].create(key=key, counter=0, payload=payload).pk)

    def get_or_create(self, tenant: int, key: str, payload: str) -> tuple[int, bool]:
        obj, created = self._items[tenant].get_or_create(key=key, defaults={"counter": 0, "payload": payload})
        return int(obj.pk), bool(created)

    def read_modify_write(self, tenant: int, row_id: int, payload: str) -> tuple[str, int] | None:
        with self._atomic(using=self._aliases[tenant]):
            try:
                obj = self._items[tenant].get(pk=row_id)
            except self._does_not_exist:
                return None
            obj.counter += 1
            obj.payload = payload
            obj.save()
            return str(obj.key), int(obj.counter)

    def f_update(self, tenant: int, row_id: int) -> int:
        return int(self._items[tenant].filter(pk=row_id).update(counter=self._F("counter") + 1))

    def bulk_delete(self, tenant: int, row_ids: Sequence[int]) -> int:
        deleted, _ = self._items[tenant].filter(pk__in=list(row_ids)).delete()
        return int(deleted)

    def read(self, tenant: int, row_ids: Sequence[int]) -> int:
        return len(list(self._items[tenant].filter(pk__in=list(row_ids))))


def schema(path: str) -> dict[str, Any]:
    """Create the model's table in the empty database ``path`` with Django's schema editor."""
    configure([path])
    from django.db import connections

    from bench.apps.tenants.models import Item

    with connections[_alias(0)].schema_editor() as editor:
        editor.create_model(Item)
    connections.close_all()
    return {"table": TABLE}


def versions() -> dict[str, str]:
    import sqlite3

    import django

    return {"django": django.get_version(), "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], DjangoApp, schema, versions))
