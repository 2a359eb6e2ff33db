"""From "this key changed" to a key offered to the channels: validation, measurement, routing, offers.

Also the words of what became of a key: verdicts (``POST /enqueue?wait=1``) and ``explain``.
Threads: the intake's pools (``smoosh-examine``, ``smoosh-measure``, ``smoosh-size``) examine
keys; callers' threads (HTTP handlers, ``Server.enqueue``) validate and explain; the server's
loop ticks it when a debounced key is due.

May import ``watch/`` (the debounce, the access table), ``control/`` (the slot gate, for its
words) and the shared leaves; never ``run/`` (the channels stand between the two) nor anything
above it.
"""
