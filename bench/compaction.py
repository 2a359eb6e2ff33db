"""SQLite compaction through ``SqliteCompactor.compact`` against bare SQLite (DESIGN §9).

Builds a ~200 MB database (450,000 rows: 32-char indexed key, 400-byte blob; DELETE journal,
as in the peers research) and an ``auto_vacuum=INCREMENTAL`` twin, and deletes the oldest
60% of the rows of both. Each run works on a fresh copy (warm page cache):

* full: ``SqliteCompactor.compact`` (its VACUUM path: free-space check, progress handler,
  cancel hook) vs a bare ``VACUUM`` on a plain connection. Budget <= 1.1x bare.
* incremental: ``compact`` on the INCREMENTAL twin (chunks of 1000 pages, each its own
  ``BEGIN IMMEDIATE ... COMMIT``, a chunk boundary between) vs a bare loop of the same
  ``executescript`` chunks. Budget <= 1.3x bare. The lock hold per chunk is the time between
  two chunk boundaries (``ctx.checkpoint()`` calls).
* ``cp`` + fsync of the same file: the copy-bandwidth reference.

The budgets compare against the bare loops on the stdlib ``sqlite3`` (SQLite as the system
ships it). The compactor opens databases through apsw, which bundles its own, newer SQLite, so
the same two bare loops also run through apsw (information, no budget): compactor / bare apsw
is smoosh's own overhead, bare apsw / bare stdlib the library's difference.

MB/s is the pre-compaction file size (10^6 bytes) / seconds, as in reference/peers_perf.md.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

import apsw

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._fixtures import make_bloated_db  # noqa: E402
from bench._harness import Metric, parse_args, percentile, repeat, report  # noqa: E402

MB = 1_000_000
#: Pages per incremental chunk (the compactor's default).
CHUNK_PAGES = 1000


class _Ctx:
    """A CompactionContext that records the chunk boundaries."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def progress(self, fraction: float) -> None:
        pass

    def checkpoint(self) -> None:
        self.marks.append(time.perf_counter())

    def on_cancel(self, fn) -> None:
        pass

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)


def _fresh(src: str, dst: str) -> None:
    for suffix in ("", "-journal", "-wal", "-shm"):
        try:
            os.remove(dst + suffix)
        except FileNotFoundError:
            pass
    shutil.copyfile(src, dst)
    # Flush the copy now: otherwise the timed step's own fsync pays for writing it back.
    os.sync()


def t_cp_fsync(src: str, dst: str) -> float:
    for suffix in ("",):
        try:
            os.remove(dst + suffix)
        except FileNotFoundError:
            pass
    t0 = time.perf_counter()
    subprocess.run(["cp", src, dst], check=True)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def t_bare_vacuum(work: str) -> float:
    c = sqlite3.connect(work, isolation_level=None)
    t0 = time.perf_counter()
    c.execute("VACUUM")
    dt = time.perf_counter() - t0
    c.close()
    return dt


def t_bare_incremental(work: str) -> float:
    c = sqlite3.connect(work, isolation_level=None)
    script = f"BEGIN IMMEDIATE; PRAGMA incremental_vacuum({CHUNK_PAGES}); COMMIT;"
    t0 = time.perf_counter()
    while c.execute("PRAGMA freelist_count").fetchone()[0] > 0:
        c.executescript(script)
    dt = time.perf_counter() - t0
    c.close()
    return dt


def _apsw_connect(work: str) -> apsw.Connection:
    return apsw.Connection(work, flags=apsw.SQLITE_OPEN_READWRITE)


def t_bare_vacuum_apsw(work: str) -> float:
    c = _apsw_connect(work)
    t0 = time.perf_counter()
    c.execute("VACUUM").fetchall()
    dt = time.perf_counter() - t0
    c.close()
    return dt


def t_bare_incremental_apsw(work: str) -> float:
    c = _apsw_connect(work)
    script = f"BEGIN IMMEDIATE; PRAGMA incremental_vacuum({CHUNK_PAGES}); COMMIT;"
    t0 = time.perf_counter()
    while True:
        free = c.execute("PRAGMA freelist_count").fetchall()[0][0]
        if not isinstance(free, int):  # apsw types a column as any SQLite value: this one is an integer
            raise TypeError(f"PRAGMA freelist_count returned {free!r}")
        if free <= 0:
            break
        c.execute(script).fetchall()  # apsw runs statements as they are stepped: step to the end
    dt = time.perf_counter() - t0
    c.close()
    return dt


def t_compact(compactor, work: str) -> tuple[float, list[float]]:
    ctx = _Ctx()
    t0 = time.perf_counter()
    compactor.compact(work, ctx)
    dt = time.perf_counter() - t0
    marks = ctx.marks
    chunks_ms = [(b - a) * 1000 for a, b in zip(marks, marks[1:])]
    return dt, chunks_ms


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    from smoosh.compactors.sqlite import SqliteCompactor

    rows = 45_000 if args.quick else 450_000
    d = tempfile.mkdtemp(prefix="smoosh-bench-compact-")
    os.environ["SQLITE_TMPDIR"] = d  # VACUUM's temporary database goes next to the file
    try:
        tpl = os.path.join(d, "tpl_none.db")
        tpl_inc = os.path.join(d, "tpl_inc.db")
        size = make_bloated_db(tpl, rows=rows, row_bytes=400)
        size_inc = make_bloated_db(tpl_inc, rows=rows, row_bytes=400, auto_vacuum="incremental")
        work = os.path.join(d, "work.db")
        compactor = SqliteCompactor()

        run_no = [0]

        def one() -> dict[str, float]:
            out = {"cp": t_cp_fsync(tpl, work)}

            def bare() -> None:
                _fresh(tpl, work)
                out["bare_full"] = t_bare_vacuum(work)
                _fresh(tpl_inc, work)
                out["bare_inc"] = t_bare_incremental(work)
                _fresh(tpl, work)
                out["bare_full_apsw"] = t_bare_vacuum_apsw(work)
                _fresh(tpl_inc, work)
                out["bare_inc_apsw"] = t_bare_incremental_apsw(work)

            def ours() -> None:
                _fresh(tpl, work)
                out["full"], _ = t_compact(compactor, work)
                out["after_full"] = os.path.getsize(work)
                _fresh(tpl_inc, work)
                out["inc"], chunks = t_compact(compactor, work)
                out["after_inc"] = os.path.getsize(work)
                out["chunk_p50"] = percentile(chunks, 0.5)
                out["chunk_max"] = max(chunks)

            # Alternate which side goes first: the disk's writeback state favours one order.
            run_no[0] += 1
            for step in ((bare, ours) if run_no[0] % 2 else (ours, bare)):
                step()
            return out

        res = repeat(one, args.runs)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    mbps = lambda vals, sz: [sz / MB / v for v in vals]  # noqa: E731
    med = lambda k: sorted(res[k])[len(res[k]) // 2]  # noqa: E731
    bare_full, bare_inc = med("bare_full"), med("bare_inc")
    bare_full_apsw, bare_inc_apsw = med("bare_full_apsw"), med("bare_inc_apsw")
    metrics = [
        Metric("cp + fsync (copy bandwidth)", "MB/s", mbps(res["cp"], size)),
        Metric("bare VACUUM", "MB/s", mbps(res["bare_full"], size)),
        Metric("SqliteCompactor full (VACUUM path)", "s", res["full"], higher_is_better=False,
               budget=1.1 * bare_full, budget_text=f"<= 1.1x bare ({1.1 * bare_full:.2f} s)",
               reference=bare_full, reference_name="bare VACUUM"),
        Metric("SqliteCompactor full (VACUUM path)", "MB/s", mbps(res["full"], size)),
        Metric("bare VACUUM through apsw (the compactor's SQLite)", "s", res["bare_full_apsw"],
               higher_is_better=False, reference=bare_full, reference_name="bare VACUUM"),
        Metric("SqliteCompactor full vs bare VACUUM through apsw", "s", res["full"], higher_is_better=False,
               reference=bare_full_apsw, reference_name="bare apsw VACUUM"),
        Metric("bare incremental_vacuum(1000) loop", "MB/s", mbps(res["bare_inc"], size_inc)),
        Metric("SqliteCompactor incremental", "s", res["inc"], higher_is_better=False,
               budget=1.3 * bare_inc, budget_text=f"<= 1.3x bare ({1.3 * bare_inc:.2f} s)",
               reference=bare_inc, reference_name="bare loop"),
        Metric("SqliteCompactor incremental", "MB/s", mbps(res["inc"], size_inc)),
        Metric("bare incremental loop through apsw", "s", res["bare_inc_apsw"], higher_is_better=False,
               reference=bare_inc, reference_name="bare loop"),
        Metric("SqliteCompactor incremental vs bare loop through apsw", "s", res["inc"], higher_is_better=False,
               reference=bare_inc_apsw, reference_name="bare apsw loop"),
        Metric("incremental lock hold per 1000-page chunk, median", "ms", res["chunk_p50"], higher_is_better=False),
        Metric("incremental lock hold per chunk, max", "ms", res["chunk_max"], higher_is_better=False),
    ]
    notes = [
        f"file {size / MB:.0f} MB ({rows:,} rows, oldest 60% deleted), incremental twin {size_inc / MB:.0f} MB; "
        f"after: full {med('after_full') / MB:.0f} MB, incremental {med('after_inc') / MB:.0f} MB; warm page cache, DELETE journal.",
        "the chunk hold includes the freelist_count reads around each chunk (the compactor's own bookkeeping).",
    ]
    report("compaction", "SQLite compaction: compactor vs bare SQLite", metrics, args, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
