"""The workload an application runs on the tenant fleet: the mix of operations, the pace, the record.

Stdlib only; runs in the application's process (``.venv-apps``), driven by
:mod:`bench.apps.django_app` or :mod:`bench.apps.sqlalchemy_app`, which supply the operations
through the framework (:class:`App`).

``THREADS`` threads share one rate (``rate_per_s`` in all, each thread on a fixed schedule
of its own: an operation late by more than :data:`MAX_LAG_S` drops the slots it missed
rather than bursting to catch up, and the slots dropped are counted). Each operation goes to
a tenant drawn at random and is one of :data:`MIX`. Every operation's start (wall clock, the
clock smoosh's JSON log is in), latency, kind, tenant and outcome (the error's type and
message) is recorded; a failed operation counts with the time it waited before failing.

Rows are owned by threads (a template row by ``id % threads``, a created row by its creator),
and an operation touches only its thread's rows: the ledger (:mod:`bench.apps.ledger`) then
holds each row's commits in the order they happened. Tenants are shared: the threads still
meet on every database's locks, which is the point.

Only the framework's database errors are caught and recorded; anything else (a bug) ends the
thread and the process exits non-zero, so a broken workload can never pass for a quiet one.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from bench.apps.ledger import Value, digest, template_key

__all__ = ["MIX", "OPS", "App", "IdPool", "ThreadState", "run_workload", "main"]

#: The operations and their shares of the mix (creates and deletes balance: about 0.27 rows
#: created per operation, 0.25 deleted).
MIX: dict[str, float] = {
    "create": 0.20,
    "get_or_create": 0.15,
    "read_modify_write": 0.20,
    "f_update": 0.15,
    "bulk_delete": 0.05,
    "read": 0.25,
}
OPS = tuple(MIX)
#: Rows a bulk delete removes, and a read fetches (at most).
BULK_DELETE_ROWS = 5
READ_ROWS = 5
#: Payload length of a written row, in characters (hex text).
PAYLOAD_CHARS = (200, 1200)
#: A thread more than this far behind its schedule drops the slots it missed (seconds).
MAX_LAG_S = 1.0


class App:
    """What a framework supplies: its operations on tenant ``tenant`` (an index into the fleet).

    Each operation is one unit of work as the framework's users write it (see the
    implementations); it raises the framework's database error when the database refuses.
    """

    #: The framework's database errors: caught and recorded, never anything else.
    db_errors: tuple[type[BaseException], ...] = ()

    def start_request(self) -> None:
        """Before each operation (Django: what its request handler does at a request's start)."""

    def end_request(self) -> None:
        """After each operation, whatever its outcome."""

    def ids(self, tenant: int) -> list[int]:
        """Every row id of ``tenant`` (read once, before the run)."""
        raise NotImplementedError

    def create(self, tenant: int, key: str, payload: str) -> int:
        """Insert a row; its id."""
        raise NotImplementedError

    def get_or_create(self, tenant: int, key: str, payload: str) -> tuple[int, bool]:
        """The row with ``key``, inserted (counter 0, ``payload``) when there is none: its id, created."""
        raise NotImplementedError

    def read_modify_write(self, tenant: int, row_id: int, payload: str) -> tuple[str, int] | None:
        """In one transaction, read the row, add 1 to its counter, set ``payload``, save: its key and
        new counter (None: no such row)."""
        raise NotImplementedError

    def f_update(self, tenant: int, row_id: int) -> int:
        """``counter = counter + 1`` in the database (Django's ``F()``): rows updated."""
        raise NotImplementedError

    def bulk_delete(self, tenant: int, row_ids: Sequence[int]) -> int:
        """Delete the rows by a filter: rows deleted."""
        raise NotImplementedError

    def read(self, tenant: int, row_ids: Sequence[int]) -> int:
        """Fetch the rows: how many came back."""
        raise NotImplementedError


class IdPool:
    """A set of ids with O(1) add, remove and random choice (owned by one thread)."""

    def __init__(self, ids: Sequence[int] = ()) -> None:
        self._items: list[int] = list(ids)
        self._where = {x: i for i, x in enumerate(self._items)}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, x: object) -> bool:
        return x in self._where

    def add(self, x: int) -> None:
        if x not in self._where:
            self._where[x] = len(self._items)
            self._items.append(x)

    def remove(self, x: int) -> None:
        i = self._where.pop(x)
        last = self._items.pop()
        if i < len(self._items):
            self._items[i] = last
            self._where[last] = i

    def choice(self, rng: random.Random) -> int:
        return self._items[rng.randrange(len(self._items))]


@dataclass
class TenantRows:
    """One thread's rows of one tenant: template rows it has not written, and rows whose value it knows."""

    template: IdPool
    known: dict[int, list[Any]] = field(default_factory=dict)  # id -> [key, counter, digest]
    known_ids: IdPool = field(default_factory=IdPool)
    ledger: dict[str, Value] = field(default_factory=dict)  # key -> [id, counter, digest] | None

    def alive(self) -> int:
        return len(self.template) + len(self.known_ids)

    def pick(self, rng: random.Random) -> int:
        """Any live row of this thread's (the tenant must have one)."""
        n = len(self.template)
        if rng.randrange(self.alive()) < n:
            return self.template.choice(rng)
        return self.known_ids.choice(rng)

    def committed(self, row_id: int, key: str, counter: int, payload_digest: str) -> None:
        if row_id in self.template:
            self.template.remove(row_id)
        self.known[row_id] = [key, counter, payload_digest]
        self.known_ids.add(row_id)
        self.ledger[key] = [row_id, counter, payload_digest]

    def forget(self, row_id: int) -> None:
        """No longer pick ``row_id`` (its ledger entry, if any, stays as it was)."""
        if row_id in self.template:
            self.template.remove(row_id)
        if row_id in self.known_ids:
            self.known_ids.remove(row_id)
            del self.known[row_id]

    def deleted(self, row_id: int) -> None:
        key = self.known[row_id][0] if row_id in self.known else template_key(row_id)
        self.forget(row_id)
        self.ledger[key] = None


@dataclass
class ThreadState:
    """One workload thread: its random stream, its rows per tenant, its record."""

    index: int
    rng: random.Random
    tenants: list[TenantRows]
    #: [start (wall s), latency (s), op index, tenant, error index or -1]
    ops: list[list[Any]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # "Type: message" -> error index (thread-local)
    anomalies: list[str] = field(default_factory=list)
    skipped_slots: int = 0
    seq: int = 0


def _payload(rng: random.Random) -> str:
    return rng.randbytes(rng.randint(*PAYLOAD_CHARS) // 2).hex()


def one_op(app: App, st: ThreadState, op: str, tenant: int, run_tag: str) -> None:
    """Run operation ``op`` on ``tenant`` for thread ``st``; update its ledger when it committed.

    Raises:
        the framework's database error when the database refused (nothing was committed).
    """
    rows = st.tenants[tenant]
    rng = st.rng
    if op in ("read_modify_write", "bulk_delete", "read") and rows.alive() == 0:
        op = "create"  # nothing of ours left in this tenant (rare): make something
    if op == "f_update" and not rows.known_ids:
        op = "read_modify_write" if rows.alive() else "create"
    st.seq += 1
    if op == "create":
        key, payload = f"w{run_tag}-{st.index}-{st.seq}", _payload(rng)
        row_id = app.create(tenant, key, payload)
        rows.committed(row_id, key, 0, digest(payload))
    elif op == "get_or_create":
        payload = _payload(rng)
        if rows.alive() and rng.random() < 0.5:
            existing = rows.pick(rng)
            key = rows.known[existing][0] if existing in rows.known else template_key(existing)
        else:
            existing, key = None, f"w{run_tag}-{st.index}-{st.seq}"
        row_id, created = app.get_or_create(tenant, key, payload)
        if created:
            if existing is not None:
                st.anomalies.append(f"get_or_create created {key!r} in tenant {tenant}, which should exist")
            rows.committed(row_id, key, 0, digest(payload))
        elif existing is None:
            st.anomalies.append(f"get_or_create found new key {key!r} in tenant {tenant}")
    elif op == "read_modify_write":
        row_id, payload = rows.pick(rng), _payload(rng)
        got = app.read_modify_write(tenant, row_id, payload)
        if got is None:
            st.anomalies.append(f"read_modify_write: row {row_id} of tenant {tenant} is missing")
            rows.forget(row_id)  # the ledger keeps what it had: the check names the row as lost
        else:
            rows.committed(row_id, got[0], got[1], digest(payload))
    elif op == "f_update":
        row_id = rows.known_ids.choice(rng)
        if app.f_update(tenant, row_id) != 1:
            st.anomalies.append(f"f_update: row {row_id} of tenant {tenant} is missing")
            rows.forget(row_id)
        else:
            key, counter, payload_digest = rows.known[row_id]
            rows.committed(row_id, key, counter + 1, payload_digest)
    elif op == "bulk_delete":
        ids = sorted({rows.pick(rng) for _ in range(min(BULK_DELETE_ROWS, rows.alive()))})
        deleted = app.bulk_delete(tenant, ids)
        if deleted != len(ids):
            st.anomalies.append(f"bulk_delete of {len(ids)} rows of tenant {tenant} deleted {deleted}")
        for row_id in ids:
            rows.deleted(row_id)
    elif op == "read":
        ids = sorted({rows.pick(rng) for _ in range(min(READ_ROWS, rows.alive()))})
        fetched = app.read(tenant, ids)
        if fetched != len(ids):
            st.anomalies.append(f"read of {len(ids)} rows of tenant {tenant} returned {fetched}")
    else:
        raise ValueError(f"unknown operation {op!r}")


def error_text(exc: BaseException) -> str:
    """``Type: first line of the message`` (SQLAlchemy's messages go on with the SQL: cut)."""
    msg = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"


def run_thread(app: App, st: ThreadState, n_tenants: int, interval_s: float, t0: float, duration_s: float,
               run_tag: str) -> None:
    """Run ``st``'s schedule: one operation every ``interval_s`` from ``t0`` (perf_counter) for ``duration_s``."""
    rng = st.rng
    weights = [MIX[o] for o in OPS]
    n = 0
    while True:
        due = t0 + n * interval_s
        now = time.perf_counter()
        if due - t0 >= duration_s:
            return
        if due > now:
            time.sleep(due - now)
        elif now - due > MAX_LAG_S:
            missed = int((now - due) / interval_s)
            st.skipped_slots += missed
            n += missed
            continue
        op_index = rng.choices(range(len(OPS)), weights)[0]
        tenant = rng.randrange(n_tenants)
        start_wall, start = time.time(), time.perf_counter()
        err = -1
        app.start_request()
        try:
            one_op(app, st, OPS[op_index], tenant, run_tag)
        except app.db_errors as exc:
            err = st.errors.setdefault(error_text(exc), len(st.errors))
        finally:
            app.end_request()
        st.ops.append([round(start_wall, 6), round(time.perf_counter() - start, 6), op_index, tenant, err])
        n += 1


def run_workload(app: App, ids: Sequence[Sequence[int]], *, threads: int, rate_per_s: float, duration_s: float,
                 seed: int, run_tag: str) -> dict[str, Any]:
    """Run the workload on ``app``'s tenants, whose row ids are ``ids``; the record (see :func:`main`)."""
    n_tenants = len(ids)
    states = []
    for k in range(threads):
        rng = random.Random(seed * 1000 + k)
        tenants = [TenantRows(IdPool([i for i in tenant_ids if i % threads == k])) for tenant_ids in ids]
        states.append(ThreadState(k, rng, tenants))
    interval_s = threads / rate_per_s
    failures: list[BaseException] = []

    def body(st: ThreadState) -> None:
        try:
            run_thread(app, st, n_tenants, interval_s, t0, duration_s, run_tag)
        except BaseException as exc:  # a bug, not the database: the run must fail loudly
            failures.append(exc)
            raise

    workers = [threading.Thread(target=body, args=(st,), name=f"app-{st.index}") for st in states]
    t0 = time.perf_counter() + 0.05
    start_wall = time.time() + 0.05
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    end_wall = time.time()
    if failures:
        raise RuntimeError(f"a workload thread failed: {failures[0]!r}") from failures[0]
    # One error table for the process: thread-local indexes are remapped.
    errors: list[str] = []
    index: dict[str, int] = {}
    ops: list[list[Any]] = []
    for st in states:
        remap = {i: index.setdefault(text, len(index)) for text, i in st.errors.items()}
        for rec in st.ops:
            if rec[4] >= 0:
                rec[4] = remap[rec[4]]
            ops.append(rec)
    errors = sorted(index, key=index.__getitem__)
    ops.sort(key=lambda r: r[0])
    # Per tenant, each thread's part (merged by the checker, which refuses a key in two parts).
    ledger = [[st.tenants[t].ledger for st in states] for t in range(n_tenants)]
    return {
        "start": start_wall,
        "end": end_wall,
        "ops_names": list(OPS),
        "ops": ops,
        "errors": errors,
        "anomalies": [a for st in states for a in st.anomalies],
        "skipped_slots": sum(st.skipped_slots for st in states),
        "ledger": ledger,
        "threads": threads,
        "rate_per_s": rate_per_s,
    }


def main(argv: Sequence[str], make_app: Callable[[list[str]], App], schema: Callable[[str], dict[str, Any]],
         versions: Callable[[], dict[str, str]]) -> int:
    """The application process's command line (``python -m bench.apps.django_app ...``).

    ``schema DB``: create the application's table in the empty database ``DB`` the framework's
    way; print ``{"table": NAME}``.

    ``run OUT SEED THREADS RATE DURATION_S RUN_TAG DB...``: print ``ready`` once set up (the
    framework configured, every tenant's ids read), wait for a line on stdin, run the workload,
    write its record to ``OUT`` as JSON (``start``, ``end``, ``ops``: ``[start, latency_s, op,
    tenant, error]`` with ``op`` an index into ``ops_names`` and ``error`` an index into
    ``errors`` or -1, ``anomalies``, ``skipped_slots``, ``ledger``: per tenant, per thread
    ``{key: [id, counter, digest] | null}``, and ``versions``), print ``done``.
    """
    cmd = argv[0] if argv else ""
    if cmd == "schema" and len(argv) == 2:
        print(json.dumps(schema(argv[1])), flush=True)
        return 0
    if cmd == "run" and len(argv) >= 8:
        out, seed, threads, rate, duration_s, run_tag = argv[1], int(argv[2]), int(argv[3]), float(argv[4]), \
            float(argv[5]), argv[6]
        paths = list(argv[7:])
        app = make_app(paths)
        ids = []
        for t in range(len(paths)):  # before the start: the workload's threads own the rows by id
            app.start_request()
            try:
                ids.append(app.ids(t))
            finally:
                app.end_request()
        print("ready", flush=True)
        sys.stdin.readline()
        record = run_workload(app, ids, threads=threads, rate_per_s=rate, duration_s=duration_s, seed=seed,
                              run_tag=run_tag)
        record["versions"] = versions()
        with open(out, "w", encoding="utf-8") as f:
            json.dump(record, f)
        print("done", flush=True)
        return 0
    print("usage: schema DB | run OUT SEED THREADS RATE DURATION_S RUN_TAG DB...", file=sys.stderr)
    return 2
