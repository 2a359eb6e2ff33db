"""The admission gate's bursts: keys enqueued one call at a time are admitted before they are examined.

A caller enqueueing keys in a loop (the Python API) and the examination thread used to hand the
GIL to each other at every system call of either; the examination now waits for such a burst to
pause, once per burst and at most ``ADMISSION_PAUSE_MAX_S``. Stepped with an injected clock: the
fake ``sleep`` advances it, and can play the caller admitting more keys meanwhile.
"""

from __future__ import annotations

from typing import Callable

import pytest

import smoosh.daemon.intake.admission as admission
from smoosh.daemon.intake.admission import ADMISSION_PAUSE_MAX_S, BURST_GAP_S, AdmissionGate

#: Well inside a burst: a call of a loop enqueueing keys.
CALL_S = BURST_GAP_S / 20


class Steps:
    """A clock and a sleep stepping it. While ``caller`` says so, the caller goes on during a
    sleep: it admits a key every ``CALL_S`` of it (``caller()`` is asked before each)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.gate: AdmissionGate | None = None
        self.caller: Callable[[], bool] = lambda: False

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        end = self.now + seconds
        while self.now + CALL_S <= end and self.caller():
            self.now += CALL_S
            assert self.gate is not None
            self.gate.admitted_one()
        self.now = end


@pytest.fixture(autouse=True)
def no_yield(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "_yield", lambda: None)


def gate_and_steps() -> tuple[AdmissionGate, Steps]:
    steps = Steps()
    steps.gate = AdmissionGate(clock=steps.clock, sleep=steps.sleep)
    return steps.gate, steps


def admit(gate: AdmissionGate, steps: Steps, n: int) -> None:
    for _ in range(n):
        gate.admitted_one()
        steps.now += CALL_S


def test_a_key_enqueued_alone_is_examined_at_once() -> None:
    gate, steps = gate_and_steps()
    gate.admitted_one()
    gate.wait_turn()
    assert steps.slept == []


def test_an_examination_waits_for_a_burst_to_pause_then_not_again_for_it() -> None:
    gate, steps = gate_and_steps()
    admit(gate, steps, 3)
    more = iter(range(70))
    # The caller goes on admitting 70 more keys (a little over three sleeps' worth), then stops
    steps.caller = lambda: next(more, None) is not None
    started = steps.now
    gate.wait_turn()
    assert len(steps.slept) == 5  # four with keys coming, one to see the pause
    assert steps.now - started >= BURST_GAP_S
    # The next keys of the same burst (what it admitted meanwhile) go without waiting
    steps.slept.clear()
    gate.wait_turn()
    gate.wait_turn()
    assert steps.slept == []


def test_a_burst_that_never_pauses_holds_the_examination_once_for_at_most_the_pause() -> None:
    gate, steps = gate_and_steps()
    admit(gate, steps, 2)
    steps.caller = lambda: True
    started = steps.now
    gate.wait_turn()
    waited_s = steps.now - started
    assert ADMISSION_PAUSE_MAX_S <= waited_s < ADMISSION_PAUSE_MAX_S + 2 * BURST_GAP_S
    # The burst goes on: the examination goes on beside it, key after key
    steps.slept.clear()
    for _ in range(10):
        gate.wait_turn()
        admit(gate, steps, 1)
    assert steps.slept == []


def test_a_new_burst_after_a_pause_is_waited_for_again() -> None:
    gate, steps = gate_and_steps()
    admit(gate, steps, 2)
    gate.wait_turn()  # the burst has paused already (CALL_S after its last key is not a pause)
    first = len(steps.slept)
    assert first == 1
    steps.now += 10 * BURST_GAP_S
    admit(gate, steps, 2)
    gate.wait_turn()
    assert len(steps.slept) == first + 1


def test_keys_a_caller_sends_apart_never_hold_the_examination() -> None:
    # Keys read from a socket one at a time, say: each comes after a gap, alone
    gate, steps = gate_and_steps()
    for _ in range(20):
        gate.admitted_one()
        gate.wait_turn()
        steps.now += 2 * BURST_GAP_S
    assert steps.slept == []


def test_keys_admitted_inside_a_batch_are_the_batch_spell_s_not_a_burst() -> None:
    gate, steps = gate_and_steps()
    with gate.admitting():
        admit(gate, steps, 5)
    gate.wait_turn()  # the spell ended; no burst of single keys was started by the batch
    assert steps.slept == []
