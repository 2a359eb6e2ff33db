"""Whether a database path still names the file being compacted, and what to say when it does not.

An application may atomically rename another file over a database smoosh is compacting. The
compaction's connection goes on writing the old inode, but SQLite names its side files (the
``-journal``, the ``-wal``) after the *path*: a journal of the old file beside the new one looks
hot to the application's next connection, which rolls it into the new file and damages it
(issue 18). SQLite itself forbids renaming over a database that is open (sqlite.org "How To
Corrupt", 2.4); smoosh narrows the window as far as it can:

* the file's identity (device and inode) is taken before the compaction opens it and compared
  at every chunk boundary of an incremental compaction (where no journal exists) and every few
  progress ticks of a VACUUM's build phase (where the database's own journal does not exist yet);
  SQLite itself refuses to start a journal for a file renamed away (``SQLITE_READONLY_DBMOVED``,
  mapped to :class:`Replaced` too);
* when it differs, the compaction is interrupted at once, so SQLite rolls back and removes its
  journal; a WAL database's log is emptied (SQLite leaves a moved file's log in place, and the
  new file would read it as its own), and the connection to the old inode is closed;
* then the new file gets ``PRAGMA integrity_check`` and the compaction ends :class:`Replaced`.

What stays open is said in the security guide (docs/guides/security.md): a VACUUM's final copy back into the
database and its commit run inside SQLite without a progress tick, and one incremental chunk
runs as one statement, so a rename in those moments is found only afterwards; and a WAL
database's ``-wal``/``-shm`` beside the new file still belong to the old one.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

import apsw

from smoosh.compactors.base import Gone, Replaced
from smoosh.compactors.sqlite_open import close_quietly, open_database, run

__all__ = ["FileIdentity", "replaced_error"]

log = logging.getLogger(__name__)


class FileIdentity:
    """The device and inode ``path`` named when it was taken.

    Parameters:
        path: the database file.
        known: ``(device, inode)`` of the file as an ``fstat`` just took them (the header read
            that decided to compact it): no ``stat`` of its own. None: taken now.

    Raises:
        Gone: ``path`` names nothing.
    """

    def __init__(self, path: str, known: tuple[int, int] | None = None) -> None:
        self.path = path
        ident = known if known is not None else self._now()
        if ident is None:
            raise Gone(f"{path} is missing")
        self._ident = ident

    @property
    def meant(self) -> tuple[int, int]:
        """``(device, inode)`` of the file the compaction means: what its open must find."""
        return self._ident

    def _now(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def same(self) -> bool:
        """Whether ``path`` still names the same file (one ``stat``)."""
        return self._now() == self._ident

    def check(self) -> None:
        """Return when ``path`` still names the same file.

        Raises:
            Gone: ``path`` names nothing now.
            Replaced: ``path`` names another file (renamed over the one being compacted).
        """
        now = self._now()
        if now == self._ident:
            return
        if now is None:
            raise Gone(f"{self.path} vanished while it was being compacted")
        raise Replaced(self.path)


def replaced_error(path: str, roots: Sequence[str] | None, busy_timeout_s: float, *, rolled_back: bool) -> Replaced:
    """The :class:`Replaced` error for ``path``, with the verdict of ``integrity_check`` on the new file.

    Parameters:
        path: the path that now names another file.
        roots: the roots in force (the new file is opened like any user database).
        busy_timeout_s: how long the check waits for the application's locks.
        rolled_back: the compaction was interrupted and rolled back (False: it had committed
            to the old file before the rename was seen).

    Returns:
        The error to raise; its ``integrity`` is SQLite's verdict, or why none was taken.
    """
    try:
        conn = open_database(path, "ro", timeout_s=busy_timeout_s, roots=roots)
    except (apsw.Error, Gone) as exc:
        return Replaced(path, integrity=f"not checked: {exc}", rolled_back=rolled_back)
    try:
        rows = run(conn, "PRAGMA integrity_check(5)")
        # SQLite heads a report on an attached schema with "*** in database main ***": the
        # problems are the lines after it.
        lines = [str(r[0]) for r in rows if not str(r[0]).startswith("*** in database")]
        verdict = "; ".join(lines) if lines else "no answer"
    except (apsw.CorruptError, apsw.NotADBError) as exc:
        verdict = str(exc)  # too damaged to check: that is the verdict
    except apsw.Error as exc:
        verdict = f"not checked: {exc}"
    finally:
        close_quietly(conn)
    return Replaced(path, integrity=verdict, rolled_back=rolled_back)
