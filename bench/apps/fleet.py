"""The tenant fleet: templates with real dead space, built once, copied fresh for every run.

A template is N tenant databases (``t000.sqlite`` ...) of the application's schema (created
by the framework itself, :mod:`bench.apps.django_app` / :mod:`bench.apps.sqlalchemy_app`),
each filled with rows to a size drawn between the fleet's bounds, then hollowed: a scattered
majority of its rows deleted (by a hash of the id, so every page loses some), which leaves
the file more than :data:`MIN_DEAD_RATIO` times its live bytes (``dbstat``'s bytes in use, the
exact figure smoosh's ratio channel compares with its threshold of 2). The rows are drawn
from the seed: the same (seed, sizes) gives the same rows for either application and either
journal mode; the WAL template is the rollback-journal one switched to WAL.

Each template also has its **compacted** twin (every tenant VACUUMed, same rows, same ids):
the control that compacts nothing during the run.

Templates live in a cache directory (``var/bench-apps/templates`` by default), one
subdirectory per (application, journal mode, seed, count, sizes, :data:`BUILDER_VERSION`),
complete once its ``meta.json`` exists. Stdlib only (the harness's side).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from bench.apps.ledger import template_key

__all__ = [
    "MIN_DEAD_RATIO", "BUILDER_VERSION", "TenantInfo", "Template", "fill_and_hollow", "live_bytes",
    "tenant_sizes", "build_template", "copy_fleet",
]

#: The fleet's file/live ratio must exceed this: smoosh's default ratio threshold (ratio_dbs).
MIN_DEAD_RATIO = 2.0
#: Rows deleted, per mille, scattered over the table by a hash of the id.
DELETE_PER_MILLE = 700
#: Bumped when the builder makes different files: a cached template of another version is rebuilt.
BUILDER_VERSION = 1
#: Knuth's multiplicative hash: which rows are deleted.
_HASH = 2654435761
#: Rows inserted per transaction while filling.
_BATCH = 2000
#: Payload length of a template row, in characters (hex text).
_PAYLOAD_CHARS = (200, 1800)
MB = 1_000_000


@dataclass
class TenantInfo:
    """One tenant of a template: its file name, size, live bytes and rows."""

    name: str
    file_bytes: int
    live_bytes: int
    rows: int

    @property
    def ratio(self) -> float:
        """File size over live bytes (what smoosh's ratio channel compares with its threshold)."""
        return self.file_bytes / max(1, self.live_bytes)

    @property
    def dead_bytes(self) -> int:
        return self.file_bytes - self.live_bytes


@dataclass
class Template:
    """A built template: its directory, table, tenants, and its compacted twin's directory and tenants."""

    directory: str
    table: str
    journal_mode: str
    tenants: list[TenantInfo]
    compacted_directory: str
    compacted: list[TenantInfo]

    def paths(self, compacted: bool = False) -> list[str]:
        base = self.compacted_directory if compacted else self.directory
        return [os.path.join(base, t.name) for t in self.tenants]

    @property
    def file_bytes(self) -> int:
        return sum(t.file_bytes for t in self.tenants)

    @property
    def dead_bytes(self) -> int:
        return sum(t.dead_bytes for t in self.tenants)


def live_bytes(path: str) -> int:
    """Bytes in use on the database's b-tree pages (``dbstat``: what smoosh measures exactly)."""
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT SUM(pgsize - unused) FROM dbstat").fetchone()[0] or 0)
    finally:
        conn.close()


def fill_and_hollow(path: str, table: str, target_bytes: int, seed: int,
                    delete_per_mille: int = DELETE_PER_MILLE) -> TenantInfo:
    """Fill the (empty) ``table`` of ``path`` with rows until the file reaches ``target_bytes``,
    then delete a scattered ``delete_per_mille`` of them.

    Rows: ``id`` 1, 2, ... (explicit), ``key`` :func:`~bench.apps.ledger.template_key`,
    ``counter`` and a hex ``payload`` drawn from ``seed``. Built fast (no journal, no sync): it
    is test material, copied before every use.

    Returns:
        The tenant as built (file size, live bytes, rows left).
    """
    rng = random.Random(seed)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        next_id = 1
        while conn.execute("PRAGMA page_count").fetchone()[0] * page_size < target_bytes:
            rows = []
            for i in range(next_id, next_id + _BATCH):
                rows.append((i, template_key(i), rng.randrange(1000),
                             rng.randbytes(rng.randint(*_PAYLOAD_CHARS) // 2).hex()))
            next_id += _BATCH
            conn.execute("BEGIN")
            conn.executemany(f'INSERT INTO "{table}"(id, key, counter, payload) VALUES (?, ?, ?, ?)', rows)
            conn.execute("COMMIT")
        conn.execute(f'DELETE FROM "{table}" WHERE ((id * ?) % 1000) < ?', (_HASH, delete_per_mille))
        left = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    finally:
        conn.close()
    return TenantInfo(os.path.basename(path), os.path.getsize(path), live_bytes(path), left)


def tenant_sizes(seed: int, count: int, min_mb: float, max_mb: float) -> list[int]:
    """The tenants' target sizes in bytes, drawn uniformly between the bounds from ``seed``."""
    rng = random.Random(f"sizes-{seed}")
    return [int(rng.uniform(min_mb, max_mb) * MB) for _ in range(count)]


def _set_journal_mode(path: str, mode: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        got = conn.execute(f"PRAGMA journal_mode={mode}").fetchone()[0]
        if got.lower() != mode.lower():
            raise RuntimeError(f"{path}: journal_mode {mode} gave {got}")
    finally:
        conn.close()


def _vacuum(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _load(directory: str) -> Template:
    with open(os.path.join(directory, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    return Template(
        directory=os.path.join(directory, "fleet"), table=meta["table"], journal_mode=meta["journal_mode"],
        tenants=[TenantInfo(**t) for t in meta["tenants"]],
        compacted_directory=os.path.join(directory, "compacted"),
        compacted=[TenantInfo(**t) for t in meta["compacted"]],
    )


def build_template(cache: str, app: str, journal_mode: str, seed: int, count: int, min_mb: float, max_mb: float,
                   apps_python: str, repo_root: str, log: Callable[[str], None] | None = None) -> Template:
    """The template of (``app``, ``journal_mode``, ``seed``, ``count``, sizes), built unless cached.

    The rollback-journal (``delete``) template of (app, seed, ...) is built first and the WAL
    one copied from it, so both hold the same rows.

    Parameters:
        cache: the templates' directory.
        app: ``django`` or ``sqlalchemy`` (its module ``bench.apps.<app>_app`` creates the schema).
        journal_mode: ``delete`` (SQLite's default rollback journal) or ``wal``.
        seed: draws the sizes and the rows.
        count: tenants.
        min_mb, max_mb: the tenants' size bounds (MB, 10**6 bytes).
        apps_python: the applications' interpreter (``.venv-apps/bin/python``).
        repo_root: put on the application's ``PYTHONPATH``.
        log: prints progress.

    Returns:
        The template.

    Raises:
        RuntimeError: a tenant came out without enough dead space (file/live <= MIN_DEAD_RATIO).
    """
    say = log or (lambda _msg: None)
    name = f"{app}-{journal_mode}-s{seed}-n{count}-{min_mb:g}-{max_mb:g}MB-v{BUILDER_VERSION}"
    directory = os.path.join(cache, name)
    if os.path.exists(os.path.join(directory, "meta.json")):
        return _load(directory)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(os.path.join(directory, "fleet"))
    os.makedirs(os.path.join(directory, "compacted"))
    names = [f"t{i:03d}.sqlite" for i in range(count)]
    t0 = time.monotonic()
    if journal_mode == "delete":
        say(f"building the template {name} ({count} tenants, {min_mb:g}-{max_mb:g} MB each)")
        schema_db = os.path.join(directory, "schema.sqlite")
        env = dict(os.environ, PYTHONPATH=repo_root)
        done = subprocess.run([apps_python, "-m", f"bench.apps.{app}_app", "schema", schema_db], cwd=repo_root,
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{app}'s schema command exited with {done.returncode}: {done.stderr[-3000:]}")
        table = json.loads(done.stdout.strip().splitlines()[-1])["table"]
        tenants = []
        for i, (tenant_name, size) in enumerate(zip(names, tenant_sizes(seed, count, min_mb, max_mb))):
            path = os.path.join(directory, "fleet", tenant_name)
            shutil.copyfile(schema_db, path)
            tenants.append(fill_and_hollow(path, table, size, seed * 100_000 + i))
        os.remove(schema_db)
    else:
        base = build_template(cache, app, "delete", seed, count, min_mb, max_mb, apps_python, repo_root, log)
        say(f"building the template {name} (the rollback-journal template switched to {journal_mode})")
        table = base.table
        tenants = []
        for tenant in base.tenants:
            path = os.path.join(directory, "fleet", tenant.name)
            shutil.copyfile(os.path.join(base.directory, tenant.name), path)
            _set_journal_mode(path, journal_mode)
            tenants.append(TenantInfo(tenant.name, os.path.getsize(path), tenant.live_bytes, tenant.rows))
    thin = [t for t in tenants if t.ratio <= MIN_DEAD_RATIO]
    if thin:
        raise RuntimeError(f"{name}: tenants without enough dead space (file/live <= {MIN_DEAD_RATIO}): "
                           + ", ".join(f"{t.name} {t.ratio:.2f}" for t in thin))
    compacted = []
    for tenant in tenants:
        path = os.path.join(directory, "compacted", tenant.name)
        shutil.copyfile(os.path.join(directory, "fleet", tenant.name), path)
        _vacuum(path)
        compacted.append(TenantInfo(tenant.name, os.path.getsize(path), live_bytes(path), tenant.rows))
    meta = {"app": app, "journal_mode": journal_mode, "seed": seed, "table": table, "builder": BUILDER_VERSION,
            "tenants": [asdict(t) for t in tenants], "compacted": [asdict(t) for t in compacted]}
    with open(os.path.join(directory, "meta.json.tmp"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    os.replace(os.path.join(directory, "meta.json.tmp"), os.path.join(directory, "meta.json"))
    say(f"  built in {time.monotonic() - t0:.0f} s: {sum(t.file_bytes for t in tenants) / MB:.0f} MB, "
        f"{sum(t.dead_bytes for t in tenants) / MB:.0f} MB of it dead; compacted "
        f"{sum(t.file_bytes for t in compacted) / MB:.0f} MB")
    return _load(directory)


def copy_fleet(sources: Sequence[str], directory: str) -> list[str]:
    """Copy the tenant files ``sources`` into ``directory`` (created); their new paths (canonical).

    Flushed to disk before returning (``os.sync``), so a run does not start with the copy's
    writeback in flight.
    """
    os.makedirs(directory, exist_ok=True)
    out = []
    for src in sources:
        dst = os.path.join(directory, os.path.basename(src))
        shutil.copyfile(src, dst)
        out.append(os.path.realpath(dst))
    os.sync()
    return out

