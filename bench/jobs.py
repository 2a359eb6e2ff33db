"""Job layer round trips (DESIGN §9): ``add`` + ``accept`` + ``finish`` per job.

Each worker adds a job, accepts one (any pending job of the type: with several workers it
may be another worker's) and finishes it with smoosh's result data, ``N`` times; the rate is
jobs / wall time. Measured on the ``memory:`` store and the embedded ``sqlite:`` store
(WAL, ``synchronous=FULL``: every commit durable), with 1, 2, 4 and 8 worker threads in one
process (the scaling curve; on SQLite group commit merges their commits), and 4 worker
processes sharing one store file.

Beside it, with equal durability (WAL, ``synchronous=FULL``, read back and shown): huey's
``SqliteHuey`` storage API with 1, 2, 4 and 8 threads, persist-queue's ``SQLiteAckQueue``
(both from the bench-only venv ``.venv-bench``, as subprocesses) and a bare stdlib sqlite3
loop doing three durable commits per job (``bench/_peers.py``). Budgets (DESIGN §9, restated by
issue 48 at the floors the lean-path issue measured): memory >= 10,000/s; SQLite one worker
>= 0.6x the bare loop; on every store, N workers never slower than one. Beside each store's curve, its floor: N threads that
share nothing (a store and job layer each: a memory store, or a SQLite file of its own), which
is what CPython leaves of N threads' Python work on this machine.

The floor printed beside the SQLite one-worker budget: one worker's round trip can be no
shorter than the bare loop's three durable commits plus the job layer's own work over a
store, measured as the memory store's round trip in the same run, so ``1 / (1/bare +
1/memory)`` is the best any SQLite store under this job layer could do. Beside each store,
its own share: the round trip's three transactions with the job layer's reads and writes but
no job layer (``store_round_trips``), the floor under the job layer's rate on that store;
on SQLite also with 4 threads sharing the store (a job type each, so only the store and its
group commits are shared), which 4 workers cannot beat.

Backlog runs (DESIGN §9, "accept cost does not grow with the backlog"): the same round trip
by one worker while 10, 1,000 or 10,000 other jobs are pending (eligible, scheduled time 0,
so every accept may pick one of them: the backlog stays the same size). Budget: the rate
with 10,000 pending >= 0.8x the rate with 10 pending, on both embedded stores.

Pipelined runs (issue 50): one worker whose claims overlap (``smoosh.jobs.pipeline``: up to
``depth`` accepts in flight, finishes committed behind it, adds kept ahead of it). On a
FoundationDB cluster every transaction waits on the network, and one worker claiming one job
after the other is a few round trips' worth; the stand-in for the binding
(``tests/helpers/fdb_standin.py``) with its round trip set to :data:`STANDIN_LATENCY_MS` shows
that wait here, and the budget is the issue's: one worker on it, pipelined, no slower than one
worker on the embedded SQLite store.

By hand, against a real store: ``python -m bench.jobs --store fdb:/etc/foundationdb/fdb.cluster``
runs the one-worker, pipelined and threaded round trips there and prints them (``bench/RESULTS.md``
is left alone); ``--store fdb-standin:MS`` does the same on the stand-in with an MS ms round
trip. Every run of this benchmark works under a key prefix of its own, ``("smoosh-bench",
<random>)``, and clears it afterwards: nothing is left under the job layer's default prefix.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import uuid
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._harness import REPO_ROOT, Metric, parse_args, repeat, report  # noqa: E402

#: The stand-in's round trip in the recorded runs, in ms: with it, one worker's serial rate on
#: the stand-in is about what one worker measured by hand on a single-process 7.3 cluster (its
#: figure is in bench/RESULTS.md), each transaction's read version, reads and commit waiting
#: in turn.
STANDIN_LATENCY_MS = 0.5
#: Claims in flight of the pipelined worker in the recorded runs.
PIPELINE_DEPTH = 8
#: URL scheme of the stand-in for FoundationDB (``fdb-standin:MS``): this benchmark's own.
STANDIN_SCHEME = "fdb-standin:"

#: Job type used by the benchmark (smoosh's own shape: "smoosh:" + node).
JOB_TYPE = "smoosh:bench"
#: Python of the bench-only venv holding huey and persist-queue.
BENCH_VENV_PYTHON = os.path.join(REPO_ROOT, ".venv-bench", "bin", "python")


def _data(i: int) -> dict:
    # The pid keeps the ids of worker processes sharing one store apart.
    return {"channel": "ratio_dbs", "key": f"/srv/dbs/{os.getpid()}/tenant-{i:08d}.sqlite", "priority": 5.0, "progress": 0.0}


def _timed_round_trips(layers: list[Any], share: int) -> float:
    """``share`` round trips on each of ``layers`` (a thread per entry, job layers maybe shared); jobs/s."""

    def work(jobs: Any, base: int) -> None:
        for i in range(base, base + share):
            data = _data(i)
            jobs.add(JOB_TYPE, data["key"], data)
            job, got = jobs.accept(JOB_TYPE)
            got.update(result="ok", error=None, size_before_bytes=2_000_000, size_after_bytes=800_000,
                       reclaimed_bytes=1_200_000, duration_s=0.1)
            jobs.finish(job, got)

    threads = [threading.Thread(target=work, args=(jobs, k * share)) for k, jobs in enumerate(layers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return share * len(layers) / (time.perf_counter() - t0)


def open_bench_store(store_url: str) -> Any:
    """A store by URL, or the stand-in for FoundationDB with a round trip of MS ms (``fdb-standin:MS``)."""
    from smoosh.store import open_store

    if not store_url.startswith(STANDIN_SCHEME):
        return open_store(store_url)
    tests = os.path.join(REPO_ROOT, "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from smoosh.store.fdb import FdbStore

    # The test suite's stand-in (a dev tool, not part of the package), found on its path.
    binding = importlib.import_module("helpers.fdb_standin").Binding()
    binding.cluster.latency_s = float(store_url[len(STANDIN_SCHEME):]) / 1000.0
    return FdbStore(None, url=store_url, binding=binding)


class Layer:
    """A job layer over a store, under a key prefix of this run's own, cleared when it closes.

    So a run against a shared store (``--store fdb:...``) leaves no key behind, and never
    writes under the job layer's default prefix.
    """

    def __init__(self, store_url: str, *, monitors: bool = True) -> None:
        from smoosh.jobs import Jobs
        from smoosh.store import tuples

        self.store = open_bench_store(store_url)
        self.prefix = tuples.pack(("smoosh-bench", uuid.uuid4().hex))
        self.jobs = Jobs(self.store, prefix=self.prefix, monitors=monitors)
        self.jobs.set_type_timeout(JOB_TYPE, 30)

    def close(self) -> None:
        """Close the layer, clear the run's prefix, close the store."""
        self.jobs.close()
        try:
            prefix = self.prefix
            self.store.transact(lambda tr: tr.clear_range_startswith(prefix))
        finally:
            self.store.close()


def _open_layer(store_url: str) -> tuple[Any, Any]:
    layer = Layer(store_url)
    return layer, layer.jobs


def round_trips(store_url: str, n: int, workers: int) -> float:
    """``n`` add+accept+finish round trips by ``workers`` threads on a fresh store; jobs/s."""
    layer, jobs = _open_layer(store_url)
    try:
        return _timed_round_trips([jobs] * workers, n // workers)
    finally:
        layer.close()


def pipelined_round_trips(store_url: str, n: int, depth: int = PIPELINE_DEPTH) -> float:
    """``n`` round trips by one worker whose claims overlap (``ClaimPipeline``, ``depth`` in flight); jobs/s.

    The worker's adds run ahead of its claims on ``depth`` threads of their own, at most
    ``2 * depth`` jobs ahead of its finishes (so the backlog stays small, as the serial
    worker's); the clock stops when the last finish has committed.
    """
    from smoosh.jobs.pipeline import ClaimPipeline

    layer, jobs = _open_layer(store_url)
    ahead = threading.Semaphore(2 * depth)
    adders = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="bench-add")

    def add_all() -> None:
        for i in range(n):
            ahead.acquire()
            data = _data(i)
            adders.submit(jobs.add, JOB_TYPE, data["key"], data)

    try:
        with ClaimPipeline(jobs, JOB_TYPE, depth=depth) as pipe:
            t0 = time.perf_counter()
            feeder = threading.Thread(target=add_all)
            feeder.start()
            for _ in range(n):
                got = pipe.take()
                assert got is not None
                job, data = got
                data.update(result="ok", error=None, size_before_bytes=2_000_000, size_after_bytes=800_000,
                            reclaimed_bytes=1_200_000, duration_s=0.1)
                pipe.finish(job, data).add_done_callback(lambda _f: ahead.release())
            pipe.flush()
            dt = time.perf_counter() - t0
            feeder.join()
        return n / dt
    finally:
        adders.shutdown(wait=True)
        layer.close()


def private_round_trips(n: int, workers: int) -> float:
    """``n`` round trips by ``workers`` threads, each on a memory store and job layer of its own; jobs/s.

    Nothing is shared between the threads but the interpreter: no store lock, no conflict,
    no pending job taken by another. What is left of a scaling loss is CPython's: one thread
    runs Python at a time, and a thread that takes the GIL on the other core finds the
    objects it touches in the first core's cache. The floor under "N workers never slower
    than one" for any design whose workers are threads of one process.
    """
    return _private(["memory:"] * workers, n)


def sqlite_private_round_trips(n: int, workers: int) -> float:
    """As :func:`private_round_trips`, each thread on a SQLite store file of its own; jobs/s.

    No group commit can form (each store has one committer), so each thread pays its own
    fsyncs: the floor under the SQLite store's scaling curve for threads of one process.
    """
    dirs = [tempfile.mkdtemp(prefix="smoosh-bench-jobs-") for _ in range(workers)]
    try:
        return _private([_sqlite_url(d) for d in dirs], n)
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def _private(urls: list[str], n: int) -> float:
    pairs = [_open_layer(url) for url in urls]
    try:
        return _timed_round_trips([jobs for _, jobs in pairs], n // len(urls))
    finally:
        for layer, _jobs in pairs:
            layer.close()


#: Worker threads of the scaling curve (the job layer's and huey's).
WORKERS = (1, 2, 4, 8)
def store_round_trips(store_url: str, n: int, threads: int = 1) -> float:
    """The store's share of a round trip: its three transactions, without the job layer; jobs/s.

    Each transaction makes exactly the reads and writes the job layer's ``add``, ``accept``
    and ``finish`` make (the same keys, values, snapshot reads, conflict key and stamped
    writes), with every key and value built before the clock starts. No job layer can make
    a round trip faster than this on the same store: the floor of the memory budget.

    ``threads``: that many threads share the store, each with its own job type (keys of its
    own: no conflict, no pending job taken by another), ``n / threads`` round trips each: on
    SQLite their commits meet in group commits. The floor under N worker threads of any job
    layer on this store, since a job layer's threads share more than these do.
    """
    from smoosh.store import open_store

    share = n // threads
    store = open_store(store_url)
    try:
        plans = [_floor_plan(store, t, share) for t in range(threads)]
        workers = [threading.Thread(target=plan) for plan in plans]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        dt = time.perf_counter() - t0
    finally:
        store.close()
    return share * threads / dt


def _floor_plan(store: Any, thread: int, n: int) -> Any:
    """The keys and values of ``n`` round trips of :func:`store_round_trips`, and what runs them."""
    from smoosh.store import tuples
    from smoosh.store.tuples import Versionstamp

    p = tuples.pack(("floor", thread))
    timeout_key, counter_key, watch_key = p + b"\x05t", p + b"\x03t", p + b"\x04t"
    pending_begin, pending_end = p + b"\x02t\x00", p + b"\x02t\xff"
    watch_value = tuples.pack_with_versionstamp((Versionstamp(),))
    store.transact(lambda tr: tr.set(timeout_key, tuples.pack((30,))))
    one = (1).to_bytes(8, "little")
    work = []
    for i in range(n):
        data = tuples.pack((str(_data(i)),))
        row_key, pending_key = p + b"\x01t%08d" % i, p + b"\x02t\x14%08d" % i
        activity = tuples.pack_with_versionstamp((Versionstamp(),), p + b"\x06t")
        work.append((row_key, pending_key, activity, tuples.pack((0, None, 0, False, data)),
                     tuples.pack_with_versionstamp((Versionstamp(), "0" * 32, 0, False, data)),
                     tuples.pack((None, None, 0, False, data))))

    def add(tr: Any, row_key: bytes, pending_key: bytes, row: bytes) -> None:
        tr.snapshot.get(timeout_key)
        tr.get(row_key)
        tr.set(row_key, row)
        tr.set(pending_key, b"")
        tr.add(counter_key, one)

    def accept(tr: Any, activity: bytes, running: bytes) -> bytes:
        key = tr.snapshot.get_range(pending_begin, pending_end, limit=8)[0][0]
        tr.add_read_conflict_key(key)
        tr.clear(key)
        row_key = p + b"\x01t" + key[len(pending_begin) :]
        tr.get(row_key)
        tr.set_versionstamped_value(row_key, running)
        tr.set_versionstamped_key(activity, b"id and data")
        tr.set_versionstamped_value(watch_key, watch_value)
        return row_key

    def finish(tr: Any, row_key: bytes, stamp: bytes, done: bytes) -> None:
        tr.get(row_key)
        tr.set(row_key, done)
        tr.clear(p + b"\x06t" + tuples.pack((Versionstamp(stamp, 0),)))
        tr.set_versionstamped_value(watch_key, watch_value)

    def run() -> None:
        for row_key, pending_key, activity, row, running, done in work:
            store.transact(lambda tr: add(tr, row_key, pending_key, row))
            tr = store.create_transaction()
            taken = accept(tr, activity, running)
            tr.commit()
            stamp = tr.get_versionstamp()
            store.transact(lambda tr: finish(tr, taken, stamp, done))

    return run


#: Backlog sizes of the accept-cost runs.
BACKLOGS = (10, 1_000, 10_000)


def backlog_round_trips(store_url: str, pending: int, n: int) -> float:
    """``n`` add+accept+finish round trips by one worker while ``pending`` jobs wait; jobs/s."""
    from smoosh.store import Transaction

    layer = Layer(store_url)
    jobs = layer.jobs
    for start in range(0, pending, 1000):  # the backlog, 1,000 jobs per transaction

        def add_batch(tr: Transaction, start: int = start) -> None:
            for i in range(start, min(pending, start + 1000)):
                jobs.add(JOB_TYPE, f"/srv/backlog/{i:08d}.sqlite", _data(i), tx=tr)

        jobs.transact(add_batch)
    t0 = time.perf_counter()
    for i in range(n):
        data = _data(i)
        jobs.add(JOB_TYPE, data["key"], data)
        job, got = jobs.accept(JOB_TYPE)
        jobs.finish(job, {**got, "result": "ok"})
    dt = time.perf_counter() - t0
    layer.close()
    return n / dt


def backlog_runs(n_mem: int, n_sql: int) -> dict[str, float]:
    """Every backlog size on both embedded stores: ``{"mem_backlog10": jobs/s, ...}``."""
    out = {}
    for pending in BACKLOGS:
        out[f"mem_backlog{pending}"] = backlog_round_trips("memory:", pending, n_mem)
        out[f"sql_backlog{pending}"] = _on_fresh_sqlite(lambda url: backlog_round_trips(url, pending, n_sql))
    return out


def _sqlite_url(d: str) -> str:
    return f"sqlite:{os.path.join(d, 'jobs.db')}"


def _on_fresh_sqlite(run: Any) -> float:
    """``run(url)`` on a SQLite store file of its own, removed afterwards; what it returns."""
    d = tempfile.mkdtemp(prefix="smoosh-bench-jobs-")
    try:
        return float(run(_sqlite_url(d)))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def sqlite_round_trips(n: int, workers: int) -> float:
    return _on_fresh_sqlite(lambda url: round_trips(url, n, workers))


def sqlite_processes(n: int, procs: int) -> float:
    """``procs`` processes, one worker thread each, sharing one store file; total jobs/s."""
    return _on_fresh_sqlite(lambda url: _processes_on(url, n, procs))


def _processes_on(url: str, n: int, procs: int) -> float:
    from smoosh.store import open_store

    open_store(url).close()  # create the schema once, before the race
    cmd = [sys.executable, "-m", "bench.jobs", "--child", url, str(n // procs)]
    t0 = time.perf_counter()
    children = [subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    for c in children:
        c.communicate()
        if c.returncode:
            raise RuntimeError(f"worker process failed with {c.returncode}")
    return (n // procs) * procs / (time.perf_counter() - t0)


def peer(case: str, n: int, workers: int = 1) -> dict:
    """Run one ``bench/_peers.py`` case in a subprocess; its JSON result."""
    python = sys.executable if case == "bare3" else BENCH_VENV_PYTHON
    if not os.path.exists(python):
        raise FileNotFoundError(f"{python} missing: create the bench venv (see bench/README.md)")
    out = subprocess.run([python, os.path.join(REPO_ROOT, "bench", "_peers.py"), case, str(n), str(workers)],
                         check=True, capture_output=True, text=True, cwd=REPO_ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        # A worker process of sqlite_processes: the store's schema already exists.
        round_trips(argv[1], int(argv[2]), 1)
        return 0
    if argv[:1] == ["--backlog-only"]:
        # Just the backlog runs, as JSON (to measure two checkouts side by side).
        n_mem, n_sql = (int(a) for a in argv[1:3]) if len(argv) >= 3 else (3000, 600)
        print(json.dumps(backlog_runs(n_mem, n_sql)))
        return 0
    args = parse_args(__doc__, argv, extra=lambda ap: ap.add_argument(
        "--store", metavar="URL", help="run one worker's round trips (serial, pipelined, threaded) against this store "
        "(fdb:CLUSTER_FILE, or fdb-standin:MS) under a prefix of their own, cleared afterwards, and print them; "
        "bench/RESULTS.md is left alone") and ap.add_argument(
        "--latency-only", action="store_true", help="only the jobs_latency section (one worker, serial and pipelined, "
        "on the stand-in with a round trip's latency, beside the SQLite store)"))
    if args.store:
        return _on_store(args)
    if args.latency_only:
        return latency_report(args)
    n_mem = 2000 if args.quick else 10_000
    n_sql = 400 if args.quick else 3000
    have_venv = os.path.exists(BENCH_VENV_PYTHON)

    def one() -> dict[str, float]:
        # Each configuration right after the others, store by store, so that a change in the
        # machine's load falls on a whole curve rather than on one point of it.
        r: dict[str, float] = {}
        for w in WORKERS:
            r[f"mem{w}"] = round_trips("memory:", n_mem, w)
        for w in WORKERS[1:]:
            r[f"own{w}"] = private_round_trips(n_mem, w)
        for w in WORKERS:
            r[f"sql{w}"] = sqlite_round_trips(n_sql, w)
        for w in WORKERS[1:]:
            r[f"sqlown{w}"] = sqlite_private_round_trips(n_sql, w)
        if have_venv:
            for w in WORKERS:
                r[f"huey{w}"] = peer("huey", n_sql, w)["per_s"]
        r["memfloor"] = store_round_trips("memory:", n_mem)
        r["sqlfloor"] = _on_fresh_sqlite(lambda url: store_round_trips(url, n_sql))
        r["sqlfloor4"] = _on_fresh_sqlite(lambda url: store_round_trips(url, n_sql, 4))
        r["sqlp4"] = sqlite_processes(n_sql, 4)
        r["bare3"] = peer("bare3", n_sql)["per_s"]
        r.update(backlog_runs(n_mem // 3, n_sql))
        if have_venv:
            r["pq_ack"] = peer("pq_ack", n_sql)["per_s"]
        return r

    res = repeat(one, args.runs)
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    bare = med["bare3"]
    huey = med.get("huey1")
    # The floor of one SQLite worker (see the module docstring), run by run.
    res["floor1"] = [1 / (1 / b + 1 / m) for b, m in zip(res["bare3"], res["mem1"])]
    floor = sorted(res["floor1"])[len(res["floor1"]) // 2]
    metrics = [
        Metric("memory store, 1 worker thread", "/s", res["mem1"], budget=10_000, reference=med["memfloor"],
               reference_name="the store alone"),
        Metric("memory store alone: the round trip's 3 transactions, no job layer", "/s", res["memfloor"],
               note="the same reads and writes as add, accept and finish, keys and values built beforehand: "
                    "the floor under the memory budget"),
    ]
    for w in WORKERS[1:]:
        metrics.append(Metric(f"memory store, {w} worker threads", "/s", res[f"mem{w}"], budget=med["mem1"],
                              budget_text=f">= 1 worker ({med['mem1']:,.0f}/s)", reference=med[f"own{w}"],
                              reference_name=f"{w} threads sharing nothing"))
    for w in WORKERS[1:]:
        metrics.append(Metric(f"{w} threads sharing nothing: a memory store and job layer each", "/s", res[f"own{w}"],
                              reference=med["mem1"], reference_name="1 worker",
                              note="no store, lock or job shared: what CPython leaves of N threads' Python work "
                                   "(one runs at a time; each switch of cores finds the caches cold), the floor under "
                                   "N worker threads of any design" if w == WORKERS[1] else ""))
    metrics += [
        Metric("SQLite store, 1 worker", "/s", res["sql1"], budget=0.6 * bare,
               budget_text=f">= 0.6x bare loop ({0.6 * bare:,.0f}/s)", reference=bare, reference_name="bare 3-commit loop"),
        Metric("SQLite store alone: the round trip's 3 transactions, no job layer", "/s", res["sqlfloor"], reference=bare,
               reference_name="bare 3-commit loop"),
        Metric("floor of any SQLite store under this job layer, 1 worker", "/s", res["floor1"], reference=bare,
               reference_name="bare 3-commit loop",
               note="the bare loop's 3 durable commits plus the job layer's work as the memory store does it (same run): "
                    "1 / (1/bare + 1/memory)"),
    ]
    for w in WORKERS[1:]:
        # DESIGN §9 as restated (issue 48, at the floors the lean-path issue measured): N workers
        # never slower than one, on every store.
        metrics.append(Metric(f"SQLite store, {w} worker threads (group commit)", "/s", res[f"sql{w}"],
                              budget=med["sql1"], budget_text=f">= 1 worker ({med['sql1']:,.0f}/s)",
                              reference=med.get(f"huey{w}"), reference_name=f"huey, {w} threads"))
    metrics.append(Metric(
        "SQLite store alone, 4 threads (a job type each, group commit): the round trip's 3 transactions, no job layer",
        "/s", res["sqlfloor4"], reference=2 * huey if huey else None, reference_name="2x huey",
        note="the floor under 4 workers: a job layer's 4 threads share the store as these do, and more"))
    for w in WORKERS[1:]:
        metrics.append(Metric(f"{w} threads sharing nothing: a SQLite store file and job layer each", "/s",
                              res[f"sqlown{w}"], reference=med["sql1"], reference_name="1 worker",
                              note="no store file, lock or job shared, so no group commit either: the floor under "
                                   "N worker threads on SQLite stores in one process" if w == WORKERS[1] else ""))
    metrics += [
        Metric("SQLite store, 4 worker processes", "/s", res["sqlp4"], reference=huey, reference_name="huey",
               note="one thread per process: no group commit across processes, so each commit is its own fsync"),
        Metric("bare sqlite3, 3 durable commits/job", "/s", res["bare3"], note="WAL, synchronous=FULL; single thread"),
    ]
    for store, label in (("mem", "memory store"), ("sql", "SQLite store")):
        base = med[f"{store}_backlog10"]
        for pending in BACKLOGS:
            key = f"{store}_backlog{pending}"
            metrics.append(Metric(
                f"{label}, 1 worker, {pending:,} jobs pending", "/s", res[key],
                budget=0.8 * base if pending == BACKLOGS[-1] else None,
                budget_text=f">= 0.8x the rate with 10 pending ({0.8 * base:,.0f}/s)" if pending == BACKLOGS[-1] else "",
                reference=base if pending != BACKLOGS[0] else None, reference_name="10 pending",
            ))
    if huey:
        metrics.append(Metric("huey SqliteHuey storage (enqueue+dequeue), 1 thread", "/s", res["huey1"],
                              note="2 commits/job; dequeue deletes the task"))
        metrics += [Metric(f"huey, {w} threads", "/s", res[f"huey{w}"], reference=huey, reference_name="huey, 1 thread")
                    for w in WORKERS[1:]]
        metrics.append(Metric("persist-queue SQLiteAckQueue put/get/ack", "/s", res["pq_ack"]))
    notes = [
        f"{n_mem} round trips per memory run, {n_sql} per SQLite/peer run; every peer reports WAL and synchronous=2 (FULL).",
        f"Backlog runs: {n_mem // 3} round trips (memory) / {n_sql} (SQLite) by one worker beside 10, 1,000 or 10,000 eligible pending jobs.",
    ]
    if not have_venv:
        notes.append("huey/persist-queue skipped: .venv-bench missing (see bench/README.md).")
    report("jobs", "Job layer: add + accept + finish round trips", metrics, args, notes)
    return latency_report(args)


def latency_report(args: Any) -> int:
    """One worker's round trips where each transaction waits on a network: the ``jobs_latency`` section.

    Side by side in one run: one worker on the embedded SQLite store (the budget), and one
    worker on the stand-in for FoundationDB with its round trip set, serial and pipelined.
    """
    n = 300 if args.quick else 2000
    standin = f"{STANDIN_SCHEME}{STANDIN_LATENCY_MS:g}"

    def one() -> dict[str, float]:
        return {
            "sql1": sqlite_round_trips(n, 1),
            "sql_pipe": _on_fresh_sqlite(lambda url: pipelined_round_trips(url, n)),
            "mem_pipe": pipelined_round_trips("memory:", n),
            "standin1": round_trips(standin, max(50, n // 10), 1),
            "standin_pipe": pipelined_round_trips(standin, n),
            "standin_pipe16": pipelined_round_trips(standin, n, 2 * PIPELINE_DEPTH),
        }

    res = repeat(one, args.runs)
    sql1 = sorted(res["sql1"])[len(res["sql1"]) // 2]
    serial = sorted(res["standin1"])[len(res["standin1"]) // 2]
    on = f"FoundationDB stand-in ({STANDIN_LATENCY_MS:g} ms round trip)"
    metrics = [
        Metric("SQLite store, 1 worker", "/s", res["sql1"]),
        Metric(f"SQLite store, 1 worker, pipelined ({PIPELINE_DEPTH} claims in flight)", "/s", res["sql_pipe"],
               reference=sql1, reference_name="1 worker, serial"),
        Metric(f"memory store, 1 worker, pipelined ({PIPELINE_DEPTH} claims in flight)", "/s", res["mem_pipe"],
               note="on a store that waits for nothing, the pipeline's threads only cost: CPython runs one at a time"),
        Metric(f"{on}, 1 worker", "/s", res["standin1"],
               note="each transaction's read version, reads and commit wait in turn: a cluster's latency-bound rate"),
        Metric(f"{on}, 1 worker, pipelined ({PIPELINE_DEPTH} claims in flight)", "/s", res["standin_pipe"],
               budget=sql1, budget_text=f">= SQLite store, 1 worker ({sql1:,.0f}/s)", reference=serial,
               reference_name="1 worker, serial"),
        Metric(f"{on}, 1 worker, pipelined ({2 * PIPELINE_DEPTH} claims in flight)", "/s", res["standin_pipe16"],
               reference=serial, reference_name="1 worker, serial"),
    ]
    notes = [f"{n} round trips per run (the serial worker on the stand-in: {max(50, n // 10)}); the stand-in is "
             "tests/helpers/fdb_standin.py under the fdb: adapter. A real cluster, by hand: "
             "`python -m bench.jobs --store fdb:CLUSTER_FILE`."]
    report("jobs_latency", "Job layer on a store with latency: one worker's claims overlapped", metrics, args, notes,
           command="python -m bench.jobs --latency-only")
    return 0


def _on_store(args: Any) -> int:
    """``--store URL``: one worker's round trips there (serial, pipelined, 4 threads), printed only."""
    n = 200 if args.quick else 2000

    def one() -> dict[str, float]:
        return {
            "serial": round_trips(args.store, max(50, n // 10), 1),
            "pipe": pipelined_round_trips(args.store, n, PIPELINE_DEPTH),
            "pipe16": pipelined_round_trips(args.store, n, 2 * PIPELINE_DEPTH),
            "threads4": round_trips(args.store, n, 4),
        }

    res = repeat(one, args.runs)
    serial = sorted(res["serial"])[len(res["serial"]) // 2]
    metrics = [
        Metric(f"{args.store}, 1 worker", "/s", res["serial"]),
        Metric(f"{args.store}, 1 worker, pipelined ({PIPELINE_DEPTH} claims in flight)", "/s", res["pipe"],
               reference=serial, reference_name="1 worker, serial"),
        Metric(f"{args.store}, 1 worker, pipelined ({2 * PIPELINE_DEPTH} claims in flight)", "/s", res["pipe16"],
               reference=serial, reference_name="1 worker, serial"),
        Metric(f"{args.store}, 4 worker threads", "/s", res["threads4"], reference=serial,
               reference_name="1 worker, serial"),
    ]
    args.no_write = True  # a store of the operator's: figures for a person to copy, not the recorded run's
    report("jobs", f"Job layer round trips on {args.store}", metrics, args,
           ["every run under a key prefix of its own, cleared afterwards"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
