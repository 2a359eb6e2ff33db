"""What the server's loop owns: the channels' host and registry, live reload, the timed chores.

Thread: the server's loop (``smoosh-server``). Every call runs there or is posted there; only
``ChannelHost.wake`` may be called from any thread.

May import every stage (``record/``, ``run/``, ``intake/``, ``watch/``), ``control/`` and the
shared leaves; never ``server.py`` (whose mixin ``LiveConfig`` is) nor ``api/``.
"""
