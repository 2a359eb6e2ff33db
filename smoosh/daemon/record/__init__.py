"""How runs ended, recorded: the outcome recorder, duration histograms, the node's status record.

The recorder writes history, counters and crash records on the server's loop; a histogram is an
immutable value the metrics collector reads on an HTTP thread; the status table is built on the
caller's thread and written to the store by the scheduler's starter thread.

May import ``run/`` (the crash records' keys), ``intake/`` and what lies below them; never
``host/``, ``server.py`` or ``api/``.
"""
