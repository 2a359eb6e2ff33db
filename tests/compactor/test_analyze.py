"""``[smoosh.sqlite] analyze = true``: ``PRAGMA optimize`` after a successful compaction, off by default."""

from __future__ import annotations

from types import SimpleNamespace

import apsw
import pytest

from compactor.contexts import RecordingContext
from compactor.dbfactory import integrity, make_bloated_db
from smoosh.compactors import SqliteCompactor
from smoosh.config import parse_config


def settings(**kw: object) -> SimpleNamespace:
    base = {"page_size": None, "auto_vacuum": None, "incremental_chunk_pages": 1000, "busy_timeout_s": 0.2}
    base.update(kw)
    return SimpleNamespace(**base)


def indexed_bloated_db(path: str, **kw: object) -> None:
    make_bloated_db(path, **kw)  # type: ignore[arg-type]
    conn = apsw.Connection(path)
    try:
        conn.execute("CREATE INDEX docs_key ON docs(key)").fetchall()
    finally:
        conn.close()


def statistics(path: str) -> list[tuple[str, str]]:
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchall():
            return []
        return [(t, i) for t, i, _ in conn.execute("SELECT tbl, idx, stat FROM sqlite_stat1").fetchall()]
    finally:
        conn.close()


@pytest.mark.parametrize(("journal_mode", "auto_vacuum"), [("wal", "none"), ("delete", "none"), ("wal", "incremental")])
def test_analyze_on_leaves_the_planners_statistics_after_a_compaction(tmp_path, journal_mode: str, auto_vacuum: str) -> None:
    path = str(tmp_path / "a.db")
    indexed_bloated_db(path, journal_mode=journal_mode, auto_vacuum=auto_vacuum)
    assert statistics(path) == []
    SqliteCompactor(settings(analyze=True)).compact(path, RecordingContext())
    assert ("docs", "docs_key") in statistics(path)
    assert integrity(path) == "ok"


def test_analyze_is_off_by_default(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    indexed_bloated_db(path)
    assert parse_config("[smoosh]\n", "smoosh.ini").sqlite.analyze is False
    SqliteCompactor(parse_config("[smoosh]\n", "smoosh.ini").sqlite).compact(path, RecordingContext())
    assert statistics(path) == []
    SqliteCompactor(settings()).compact(path, RecordingContext())  # settings without the attribute: off
    assert statistics(path) == []


def test_analyze_follows_a_live_reconfiguration(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    indexed_bloated_db(path)
    c = SqliteCompactor(settings())
    c.configure(parse_config("[smoosh.sqlite]\nanalyze = true\n", "smoosh.ini").sqlite)
    c.compact(path, RecordingContext())
    assert ("docs", "docs_key") in statistics(path)
