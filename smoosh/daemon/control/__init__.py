"""What holds work back, and what guards a ``state_dir``.

Holds and rotation requests through the store, the operator's suspensions (local, and
cluster-wide in the store), the gates on a start (``max_jobs`` slots, the I/O budget, the job
store's health), one daemon per ``state_dir`` and one live daemon per ``node``, a corrupt job
store set aside. Threads: the gates and the suspension live on the server's loop; holds are
written from the scheduler's starter thread and read by the workers' heartbeat threads; the
store's health hears from every thread that transacts; the lock, the node's claim and the
store reset run at start-up.

The daemon's lowest layer, with ``history`` and ``keypool``: it imports nothing of the daemon.
"""
