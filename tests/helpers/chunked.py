"""A real `smoosh run` caught in the middle of an incremental compaction, however fast its disk.

One-page chunks over a database of thousands of free pages made the middle last long on a
fast disk and never end on a slow one (one chunk is one commit: 2,588 of them took 53 s at
18 ms a commit). Here the work is sized to what the tests check instead: a database whose
incremental compaction takes :data:`CHUNKS` chunks, and a daemon that stops after the first
one and stays stopped (:data:`STALLED_AFTER_FIRST_CHUNK`) until it is killed or stopped, so
"under way" is a state the test waits for, not a moment it must catch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from compactor.dbfactory import make_bloated_db

#: Chunks an incremental compaction of :func:`chunked_db` takes.
CHUNKS = 4
#: The [smoosh] line that stalls a compaction after its first chunk: one byte a second of I/O
#: budget, and the first chunk charges its pages (hundreds of KiB), a debt of days that the
#: next chunk waits out before it starts. The wait holds no lock, the job stays running and
#: heartbeats its progress (1 / CHUNKS), and a stop ends it at once.
STALLED_AFTER_FIRST_CHUNK = "max_io_rate = 1"


def chunked_db(path: Path, rows: int = 3000) -> dict[str, Any]:
    """A bloated incremental database (``make_bloated_db``'s stats), plus ``chunk_pages``: the
    ``incremental_chunk_pages`` that compacts it in :data:`CHUNKS` chunks."""
    stats = make_bloated_db(str(path), rows=rows, delete_fraction=0.8, auto_vacuum="incremental")
    stats["chunk_pages"] = math.ceil(stats["freelist_count"] / CHUNKS)
    return stats


def chunk_section(stats: dict[str, Any]) -> str:
    """The ``[smoosh.sqlite]`` section (a config's ``channels=`` text) sizing chunks for ``stats``."""
    return f"[smoosh.sqlite]\nincremental_chunk_pages = {stats['chunk_pages']}\n"
