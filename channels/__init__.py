"""Channel workers: the capacity-bounded priority queue, time windows, and the Channel.

Pure of smoosh: the server hands each :class:`Channel` the job layer and its callbacks.

    from channels import PriorityQueue, Window, Channel
"""

from __future__ import annotations

from channels.channel import Channel, ChannelSettings
from channels.priority_queue import PriorityQueue
from channels.window import Window

__all__ = ["PriorityQueue", "Window", "Channel", "ChannelSettings"]
