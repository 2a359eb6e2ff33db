"""The plots of the docs' benchmarks page, drawn from the tables in bench/RESULTS.md.

Run by ``bench.summary`` (so by `make bench`) with the Python of ``.venv-bench``, where matplotlib
lives: it is no project dependency. Each plot reads one benchmark's section back
(``_harness.read_sections``) and writes a PNG under ``docs/images/``:

- ``bench-drain.png``: the fleet drain beside the bare VACUUM loop and its floors (``bench.drain``);
- ``bench-writer.png``: an application writer's commit latency with and without smoosh compacting
  its database, per way of compacting (``bench.writer``);
- ``bench-jobs.png``: the job layer's round trips beside huey, persist-queue and a bare loop
  (``bench.jobs``).

Usage: .venv-bench/bin/python -m bench.plots
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bench._harness import REPO_ROOT, RESULTS_PATH, Row, Section, fmt, read_sections  # noqa: E402

#: Where the benchmarks page finds its images.
IMAGES = os.path.join(REPO_ROOT, "docs", "images")
#: One colour for smoosh, one for the tools it is measured beside.
SMOOSH, PEER, FLOOR = "#2b6cb0", "#8a8a8a", "#c4c4c4"
#: Same size and resolution for every plot: they sit one under the other on the page.
WIDTH_IN, DPI = 9.0, 110


def _bars(ax: plt.Axes, rows: list[Row], labels: list[str], colours: list[str]) -> None:
    """Horizontal bars at each row's median, a whisker over its runs' range, the value at the bar's end."""
    y = list(range(len(rows)))[::-1]
    medians = [r.median for r in rows]
    ax.barh(y, medians, color=colours, height=0.62,
            xerr=[[r.median - r.low for r in rows], [r.high - r.median for r in rows]],
            error_kw={"ecolor": "#333333", "capsize": 3, "lw": 1})
    ax.set_yticks(y, labels)
    for yi, r in zip(y, rows):
        ax.text(r.high, yi, f"  {fmt(r.median)} {r.unit}", va="center", fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.margins(x=0.18)


def drain(section: Section) -> plt.Figure:
    """The time to compact a fleet of small databases: smoosh's ways beside the bare loop's."""
    rows = [r for r in section.rows if r.name.endswith(", 1000 files")]
    labels = [r.name.removesuffix(", 1000 files").replace("`", "") for r in rows]
    colours = [SMOOSH if r.name.startswith("smoosh") else FLOOR if "design's work" in r.name else PEER for r in rows]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.45 * len(rows) + 1.4), dpi=DPI)
    _bars(ax, rows, [_wrap(label) for label in labels], colours)
    bare = rows[0].median if rows and rows[0].name.startswith("bare VACUUM loop,") else None
    if bare is not None:
        ax.axvline(bare, color=PEER, ls=":", lw=1)
    ax.set_xlabel("seconds for 1,000 small bloated databases (median; whisker: the runs' range)")
    _title(fig, "The fleet drain beside a bare VACUUM loop", section)
    return fig


#: The writer's latencies, per scenario.
LATENCIES = ("p50 commit latency", "p99 commit latency", "max commit latency")


def writer(section: Section) -> plt.Figure:
    """An application's commit latencies while smoosh compacts its database, beside the same writer alone."""
    scenarios: dict[str, dict[str, Row]] = {}
    for row in section.rows:
        for latency in LATENCIES:
            if row.name.endswith(latency):
                scenario = row.name.removesuffix(latency).rstrip(": ").strip() or "baseline"
                scenarios.setdefault(scenario, {})[latency] = row
    names = [n for n, found in scenarios.items() if len(found) == len(LATENCIES)]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.75 * len(names) + 1.6), dpi=DPI)
    height = 0.26
    shades = ("#9cc3e6", "#2b6cb0", "#173d66")
    for i, latency in enumerate(LATENCIES):
        y = [len(names) - 1 - n + (1 - i) * height for n in range(len(names))]
        values = [scenarios[name][latency].median for name in names]
        ax.barh(y, values, height=height, color=shades[i], label=latency.replace(" commit latency", ""))
    labels = ["without smoosh (the writer alone)" if n == "baseline" else "smoosh: " + n.replace(", as the README says", "")
              for n in names]
    ax.set_yticks(range(len(names))[::-1], [_wrap(label, 46) for label in labels])
    ax.set_xscale("log")
    ax.set_xlabel("the application's commit latency, ms (log scale; medians of the runs)")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    _title(fig, "An application writing beside a compaction, with and without smoosh", section)
    return fig


#: The job layer's rows and how the plot names them, in the order shown.
JOB_ROWS = (
    ("bare sqlite3, 3 durable commits/job", "bare sqlite3 loop, 3 durable commits a job"),
    ("huey SqliteHuey storage (enqueue+dequeue), 1 thread", "huey SqliteHuey, 1 thread (2 commits a job)"),
    ("huey, 4 threads", "huey SqliteHuey, 4 threads"),
    ("persist-queue SQLiteAckQueue put/get/ack", "persist-queue SQLiteAckQueue"),
    ("SQLite store, 1 worker", "smoosh job layer, SQLite store, 1 worker"),
    ("SQLite store, 4 worker threads (group commit)", "smoosh job layer, SQLite store, 4 worker threads"),
    ("SQLite store, 4 worker processes", "smoosh job layer, SQLite store, 4 worker processes"),
    ("memory store, 1 worker thread", "smoosh job layer, memory store (nothing durable)"),
)


def jobs(section: Section) -> plt.Figure:
    """Durable job round trips (add, accept, finish) a second: smoosh's job layer beside huey and the rest."""
    rows, labels = [], []
    for name, label in JOB_ROWS:
        try:
            rows.append(section.row(name))
        except KeyError as e:
            print(f"bench.plots: {e}; left out of bench-jobs.png", file=sys.stderr)
            continue
        labels.append(label)
    colours = [SMOOSH if label.startswith("smoosh") else PEER for label in labels]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.45 * len(rows) + 1.4), dpi=DPI)
    _bars(ax, rows, labels, colours)
    ax.set_xlabel("add + accept + finish a second (median; whisker: the runs' range)")
    _title(fig, "The job layer beside huey, persist-queue and a bare loop (all WAL, synchronous=FULL)", section)
    return fig


def _title(fig: plt.Figure, title: str, section: Section) -> None:
    """The figure's title and where its figures come from, across the whole width, then the layout."""
    fig.suptitle(f"{title}\nbench.{section.name}, {section.measured}", x=0.01, ha="left", fontsize=10.5)
    fig.tight_layout()


def _wrap(text: str, width: int = 58) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


#: Each plot: its file, the section it reads, how it is drawn.
PLOTS: tuple[tuple[str, str, Callable[[Section], plt.Figure]], ...] = (
    ("bench-drain.png", "drain", drain),
    ("bench-writer.png", "writer", writer),
    ("bench-jobs.png", "jobs", jobs),
)


def main() -> int:
    """Draw every plot whose section RESULTS.md has; 1 if one could not be drawn."""
    with open(RESULTS_PATH, encoding="utf-8") as f:
        sections = read_sections(f.read())
    os.makedirs(IMAGES, exist_ok=True)
    failed = 0
    for filename, name, draw in PLOTS:
        if name not in sections or not sections[name].rows:
            print(f"bench.plots: RESULTS.md has no bench:{name} table; {filename} left as it was", file=sys.stderr)
            failed += 1
            continue
        fig = draw(sections[name])
        path = os.path.join(IMAGES, filename)
        # No timestamp in the file: the same figures draw the same bytes.
        fig.savefig(path, metadata={"Software": None})
        plt.close(fig)
        print(f"drew {os.path.relpath(path, REPO_ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
