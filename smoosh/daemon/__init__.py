"""The daemon: the server and the parts it wires together (intake, routing, channels' host, workers).

Nothing outside the daemon and the command line imports from here; the job layer
(``smoosh.jobs``), the stores, the compactors, ``channels`` and ``persist`` know nothing of it.
"""
