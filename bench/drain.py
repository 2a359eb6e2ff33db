"""The whole path as a user meets it: a fleet of small bloated databases drained end to end (DESIGN §9).

``--files`` copies (1,000 by default) of one ~230 KiB database with 80% of its rows deleted
lie in a watched directory. Measured, each on fresh copies:

* **bare loop**: one Python process running ``VACUUM`` on each file in turn (stdlib sqlite3),
  the tool a user would otherwise write. Timed from its first file to its last.
* **smoosh, default config**: ``smoosh run`` (a subprocess, the embedded SQLite job store,
  in-process workers, the watcher), timed from the moment it answers ``GET /status`` until
  ``/metrics`` counts every file compacted ok. Budget: at most 1.25x the bare loop (DESIGN §9,
  restated by issue 48: small databases are compacted in batches). Beside it, the same with
  ``batch_max_size = 0``: a job per database, as before batches.
* **smoosh, concurrency = 2** (the ratio channel runs two at once): budget at most 1.0x the
  bare loop, with two bare VACUUM threads printed beside (the floor of two slots).
* **the curve: 1, 2 and 4 slots** (``concurrency`` of the ratio channel, and ``min_jobs`` as
  many, so the backlog controller lets them all run whatever the backlog).
* **two worker processes**: ``smoosh run --workers 0`` with ``concurrency = 2``, and two
  ``smoosh worker`` processes (started before it) running the compactions: each job crosses
  processes through the SQLite store twice, the add and the finish. Its CPU row counts all
  three processes.
* **the floors**: the bare loop with a durable job per file (a claim and a finish, each a
  ``synchronous=FULL`` commit), and both on two threads: what any daemon that runs two
  compactions at once, and records each as a job that survives a crash, cannot beat here.
* **the design's work in one thread** (``LEAN_LOOP``): per file, what the daemon must do and
  nothing else (the examination's look, the claim's commit through smoosh's own job layer and
  SQLite store, the compaction with its checks at start and end), in one loop with no
  channel, scheduler, watcher or thread hand-off: its CPU beyond the bare loop's is the floor
  under the daemon's CPU per compaction.
* **the design's work on the daemon's threads** (``LEAN_THREADS``): the same work, handed between
  the threads the daemon uses for it (an examination thread, smoosh's loop, a compaction pool
  thread that runs the loop's iteration taking its end while the loop sleeps, smoosh's inotify
  observer reading each run's own events once), with no channel, scheduler or record of
  outcomes: its CPU beyond the lean loop's is what the thread model costs.
* **the daemon with nothing to compact**: a ``Server`` in process, on the default config and job
  store, whose compactor returns at once: its CPU per file is the daemon's own work per
  compaction measured directly, not as a difference from the bare loop.
* **the daemon's CPU beyond the VACUUM** (the budget: at most 1.0 ms per compaction): a ``Server``
  in process, on the default config and job store, with smoosh's own compactor, each of whose
  ``VACUUM`` statements is timed in thread CPU where it runs (``bench._vacuum_cpu``). The
  process's CPU less its VACUUM statements' is measured in one run, with nothing subtracted from
  another process's; the lean scripts above and the bare loops are measured the same way, so the
  floors compare. Beside it: the bare loop's own cost beyond its statements (its connections,
  its loop), and the same for the bare loop with a durable job per file, the bare tools' floor
  under the budget (as the lean loop is smoosh's own parts'). (Read as the daemon's CPU less the
  bare loop's, the figure moved by half a millisecond with the bare loop's own CPU between runs;
  that reading is still printed.)

The daemon runs with ``min_size = 0``, ``wait_secs = 0`` and ``staleness = 0`` (so every
file qualifies and nothing waits on the start-up pause); everything else is the default.
The files are in place before the daemon starts, so its start-up scan finds them.

**CPU**: the processor time (user + system, all threads) each takes over the drain: the
daemon's from ``/proc/PID/stat`` over the timed window, the loops' from the rusage of their
process. At ``concurrency = 2`` the daemon cannot finish sooner than its CPU spread evenly
over the machine's two cores; that bound is reported beside the budget ("its CPU over two
cores"), and ``memory store`` drains once more with the job store in memory (no durable
commit) to show what durability costs of it. Linux only (elsewhere the CPU rows are left out).

**What a wake-up costs here**: one piece of smoosh's per-compaction Python (a history row's
store key) timed in thread CPU right after its thread slept 5 ms, and again at once. The first
runs on caches the wait left cold; the difference is the price each wake-up of a daemon thread
adds to the code that follows it, on top of the switch.

The hand-off latency is measured in process (a ``Server`` on the same config, its SQLite
compactor wrapped to time each ``compact`` call): a key becomes eligible when a slot of
its channel frees (the end of the run ``concurrency`` places before it), and the latency is
the time from then until its compaction starts: the waiting between one compaction and the
next, with no work in it.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._daemon import Daemon, Workers, free_port, process_cpu_s, smoosh_env  # noqa: E402
from bench._fixtures import make_bloated_db  # noqa: E402
from bench._harness import Metric, parse_args, percentile, repeat, report  # noqa: E402
from smoosh.daemon.watch.scan import SETTLE_S  # noqa: E402

#: Rows of 400 bytes in the template: a ~230 KiB file, a per-tenant database of a small fleet.
TEMPLATE_ROWS = 440
#: The [smoosh] line that turns batches off (a job per database, as before issue 48).
NO_BATCHES = "batch_max_size = 0"
#: Seconds a drain may take before the run is declared failed.
DRAIN_TIMEOUT_S = 600.0

#: The bare loop, its VACUUM statements timed in thread CPU as smoosh's are (bench._vacuum_cpu):
#: two clock reads per file, beside a VACUUM's millisecond. Prints: seconds, the statements' CPU
#: seconds.
BARE_LOOP = """
import sqlite3, sys, time
paths = sys.argv[1:]
vacuum_s = 0.0
t0 = time.perf_counter()
for p in paths:
    c = sqlite3.connect(p, isolation_level=None)
    v0 = time.thread_time()
    c.execute("VACUUM")
    vacuum_s += time.thread_time() - v0
    c.close()
print(time.perf_counter() - t0, vacuum_s)
"""

#: The floors under any daemon (BARE_LOOP stays a loop of its own, exactly what a user would
#: write: run through this script it measured 2-3% slower, which would flatter the daemon):
#: the same VACUUM on ``threads`` threads, and optionally a
#: durable job per file (a claim and a finish, each a commit of a WAL, synchronous=FULL
#: database: the floor under any job layer that survives a crash), each thread with its own
#: connection to it. Arguments: threads, the jobs database (or "-" for none), the paths.
#: Prints: seconds, and the CPU seconds of its VACUUM statements (timed as BARE_LOOP's are,
#: summed over its threads).
BARE_POOL = """
import sqlite3, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
threads, jobs_path, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
vacuum_s = []  # one entry per file: list.append needs no lock
if jobs_path != "-":
    setup = sqlite3.connect(jobs_path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE IF NOT EXISTS job(key TEXT PRIMARY KEY, state TEXT)")
    setup.close()
local = threading.local()

def one(p):
    jobs = None
    if jobs_path != "-":
        jobs = getattr(local, "jobs", None)
        if jobs is None:
            jobs = local.jobs = sqlite3.connect(jobs_path, isolation_level=None, timeout=60, check_same_thread=False)
            jobs.execute("PRAGMA synchronous=FULL")
        jobs.execute("INSERT OR REPLACE INTO job VALUES (?, 'running')", (p,))
    c = sqlite3.connect(p, isolation_level=None)
    v0 = time.thread_time()
    c.execute("VACUUM")
    vacuum_s.append(time.thread_time() - v0)
    c.close()
    if jobs is not None:
        jobs.execute("DELETE FROM job WHERE key = ?", (p,))

t0 = time.perf_counter()
if threads == 1:
    for p in paths:
        one(p)
else:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, paths))
print(time.perf_counter() - t0, sum(vacuum_s))
"""


#: What both lean scripts below share: their set-up, the design's work on one file in two steps
#: (the examination's look at the file and its sizes; then one commit through smoosh's job layer
#: on its SQLite store, the run's job added already claimed with the previous run's finish, as
#: the daemon's claim does, and the compaction with every check the daemon makes at its start
#: and end, smoosh.daemon.run.compaction.compact), and the report of what the timed part took.
#: Arguments: the jobs store URL, the root, the paths. Prints: seconds, CPU seconds, wake-ups,
#: and the CPU seconds of the VACUUM statements themselves (bench._vacuum_cpu).
_LEAN_COMMON = """
import os, resource, sys, time
from bench._vacuum_cpu import VacuumCpu
from smoosh.compactors.sqlite import SqliteCompactor
from smoosh.daemon.run.compaction import compact
from smoosh.daemon.run.job_context import JobContext
from smoosh.jobs import Jobs
from smoosh.store import open_store
store_url, root, paths = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3:]
compactor = SqliteCompactor(roots=[root])
store = open_store(store_url)
jobs = Jobs(store)
vacuums = VacuumCpu().__enter__()
jobs.set_type_timeout("smoosh:bench", 30)

def examine(path):
    return compactor.sizes(path, look=compactor.look(path, strict=False))

def claim(tr, previous, path, data):
    if previous is not None:
        jobs.finish_and_remove(previous, tx=tr)
    return jobs.add_claimed("smoosh:bench", path, data, tx=tr)

def job_data(run, path, sizes):
    return {"channel": "ratio_dbs", "key": path, "priority": float(sizes.file_bytes - sizes.active_bytes),
            "progress": 0.0, "run": run, "file_bytes": sizes.file_bytes}

def compact_checked(path, data):
    outcome = compact(path, data, JobContext(), [compactor], [root], time.monotonic(), time.monotonic)
    if outcome.result != "ok":
        print(f"{path}: {outcome.result} {outcome.error}", file=sys.stderr)
        os._exit(1)

def claim_and_compact(previous, run, path, sizes):
    data = job_data(run, path, sizes)
    job = store.transact(lambda tr: claim(tr, previous, path, data))
    compact_checked(path, data)
    return job

def start():
    return resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()

def report(r0, t0, last, *closing):
    store.transact(lambda tr: jobs.finish_and_remove(last, tx=tr))
    seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    for close in closing:
        close()
    store.close()
    print(seconds, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), r1.ru_nvcsw - r0.ru_nvcsw, vacuums.seconds)
"""

#: The floor under the daemon's CPU per compaction: what the design asks of any daemon for each
#: file (_LEAN_COMMON's two steps), in one thread and nothing else. No channel, no scheduler, no
#: watcher, no thread hand-off. Times only its loop, not its imports.
LEAN_LOOP = _LEAN_COMMON + """
r0, t0 = start()
previous = None
for run, path in enumerate(paths):
    previous = claim_and_compact(previous, run, path, examine(path))
report(r0, t0, previous)
"""

#: The floor under a batch that is one job (issue 48's "one claim, one finish per batch"): the
#: lean loop's work, but the claims of a batch of files (as many as the daemon's batch bound)
#: committed in one transaction, which also finishes the batch before it. Its CPU beyond
#: LEAN_LOOP's is what the daemon could save per file by batching its commits, and no more.
LEAN_BATCH = _LEAN_COMMON + """
from smoosh.daemon.run.batch import BATCH_MAX_DATABASES

def claim_batch(tr, previous, batch):
    for job in previous:
        jobs.finish_and_remove(job, tx=tr)
    return [jobs.add_claimed("smoosh:bench", path, data, tx=tr) for path, data in batch]

r0, t0 = start()
previous = []
for first in range(0, len(paths), BATCH_MAX_DATABASES):
    batch = [(path, job_data(first + i, path, examine(path)))
             for i, path in enumerate(paths[first:first + BATCH_MAX_DATABASES])]
    previous = store.transact(lambda tr: claim_batch(tr, previous, batch))
    for path, data in batch:
        compact_checked(path, data)
store.transact(lambda tr: [jobs.finish_and_remove(job, tx=tr) for job in previous[:-1]])
report(r0, t0, previous[-1])
"""

#: The same work on the daemon's own threads, handed between them as the daemon hands it and with
#: nothing else: an examination pool thread looks at each file and posts it to a smoosh.loop.Loop,
#: which hands one at a time to a compaction pool thread (smoosh.daemon.keypool.KeyPool); that
#: thread claims and compacts as LEAN_LOOP does, has smoosh's inotify observer read the run's
#: own file events once at its end (dropped unbuilt, as the watcher's are), posts the end to the
#: loop and, as the daemon's compaction threads do, runs the loop's iteration that takes it while
#: the loop sleeps (Loop.help, from the pool's after_item): that iteration starts the next, which
#: the same thread then takes. No channel, scheduler, outcome record or history: its CPU
#: beyond LEAN_LOOP's is what the daemon's thread model costs by itself. Its set-up (the
#: threads, the observer's watch) comes before the timed part.
LEAN_THREADS = _LEAN_COMMON + """
import threading
from collections import deque
from smoosh.daemon.keypool import KeyPool
from smoosh.daemon.watch.inotify import InotifyObserver
from smoosh.daemon.watch.observers import EVENT_FILTER
from smoosh.loop import Loop

class Own:
    def dispatch(self, event):
        pass

    def ignores(self, path):
        return True

running = set()  # the loop thread's
queued = deque()  # the loop thread's
previous = [None]  # the compaction thread's
ended_count = [0]  # the loop thread's
done = threading.Event()
observer = InotifyObserver()
observer.schedule(Own(), root, recursive=True, event_filter=EVENT_FILTER)
observer.set_quiet(lambda: bool(running))
observer.start()
loop = Loop("lean-loop")
loop.start()

def examined(path):
    sizes = examine(path)
    loop.post(lambda: offer(path, sizes))

def offer(path, sizes):
    queued.append((path, sizes))
    if not running:
        start_next()

def start_next():
    if queued:
        path, sizes = queued.popleft()
        running.add(path)
        pool.submit((path, sizes))

def run(item):
    path, sizes = item
    previous[0] = claim_and_compact(previous[0], ended_count[0], path, sizes)
    observer.after_drain(lambda: None)
    loop.post(lambda: ended(path), helped=True)

def ended(path):
    running.discard(path)
    ended_count[0] += 1
    if ended_count[0] == len(paths):
        done.set()
    start_next()

pool = KeyPool(run, 1, "lean-compact", after_item=loop.help)
examiners = KeyPool(examined, 1, "lean-examine")
pool.start()
examiners.start()
r0, t0 = start()
for path in paths:
    examiners.submit(path)
done.wait()
report(r0, t0, previous[0], loop.stop, observer.stop)
"""

def copies(template: str, directory: Path, count: int) -> list[str]:
    """``count`` copies of ``template`` in ``directory`` (flushed, so no run pays for writing them).

    They are left to age past the scan's settling time first: a database written a moment ago
    is one still being copied in, which the daemon rightly lets settle a second before it looks
    (smoosh.daemon.watch.scan.SETTLE_S), and the fleet this measures was written long before.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = directory / f"tenant{i:05d}.db"
        shutil.copyfile(template, path)
        paths.append(str(path))
    os.sync()
    time.sleep(SETTLE_S + 0.5)
    return paths


def config_text(base: Path, concurrency: int, port: int | None, store: str | None = None, extra: str = "") -> str:
    """The default config, but every file qualifies and nothing waits (see the module docstring).

    ``store``: the job store URL (default: the embedded SQLite store in the state directory).
    ``extra``: more ``[smoosh]`` lines (``disk_pressure = 1%``).
    """
    http = f"http = 127.0.0.1:{port}\n" if port else ""
    store = store or f"sqlite:{base / 'state' / 'jobs.db'}"
    extra = f"{extra}\n" if extra else ""
    return f"""[smoosh]
watch = {base / 'dbs'}
state_dir = {base / 'state'}
store = {store}
node = bench
{http}wait_secs = 0
staleness = 0
{extra}
[smoosh.ratio_dbs]
min_size = 0
concurrency = {concurrency}

[smoosh.slack_dbs]
min_size = 0
"""


#: Seconds between two looks at the daemon's counters: often enough to notice the end soon,
#: rarely enough that answering them costs the daemon nothing it would not spend anyway.
POLL_S = 0.5


def _get(daemon: Daemon, path: str) -> str:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def compacted_ok(daemon: Daemon) -> int:
    """Compactions counted ok, from /metrics."""
    text = _get(daemon, "/metrics")
    return int(sum(float(v) for v in re.findall(r'^smoosh_compactions_total\{[^}]*result="ok"[^}]*\} (\S+)$', text, re.M)))


def mean_compaction_s(daemon: Daemon) -> float | None:
    """The daemon's mean compaction time over its ok runs (its duration histogram's sum / count),
    or None before one ended: beside the bare loop's time per file, it says how fast the disk
    was in this run, whatever the daemon's own overhead."""
    text = _get(daemon, "/metrics")

    def total(part: str) -> float:
        pattern = rf'^smoosh_compaction_duration_seconds_{part}\{{[^}}]*result="ok"[^}}]*\}} (\S+)$'
        return sum(float(v) for v in re.findall(pattern, text, re.M))

    count = total("count")
    return total("sum") / count if count else None


def last_finish_wall(daemon: Daemon) -> float | None:
    """When the last compaction finished (Unix seconds, the daemon's own record in /jobs)."""
    import json

    rows = json.loads(_get(daemon, "/jobs"))["jobs"]
    ends = [r["last_updated"] for r in rows if r.get("state") == "finished"]
    return max(ends) if ends else None


def thread_counters(pid: int) -> dict[int, tuple[str, int, int]]:
    """Per thread of process ``pid``: ``{tid: (name, CPU clock ticks, voluntary context switches)}``
    ({} off Linux). A voluntary switch is the thread going to sleep (a lock, a condition, I/O):
    each is a wake-up some other thread or the kernel must give it."""
    out: dict[int, tuple[str, int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except OSError:
            continue  # the thread ended between the listing and the read
        fields = tail.split()
        m = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)
        out[int(tid)] = (head.split("(", 1)[1], int(fields[11]) + int(fields[12]), int(m.group(1)) if m else 0)
    return out


class ThreadTally:
    """CPU and voluntary context switches per thread name over a window, from repeated looks.

    A thread seen only at a later look counts from zero (it started in the window); one that
    ended between two looks keeps what the last look saw, so the window's counts are a lower
    bound by at most one poll interval of a thread that ended (the pool threads of a drain stay).
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.first = thread_counters(pid)
        self.last = dict(self.first)

    def look(self) -> None:
        """Read every thread's counters now."""
        self.last.update(thread_counters(self.pid))

    def by_name(self) -> dict[str, tuple[float, int]]:
        """``{thread name without its serial: (CPU seconds, voluntary switches)}`` over the window."""
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, tuple[float, int]] = {}
        for tid, (name, cpu, vol) in self.last.items():
            _n, cpu0, vol0 = self.first.get(tid, (name, 0, 0))
            base = re.sub(r"_\d+$", "", name)
            c, v = out.get(base, (0.0, 0))
            out[base] = (c + (cpu - cpu0) / tick, v + vol - vol0)
        return out


#: The last drain's per-thread tally (name: (CPU seconds, voluntary switches)), for the report.
LAST_TALLY: dict[str, tuple[float, int]] = {}
#: The last drain's mean compaction time in the daemon (seconds; see mean_compaction_s), or None.
LAST_MEAN_S: list[float | None] = [None]
#: The CPU seconds the last drain's VACUUM statements took (bench._vacuum_cpu), where it was timed.
LAST_VACUUM_S: list[float | None] = [None]


def drain_daemon(
    template: str, count: int, concurrency: int, store: str | None = None, worker_processes: int = 0, extra: str = "",
) -> tuple[float, float | None]:
    """Seconds ``smoosh run`` takes to compact ``count`` copies, from its first answer, and the
    CPU seconds it used meanwhile (None off Linux); ``store`` and ``extra`` as for :func:`config_text`.
    Its threads' CPU and wake-ups are left in :data:`LAST_TALLY`.

    ``worker_processes``: the daemon runs no compaction itself (``--workers 0``) and that many
    ``smoosh worker`` processes, started before it, run them; their CPU is counted in."""
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-drain-"))
    try:
        copies(template, base / "dbs", count)
        (base / "state").mkdir()
        port = free_port()
        config = base / "smoosh.ini"
        config.write_text(config_text(base, concurrency, port, store, extra))
        workers = Workers(config, worker_processes) if worker_processes else None
        daemon = Daemon(config, port, args=("--workers", "0") if workers else ())
        pids = [daemon.proc.pid, *(p.pid for p in workers.procs)] if workers else [daemon.proc.pid]

        def cpu_now() -> float | None:
            each = [process_cpu_s(pid) for pid in pids]
            return None if None in each else sum(v for v in each if v is not None)

        try:
            daemon.wait_ready()
            t0_wall, t0 = time.time(), time.perf_counter()
            cpu0 = cpu_now()
            tally = ThreadTally(daemon.proc.pid)
            deadline = t0 + DRAIN_TIMEOUT_S
            while compacted_ok(daemon) < count:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"drain of {count} files did not finish in {DRAIN_TIMEOUT_S:.0f} s")
                time.sleep(POLL_S)
                tally.look()
            cpu1 = cpu_now()
            tally.look()
            LAST_TALLY.clear()
            LAST_TALLY.update(tally.by_name())
            LAST_MEAN_S[0] = mean_compaction_s(daemon)
            # The end as the daemon recorded it, not as the poll noticed it (up to POLL_S later).
            end_wall = last_finish_wall(daemon)
            seconds = end_wall - t0_wall if end_wall is not None else time.perf_counter() - t0
            # The CPU is read when the poll noticed the end: the idle daemon adds next to nothing.
            return seconds, (cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None)
        finally:
            daemon.stop()
            if workers is not None:
                workers.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def drain_bare(template: str, count: int, *, durable_jobs: bool = False, threads: int = 1) -> tuple[float, float]:
    """Seconds a bare VACUUM loop takes over ``count`` copies (one thread: the tool a user writes),
    and the CPU seconds its whole process used (interpreter start included: ~2% of it).

    ``durable_jobs``: each file is also a durable job (a claim and a finish committed).
    ``threads``: that many files at once (a thread pool), the floor for ``concurrency``.
    """
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-bare-"))
    try:
        paths = copies(template, base / "dbs", count)
        if threads == 1 and not durable_jobs:
            script = [BARE_LOOP]
        else:
            script = [BARE_POOL, str(threads), str(base / "jobs.db") if durable_jobs else "-"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([sys.executable, "-c", *script, *paths], check=True, capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        # Its wake-ups, counted as the daemon's are (voluntary context switches): the floor the
        # daemon's count stands on, since a VACUUM blocks on its own writes and syncs.
        LAST_TALLY.clear()
        LAST_TALLY["bare process"] = (cpu_s, after.ru_nvcsw - before.ru_nvcsw)
        seconds, *vacuum_s = out.stdout.split()
        if vacuum_s:
            LAST_VACUUM_S[0] = float(vacuum_s[0])
        return float(seconds), cpu_s
    finally:
        shutil.rmtree(base, ignore_errors=True)


def drain_lean(template: str, count: int, *, threads: bool = False, batched: bool = False) -> tuple[float, float]:
    """Seconds and CPU seconds of :data:`LEAN_LOOP` (``threads``: :data:`LEAN_THREADS`; ``batched``:
    :data:`LEAN_BATCH`) over ``count`` copies (its loop alone).

    Its wake-ups are left in :data:`LAST_TALLY`, as the bare loop's are; its VACUUM statements'
    CPU in :data:`LAST_VACUUM_S`."""
    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-lean-"))
    try:
        paths = copies(template, base / "dbs", count)
        out = subprocess.run(
            [sys.executable, "-c", LEAN_THREADS if threads else LEAN_BATCH if batched else LEAN_LOOP,
             f"sqlite:{base / 'jobs.db'}",
             str(base / "dbs"), *paths],
            check=True, capture_output=True, text=True, env=smoosh_env(), cwd=str(base),
        )
        seconds, cpu_s, wakes, vacuum_s = out.stdout.split()
        LAST_TALLY.clear()
        LAST_TALLY["lean process"] = (float(cpu_s), int(wakes))
        LAST_VACUUM_S[0] = float(vacuum_s)
        return float(seconds), float(cpu_s)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def drain_in_process(
    template: str, count: int, concurrency: int, compactor: Any, extra: str = "",
) -> tuple[float, float]:
    """Seconds and CPU seconds of a ``Server`` in this process draining ``count`` copies on the
    drain's config (the default SQLite job store, no HTTP), its compactor made by
    ``compactor(sqlite_settings)``. Timed from the return of its start, as :func:`drain_daemon`
    times from the first answer; the CPU is the process's, so the look at the counters every
    20 ms is counted too."""
    from smoosh.config import parse_config
    from smoosh.daemon.server import Server

    base = Path(tempfile.mkdtemp(prefix="smoosh-bench-inproc-"))
    try:
        copies(template, base / "dbs", count)
        (base / "state").mkdir()
        text = config_text(base, concurrency, None, extra=extra) + "\n"
        config = parse_config(text.replace("[smoosh]\n", "[smoosh]\nhttp =\n", 1), str(base / "smoosh.ini"))
        server = Server(config, watch_config=False, compactors=[compactor(config.sqlite)])
        server.start()
        try:
            t0, cpu0 = time.perf_counter(), time.process_time()
            deadline = t0 + DRAIN_TIMEOUT_S
            while sum(n for (_ch, result), n in server.counters.compactions.items() if result == "ok") < count:
                if time.perf_counter() > deadline:
                    raise RuntimeError("in-process drain did not finish")
                time.sleep(0.02)
            return time.perf_counter() - t0, time.process_time() - cpu0
        finally:
            server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def drain_direct(template: str, count: int, extra: str = "") -> tuple[float, float]:
    """:func:`drain_in_process` with smoosh's own compactor, each of its VACUUM statements timed
    (bench._vacuum_cpu): their CPU is left in :data:`LAST_VACUUM_S`, and the process's CPU less
    theirs is the daemon's CPU beyond the VACUUM, measured in one run."""
    from bench._vacuum_cpu import VacuumCpu
    from smoosh.compactors import SqliteCompactor

    with VacuumCpu() as vacuums:
        seconds, cpu_s = drain_in_process(template, count, 1, SqliteCompactor, extra)
    if vacuums.count < count:
        raise RuntimeError(f"{vacuums.count} VACUUM statements timed for {count} files: the compactor's path changed")
    LAST_VACUUM_S[0] = vacuums.seconds
    return seconds, cpu_s


def drain_noop(template: str, count: int) -> tuple[float, float]:
    """:func:`drain_in_process` with a compactor that returns at once: everything the daemon does
    per file but the compaction itself."""
    from smoosh.compactors import SqliteCompactor
    from smoosh.compactors.base import CompactionResult

    class Nothing(SqliteCompactor):
        def compact(self, key: str, ctx: Any) -> Any:
            size = os.path.getsize(key)
            return CompactionResult(size, size)

    return drain_in_process(template, count, 1, Nothing)


#: How long the thread sleeps before each sample of :func:`wake_cost_us` (seconds): about one
#: small database's compaction, the time a daemon thread waits between two turns of its work.
WAKE_SLEEP_S = 0.005


def wake_cost_us(samples: int = 300) -> tuple[float, float]:
    """Thread CPU (us, medians) of one piece of smoosh's per-compaction Python, a history row's
    store key (``smoosh.daemon.results.history_row_key``), run right after the thread slept
    :data:`WAKE_SLEEP_S`, and run again at once.

    The difference is what a wake-up costs the code that runs after it on this machine, beyond
    the switch itself: the caches it finds cold. A daemon thread pays it at each turn of its
    work, so the daemon's CPU per compaction grows with its wake-ups by about that much each.
    """
    from smoosh.daemon.results import history_row_key

    after: list[float] = []
    again: list[float] = []
    for i in range(samples):
        time.sleep(WAKE_SLEEP_S)
        t0 = time.thread_time_ns()
        history_row_key("bench", f"/srv/dbs/tenant{i:05d}.db")
        t1 = time.thread_time_ns()
        history_row_key("bench", f"/srv/dbs/tenant{i:05d}.db-again")
        t2 = time.thread_time_ns()
        after.append((t1 - t0) / 1000)
        again.append((t2 - t1) / 1000)
    return percentile(after, 0.5), percentile(again, 0.5)


def handoff_latencies(template: str, count: int, concurrency: int) -> list[float]:
    """Milliseconds from each key's eligibility to its compaction's start, in process."""
    from smoosh.compactors import SqliteCompactor

    starts: list[float] = []
    ends: list[float] = []

    class Timed(SqliteCompactor):
        def compact(self, key: str, ctx: Any) -> Any:
            starts.append(time.perf_counter())
            try:
                return super().compact(key, ctx)
            finally:
                ends.append(time.perf_counter())

    drain_in_process(template, count, concurrency, Timed)
    starts.sort()
    ends.sort()
    # Run i may start once `concurrency` runs before it have ended: the end that freed its slot.
    return [(starts[i] - ends[i - concurrency]) * 1000 for i in range(concurrency, len(starts))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=lambda p: p.add_argument("--files", type=int, default=None))
    count = args.files or (200 if args.quick else 1000)
    d = tempfile.mkdtemp(prefix="smoosh-bench-tpl-")
    try:
        template = os.path.join(d, "tenant.db")
        size = make_bloated_db(template, rows=TEMPLATE_ROWS, row_bytes=400, delete_fraction=0.8)

        def one() -> dict[str, float]:
            out: dict[str, float] = {}
            runs = {
                "bare": lambda: drain_bare(template, count),
                "bare_durable": lambda: drain_bare(template, count, durable_jobs=True),
                "bare_two": lambda: drain_bare(template, count, threads=2),
                "bare_two_durable": lambda: drain_bare(template, count, durable_jobs=True, threads=2),
                "lean": lambda: drain_lean(template, count),
                "lean_threads": lambda: drain_lean(template, count, threads=True),
                "lean_batch": lambda: drain_lean(template, count, batched=True),
                "default": lambda: drain_daemon(template, count, 1),
                "default_unbatched": lambda: drain_daemon(template, count, 1, extra=NO_BATCHES),
                "two": lambda: drain_daemon(template, count, 2),
                "slots1": lambda: drain_daemon(template, count, 1, extra="min_jobs = 1"),
                "slots2": lambda: drain_daemon(template, count, 2, extra="min_jobs = 2"),
                "slots4": lambda: drain_daemon(template, count, 4, extra="min_jobs = 4"),
                "two_memory": lambda: drain_daemon(template, count, 2, store="memory:"),
                "two_procs": lambda: drain_daemon(template, count, 2, worker_processes=2),
                "noop": lambda: drain_noop(template, count),
                "direct": lambda: drain_direct(template, count),
                "direct_unbatched": lambda: drain_direct(template, count, NO_BATCHES),
            }
            for name, run in runs.items():
                LAST_TALLY.clear()
                LAST_MEAN_S[0] = LAST_VACUUM_S[0] = None
                seconds, cpu_s = run()
                out[name] = seconds
                if LAST_MEAN_S[0] is not None:
                    out[name + "_mean"] = LAST_MEAN_S[0]
                if LAST_VACUUM_S[0] is not None:
                    out[name + "_vacuum_cpu"] = LAST_VACUUM_S[0]
                if cpu_s is not None:
                    out[name + "_cpu"] = cpu_s
                if LAST_TALLY:
                    out[name + "_wake"] = sum(v for _c, v in LAST_TALLY.values())
                    if name == "default":
                        tallies.append(dict(LAST_TALLY))
            return out

        tallies: list[dict[str, tuple[float, int]]] = []

        res = repeat(one, args.runs)
        lat1 = handoff_latencies(template, count, 1)
        lat2 = handoff_latencies(template, count, 2)
        woken_us, hot_us = wake_cost_us(100 if args.quick else 300)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    bare = sorted(res["bare"])[len(res["bare"]) // 2]
    two_bare = sorted(res["bare_two"])[len(res["bare_two"]) // 2]
    metrics = [
        Metric(f"bare VACUUM loop, {count} files", "s", res["bare"], higher_is_better=False),
        Metric(f"bare VACUUM loop + a durable job per file (2 commits), {count} files", "s", res["bare_durable"],
               higher_is_better=False, reference=bare, reference_name="bare loop"),
        Metric(f"bare VACUUM on 2 threads, {count} files", "s", res["bare_two"], higher_is_better=False,
               reference=bare, reference_name="bare loop"),
        Metric(f"bare VACUUM on 2 threads + a durable job per file (2 commits), {count} files", "s",
               res["bare_two_durable"], higher_is_better=False, reference=bare, reference_name="bare loop"),
        Metric(f"the design's work per file in one thread, no daemon (look, claim commit, checked compaction), {count} files",
               "s", res["lean"], higher_is_better=False, reference=bare, reference_name="bare loop"),
        Metric(f"the design's work per file on the daemon's threads (loop, compaction pool, inotify observer), "
               f"no daemon, {count} files", "s", res["lean_threads"], higher_is_better=False, reference=bare,
               reference_name="bare loop"),
        Metric(f"the design's work per file in one thread, the claims of a batch in one commit (a batch as one job), "
               f"no daemon, {count} files", "s", res["lean_batch"], higher_is_better=False, reference=bare,
               reference_name="bare loop"),
        Metric(f"smoosh run, default config, {count} files", "s", res["default"], higher_is_better=False,
               budget=1.25 * bare, budget_text=f"<= 1.25x bare ({1.25 * bare:.2f} s)", reference=bare,
               reference_name="bare loop"),
        Metric(f"smoosh run, default config without batches (batch_max_size = 0), {count} files", "s",
               res["default_unbatched"], higher_is_better=False, reference=bare, reference_name="bare loop"),
        Metric(f"smoosh run, concurrency = 2, {count} files", "s", res["two"], higher_is_better=False,
               budget=bare, budget_text=f"<= 1.0x bare ({bare:.2f} s; two bare VACUUM threads: "
                                        f"{two_bare / bare:.2f}x)", reference=bare, reference_name="bare loop"),
        Metric(f"smoosh run, concurrency = 2, memory job store (no durable commit), {count} files", "s",
               res["two_memory"], higher_is_better=False, reference=bare, reference_name="bare loop"),
        Metric(f"smoosh run --workers 0, concurrency = 2, two `smoosh worker` processes, {count} files", "s",
               res["two_procs"], higher_is_better=False, reference=bare, reference_name="bare loop"),
    ]
    # The curve: what a second and a fourth slot add, beside two bare VACUUM threads.
    metrics += [
        Metric(f"the curve: smoosh run, {n} slot{'s' if n > 1 else ''} (concurrency = min_jobs = {n}), {count} files",
               "s", res[f"slots{n}"], higher_is_better=False, reference=bare, reference_name="bare loop")
        for n in (1, 2, 4)
    ]
    # How fast the disk was in each run: the daemon's own mean compaction beside the bare loop's
    # time per file (a shared VM's disk has fast and slow spells, and the drain follows them).
    metrics.append(Metric("bare VACUUM loop: time per file", "ms", [v * 1000 / count for v in res["bare"]],
                          higher_is_better=False))
    metrics += [
        Metric(f"mean compaction in the daemon (its duration histogram's sum / count): {label}", "ms",
               [v * 1000 for v in res[key]], higher_is_better=False)
        for label, key in (("default config", "default_mean"), ("concurrency = 2", "two_mean"))
        if key in res
    ]
    if "two_cpu" in res:
        per_file = 1000 / count
        cpu_rows = [
            ("bare VACUUM loop", "bare_cpu"),
            ("bare VACUUM loop + a durable job per file", "bare_durable_cpu"),
            ("bare VACUUM on 2 threads + a durable job per file", "bare_two_durable_cpu"),
            ("the design's work per file in one thread, no daemon", "lean_cpu"),
            ("the design's work per file on the daemon's threads, no daemon", "lean_threads_cpu"),
            ("the design's work per file in one thread, a batch's claims in one commit", "lean_batch_cpu"),
            ("smoosh run, default config", "default_cpu"),
            ("smoosh run, concurrency = 2", "two_cpu"),
            ("smoosh run, concurrency = 2, memory job store", "two_memory_cpu"),
            ("smoosh run --workers 0 and two `smoosh worker` processes (all three)", "two_procs_cpu"),
        ]
        metrics += [
            Metric(f"CPU per file (user + system, all threads): {label}", "ms", [v * per_file for v in res[key]],
                   higher_is_better=False)
            for label, key in cpu_rows
        ]
        def beyond_bare(key: str) -> list[float]:
            """CPU per file of run ``key`` less the bare loop's (the VACUUM and a connection), ms,
            paired run by run."""
            return [(d - b) * per_file for d, b in zip(res[key + "_cpu"], res["bare_cpu"])]

        def beyond_own(key: str) -> list[float]:
            """CPU per file of run ``key`` less its own VACUUM statements' (same process, same
            run: bench._vacuum_cpu), ms."""
            return [(c - v) * per_file for c, v in zip(res[key + "_cpu"], res[key + "_vacuum_cpu"])]

        # What the bare loop spends beyond its VACUUM statements: its connections, its loop, the
        # interpreter's start. The daemon's figure below includes the same kind of work.
        metrics.append(Metric("the bare loop's CPU per file beyond its VACUUM statements (same run)", "ms",
                              beyond_own("bare"), higher_is_better=False))
        # The same with a durable job per file (its claim and its finish, two commits): what bare
        # tools spend beyond the VACUUM on what the budget counts, a job that survives a crash.
        metrics.append(Metric("the bare loop + a durable job per file: CPU per file beyond its VACUUM statements "
                              "(same run; the bare tools' floor under the budget below)", "ms",
                              beyond_own("bare_durable"), higher_is_better=False))
        # What the daemon spends per compaction beyond the VACUUM itself (DESIGN §9: <= 1.0 ms),
        # measured in one process: its CPU less its own VACUUM statements'.
        metrics.append(Metric("daemon CPU per compaction beyond its VACUUM statements (in process, default config; "
                              "both measured in the same run)", "ms", beyond_own("direct"), higher_is_better=False,
                              budget=1.0, budget_text="<= 1.0 ms"))
        metrics.append(Metric("the same without batches (batch_max_size = 0)", "ms", beyond_own("direct_unbatched"),
                              higher_is_better=False))
        # The same as read before: smoosh run's CPU less the bare loop's, two processes run apart.
        metrics.append(Metric("smoosh run, default config: CPU per compaction less the bare loop's (another run)",
                              "ms", beyond_bare("default"), higher_is_better=False))
        # What the VACUUM statements themselves cost: SQLite's work, the same in both but for the
        # library's version and the compactor's page cache.
        metrics += [
            Metric(f"VACUUM statements alone: CPU per file, {label}", "ms",
                   [v * per_file for v in res[key]], higher_is_better=False)
            for label, key in (("bare loop (stdlib sqlite3)", "bare_vacuum_cpu"),
                               ("the daemon (smoosh's compactor, apsw)", "direct_vacuum_cpu"))
        ]
        # What it spends per file when there is no compaction to subtract at all.
        metrics.append(Metric("daemon CPU per file with a compactor that returns at once (in process, default config)",
                              "ms", [v * per_file for v in res["noop_cpu"]], higher_is_better=False))
        # The same for the lean loop: what the design's work per file costs beyond the VACUUM
        # when nothing else runs, the floor under the budget above, measured as it is.
        metrics.append(Metric("the design's work per file beyond its VACUUM statements, in one thread (the floor "
                              "under the daemon's CPU per compaction)", "ms", beyond_own("lean"), higher_is_better=False))
        # And on the daemon's threads: the floor under the daemon's thread model.
        metrics.append(Metric("the design's work per file beyond its VACUUM statements, on the daemon's threads (the "
                              "floor under the daemon's CPU per compaction with its thread model)", "ms",
                              beyond_own("lean_threads"), higher_is_better=False))
        # And with a batch's claims in one commit: the floor under a batch that is one job.
        metrics.append(Metric("the design's work per file beyond its VACUUM statements, in one thread, a batch's "
                              "claims in one commit (the floor under a batch that is one job)", "ms",
                              beyond_own("lean_batch"), higher_is_better=False))
        if "default_wake" in res:
            metrics += [
                Metric(f"wake-ups per compaction (voluntary context switches, all threads): {label}", "",
                       [v * per_file / 1000 for v in res[key]], higher_is_better=False,
                       budget=15.0 if key == "default_wake" else None,
                       budget_text="< 15" if key == "default_wake" else "")
                for label, key in (("default config", "default_wake"), ("concurrency = 2", "two_wake"))
            ]
            metrics += [
                Metric(f"wake-ups per file (voluntary context switches, whole process): {label}", "",
                       [v * per_file / 1000 for v in res[key]], higher_is_better=False)
                for label, key in (("bare VACUUM loop", "bare_wake"),
                                   ("bare VACUUM loop + a durable job per file (the floor under the budget)",
                                    "bare_durable_wake"),
                                   ("the design's work per file in one thread, no daemon", "lean_wake"),
                                   ("the design's work per file on the daemon's threads, no daemon",
                                    "lean_threads_wake"))
                if key in res
            ]
        metrics.append(Metric(
            "smoosh run, concurrency = 2: its CPU over two cores (the soonest it could end)", "s",
            [v / 2 for v in res["two_cpu"]], higher_is_better=False, reference=bare, reference_name="bare loop"))
    metrics += [
        Metric("hand-off, eligible to compaction start, p50 (default)", "ms", [percentile(lat1, 0.5)], higher_is_better=False),
        Metric("hand-off, eligible to compaction start, p99 (default)", "ms", [percentile(lat1, 0.99)], higher_is_better=False),
        Metric("hand-off, eligible to compaction start, p50 (concurrency 2)", "ms", [percentile(lat2, 0.5)], higher_is_better=False),
        Metric("hand-off, eligible to compaction start, p99 (concurrency 2)", "ms", [percentile(lat2, 0.99)], higher_is_better=False),
        Metric(f"a piece of smoosh's Python (a history row's key) right after its thread slept "
               f"{WAKE_SLEEP_S * 1000:.0f} ms (median)", "us", [woken_us], higher_is_better=False),
        Metric("the same piece again at once (median)", "us", [hot_us], higher_is_better=False),
    ]
    notes = [
        f"{count} copies of a {size / 1024:.0f} KiB database with 80% of its rows deleted, in place before the daemon "
        "starts; the daemon runs with min_size = 0, wait_secs = 0, staleness = 0 (every file qualifies, no start-up "
        "pause), the default SQLite job store and max_jobs; its clock starts when it answers GET /status.",
        f"the bare loop uses Python's sqlite3 (SQLite {sqlite3.sqlite_version}), one connection per file.",
        *([("per thread, default config, per compaction (last run; CPU ms / wake-ups): " + ", ".join(
            f"{name} {cpu * 1000 / count:.2f} / {vol / count:.1f}"
            for name, (cpu, vol) in sorted(tallies[-1].items(), key=lambda kv: -kv[1][0]) if cpu or vol))]
          if tallies else []),
        "hand-off: in process, from the end of the run that freed a slot to the start of the next compaction "
        f"({len(lat1)} and {len(lat2)} samples).",
    ]
    report("drain", "The whole path: a fleet drained end to end, beside a bare VACUUM loop", metrics, args, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
