"""Contract: the fleet-wide cap (``cluster_max_jobs``) behaves alike on every store.

A slot is taken in the claim's transaction and given back in the one that ends the run; the
conflict read on the slots serialises claims, so the cap never overshoots, with threads (every
store) and with processes racing on one SQLite file; a dead node's slots stop counting once
its lease expires; a node holding its share gives way to one waiting below it; a refusal's
watch fires as a slot is given back.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from helpers.daemon import wait_for
from smoosh.daemon.control.cluster_cap import LEASE_S, WANT_TTL_S, ClusterCap, NodeSlots, Refusal

WORKER = str(Path(__file__).with_name("cap_worker.py"))
T0 = 1_700_000_000.0
#: Bound on a hang (a worker process, a watch that must fire), never a measure of speed.
HANG_S = 120.0


def _cap(ctx) -> ClusterCap:
    return ClusterCap(prefix=ctx.prefix)


def take(ctx, cap: ClusterCap, node: str, token: int, limit: int, now: float = T0, store=None) -> Refusal | None:
    return (store or ctx.store).transact(lambda tr: cap.take(tr, node, token, limit, now))


def release(ctx, cap: ClusterCap, node: str, token: int) -> None:
    ctx.store.transact(lambda tr: cap.release(tr, node, token))


def read(ctx, cap: ClusterCap, now: float = T0) -> dict[str, NodeSlots]:
    return ctx.store.transact(lambda tr: cap.read(tr.snapshot, now))


def test_slots_are_taken_up_to_the_cap_and_given_back(ctx):
    cap = _cap(ctx)
    assert take(ctx, cap, "a", 1, 2) is None
    assert take(ctx, cap, "b", 2, 2) is None
    refusal = take(ctx, cap, "a", 3, 2)
    assert refusal == Refusal(limit=2, running=2, mine=1)
    assert "the store's nodes run 2 compactions, cluster_max_jobs = 2" in refusal.reason()
    release(ctx, cap, "b", 2)
    assert take(ctx, cap, "a", 3, 2) is None
    assert read(ctx, cap) == {"a": NodeSlots(slots=2, counted=True, wanting_since=None)}


def test_a_slot_taken_twice_by_one_run_is_one_slot(ctx):
    cap = _cap(ctx)
    assert take(ctx, cap, "a", 7, 1) is None
    assert take(ctx, cap, "a", 7, 1) is None  # a retried claim finds its own slot
    assert read(ctx, cap)["a"].slots == 1
    release(ctx, cap, "a", 7)
    release(ctx, cap, "a", 7)  # and a run ended twice gives it back once
    assert read(ctx, cap).get("a", NodeSlots()).slots == 0


def test_a_dead_nodes_slots_stop_counting_once_its_lease_expires(ctx):
    cap = _cap(ctx)
    assert take(ctx, cap, "dead", 1, 1, now=T0) is None
    assert take(ctx, cap, "b", 2, 1, now=T0 + LEASE_S - 1) is not None  # its lease still holds
    assert take(ctx, cap, "b", 2, 1, now=T0 + LEASE_S + 1) is None
    slots = read(ctx, cap, now=T0 + LEASE_S + 1)
    assert slots["dead"] == NodeSlots(slots=1, counted=False, wanting_since=None)
    assert slots["b"].slots == 1 and slots["b"].counted


def test_a_node_holding_its_share_gives_way_to_one_waiting_below_it(ctx):
    cap = _cap(ctx)
    for token in range(4):  # alone, a node may use every slot
        assert take(ctx, cap, "a", token, 4) is None
    refusal = take(ctx, cap, "b", 10, 4, now=T0 + 1)
    assert refusal is not None and refusal.share is None  # the cap itself is full: b waits
    assert read(ctx, cap, now=T0 + 1)["b"].wanting_since == T0 + 1
    release(ctx, cap, "a", 0)
    # a slot is free, but a holds more than its share (4 over 2 nodes) while b waits: a waits too
    refusal = take(ctx, cap, "a", 4, 4, now=T0 + 2)
    assert refusal == Refusal(limit=4, running=3, mine=3, share=2, waiting=("b",))
    assert "while node(s) b wait for a slot" in refusal.reason()
    assert take(ctx, cap, "b", 10, 4, now=T0 + 2) is None
    assert read(ctx, cap, now=T0 + 2)["b"].wanting_since is None  # served: no longer waiting
    release(ctx, cap, "a", 1)
    assert take(ctx, cap, "b", 11, 4, now=T0 + 3) is None  # b below its share still: it may take it
    release(ctx, cap, "a", 2)
    # both at their share, and a's want expired: whoever asks first gets the free slot
    assert take(ctx, cap, "a", 5, 4, now=T0 + 3 + WANT_TTL_S + 1) is None


def test_reconcile_gives_back_the_slots_no_live_run_holds(ctx):
    cap = _cap(ctx)
    for token in (1, 2, 3):
        assert take(ctx, cap, "a", token, 10) is None
    assert take(ctx, cap, "b", 9, 10) is None
    gone = ctx.store.transact(lambda tr: cap.reconcile(tr, "a", [2]))
    assert gone == 2 or ctx.faulty  # (a retry after a fault past the commit finds them gone already)
    assert {n: s.slots for n, s in read(ctx, cap).items()} == {"a": 1, "b": 1}
    ctx.store.transact(lambda tr: cap.forget(tr, "b"))
    assert {n: s.slots for n, s in read(ctx, cap).items()} == {"a": 1}


def test_a_refusals_watch_fires_when_a_slot_is_given_back(ctx):
    cap = _cap(ctx)
    assert take(ctx, cap, "a", 1, 1) is None
    other = ctx.make() if ctx.kind.endswith("sqlite") else ctx.store  # another handle: another process's view

    def refused(tr):
        refusal = cap.take(tr, "b", 2, 1, T0)
        assert refusal is not None
        return cap.watch_freed(tr)

    watch = other.transact(refused)
    assert not watch.wait(0.05)
    release(ctx, cap, "a", 1)
    assert watch.wait(HANG_S)


def test_racing_threads_never_hold_more_than_the_cap(ctx):
    if ctx.faulty:
        ctx.without_faults()  # the count below is of bodies that committed: no replays wanted
    cap = _cap(ctx)
    limit, nodes, each = 1, 4, 20
    lock = threading.Lock()
    held = [0]
    most = [0]
    errors: list[BaseException] = []

    def node(name: str) -> None:
        rng = random.Random(name)
        try:
            done = 0
            while done < each:
                token = rng.getrandbits(62)
                if take(ctx, cap, name, token, limit, now=T0) is not None:
                    continue
                with lock:
                    held[0] += 1
                    most[0] = max(most[0], held[0])
                time.sleep(rng.uniform(0, 0.001))  # the slot's compaction: the holds must be able to overlap
                with lock:
                    held[0] -= 1
                release(ctx, cap, name, token)
                done += 1
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=node, args=(f"n{i}",)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S)
    assert not errors and not any(t.is_alive() for t in threads)
    assert most[0] == limit


def overlap(spans: list[tuple[int, int]]) -> int:
    """The most spans open at one instant."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_nodes_racing_in_processes_on_one_sqlite_file_never_overshoot_the_cap(ctx, tmp_path: Path):
    ctx.only("sqlite", why="processes sharing one store file")
    limit, nodes, each = 1, 4, 40
    url = f"sqlite:{ctx.path}"
    go = tmp_path / "go"
    outs = [tmp_path / f"n{i}.spans" for i in range(nodes)]
    procs = [subprocess.Popen([sys.executable, WORKER, url, f"n{i}", str(limit), str(each), str(outs[i]), str(go)],
                              stdout=subprocess.PIPE, text=True) for i in range(nodes)]
    # Every worker ready (its store open, waiting for the go) before any starts: they race.
    wait_for(lambda: len(list(tmp_path.glob("go.ready.*"))) == nodes, HANG_S, what="every worker ready")
    go.touch()
    refused = 0
    for p in procs:
        stdout, _ = p.communicate(timeout=HANG_S)
        assert p.returncode == 0
        refused += int(stdout.strip())
    spans = [tuple(map(int, line.split())) for out in outs for line in out.read_text().splitlines()]
    assert len(spans) == nodes * each  # every node got its turns: none starved
    assert overlap(spans) <= limit  # type: ignore[arg-type]
    assert refused > 0  # they did contend
