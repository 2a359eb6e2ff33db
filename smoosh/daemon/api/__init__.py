"""The admin HTTP API: ``/status``, ``/jobs``, ``/explain``, ``/metrics``, enqueue, suspend, resume, flush.

Threads: one connection loop thread (``smoosh-http``) gathers requests and a bounded few handler
threads answer them, from the server's published snapshots; the metrics collector runs at scrape
time, on a handler thread.

May import ``server.py`` and everything below it. Only the command line imports it (``smoosh
run``, ``smoosh demo``): nothing else of smoosh does, which ``lint-imports`` checks.
"""
