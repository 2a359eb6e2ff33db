"""Terminal output for long operations: progress bars and a screen redrawn in place.

Long operations show progress on a terminal and stay quiet in pipes (DESIGN §4.1): callers
ask :func:`is_tty` and, in a pipe, print plain lines once instead of redrawing.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, TextIO

#: Characters of a progress bar between its brackets.
BAR_WIDTH = 30


def is_tty(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (and the user did not ask for dumb output)."""
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # closed or exotic streams
        return False


def progress_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """``[#########.........]  42%`` for ``fraction`` in [0, 1] (clamped)."""
    fraction = min(1.0, max(0.0, float(fraction)))
    filled = int(round(fraction * width))
    return f"[{'#' * filled}{'.' * (width - filled)}] {fraction * 100:3.0f}%"


def format_running(jobs: list[dict[str, Any]], *, bars: bool) -> str:
    """The running compactions of a ``/jobs`` body, one line each, with a bar on a terminal.

    Parameters:
        jobs: the ``jobs`` list of ``GET /jobs``.
        bars: draw progress bars (a terminal) rather than plain percentages (a pipe).
    """
    running = [j for j in jobs if j.get("state") == "running"]
    if not running:
        return "no compaction running"
    columns = shutil.get_terminal_size((100, 24)).columns
    lines = []
    for job in running:
        progress = job.get("progress") or 0.0
        label = f"{job.get('channel') or '-'}  {job.get('key')}"
        if bars:
            bar = progress_bar(progress)
            room = max(10, columns - len(bar) - 2)
            if len(label) > room:
                label = "..." + label[-(room - 3):]
            lines.append(f"{bar}  {label}")
        else:
            lines.append(f"{progress * 100:3.0f}%  {label}")
    return "\n".join(lines)


class Screen:
    """Redraws a block of text in place on a terminal: each frame replaces the previous one.

    Only the block's own lines are rewritten (cursor up, clear to the end), so what was
    printed before the first frame stays on screen.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._lines = 0

    def draw(self, text: str) -> None:
        """Replace the previous frame with ``text``."""
        columns = max(1, shutil.get_terminal_size((100, 24)).columns)
        prefix = f"\x1b[{self._lines}F\x1b[J" if self._lines else ""
        self.stream.write(prefix + text + "\n")
        self.stream.flush()
        # Long lines wrap: count screen rows, not text lines, or the next frame starts too low.
        self._lines = sum(max(1, -(-len(line) // columns)) for line in text.split("\n"))
