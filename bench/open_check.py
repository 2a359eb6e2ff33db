"""What the open check costs a compaction (issue 45): small compactions with it and without it, in one run.

Every file SQLite opens for a compaction passes through the check
(``smoosh/compactors/sqlite_guard.py``: the directory and the file opened by descriptor, checked by
``fstat``, then reopened through ``/proc/self/fd``), a handful of system calls per file. This
bench compacts a fleet of small bloated databases through ``SqliteCompactor.compact`` in a child
process, with the check installed and, in another child, with it left out (its C part not
loaded: what a host without a compiler runs), the two alternated run by run, and reports the
wall and CPU time per compaction of each and their difference.

Usage: python -m bench.open_check [--runs N] [--quick] [--no-write]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._fixtures import make_bloated_db  # noqa: E402
from bench._harness import REPO_ROOT, Metric, parse_args, report  # noqa: E402

#: Databases per run, and their rows (each a few hundred KB: the fixed cost of a compaction shows).
DATABASES = 300
QUICK_DATABASES = 60
ROWS = 600

_CHILD = """
import json, os, sys, time
checked = sys.argv[2] == "checked"
from smoosh.compactors import SqliteCompactor, sqlite_guard
from smoosh.compactors.sqlite_open import canonical_roots
if not checked:
    # As where the C part could not be built: SQLite's own open back (a null pointer resets a
    # system call to its default), and nothing registered.
    vfs = sqlite_guard._installed[0]
    vfs.xSetSystemCall("open", 0)
    sqlite_guard._installed.clear()
    sqlite_guard._lib = None

class Ctx:
    def progress(self, f): pass
    def checkpoint(self): pass
    def on_cancel(self, fn): pass

root = sys.argv[1]
assert sqlite_guard.installed() == checked
compactor = SqliteCompactor(roots=canonical_roots([root]))
paths = sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".db"))
cpu0, wall0 = time.process_time(), time.perf_counter()
for p in paths:
    compactor.compact(p, Ctx())
cpu1, wall1 = time.process_time(), time.perf_counter()
print(json.dumps({"n": len(paths), "wall_ms": (wall1 - wall0) * 1000 / len(paths), "cpu_ms": (cpu1 - cpu0) * 1000 / len(paths)}))
"""


def _run(template: str, how: str) -> dict[str, float]:
    work = tempfile.mkdtemp(prefix="smoosh-bench-open-")
    try:
        fleet = os.path.join(work, "dbs")
        shutil.copytree(template, fleet)
        out = subprocess.run([sys.executable, "-c", _CHILD, fleet, how], capture_output=True, text=True,
                             check=True, cwd=REPO_ROOT)
        result: dict[str, float] = json.loads(out.stdout)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    count = QUICK_DATABASES if args.quick else DATABASES
    template = tempfile.mkdtemp(prefix="smoosh-bench-open-template-")
    try:
        for i in range(count):
            make_bloated_db(os.path.join(template, f"t{i:04d}.db"), rows=ROWS, row_bytes=400,
                            journal_mode="delete" if i % 2 else "wal")
        runs: dict[str, dict[str, list[float]]] = {"checked": {"wall_ms": [], "cpu_ms": []},
                                                   "unchecked": {"wall_ms": [], "cpu_ms": []}}
        for run in range(args.runs):
            for how in (("checked", "unchecked") if run % 2 == 0 else ("unchecked", "checked")):
                result = _run(template, how)
                for field in ("wall_ms", "cpu_ms"):
                    runs[how][field].append(result[field])
    finally:
        shutil.rmtree(template, ignore_errors=True)
    diff_cpu = [c - u for c, u in zip(runs["checked"]["cpu_ms"], runs["unchecked"]["cpu_ms"])]
    diff_wall = [c - u for c, u in zip(runs["checked"]["wall_ms"], runs["unchecked"]["wall_ms"])]
    metrics = [
        Metric("compaction with the open check: wall", "ms", runs["checked"]["wall_ms"], higher_is_better=False),
        Metric("compaction without it: wall", "ms", runs["unchecked"]["wall_ms"], higher_is_better=False),
        Metric("compaction with the open check: CPU", "ms", runs["checked"]["cpu_ms"], higher_is_better=False),
        Metric("compaction without it: CPU", "ms", runs["unchecked"]["cpu_ms"], higher_is_better=False),
        Metric("the check's cost per compaction: wall (pair by pair)", "ms", diff_wall, higher_is_better=False),
        Metric("the check's cost per compaction: CPU (pair by pair)", "ms", diff_cpu, higher_is_better=False),
    ]
    report("open_check", "The open check's cost per compaction", metrics, args, notes=[
        f"{count} small bloated databases ({ROWS} rows of 400 bytes, 60% deleted; half rollback-journal, half "
        "WAL), compacted one after another by `SqliteCompactor.compact` in a child process; a fresh copy per "
        "run; with and without the check alternated run by run.",
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
