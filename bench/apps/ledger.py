"""The workload's ledger of what it committed, and the check of a tenant against it after a run.

Stdlib only: the application processes (``.venv-apps``) write the ledger, the harness
(``.venv``) checks it, and ``tests/`` checks the check.

What the ledger holds, per tenant: for every row the workload committed a change to, keyed by
the row's unique ``key``, its last committed value (``[id, counter, payload digest]``), or
``None`` once its delete committed. Rows are named by ``key``, not ``id``: a table whose
``INTEGER PRIMARY KEY`` has no ``AUTOINCREMENT`` (SQLAlchemy's default) gives a new row the id
of the highest row deleted, so one id can name two rows in a run, while a key is written once
(the template's, or a new one per create). A row the workload never touched must still be in
the tenant exactly as it is in the fleet's template (the run's tenant is a fresh copy of it).
So after a run every row of every tenant is accounted for:

* a template row not in the ledger: present and unchanged;
* a ledger row with a value: present with that value;
* a ledger row deleted: absent;
* nothing else present.

An operation whose commit failed is not in the ledger (SQLite's commit is atomic: a failed
``COMMIT`` left nothing; Django and SQLAlchemy roll back after it). Rows are owned by one
workload thread each (see :mod:`bench.apps.workload`), so a row's ledger entries are in the
order its commits happened; a key in two threads' ledgers is refused.
"""

from __future__ import annotations

import hashlib
import sqlite3
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

__all__ = ["Value", "digest", "template_key", "TenantCheck", "check_tenant", "merge_ledgers"]

#: A row's committed value: ``[id, counter, payload digest]``; None: its delete committed.
Value = Optional[Sequence[Any]]

#: Ids listed per kind of violation in a report (the counts are always complete).
MAX_LISTED_IDS = 50


def digest(payload: str) -> str:
    """The ledger's short fingerprint of a payload (16 hex digits of its SHA-1)."""
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def template_key(row_id: int) -> str:
    """The unique ``key`` of the template's row ``row_id`` (the fleet builder writes these)."""
    return f"tmpl-{row_id:09d}"


def merge_ledgers(parts: Sequence[Mapping[str, Value]]) -> dict[str, Value]:
    """One tenant's ledger from its threads' parts (each thread owns its rows: no key is in two).

    Raises:
        ValueError: a key in two parts (two threads wrote one row: the ledger's order is lost).
    """
    out: dict[str, Value] = {}
    for part in parts:
        for key, value in part.items():
            if key in out:
                raise ValueError(f"row {key!r} is in two threads' ledgers")
            out[key] = value
    return out


@dataclass
class TenantCheck:
    """What the check of one tenant found; ``ok`` when nothing.

    Attributes:
        path: the tenant's database.
        integrity: ``PRAGMA integrity_check``'s first lines (``["ok"]`` when sound).
        rows: rows present after the run.
        lost: ids of rows that should be present and are not (template rows and committed rows;
            a committed row's id as its commit left it).
        changed: ids of rows present with another value than the template's or the ledger's last.
        resurrected: ids of rows present whose delete committed.
        unexpected: ids of rows present that neither the template nor the ledger knows.
    """

    path: str
    integrity: list[str]
    rows: int = 0
    lost: list[int] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)
    resurrected: list[int] = field(default_factory=list)
    unexpected: list[int] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        """The integrity check found something."""
        return self.integrity != ["ok"]

    @property
    def ok(self) -> bool:
        """Sound, and every row as the template and the ledger say."""
        return not (self.damaged or self.lost or self.changed or self.resurrected or self.unexpected)

    def summary(self) -> dict[str, object]:
        """Counts, and at most :data:`MAX_LISTED_IDS` ids of each kind (for the JSON report)."""
        out: dict[str, object] = {"path": self.path, "integrity": self.integrity[:5], "rows": self.rows}
        for name in ("lost", "changed", "resurrected", "unexpected"):
            ids = sorted(getattr(self, name))
            out[name] = len(ids)
            if ids:
                out[f"{name}_ids"] = ids[:MAX_LISTED_IDS]
        return out


def check_tenant(path: str, template: str, table: str, ledger: Mapping[str, Value]) -> TenantCheck:
    """Check ``path`` after a run: sound, and every row as ``template`` and ``ledger`` say.

    Opens ``path`` read-write (nothing else may have it open: the application and smoosh have
    stopped) and attaches ``template`` read-only. Rows are matched by their unique ``key``.
    Untouched rows are compared inside SQLite (id, counter and payload); the ledger's rows are
    fetched and compared by id, counter and payload digest.

    Parameters:
        path: the tenant database after the run.
        template: the template it was copied from (or the template of its compacted copy: a
            VACUUM keeps every rowid of a table with an ``INTEGER PRIMARY KEY``).
        table: the application's table (``id``, ``key``, ``counter``, ``payload``; ``key`` unique).
        ledger: the workload's ledger of this tenant (:func:`merge_ledgers`).

    Returns:
        What was found; :attr:`TenantCheck.ok` says whether it is all as it should be.
    """
    # URI filenames: the template is attached read-only (``mode=ro``), which only a connection
    # opened with URIs enabled understands.
    conn = sqlite3.connect(_uri(path), isolation_level=None, uri=True)
    try:
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check(20)")]
        check = TenantCheck(path, integrity)
        if check.damaged:
            return check  # the rows of a damaged file say nothing more
        conn.execute("ATTACH DATABASE ? AS tmpl", (_uri(template, "?mode=ro"),))
        conn.execute("CREATE TEMP TABLE touched(key TEXT PRIMARY KEY)")
        conn.executemany("INSERT INTO temp.touched(key) VALUES (?)", ((k,) for k in ledger))
        t = f'"{table}"'
        check.rows = conn.execute(f"SELECT count(*) FROM main.{t}").fetchone()[0]
        check.lost += [r[0] for r in conn.execute(
            f"SELECT p.id FROM tmpl.{t} p WHERE p.key NOT IN (SELECT key FROM temp.touched) "
            f"AND p.key NOT IN (SELECT key FROM main.{t})")]
        check.changed += [r[0] for r in conn.execute(
            f"SELECT m.id FROM main.{t} m JOIN tmpl.{t} p ON p.key = m.key "
            "WHERE m.key NOT IN (SELECT key FROM temp.touched) "
            "AND (m.id IS NOT p.id OR m.counter IS NOT p.counter OR m.payload IS NOT p.payload)")]
        check.unexpected += [r[0] for r in conn.execute(
            f"SELECT id FROM main.{t} WHERE key NOT IN (SELECT key FROM tmpl.{t}) "
            "AND key NOT IN (SELECT key FROM temp.touched)")]
        present = {r[0]: (r[1], r[2], digest(r[3])) for r in conn.execute(
            f"SELECT m.key, m.id, m.counter, m.payload FROM main.{t} m JOIN temp.touched USING (key)")}
        for key, value in ledger.items():
            row = present.get(key)
            if value is None:
                if row is not None:
                    check.resurrected.append(row[0])
            elif row is None:
                check.lost.append(int(value[0]))
            elif tuple(row) != (value[0], value[1], value[2]):
                check.changed.append(row[0])
        return check
    finally:
        conn.close()


def _uri(path: str, query: str = "") -> str:
    return "file:" + urllib.request.pathname2url(path) + query
