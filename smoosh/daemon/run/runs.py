"""Every run of this daemon, from its start (or adoption) to its end, indexed by its token.

A channel that starts a key gets a run token from the scheduler
(:class:`~smoosh.daemon.run.scheduler.JobScheduler`), and every later step of that run
(running, pending, ended, dropped) comes back as an event carrying the token. This table is
where the scheduler keeps the runs it follows, so that every event finds its own run, and
only its own:

* by **token**: each run its own entry, whatever its key. A second run of a key (two channels
  holding one database: a routing change by a live edit, a crash backoff ending in both at
  the same instant) is entered too, so that its refusal reaches its channel and frees the
  slot that channel took for it;
* by **key**: the key's *live* run, at most one (one key, one job). A second run never
  replaces it: it is refused (:meth:`RunTable.open` names the run that holds the key).

Before, the scheduler kept one record per key, and a second run's submit replaced the first
one's: every later event of the first was taken for an old run's and ignored, so its channel
kept it "active" and its slots forever (issue 45: a wedged channel until restart).

The table also publishes what ``/status`` and ``/metrics`` show of each run (:class:`RunView`:
its age, its progress, when it last progressed), as an immutable tuple any thread may read.

Owner: the server's loop thread (through the scheduler); other threads read
:attr:`RunTable.views` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from smoosh.jobs import Subscription

__all__ = ["Run", "RunTable", "RunView", "STARTING", "CLAIMED", "RUNNING"]

#: A run whose job is being added, or waits for a worker (a ``smoosh worker``, or this
#: process's once a slot frees).
STARTING = "starting"
#: A run this process's worker took at its start: its claim (the re-check, the job added
#: already accepted) runs on the compaction thread that then compacts it.
CLAIMED = "claimed"
#: A run a worker said it runs.
RUNNING = "running"


@dataclass(eq=False)
class Run:
    """One run the scheduler follows (owner: the server's loop).

    Attributes:
        opened_at: when the run was started or adopted (the loop's monotonic clock).
        progress_at: when its progress last grew (monotonic), None while it has not.
        local: this process's worker said it runs it (its end is told directly).
    """

    channel: str
    key: str
    token: int
    priority: float
    sub: Subscription | None = None
    # The run token in the data of a job this run follows but did not add (another run of
    # this channel added it: an earlier daemon's): that job is this run's to remove too.
    job_run: int | None = None
    # Added claimed by this process's worker: it removes the job as it finishes it.
    claimed: bool = False
    # This process's worker reserved a slot for it at submit: it waits for no worker.
    reserved: bool = False
    running_since: float | None = None
    run_id: str | None = None
    suspendable: bool = False
    progress: float = 0.0
    ended: bool = False
    opened_at: float = 0.0
    progress_at: float | None = None
    local: bool = False
    # Refused at its start (its key's live run is another): followed only until its refusal
    # reaches its channel, and never shown.
    refused: bool = False
    # Holds a slot of the fleet-wide cap (its claim took one: smoosh.daemon.control.cluster_cap).
    cap_slot: bool = False

    @property
    def state(self) -> str:
        """:data:`RUNNING`, :data:`CLAIMED` or :data:`STARTING`.

        A run this process's worker reserved is running only once its claim has committed: a
        batch's next database is handed to its thread (and told running) before that commit,
        which waits as long as the store does not answer (issue 50).
        """
        if self.running_since is not None and (self.claimed or not self.reserved):
            return RUNNING
        return CLAIMED if self.reserved else STARTING

    def view(self) -> RunView:
        """What the status shows of this run, frozen."""
        return RunView(self.channel, self.key, self.token, self.state, self.opened_at, self.running_since,
                       self.progress, self.progress_at, self.local)


@dataclass(frozen=True)
class RunView:
    """A run as ``/status`` shows it (immutable; any thread).

    Attributes:
        opened_at, running_since, progress_at: monotonic seconds (the loop's clock).
        local: run by this process's worker (its live progress is the worker's to tell).
    """

    channel: str
    key: str
    token: int
    state: str
    opened_at: float
    running_since: float | None
    progress: float
    progress_at: float | None
    local: bool


class RunTable:
    """The runs the scheduler follows, by token, with each key's live run (see the module docstring)."""

    def __init__(self) -> None:
        self._by_token: dict[int, Run] = {}
        self._live: dict[str, Run] = {}
        #: Every run as the status shows it (a refused one never); replaced whole on each change
        #: (any thread reads it).
        self.views: tuple[RunView, ...] = ()

    def open(self, run: Run) -> Run | None:
        """Enter ``run``; the key's live run when that one refuses it (one key, one run), else None.

        A refused run is entered all the same (by its token, not as its key's live run): its
        refusal comes back as its own event, which must find it.
        """
        self._by_token[run.token] = run
        live = self._live.get(run.key)
        if live is None:
            self._live[run.key] = run
            self.publish()
        else:
            run.refused = True
        return live

    def close(self, run: Run) -> bool:
        """Take ``run`` out (idempotent); whether it was its key's live run."""
        if self._by_token.get(run.token) is run:
            del self._by_token[run.token]
        was_live = self._live.get(run.key) is run
        if was_live:
            del self._live[run.key]
        self.publish()
        return was_live

    def get(self, token: int) -> Run | None:
        """The run of ``token``, if it is followed now."""
        return self._by_token.get(token)

    def live(self, key: str) -> Run | None:
        """The live run of ``key``, if any (the one that holds the key: one key, one run).

        Also read from the intake's threads (one dict lookup): whether a key runs already.
        """
        return self._live.get(key)

    def clear(self) -> list[Run]:
        """Forget every run (a close); the runs forgotten."""
        runs = list(self._by_token.values())
        self._by_token.clear()
        self._live.clear()
        self.publish()
        return runs

    def publish(self) -> None:
        """Rebuild :attr:`views` (after a run changed what the status shows of it)."""
        self.views = tuple(run.view() for run in self._by_token.values() if not run.refused)

    def __iter__(self) -> Iterator[Run]:
        return iter(list(self._by_token.values()))

    def __len__(self) -> int:
        return len(self._by_token)
