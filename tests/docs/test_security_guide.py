"""The security guide (docs/guides/security.md) says what smoosh does; these tests hold it to that,
through the same paths it names."""

from __future__ import annotations

import os
import re
from pathlib import Path

from helpers.daemon import config_text
from smoosh import Server
from smoosh.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
SECURITY = (ROOT / "docs" / "guides" / "security.md").read_text()


def test_a_key_that_names_no_sqlite_file_is_rejected_over_http_and_the_cli_with_the_reasons_it_names(
    tmp_path: Path,
) -> None:
    # Given each kind of key the page says is rejected, inside the roots
    dbs = tmp_path / "dbs"
    dbs.mkdir()
    (dbs / "a-directory").mkdir()
    os.mkfifo(dbs / "a-fifo")
    (dbs / "text.db").write_text("not a database, but long enough to have a header\n")
    keys = {str(dbs / "missing.db"): "no such file", str(dbs / "a-directory"): "a directory",
            str(dbs / "a-fifo"): "not a regular file", str(dbs / "text.db"): "not a SQLite file"}
    settings = {"watch": "", "roots": str(dbs), "state_dir": str(tmp_path / "state"), "store": "memory:", "node": "t"}
    config = parse_config(config_text(settings), str(tmp_path / "smoosh.ini"))
    server = Server(config, workers=0, watch_config=False)
    server.start()
    try:
        # When they come as HTTP's POST /enqueue?wait=1 (and the CLI's enqueue) brings them
        verdicts = server.enqueue_and_wait(list(keys))
        # And as the Python API does
        for key in keys:
            server.enqueue(key)
    finally:
        server.stop()
    # Then each is rejected with the reason the page names; the Python API raised nothing
    assert {v.key: (v.outcome, v.reason) for v in verdicts} == {k: ("rejected", r) for k, r in keys.items()}
    bullet = SECURITY[SECURITY.index("- Over HTTP and the CLI, a key that names no SQLite file"):]
    bullet = " ".join(bullet[:bullet.index("\n- ")].split())
    assert re.findall(r"`([a-zA-Z ]+)`", bullet)[:5] == ["rejected", *keys.values()]
    assert "From the file watcher and the Python API such a key gets priority 0 instead, no error." in bullet


def test_no_sentence_says_such_keys_get_priority_0_without_saying_where() -> None:
    text = " ".join(SECURITY.split())
    assert "A missing file, a directory, a FIFO or a non-SQLite file gets priority 0" not in text
