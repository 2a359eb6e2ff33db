"""canonical_path gives exactly os.path.realpath's answer, and never drops this process's locks."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

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
