"""Contract: the cluster holds (``smoosh suspend --store``) behave alike on every store.

Each operation is one transaction with one answer, whether a "may have committed" error
struck before or after its commit (the faulty variants inject both), and the one watch a
daemon keeps on them fires at every change, from another handle of the store as well.
"""

from __future__ import annotations

import random

import pytest

from smoosh.daemon.control.cluster_holds import ClusterHolds, Hold, covering
from smoosh.store import tuples

#: Generous bound for a watch that must fire (FoundationDB and the SQLite poller deliver later).
FIRE_S = 5.0
#: How long a watch that must NOT fire is given (longer than the SQLite poller's first period).
QUIET_S = 0.2
T0 = 1_700_000_000.0


def _holds(ctx, store=None) -> ClusterHolds:
    return ClusterHolds(store or ctx.store, prefix=ctx.prefix)


def _scopes(holds: list[Hold]) -> list[tuple[str | None, str | None]]:
    return [(h.node, h.channel) for h in holds]


def _watch(holds: ClusterHolds):
    """The holds and a watch on them, read in one transaction (as a daemon does)."""
    return holds.store.transact(lambda tr: (holds.read(tr), holds.watch(tr)))


def test_a_hold_is_read_back_with_its_scope_who_and_when(ctx):
    holds = _holds(ctx)
    assert holds.current() == []
    got = holds.hold(None, "ratio_dbs", by="ops@admin", at=T0)
    assert got == Hold(None, "ratio_dbs", "ops@admin", T0)
    assert holds.current() == [got]
    assert got.to_json() == {"node": None, "channel": "ratio_dbs", "by": "ops@admin", "at": T0}


def test_suspending_twice_is_one_hold_that_keeps_its_first_who_and_when(ctx):
    holds = _holds(ctx)
    first = holds.hold("n2", None, by="alice@a", at=T0)
    again = holds.hold("n2", None, by="bob@b", at=T0 + 60)
    assert again == first
    assert holds.current() == [first]


def test_holds_cover_their_scope_every_node_and_every_channel_included_later_ones(ctx):
    holds = _holds(ctx)
    holds.hold(None, "ratio_dbs", by="a", at=T0)
    holds.hold("n2", None, by="b", at=T0 + 1)
    now = holds.current()
    assert _scopes(now) == [(None, "ratio_dbs"), ("n2", None)]  # broadest first
    assert covering(now, "n1", "ratio_dbs").channel == "ratio_dbs"
    assert covering(now, "a-node-that-joins-later", "ratio_dbs") is not None
    assert covering(now, "n1", "slack_dbs") is None
    assert covering(now, "n2", "a_channel_configured_later").node == "n2"
    # Both cover ratio_dbs on n2: the broader (every node) is the one shown.
    assert (covering(now, "n2", "ratio_dbs").node, covering(now, "n2", "ratio_dbs").channel) == (None, "ratio_dbs")


def test_resume_clears_what_lies_inside_its_scope_and_names_the_broader_holds_left(ctx):
    holds = _holds(ctx)
    for node, channel in [(None, None), (None, "ratio_dbs"), ("n1", "ratio_dbs"), ("n2", None), ("n2", "slack_dbs")]:
        holds.hold(node, channel, by="ops", at=T0)
    # One channel of one node: only that exact hold lies inside; three broader ones still hold it.
    left = holds.release("n1", "ratio_dbs")
    assert _scopes(left) == [(None, None), (None, "ratio_dbs")]
    assert ("n1", "ratio_dbs") not in _scopes(holds.current())
    # One channel everywhere: its holds on every node and on each node go.
    assert _scopes(holds.release(None, "slack_dbs")) == [(None, None), ("n2", None)]
    assert _scopes(holds.current()) == [(None, None), (None, "ratio_dbs"), ("n2", None)]
    # One node: the holds naming it go; the every-node ones stay and are named.
    assert _scopes(holds.release("n2", None)) == [(None, None), (None, "ratio_dbs")]
    # Everything.
    assert holds.release(None, None) == []
    assert holds.current() == []
    assert holds.release(None, None) == []  # idempotent


def test_an_unreadable_record_still_holds(ctx):
    holds = _holds(ctx)
    key = ctx.prefix + tuples.pack(("holds", 1, "hold", None, "ratio_dbs"))
    ctx.store.transact(lambda tr: tr.set(key, b"\xc1 not msgpack"))
    assert holds.current() == [Hold(None, "ratio_dbs", "unknown", 0.0)]
    assert holds.release(None, "ratio_dbs") == []
    assert holds.current() == []


def test_empty_names_are_refused_before_any_write(ctx):
    holds = _holds(ctx)
    with pytest.raises(ValueError, match="a hold's node must be a non-empty name or None, not ''"):
        holds.hold("", None, by="ops", at=T0)
    with pytest.raises(ValueError, match="a hold's channel must be a non-empty name or None, not ''"):
        holds.release(None, "")
    assert holds.current() == []


def test_the_watch_fires_on_a_hold_and_on_a_resume_and_not_on_a_repeated_suspend(ctx):
    holds = _holds(ctx)
    other = _holds(ctx, ctx.make()) if ctx.kind.endswith("sqlite") else holds  # another handle: another process's view
    seen, watch = _watch(holds)
    assert seen == []
    other.hold(None, None, by="ops", at=T0)
    assert watch.wait(FIRE_S) is True
    seen, watch = _watch(holds)
    assert _scopes(seen) == [(None, None)]
    other.hold(None, None, by="ops", at=T0)  # already held: nothing changes
    assert watch.wait(QUIET_S) is False
    other.release(None, None)
    assert watch.wait(FIRE_S) is True
    seen, watch = _watch(holds)
    assert seen == []
    other.release(None, None)  # nothing to clear: nothing changes
    assert watch.wait(QUIET_S) is False
    watch.cancel()


def test_a_random_run_of_suspends_and_resumes_answers_as_a_model_does(ctx):
    """Under injected faults every answer is the model's: no hold lost, none doubled, no wrong remainder."""
    holds = _holds(ctx)
    rng = random.Random(7)
    nodes, channels = [None, "n1", "n2"], [None, "ratio_dbs", "slack_dbs"]
    model: dict[tuple[str | None, str | None], Hold] = {}
    for step in range(40 if ctx.faulty else 20):
        node, channel = rng.choice(nodes), rng.choice(channels)
        if rng.random() < 0.6:
            got = holds.hold(node, channel, by=f"op{step}", at=T0 + step)
            expected = model.setdefault((node, channel), Hold(node, channel, f"op{step}", T0 + step))
            assert got == expected, step
        else:
            left = holds.release(node, channel)
            for scope in [s for s, h in model.items() if h.within(node, channel)]:
                del model[scope]
            assert sorted(_scopes(left), key=repr) == sorted(
                (s for s, h in model.items() if h.overlaps(node, channel)), key=repr), step
        assert sorted(_scopes(holds.current()), key=repr) == sorted(model, key=repr), step
    if ctx.faulty:
        assert ctx.after_commit_faults() > 0  # the run did meet "committed, but told it may not have"
