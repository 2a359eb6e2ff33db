"""``smoosh doctor``: is this host ready to run smoosh with this config? Each check says what it
found and, when something is wrong, how to fix it.

Every check is a small function returning :class:`Finding` s, so each can be tried on its own
against real files: the config (what ``smoosh config check`` says), access to the watched
directories, roots and ``state_dir``, and free space for the largest database's VACUUM
(:mod:`.disk`, one bounded walk that says when it stopped), inotify's limits against the
directories to watch (:mod:`.inotify`), the instance lock (:mod:`.lock`), the admin API's
address (:mod:`.admin`: free, or held by this node's own daemon), and the job store,
opened read-only and never created, with the binding, client library and cluster versions
for ``fdb:`` (:mod:`.store`).

Nothing here changes anything: the lock is inspected through ``/proc/locks``, never taken
while a daemon could be starting, the admin address is bound for a moment and closed (never
listened on), and a missing store or ``state_dir`` is reported as "will
be created", not created.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Sequence

from smoosh import jsonutil
from smoosh.cli.doctor.disk import (
    MAX_FILES, Survey, check_access, check_databases_writable, check_discard, check_free_space, check_state_dir, survey,
)
from smoosh.cli.doctor.admin import check_admin
from smoosh.cli.doctor.findings import FAIL, OK, WARN, Finding
from smoosh.cli.doctor.inotify import check_inotify, inotify_usage
from smoosh.cli.doctor.lock import check_lock, lock_holder
from smoosh.cli.doctor.store import check_store
from smoosh.errors import ConfigError

if TYPE_CHECKING:
    from smoosh.config import Config

__all__ = [
    "Finding", "Survey", "OK", "WARN", "FAIL", "MAX_FILES",
    "check_config", "survey", "check_access", "check_state_dir", "check_databases_writable",
    "check_inotify", "inotify_usage", "check_free_space", "check_discard", "check_lock", "lock_holder", "check_store",
    "check_admin",
    "run_checks", "format_findings", "cmd_doctor",
]


def check_config(path: str | None) -> tuple[Config | None, list[Finding]]:
    """The config as ``smoosh config check`` reads it: loads, its directories exist, its warnings.

    Parameters:
        path: the config file (None: ``$SMOOSH_CONFIG``, else ``conf/smoosh.ini``).

    Returns:
        The config (None when it does not load: nothing else can be checked) and the findings.
    """
    from smoosh.config import load_config
    from smoosh.config.checks import check_directories, check_store

    try:
        config = load_config(path, log_warnings=False)
    except ConfigError as e:
        return None, [Finding(FAIL, "config", str(e), "correct the file (then `smoosh config check` says ok)")]
    findings: list[Finding] = []
    try:
        check_directories(config)
    except ConfigError as e:
        findings.append(Finding(FAIL, "config", str(e), "create the directory, or correct the entry"))
    try:
        check_store(config)
    except ConfigError as e:
        findings.append(Finding(FAIL, "config", str(e), "give store a file of its own, outside watch and roots"))
    if not findings:
        findings.append(Finding(OK, "config", f"{config.path or 'defaults'}: ok ({len(config.channels)} channel(s))"))
    for warning in config.warnings:
        findings.append(Finding(WARN, "config", warning, "correct or remove the key (the configuration reference, docs/reference/config.md, lists every key)"))
    return config, findings


def run_checks(config_path: str | None, *, max_files: int = MAX_FILES) -> list[Finding]:
    """Every check, in the order an operator fixes things: config, access, the walk's findings, lock, store.

    Parameters:
        config_path: the config file (None: ``$SMOOSH_CONFIG``, else ``conf/smoosh.ini``).
        max_files: the walk's bound.

    Returns:
        The findings.
    """
    config, findings = check_config(config_path)
    if config is None:
        return findings
    findings.append(check_open_check())
    watched = _watch_dirs(config.watch)
    findings += check_access(watched)
    findings += check_access([r for r in config.roots if r not in watched], what="root")
    findings.append(check_state_dir(config.state_dir))
    lock, holder = check_lock(config.state_dir)
    s = survey(config.watch, config.roots, max_files=max_files)
    findings += check_databases_writable(s)
    findings += check_inotify(s, usage=inotify_usage(exclude_pids=[holder] if holder else ()),
                              rescan_interval_s=config.rescan_interval_s)
    findings += check_free_space(s, min_free=config.min_free_space)
    findings += check_discard(list(dict.fromkeys([*watched, *config.roots])))
    findings.append(lock)
    if config.http:
        findings.append(check_admin(config.http, lock_pid=holder))
    findings += check_store(config.store)
    return findings


def check_open_check() -> Finding:
    """Whether every file SQLite opens for a compaction is checked as it is opened (the C part is built)."""
    from smoosh.compactors import sqlite_guard
    from smoosh.compactors.sqlite_open import open_database  # noqa: F401 - installs the check

    if sqlite_guard.installed():
        return Finding(OK, "open check", "every file SQLite opens for a compaction is checked as it is opened")
    return Finding(WARN, "open check", sqlite_guard.NOT_BUILT,
                   "install a C compiler and Python's headers, then reinstall smoosh")


def _watch_dirs(watch: Sequence[str]) -> list[str]:
    from smoosh.daemon.watch.scan import resolve_watch

    return list(dict.fromkeys(resolve_watch(spec).root for spec in watch))


def format_findings(findings: Sequence[Finding]) -> str:
    """The findings as text: ``STATUS  CHECK: FINDING``, then ``      fix: ...`` under a warn or fail."""
    lines: list[str] = []
    for f in findings:
        lines.append(f"{f.status:<4}  {f.check}: {f.finding}")
        if f.fix and f.status != OK:
            lines.append(f"      fix: {f.fix}")
    return "\n".join(lines)


def cmd_doctor(args: argparse.Namespace) -> int:
    """``smoosh doctor [--config PATH] [--json]``: every check; exit 1 if any failed."""
    findings = run_checks(args.config)
    failed = any(f.status == FAIL for f in findings)
    if args.json:
        print(jsonutil.dumps({"ok": not failed, "checks": [f.to_json() for f in findings]}, indent=2))
    else:
        print(format_findings(findings))
        counts = {s: sum(f.status == s for f in findings) for s in (OK, WARN, FAIL)}
        print(f"\n{counts[OK]} ok, {counts[WARN]} warning(s), {counts[FAIL]} failure(s)")
    sys.stdout.flush()
    return 1 if failed else 0
