"""The budgets at a glance, and the plots of the benchmarks page, from the tables in RESULTS.md.

`make bench` runs this last (``bench.all``), after every benchmark has rewritten its own section:
it reads those tables back (``_harness.read_sections``), rewrites the ``summary`` section of
``bench/RESULTS.md`` (one row per budget a benchmark measures, with its verdict), and draws the
plots the docs' benchmarks page shows (``bench.plots``, with matplotlib from ``.venv-bench``: it
is no project dependency). Nothing is measured here, so it can run on its own at any time:

    .venv/bin/python -m bench.summary        # the summary, then the plots (if .venv-bench has matplotlib)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._harness import REPO_ROOT, RESULTS_PATH, Section, fmt, read_sections, write_section  # noqa: E402

#: The Python of the benchmarks' own environment (matplotlib, the peers), made by `make bench`.
BENCH_PYTHON = os.path.join(REPO_ROOT, ".venv-bench", "bin", "python")


def summary(sections: dict[str, Section]) -> str:
    """The budgets table: every row of every section that has a budget, grouped by benchmark, in the file's order.

    Parameters:
        sections: what :func:`read_sections` read.

    Returns:
        The section's Markdown (its heading, a count of budgets met and missed, the table).
    """
    rows = []
    met = missed = 0
    for section in sections.values():
        budgeted = [row for row in section.rows if row.verdict in ("ok", "MISS")]
        if not budgeted:
            continue
        rows.append(f"| **{section.title}** ({section.measured}) | | | | |")
        for row in budgeted:
            met += row.verdict == "ok"
            missed += row.verdict == "MISS"
            rows.append(f"| {row.name} | {fmt(row.median)} {row.unit} | {row.budget} | {row.ratio} | "
                        f"{'**MISS**' if row.verdict == 'MISS' else 'ok'} |")
    head = ["### Budgets at a glance", "",
            f"{met + missed} budgets measured: {met} met, {missed} missed. Each row is a row of its benchmark's "
            "table below (the median of its runs); the benchmark's section says the machine, the method, the "
            "runs' spread and the peers it ran beside.", "",
            "| measurement | median | budget | ratio | verdict |",
            "|---|---|---|---|---|"]
    return "\n".join(head + rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Rewrite the summary section of RESULTS.md, then draw the plots.

    Returns:
        0, or 1 when the plots could not be drawn (the summary is written either way).
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-plots", action="store_true", help="write the summary only")
    args = ap.parse_args(argv)
    with open(RESULTS_PATH, encoding="utf-8") as f:
        sections = read_sections(f.read())
    sections.pop("summary", None)
    write_section("summary", summary(sections))
    print(f"wrote the budgets at a glance of {len(sections)} benchmarks into {os.path.relpath(RESULTS_PATH)}")
    if args.no_plots:
        return 0
    if not os.access(BENCH_PYTHON, os.X_OK):
        print(f"no {os.path.relpath(BENCH_PYTHON)}: the plots are not drawn (`make bench` makes it)")
        return 1
    return subprocess.call([BENCH_PYTHON, "-m", "bench.plots"], cwd=REPO_ROOT)


if __name__ == "__main__":
    sys.exit(main())
