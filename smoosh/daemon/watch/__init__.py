"""File events into keys: the watcher, its observers, the scans, the debounce and the staleness table.

Threads: the inotify observer (``smoosh-inotify``; watchdog's polling observer as the fallback)
calls the watcher on its own thread; the housekeeping ticks the watcher on the server's loop; a
scan walks the trees in a helper process (``python -m smoosh.daemon.watch.scan``) driven from a
short-lived ``smoosh-scan`` thread. The debouncer and the access table are the intake's front,
called from the observer's thread, the intake's and the loop.

Imports nothing else of the daemon; only ``control/`` and the shared leaves (``history``,
``keypool``) lie below it (the layers are checked by ``lint-imports``, see pyproject.toml).
"""
