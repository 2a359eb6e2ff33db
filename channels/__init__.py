"""Channel workers: the capacity-bounded priority queue, time windows, and the Channel.

Pure of smoosh: a :class:`Channel` reaches the world only through the typed ports of
:mod:`channels.ports` (a scheduler and a host), which the daemon implements.

    from channels import PriorityQueue, Window, Channel
"""

from __future__ import annotations

from channels.channel import Channel
from channels.channel_state import ChannelSettings
from channels.ports import Host, Outcome, RunEvent, Scheduler
from channels.priority_queue import PriorityQueue
from channels.window import Window

__all__ = ["PriorityQueue", "Window", "Channel", "ChannelSettings", "Scheduler", "Host", "Outcome", "RunEvent"]
