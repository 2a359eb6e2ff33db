"""``smoosh doctor``'s store checks: the job store opens (read-only, never created), and for
``fdb:`` the binding, client library, selected API version and cluster versions agree.

Three FoundationDB versions must agree (docs/guides/several-nodes.md has the matrix): the binding refuses a
client library older than itself, and a client library talks only to clusters of its own
major.minor version unless the multi-version client is set up.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

from smoosh.cli.doctor.findings import FAIL, OK, WARN, Finding, existing_ancestor, user_name
from smoosh.cli.format import fmt_bytes

if TYPE_CHECKING:
    from smoosh.store.fdb import FdbVersions

__all__ = ["check_store", "check_sqlite_store", "check_fdb_store", "FDB_TIMEOUT_S", "FDB_FIX", "FDB_BINDING_FIX"]

#: Seconds a FoundationDB cluster has to send its status document.
FDB_TIMEOUT_S = 3.0
#: How to get a working FoundationDB client: the native library (the binding is a dependency).
FDB_FIX = ("install the FoundationDB client package of your cluster's version (it provides libfdb_c); the "
           "documentation's guide to several nodes and FoundationDB (docs/guides/several-nodes.md) has the version matrix")
#: How to get the binding back when it is missing.
FDB_BINDING_FIX = ("pip install 'smoosh-compactor[fdb]' (the foundationdb binding, 7.1); see the version matrix in "
                   "docs/guides/several-nodes.md")

CHECK = "store"


def check_store(url: str, *, timeout_s: float = FDB_TIMEOUT_S) -> list[Finding]:
    """The config's job store, by scheme.

    Parameters:
        url: the config's ``store``.
        timeout_s: how long an ``fdb:`` cluster has to answer.

    Returns:
        The store's findings.
    """
    scheme, _, rest = url.partition(":")
    if scheme == "memory":
        return [Finding(WARN, CHECK, "memory: keeps jobs and crash history in the daemon's process only: a restart "
                        "loses them and no `smoosh worker` can share them",
                        "store = sqlite:/var/lib/smoosh/jobs.db (or fdb: for many nodes)")]
    if scheme == "sqlite":
        return check_sqlite_store(rest)
    if scheme == "fdb":
        return check_fdb_store(rest or None, timeout_s=timeout_s)
    if scheme == "faulty":
        return [Finding(WARN, CHECK, f"{url} injects FoundationDB's errors on purpose: a store for tests",
                        "store = sqlite:PATH or fdb:CLUSTER_FILE")]
    return [Finding(FAIL, CHECK, f"{url}: unknown scheme", "store = memory:, sqlite:PATH or fdb:[CLUSTER_FILE]")]


def check_sqlite_store(path: str) -> list[Finding]:
    """The embedded store: absent (it will be created), or it opens read-only as smoosh's store and is writable.

    Parameters:
        path: the store's file.

    Returns:
        One finding.
    """
    from smoosh.daemon.control.store_reset import RESET_FLAG, corruption
    from smoosh.store.errors import StoreUnavailable
    from smoosh.store.sqlite import probe

    user = user_name()
    name = f"sqlite:{path}"
    if not os.path.exists(path):
        parent = existing_ancestor(path)
        if os.access(parent, os.W_OK | os.X_OK):
            return [Finding(OK, CHECK, f"{name} does not exist yet; it will be created at the first start")]
        return [Finding(FAIL, CHECK, f"{name} does not exist and {user} cannot create it: {parent} is not writable",
                        f"mkdir -p {os.path.dirname(path)} && chown {user} {os.path.dirname(path)}")]
    damage = corruption(path)
    if damage is not None:
        return [Finding(FAIL, CHECK, f"{name} is corrupt ({damage})",
                        f"smoosh run {RESET_FLAG} (moves it aside, never deletes it, and starts with an empty store)")]
    try:
        # The job store's own file, read with the store's own library (never a user database).
        version = probe(path)
    except StoreUnavailable as e:
        if "not a smoosh job store" in str(e):
            return [Finding(FAIL, CHECK, f"sqlite:{e}",
                            "point [smoosh] store at another file; this one belongs to something else")]
        return [Finding(FAIL, CHECK, f"sqlite:{e}", f"check its owner and mode (chown {user})")]
    writable = os.access(path, os.W_OK) and os.access(os.path.dirname(path), os.W_OK | os.X_OK)
    if not writable:
        return [Finding(FAIL, CHECK, f"{name} opens, but {user} cannot write it (or its directory, for the WAL)",
                        f"chown {user} {path} {os.path.dirname(path)}")]
    return [Finding(OK, CHECK, f"{name} opens read-only ({fmt_bytes(os.path.getsize(path))}, at version {version})")]


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check_fdb_store(cluster_file: str | None, *, timeout_s: float = FDB_TIMEOUT_S,
                    describe: Callable[..., FdbVersions] | None = None) -> list[Finding]:
    """An ``fdb:`` store: the client side (binding, library, API version) and the cluster's versions.

    Parameters:
        cluster_file: the cluster file (None: the client's default).
        timeout_s: how long the cluster has to answer.
        describe: :func:`smoosh.store.fdb.describe_versions` (a stand-in in tests).

    Returns:
        The client's finding, then the cluster's.
    """
    from smoosh.store.errors import StoreUnavailable

    if describe is None:
        from smoosh.store.fdb import describe_versions  # imports `fdb` only when called

        describe = describe_versions
    where = cluster_file or "the default cluster file"
    if cluster_file is not None and not os.path.isfile(cluster_file):
        return [Finding(FAIL, "FoundationDB cluster", f"{cluster_file}: no such cluster file",
                        "copy the cluster's fdb.cluster there, or correct [smoosh] store")]
    try:
        v = describe(cluster_file, timeout_s=timeout_s)
    except StoreUnavailable as e:
        fix = FDB_BINDING_FIX if "binding not installed" in str(e) else FDB_FIX
        return [Finding(FAIL, "FoundationDB client", str(e), fix)]
    client = v.client_library or "unknown"
    findings = [Finding(
        OK, "FoundationDB client",
        f"binding {v.binding} (API {v.binding_api_version}), client library {client} "
        f"(API up to {v.client_max_api_version}), API version {v.api_version} selected",
    )]
    error = v.cluster_error
    servers = list(v.server_versions or [])
    if error is not None:
        findings.append(Finding(FAIL, "FoundationDB cluster", f"{where}: no answer within {timeout_s:g} s ({error})",
                                f"check the cluster is up and reachable: fdbcli -C {cluster_file or '<cluster file>'} "
                                "--exec status"))
    elif not servers:
        findings.append(Finding(WARN, "FoundationDB cluster", f"{where}: answered, but named no process versions",
                                "fdbcli --exec status shows the cluster's health"))
    elif client != "unknown" and any(_major_minor(s) != _major_minor(client) for s in servers):
        findings.append(Finding(
            FAIL, "FoundationDB cluster",
            f"{where}: the cluster runs {', '.join(servers)}, and a {_major_minor(client)} client library talks only "
            f"to {_major_minor(client)} clusters",
            f"install the client library of the cluster's version ({_major_minor(servers[0])}), or set up "
            "FoundationDB's multi-version client (external_client_library)",
        ))
    else:
        findings.append(Finding(OK, "FoundationDB cluster", f"{where}: FoundationDB {', '.join(servers)}"))
    return findings
