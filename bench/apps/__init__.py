"""The application beside smoosh: real applications at their defaults on a bloated tenant fleet (issue 46).

Two sides, two environments:

* the harness (``python -m bench.apps``, the project's ``.venv``): :mod:`~bench.apps.sitting`
  (the command line and the sitting), :mod:`~bench.apps.runs` (one run: smoosh's process,
  the application's, the checks), :mod:`~bench.apps.fleet` (the template fleets),
  :mod:`~bench.apps.windows` (smoosh's runs from its JSON log, matched with operations),
  :mod:`~bench.apps.summary` (figures and tables);
* the applications (``.venv-apps``: Django and SQLAlchemy from PyPI, ``make apps-env``):
  :mod:`~bench.apps.django_app`, :mod:`~bench.apps.sqlalchemy_app`, over the shared
  :mod:`~bench.apps.workload`; :mod:`~bench.apps.ledger` (stdlib) is on both sides: the
  applications write it, the harness checks every row against it.

How it works and how to run it: docs/guides/the-application-beside-smoosh.md.
"""
