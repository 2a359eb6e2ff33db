"""The Django application of the harness's Django workload: one model, :class:`~bench.apps.tenants.models.Item`
(table ``tenants_item``), in every tenant database. Imported only in ``.venv-apps``."""
