"""The daemon: the server and the parts it wires together, a subpackage per stage of a key's path.

Top to bottom, each part imports only what lies below it (``lint-imports`` checks it, see
pyproject.toml): ``api/`` (the admin HTTP API, the command line's alone), ``server.py`` (the
wiring), ``host/`` (what the server's loop owns), ``record/`` (how runs ended), ``run/`` and
``intake/`` (neither knows the other), ``watch/`` (file events into keys), ``control/`` (holds,
gates, the ``state_dir``'s guards) and the leaves several stages share, ``history`` and
``keypool``.

Nothing outside the daemon and the command line imports from here; the job layer
(``smoosh.jobs``), the stores, the compactors, ``channels`` and ``persist`` know nothing of it.
"""
