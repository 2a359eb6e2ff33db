"""canonical_path gives exactly os.path.realpath's answer, and never drops this process's locks."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from helpers.locks import other_process_write
from smoosh.paths import canonical_path


def test_canonical_path_agrees_with_realpath_on_every_kind_of_path(tmp_path: Path) -> None:
    real_dir = tmp_path / "real" / "tenants"
    real_dir.mkdir(parents=True)
    db = real_dir / "a.db"
    db.write_bytes(b"x")
    (tmp_path / "dirlink").symlink_to(tmp_path / "real")
    (tmp_path / "filelink.db").symlink_to(db)
    (tmp_path / "relative.db").symlink_to(Path("real") / "tenants" / "a.db")
    (tmp_path / "chain.db").symlink_to(tmp_path / "filelink.db")
    (tmp_path / "dangling.db").symlink_to(tmp_path / "nowhere.db")
    cases = [
        db,
        tmp_path / "dirlink" / "tenants" / "a.db",
        tmp_path / "filelink.db",
        tmp_path / "relative.db",
        tmp_path / "chain.db",
        tmp_path / "dangling.db",
        tmp_path / "missing" / "x.db",
        tmp_path / "dirlink" / "tenants" / ".." / "tenants" / "a.db",
        tmp_path / "dirlink",
        real_dir,
    ]
    for path in cases:
        assert canonical_path(str(path)) == os.path.realpath(path), path
    for text in ("/" + str(db), "//" + str(db).lstrip("/"), str(real_dir) + "//a.db"):
        assert canonical_path(text) == os.path.realpath(text), text
    assert canonical_path(str(tmp_path / "dirlink" / "tenants" / "a.db")) == str(db)


def test_canonical_path_of_a_locked_database_keeps_the_lock(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE docs(key, body)")
    conn.close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO docs VALUES ('a', x'00')")
    try:
        assert canonical_path(str(db)) == str(db)
        assert other_process_write(db) == "database is locked"
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_missing_paths_agree_with_realpath_through_links_and_dangling_ones(tmp_path: Path) -> None:
    base = Path(os.path.realpath(tmp_path))
    (base / "a" / "b").mkdir(parents=True)
    (base / "a" / "b" / "f").write_bytes(b"")
    (base / "la").symlink_to(base / "a")
    (base / "dang").symlink_to(base / "nowhere")
    (base / "a" / "lb").symlink_to("b")
    cases = ["la/b/missing.db", "la/x/y/z.db", "dang/x.db", "dang", "la/../a/q.db", "a/lb/../q.db",
             "a/lb/nope/q.db", "a/b/f/under-a-file.db"]
    for case in cases:
        assert canonical_path(str(base / case)) == os.path.realpath(base / case), case
    assert canonical_path("/nonexistent/q/r.db") == "/nonexistent/q/r.db"


def test_a_deep_missing_path_costs_a_few_opens_not_a_walk_of_every_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # realpath lstat()s every prefix (quadratic in the depth): 200 missing components cost it
    # ~20,000 component lookups; the bisection opens a handful of prefixes. Counted, not timed.
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, *args: int, **kw: int) -> int:
        opened.append(path)
        return real_open(path, *args, **kw)

    deep = str(Path(os.path.realpath(tmp_path)) / "/".join(["a"] * 200) / "x.db")
    monkeypatch.setattr(os, "open", counting_open)
    assert canonical_path(deep) == deep
    assert len(opened) <= 10
