"""What a watch asks of the kernel: the inotify(7) bits, which of them each watchdog event
class needs, and one scheduled watch (:class:`Watch`).

:mod:`smoosh.daemon.watch.inotify` reads the events; ``inotify_simple`` only wraps the system calls,
so the constants of ``linux/inotify.h`` live here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
)

# inotify(7) constants (linux/inotify.h); inotify_simple only wraps the system calls.
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_MOVE = IN_MOVED_FROM | IN_MOVED_TO

#: The inotify bits behind each watchdog event class (``modified`` includes attribute
#: changes, as in watchdog; a file moved in from outside is ``created``, one moved out
#: ``deleted``, so those need the move bits too).
CLASS_MASKS: dict[type, int] = {
    FileCreatedEvent: IN_CREATE | IN_MOVED_TO, DirCreatedEvent: IN_CREATE | IN_MOVED_TO,
    FileModifiedEvent: IN_MODIFY | IN_ATTRIB, DirModifiedEvent: IN_MODIFY | IN_ATTRIB,
    FileMovedEvent: IN_MOVE, DirMovedEvent: IN_MOVE,
    FileDeletedEvent: IN_DELETE | IN_MOVED_FROM, DirDeletedEvent: IN_DELETE | IN_MOVED_FROM,
    FileClosedEvent: IN_CLOSE_WRITE,
}
#: What a schedule without a filter receives (everything above; not opens or reads).
ALL_EVENTS = IN_CREATE | IN_MODIFY | IN_ATTRIB | IN_MOVE | IN_DELETE | IN_CLOSE_WRITE
#: Always asked of the kernel: the end of a watched directory (its watch is then gone).
SELF_EVENTS = IN_DELETE_SELF | IN_MOVE_SELF
#: A recursive watch also needs to hear of directories appearing, moving and going.
TREE_EVENTS = IN_CREATE | IN_MOVE
#: Flags of every inotify_add_watch: never through a symlink, directories only, and no
#: events for files already unlinked but still open (a deleted journal's last writes).
ADD_FLAGS = IN_DONT_FOLLOW | IN_ONLYDIR | IN_EXCL_UNLINK


def mask_of(event_filter: Iterable[type] | None) -> int:
    """The inotify bits a schedule with ``event_filter`` (watchdog event classes) needs; None: all."""
    if event_filter is None:
        return ALL_EVENTS
    mask = 0
    for cls in event_filter:
        mask |= CLASS_MASKS.get(cls, 0)
    return mask


@dataclass(eq=False)
class Watch:
    """One scheduled watch (what :meth:`InotifyObserver.schedule` returns).

    Attributes:
        path: the watched directory, as given.
        is_recursive: whether the directories below it are watched too.
    """

    path: str
    is_recursive: bool
    handler: Any = field(repr=False)
    #: The inotify bits this watch's handler receives.
    mask: int = field(repr=False, default=ALL_EVENTS)
    #: False once its root is gone (deleted, moved away) or unscheduled.
    alive: bool = field(repr=False, default=True)
    #: The handler's ``ignores(path)``, if it has one: a file's creation or change it returns
    #: True for is dropped before an event is built for it.
    ignores: Callable[[str], bool] | None = field(repr=False, default=None)

    def covers(self, directory: str) -> bool:
        """Whether events in ``directory`` belong to this watch."""
        if directory == self.path:
            return True
        return self.is_recursive and directory.startswith(self.path.rstrip("/") + "/")
