"""Third-party compactors load from the ``smoosh.compactors`` entry point group; broken ones are skipped."""

from __future__ import annotations

import importlib.metadata
import logging

import pytest

from smoosh.compactors import ENTRY_POINT_GROUP, SqliteCompactor, compactor_for, load_compactors

PLUGIN = '''
class Fake:
    name = "fake"
    def claims(self, key): return key.startswith("fake:")
    def sizes(self, key): return None
    def needs_upgrade(self, key): return False
    def cleanup_priority(self, key): return 0.0
    def compact(self, key, ctx): raise NotImplementedError

def make():
    return Fake()

def not_a_compactor():
    return object()

def explode():
    raise RuntimeError("plugin exploded")
'''


def test_plugins_load_after_the_builtin_and_broken_ones_are_skipped(tmp_path, monkeypatch, caplog) -> None:
    (tmp_path / "smoosh_fake_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [
        importlib.metadata.EntryPoint("fake", "smoosh_fake_plugin:make", ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("bad", "smoosh_fake_plugin:not_a_compactor", ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("boom", "smoosh_fake_plugin:explode", ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("missing", "no_such_module_here:make", ENTRY_POINT_GROUP),
    ]

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        assert group == ENTRY_POINT_GROUP
        return eps

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    with caplog.at_level(logging.ERROR, logger="smoosh.compactors"):
        compactors = load_compactors(None)
    assert [c.name for c in compactors] == ["sqlite", "fake"]
    assert isinstance(compactors[0], SqliteCompactor)
    assert compactor_for("fake:x", compactors) is compactors[1]
    assert compactor_for("/abs.db", compactors) is compactors[0]
    failed = sorted(r.getMessage().split()[2] for r in caplog.records)
    assert failed == ["'bad'", "'boom'", "'missing'"]


def test_invalid_auto_vacuum_target_is_refused() -> None:
    class Settings:
        auto_vacuum = "sometimes"

    with pytest.raises(ValueError):
        SqliteCompactor(Settings())
