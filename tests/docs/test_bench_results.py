"""bench/RESULTS.md is written by `make bench` alone: its tables read back as they were written, and
its budgets at a glance are what bench.summary makes of them (no hand edit survives a test run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench._harness import Metric, read_sections, report
from bench.summary import summary

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "RESULTS.md"


def test_a_table_the_harness_writes_reads_back(tmp_path: Path, monkeypatch: object) -> None:
    metrics = [
        Metric("bare VACUUM loop, 1000 files", "s", [6.4312, 6.54, 6.68]),
        Metric("hot path: seen key re-enqueued", "/s", [2_843_368, 2_706_915, 2_906_925], budget=1_000_000),
        Metric("wake-ups per compaction", "", [18.5, 16.3, 18.8], higher_is_better=False, budget=15),
    ]
    args = argparse.Namespace(runs=3, quick=False, no_write=True)
    text = report("example", "An example", metrics, args)
    (section,) = read_sections(f"<!-- bench:example -->\n{text}<!-- /bench:example -->").values()
    assert section.title == "An example"
    assert [(r.name, r.median, r.unit, r.runs, r.verdict) for r in section.rows] == [
        ("bare VACUUM loop, 1000 files", 6.54, "s", 3, "-"),
        ("hot path: seen key re-enqueued", 2_843_368, "/s", 3, "ok"),
        ("wake-ups per compaction", 18.5, "", 3, "MISS"),
    ]
    assert section.row("wake-ups per compaction").low == 16.3


def test_the_results_file_holds_only_what_make_bench_writes() -> None:
    text = RESULTS.read_text()
    sections = read_sections(text)
    written = sections.pop("summary")
    # The application beside smoosh is written by bench.apps --write-results (a sitting takes hours,
    # never part of make bench): its tables are the runs side by side and issue 46's verdicts,
    # not the harness's metric rows, so it adds nothing to the budgets at a glance.
    apps = {name: sections[name] for name in ("apps",) if name in sections}
    assert all(s.measured and "| issue 46's condition |" in text for s in apps.values())
    assert sections and all((s.rows or s.name in apps) and s.measured for s in sections.values())
    # The budgets at a glance are bench.summary's, from the tables below them
    begin, end = "<!-- bench:summary -->\n", "<!-- /bench:summary -->"
    assert text[text.index(begin) + len(begin):text.index(end)] == summary(sections)
    assert written.title == "Budgets at a glance"
    # and outside the sections, only the file's short header
    outside = text
    for name in ["summary", *sections]:
        b, e = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
        outside = outside[:outside.index(b)] + outside[outside.index(e) + len(e):]
    assert len([line for line in outside.splitlines() if line.strip()]) < 12
