"""Shared benchmark harness: repeat a measurement, summarise it, print it, record it.

Every ``bench/<name>.py`` builds a list of :class:`Metric` (one per number it measures,
each holding the value of every run), then calls :func:`report`, which prints a table and
rewrites only that benchmark's section of ``bench/RESULTS.md`` — the text between
``<!-- bench:<name> -->`` and ``<!-- /bench:<name> -->`` — so benchmarks can be run one at a
time without clobbering each other's results.

Why medians with min/max: on a 2-vCPU VM the noise is one-sided (a neighbour, a writeback,
a GC pause only ever slow a run down), so the median of a few runs is the honest central
value and min/max shows how noisy the run was.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sqlite3
import statistics
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

#: Runs per measurement unless ``--runs`` says otherwise.
DEFAULT_RUNS = 5
#: Runs per measurement with ``--quick`` (a smoke run).
QUICK_RUNS = 1
#: The results file every benchmark rewrites its own section of.
RESULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
#: Repository root (for subprocesses that must import the project).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Metric:
    """One measured number: its value in every run, and how it compares with a budget or a peer.

    Parameters:
        name: what was measured (a table row label).
        unit: the unit of the values (``"/s"``, ``"MB"``, ``"ms"``, ``"s"``, ``"MB/s"``).
        values: one value per run.
        higher_is_better: True for rates, False for times, latencies and memory.
        budget: the DESIGN §9 limit in the same unit, or None.
        budget_text: how the budget reads in the table (``">= 1,000,000/s"``); derived if empty.
        reference: a peer's value in the same unit, for a ratio column, or None.
        reference_name: the peer's name (``"bare VACUUM"``).
        note: free text shown after the table.
    """

    name: str
    unit: str
    values: list[float]
    higher_is_better: bool = True
    budget: float | None = None
    budget_text: str = ""
    reference: float | None = None
    reference_name: str = ""
    note: str = ""

    @property
    def median(self) -> float:
        """The median of the runs."""
        return statistics.median(self.values)

    def verdict(self) -> str:
        """``"ok"`` or ``"MISS"`` against the budget; ``"-"`` without one."""
        if self.budget is None:
            return "-"
        ok = self.median >= self.budget if self.higher_is_better else self.median <= self.budget
        return "ok" if ok else "MISS"

    def budget_cell(self) -> str:
        if self.budget is None:
            return "-"
        if self.budget_text:
            return self.budget_text
        op = ">=" if self.higher_is_better else "<="
        return f"{op} {fmt(self.budget)} {self.unit}"

    def ratio_cell(self) -> str:
        parts = []
        if self.budget:
            parts.append(f"{self.median / self.budget:.2f}x budget")
        if self.reference:
            parts.append(f"{self.median / self.reference:.2f}x {self.reference_name}")
        return "; ".join(parts) or "-"


def fmt(x: float) -> str:
    """A number for a table: thousands separators for big ones, 3 significant digits for small."""
    if x != x:
        return "nan"
    if float(x).is_integer() and abs(x) < 1000:
        return f"{int(x)}"  # a count (commits, files): never "1.00"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], object] | None = None,
    *,
    default_runs: int = DEFAULT_RUNS,
) -> argparse.Namespace:
    """The common options: ``--runs N``, ``--quick``, ``--no-write``.

    Parameters:
        description: the benchmark's docstring (``--help``).
        argv: arguments (None: ``sys.argv[1:]``).
        extra: adds benchmark-specific options (what it returns, such as the
            ``argparse.Action`` of ``add_argument``, is ignored).
        default_runs: runs per measurement without ``--runs`` (a long benchmark runs once).

    Returns:
        The parsed namespace; ``runs`` already reflects ``--quick``.
    """
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=None, help=f"runs per measurement (default {default_runs})")
    ap.add_argument("--quick", action="store_true", help="a short smoke run (smaller sizes, one run)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    if extra is not None:
        extra(ap)
    args = ap.parse_args(argv)
    if args.runs is None:
        args.runs = QUICK_RUNS if args.quick else default_runs
    return args


def repeat(fn: Callable[[], dict[str, float]], runs: int, *, warmup: bool = False) -> dict[str, list[float]]:
    """Call ``fn`` ``runs`` times; gather each returned ``{metric: value}`` into lists.

    Parameters:
        fn: one run; returns the values it measured.
        runs: how many runs.
        warmup: run once more first and discard it (imports, page cache, allocator).

    Returns:
        ``{metric: [value of run 1, run 2, ...]}``.
    """
    if warmup:
        fn()
    out: dict[str, list[float]] = {}
    for _ in range(runs):
        for key, value in fn().items():
            out.setdefault(key, []).append(value)
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return float("nan")


def machine_info() -> dict[str, str]:
    """nproc, CPU model, RAM, Python and SQLite versions, and the date (UTC).

    Two SQLite libraries: the stdlib's (the job store, the peers, the bare loops) and apsw's
    bundled one (every user database smoosh's compactor opens).
    """
    try:
        import apsw

        apsw_sqlite = apsw.sqlite_lib_version()
    except ImportError:
        apsw_sqlite = "not installed"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "ram": f"{_mem_total_gib():.0f} GiB",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "apsw_sqlite": apsw_sqlite,
    }


def machine_line() -> str:
    """Machine info as one line of text."""
    m = machine_info()
    return (f"{m['date']}; {m['nproc']} CPU ({m['cpu']}), {m['ram']} RAM; "
            f"Python {m['python']}, SQLite {m['sqlite']} (stdlib), {m['apsw_sqlite']} (apsw, user databases)")


def table(metrics: list[Metric]) -> str:
    """The metrics as a Markdown table (also readable on a terminal)."""
    lines = [
        "| measurement | median | min - max | runs | budget | ratio | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in metrics:
        lines.append(
            f"| {m.name} | {fmt(m.median)} {m.unit} | {fmt(min(m.values))} - {fmt(max(m.values))} | "
            f"{len(m.values)} | {m.budget_cell()} | {m.ratio_cell()} | {m.verdict()} |"
        )
    return "\n".join(lines)


@dataclass
class Row:
    """One row of a table :func:`table` wrote, read back (:func:`read_sections`).

    Parameters:
        name: the measurement.
        median: its median, as the table rounds it.
        unit: its unit ("" for a count).
        low: the fastest or smallest run, as rounded.
        high: the slowest or largest run, as rounded.
        runs: how many runs.
        budget: the budget cell as written ("-" without one).
        ratio: the ratio cell as written.
        verdict: "ok", "MISS" or "-".
    """

    name: str
    median: float
    unit: str
    low: float
    high: float
    runs: int
    budget: str
    ratio: str
    verdict: str


@dataclass
class Section:
    """One benchmark's section of RESULTS.md, read back: its heading, its "Measured ..." line, its rows."""

    name: str
    title: str
    measured: str
    rows: list[Row]

    def row(self, name: str) -> Row:
        """The row named ``name``.

        Raises:
            KeyError: no row has that name (the benchmark renamed or dropped it).
        """
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"bench:{self.name} has no row {name!r}")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def read_sections(text: str) -> dict[str, Section]:
    """Every benchmark's section of a RESULTS.md, read back from the tables :func:`report` wrote.

    The reader of :func:`table`'s format, beside it: a change to one is a change to both. A row
    whose cells do not read as numbers (none :func:`table` writes) is skipped.

    Parameters:
        text: the file's text.

    Returns:
        Section name -> its heading, "Measured" line and rows, in file order.
    """
    sections: dict[str, Section] = {}
    for match in re.finditer(r"<!-- bench:(\w+) -->\n(.*?)<!-- /bench:\1 -->", text, re.S):
        name, body = match.group(1), match.group(2)
        title = re.search(r"^### (.+)$", body, re.M)
        measured = re.search(r"^Measured (.+?);", body, re.M)
        rows = []
        for line in body.splitlines():
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            if len(cells) != 7 or not line.startswith("| ") or cells[0] == "measurement":
                continue
            value, _, unit = cells[1].partition(" ")
            low, _, high = cells[2].partition(" - ")
            try:
                rows.append(Row(cells[0], _number(value), unit.strip(), _number(low), _number(high), int(cells[3]),
                                cells[4], cells[5], cells[6]))
            except ValueError:
                continue
        sections[name] = Section(name, title.group(1) if title else name, measured.group(1) if measured else "", rows)
    return sections


def report(name: str, title: str, metrics: list[Metric], args: argparse.Namespace, notes: Sequence[str] = (),
           command: str = "") -> str:
    """Print the table and (unless ``--no-write`` or ``--quick``) rewrite ``name``'s section of RESULTS.md.

    Parameters:
        name: the section marker (``enqueue`` -> ``<!-- bench:enqueue -->``).
        title: the section heading.
        metrics: what was measured.
        args: the parsed options.
        notes: extra lines (method, caveats) shown under the table.
        command: how to rerun it (default ``python -m bench.NAME``).

    Returns:
        The section's Markdown.
    """
    body = [f"### {title}", "", f"Measured {machine_line()}; `{command or 'python -m bench.' + name}` ({args.runs} run(s) each).", "",
            table(metrics), ""]
    for m in metrics:
        if m.note:
            body.append(f"- *{m.name}*: {m.note}")
    body.extend(f"- {n}" for n in notes)
    text = "\n".join(body).rstrip() + "\n"
    print(text, flush=True)
    if args.quick or args.no_write:
        print(f"(--quick/--no-write: {os.path.relpath(RESULTS_PATH)} left alone)")
        return text
    write_section(name, text)
    return text


def write_section(name: str, text: str, path: str = RESULTS_PATH) -> None:
    """Replace the ``<!-- bench:name -->`` section of ``path`` (appended when absent).

    The file is rewritten through a temp file and ``os.replace`` so an interrupted run never
    leaves it half written.
    """
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{text}{end}"
    try:
        with open(path, encoding="utf-8") as f:
            old = f.read()
    except FileNotFoundError:
        old = "# Benchmark results\n\nWritten by `make bench` (see bench/README.md).\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    new = pattern.sub(lambda _m: block, old) if pattern.search(old) else old.rstrip() + "\n\n" + block + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, path)


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process, from ``/proc/PID/status`` (VmRSS)."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest-rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))
    return ordered[k]


def ensure_repo_on_path() -> None:
    """Let ``python bench/NAME.py`` import the project like ``python -m bench.NAME`` does."""
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
