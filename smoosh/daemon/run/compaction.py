"""One compaction run to its outcome: the compactor chosen, roots checked at use, errors classified.

Pure of the worker's bookkeeping (slots, heartbeats, the job layer): it runs on whichever
thread compacts, and every way a compaction can end becomes one :class:`~channels.ports.Outcome`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from channels.ports import BLOCKED, BUSY, FAILED, GONE, INTERRUPTED, OK, REPLACED, Outcome
from smoosh.compactors import Blocked, Busy, CompactorBase, Gone, Interrupted, Replaced, compactor_for
from smoosh.compactors.base import refused
from smoosh.compactors.sqlite import CLEANUP_PREFIX
from smoosh.daemon.run.job_context import ROTATED, STOPPING, JobContext
from smoosh.paths import refused_at_use

__all__ = ["compact"]

log = logging.getLogger(__name__)


def compact(
    key: str,
    data: dict[str, Any],
    ctx: JobContext,
    compactors: Sequence[CompactorBase],
    roots: Sequence[str] | None,
    started: float,
    clock: Callable[[], float],
    *,
    checked: bool = False,
) -> Outcome:
    """Compact ``key`` through the compactor that claims it; how it ended, never an exception.

    Parameters:
        key: the job's key (a database path, or ``cleanup:`` and a path).
        data: the job's data (``file_bytes``: the size measured when it was queued).
        ctx: the run's context: progress, holds, and the reason it was asked to stop.
        compactors: in priority order.
        roots: the roots in force (None: no roots restriction); checked here, at use, so a
            file swapped for a link after it was queued is refused unopened.
        started: the run's start (``clock`` seconds), for its duration.
        clock: monotonic seconds (a wall clock stepped mid-run would make the duration lie).
        checked: the caller checked the path at use (``refused_at_use``) on this thread just
            before (a claimed run's re-check): one look per start (DESIGN §12). The compactor's
            open still refuses a symlink in any component and a path outside its roots.
    """
    size_bytes = int(data.get("file_bytes") or 0)

    def outcome(result: str, error: str | None, before: int = 0, after: int | None = None) -> Outcome:
        return Outcome(
            result=result,
            error=error,
            size_before_bytes=int(before),
            size_after_bytes=int(before if after is None else after),
            duration_s=max(0.0, float(clock() - started)),
            progress=1.0 if result == OK else ctx.fraction,
            rotated=result == INTERRUPTED and ctx.stop_reason == ROTATED,
            stopping=result == INTERRUPTED and ctx.stop_reason == STOPPING,
        )

    compactor = compactor_for(key, compactors)
    if compactor is None:
        return outcome(FAILED, f"no compactor claims {key}")
    path = key[len(CLEANUP_PREFIX):] if key.startswith(CLEANUP_PREFIX) else key
    reason = None if checked else refused_at_use(path, roots)
    if reason is not None:
        return outcome(GONE, str(refused(path, reason)))
    if ctx.stop_reason is not None:
        return outcome(INTERRUPTED, ctx.stop_reason, size_bytes, size_bytes)
    try:
        result = compactor.compact(key, ctx)
        return outcome(OK, None, result.size_before_bytes, result.size_after_bytes)
    except Busy as exc:
        return outcome(BUSY, str(exc), size_bytes, size_bytes)
    except Blocked as exc:
        # Outside smoosh's hands (a reader, the permissions): one WARNING line, written by the
        # outcome's record, and no traceback.
        before = exc.size_before_bytes if exc.size_before_bytes is not None else size_bytes
        return outcome(BLOCKED, str(exc), before, before)
    except Interrupted as exc:
        return outcome(INTERRUPTED, str(exc), size_bytes, size_bytes)
    except Replaced as exc:
        # The file the key names now is another one: measured afresh, never retried as this run.
        return outcome(REPLACED, str(exc), size_bytes, size_bytes)
    except Gone as exc:
        return outcome(GONE, str(exc))
    except Exception as exc:
        # DEBUG, with the traceback: the one WARNING line of a failed compaction is its outcome's
        # (DESIGN §11), written where the outcome is recorded; two lines said one failure twice.
        log.debug("Compaction of %r failed: %s: %s", key, type(exc).__name__, exc, exc_info=True)
        return outcome(FAILED, f"{type(exc).__name__}: {exc}", size_bytes, size_bytes)
