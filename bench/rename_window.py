"""How long smoosh's rollback journal exists during a VACUUM: the window of the rename hazard (issue 25).

An application that renames a new file over a database while smoosh's ``-journal`` sits
beside it, and then opens the new file, takes the journal for a hot one and rolls the old
file's pages into the new file (sqlite.org "How To Corrupt", 2.4). smoosh notices a rename
at every 64 progress ticks of a VACUUM's build phase, when no journal exists yet; the
journal exists from the first page of the copy back into the file until its commit, inside
SQLite, with no tick to notice anything.

This measures that window: the time from the ``-journal``'s creation to its deletion (inotify
events on the directory, stamped as they are read by a thread that does nothing else), as a
share of the whole ``SqliteCompactor.compact``, for bloated rollback-journal databases of
several sizes and live fractions. A WAL database has no rollback journal (its VACUUM writes the
WAL, which belongs to whoever holds the file open: docs/guides/security.md, "Renaming over a
database being compacted").
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from inotify_simple import INotify, flags  # noqa: E402

from bench._fixtures import NullContext, make_bloated_db  # noqa: E402
from bench._harness import Metric, parse_args, report  # noqa: E402
from smoosh.compactors import SqliteCompactor  # noqa: E402

#: (rows of 400 bytes, fraction deleted): about 85 MB with 20% live (the issue's trial), the
#: same file with 60% live, and a 20 MB one.
SHAPES = [(200_000, 0.8), (200_000, 0.4), (50_000, 0.8)]


def _journal_window(directory: str, db: str) -> tuple[float, float, float]:
    """(journal seconds, compaction seconds, file MB) of one compaction of ``db``."""
    name = os.path.basename(db) + "-journal"
    stamps: dict[str, float] = {}
    stop = threading.Event()
    ino = INotify()
    ino.add_watch(directory, flags.CREATE | flags.DELETE)

    def read() -> None:
        while not stop.is_set():
            for event in ino.read(timeout=50):
                if event.name == name:
                    kind = "created" if event.mask & flags.CREATE else "deleted"
                    stamps.setdefault(kind, time.perf_counter())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    size_mb = os.path.getsize(db) / 1e6
    compactor = SqliteCompactor(SimpleNamespace(page_size=None, auto_vacuum=None, incremental_chunk_pages=1000,
                                                busy_timeout_s=1.0))
    t0 = time.perf_counter()
    compactor.compact(db, NullContext())
    took = time.perf_counter() - t0
    deadline = time.monotonic() + 5
    while "deleted" not in stamps and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    reader.join()
    ino.close()
    window = stamps.get("deleted", 0.0) - stamps.get("created", 0.0) if "created" in stamps else 0.0
    return window, took, size_mb


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    shapes = [(rows // 10, dead) for rows, dead in SHAPES[:1]] if args.quick else SHAPES
    metrics = []
    with tempfile.TemporaryDirectory(prefix="smoosh-rename-") as tmp:
        for rows, dead in shapes:
            template = os.path.join(tmp, "template.db")
            make_bloated_db(template, rows=rows, row_bytes=400, delete_fraction=dead, journal_mode="delete")
            shares, windows, tooks, size = [], [], [], 0.0
            for _ in range(args.runs):
                db = os.path.join(tmp, "db.db")
                shutil.copyfile(template, db)
                os.sync()
                window, took, size = _journal_window(tmp, db)
                windows.append(window * 1000)
                tooks.append(took * 1000)
                shares.append(100 * window / took if took else 0.0)
            label = f"{size:.0f} MB, {100 * (1 - dead):.0f}% live"
            metrics += [
                Metric(f"{label}: journal exists", "ms", windows, higher_is_better=False),
                Metric(f"{label}: whole compaction", "ms", tooks, higher_is_better=False),
                Metric(f"{label}: journal's share", "%", shares, higher_is_better=False),
            ]
    report("rename_window", "The rename hazard's window: how long smoosh's rollback journal exists", metrics, args, notes=[
        "The journal exists from the first page the VACUUM copies back into the file until its commit: "
        "SQLite journals every page it overwrites and every page it truncates away, so the window grows with "
        "the file's size, not its live part. No progress tick runs in it, so a rename then is noticed afterwards "
        "(the run ends `replaced`, with the new file's `integrity_check`).",
        "Before the copy back (the build phase) there is no journal, and a rename is noticed within 64 ticks.",
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
