"""The global max_jobs gate: a slot goes to the channel that has waited longest."""

from __future__ import annotations

from smoosh.daemon.control.slots import SlotGate


def test_slots_are_capped_and_released() -> None:
    gate = SlotGate(2)
    assert gate.acquire("a") and gate.acquire("a")
    assert not gate.acquire("a")
    assert gate.busy == 2
    gate.release("a")
    assert gate.acquire("a")
    gate.release("a")
    gate.release("a")
    gate.release("a")
    gate.release("a")  # never below zero
    assert gate.busy == 0


def test_a_freed_slot_goes_to_the_longest_waiting_channel_not_the_first_to_ask() -> None:
    gate = SlotGate(1)
    assert gate.acquire("busy")
    assert not gate.acquire("upgrade")  # in line first
    assert not gate.acquire("busy")  # in line second
    assert gate.waiting() == ["upgrade", "busy"]
    gate.release("busy")
    # "busy" asks first after the release, but "upgrade" has waited longer.
    assert not gate.acquire("busy")
    assert gate.acquire("upgrade")
    assert gate.waiting() == ["busy"]


def test_two_free_slots_serve_the_two_oldest_waiters() -> None:
    gate = SlotGate(2)
    assert gate.acquire("x") and gate.acquire("x")
    for name in ("a", "b", "c"):
        assert not gate.acquire(name)
    gate.release("x")
    gate.release("x")
    assert not gate.acquire("c")
    assert gate.acquire("b")
    assert gate.acquire("a")
    assert not gate.acquire("c")


def test_a_channel_that_withdraws_leaves_the_line() -> None:
    gate = SlotGate(1)
    assert gate.acquire("x")
    assert not gate.acquire("suspended")
    assert not gate.acquire("live")
    assert gate.waiting() == ["suspended", "live"]
    gate.release("x")
    assert not gate.acquire("live")  # "suspended" is ahead while it waits
    gate.withdraw("suspended")  # it was suspended: it cannot start anything now
    assert gate.acquire("live")


def test_a_forced_acquire_takes_a_slot_past_the_limit() -> None:
    gate = SlotGate(1)
    assert gate.acquire("a")
    assert gate.acquire("b", force=True)
    assert gate.busy == 2
    assert not gate.acquire("c")


def test_a_lower_limit_applies_to_the_next_acquire() -> None:
    gate = SlotGate(3)
    assert gate.acquire("a") and gate.acquire("a")
    gate.limit = 2
    assert not gate.acquire("a")
    gate.limit = 4
    assert gate.acquire("a")
