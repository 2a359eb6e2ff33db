"""Running a job: the channels' scheduler over the job layer, the worker and its compactions.

Also its heartbeats, the finishes carried by the next claim, the take-over at start-up, the
rotation policy, and ``smoosh worker`` (a worker in a process of its own). Threads: the
scheduler's starter (``smoosh-starter``), the worker's dispatcher (``smoosh-worker``), a
compaction thread per running job (``smoosh-compact``) and the heartbeat (``smoosh-heartbeat``);
they reach the server's loop only by posting run events. The take-over runs before any worker,
and the loop calls the rotation policy.

May import ``watch/``, ``control/`` and the shared leaves; never ``intake/`` (the channels
stand between the two) nor anything above it.
"""
