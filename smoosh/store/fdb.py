"""``fdb:`` / ``fdb:CLUSTER_FILE`` — FoundationDB through the official binding, wrapped 1:1.

The seam mirrors FoundationDB's own transaction API, so this module only converts: our
:class:`~smoosh.store.base.KeySelector` to ``fdb.KeySelector``, futures to values,
``fdb.FDBError`` to :class:`~smoosh.store.errors.StoreError` with the same code, and watch
futures to :class:`~smoosh.store.base.Watch`. Retries go through the binding's ``on_error``
(its retryable set, its backoff, ``max_retry_delay``); the retry loop is the base class's.
Errors surface where the client library raises them, which is the contract of every store
(:mod:`smoosh.store.base`): a write's error at the next read or the commit, 1025 after a
failed ``on_error``, and ``on_error(1039)`` raised in bypass mode (libfdb_c without an
external client), so the retry loop retries 1039 itself.

The suite runs this adapter without a cluster over a stand-in for the binding that models
those behaviours (``tests/helpers/fdb_standin.py``, passed as ``binding``).

Versions. Three things must agree: the binding (PyPI ``foundationdb``), the client library
``libfdb_c`` it loads, and the cluster. The binding announces a *header* API version (710 for
the 7.1 binding, 730 for 7.3, 800 for 8.0) and the client library refuses any binding whose
header version is above its own maximum: the 8.0 binding loads only an 8.0 library, the 7.3
binding a 7.3 or 8.0 one, the 7.1 binding any of 7.1, 7.3 and 8.0. smoosh therefore depends on
the 7.1 binding and selects, once per process, the highest API version that both the binding
and the loaded library support (never below :data:`MIN_API_VERSION`). The client library talks
to clusters of its own major.minor version (or others through FoundationDB's multi-version
client, ``external_client_library``). :func:`describe_versions` reports all of it.

``fdb`` is imported lazily, and only when an ``fdb:`` store is opened or versions are asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Iterator

from smoosh.store.base import KeySelector, ReadView, Store, Transaction, Watch
from smoosh.store.errors import CLIENT_INVALID_OPERATION, StoreError, StoreUnavailable
from smoosh.store.retry import MAX_RETRY_DELAY_S

#: The lowest FoundationDB API version smoosh runs at (persistent transaction timeouts need
#: 610, 4-byte versionstamp offsets 520; 710 is what the 7.1 binding, our floor, speaks).
MIN_API_VERSION = 710
#: The header API version of a binding too old to say it (the 7.1 binding has no
#: ``LATEST_API_VERSION``; its ``api_version`` passes 710 as the header version).
LEGACY_BINDING_API_VERSION = 710
#: What to do when the binding or the native client is missing.
INSTALL_HINT = "install smoosh-compactor[fdb] and the FoundationDB client library (libfdb_c)"
#: The special key whose value is the cluster's status document (JSON).
STATUS_KEY = b"\xff\xff/status/json"
#: Seconds :func:`describe_versions` waits for the cluster's status.
STATUS_TIMEOUT_S = 5.0

_api_lock = threading.Lock()


def binding_api_version(fdb: ModuleType) -> int:
    """The header API version of the imported binding (710 for a 7.1 binding)."""
    return int(getattr(fdb, "LATEST_API_VERSION", LEGACY_BINDING_API_VERSION))


def client_max_api_version(fdb: ModuleType) -> int:
    """The highest API version the client library ``libfdb_c`` supports (loads it).

    Raises:
        StoreUnavailable: the client library cannot be found or loaded.
    """
    try:
        import fdb.impl as impl  # loads libfdb_c; fails without it
    except Exception as e:  # the binding raises a bare Exception when libfdb_c is missing
        raise StoreUnavailable(f"FoundationDB client library not found ({e}): {INSTALL_HINT}") from e
    return int(impl._capi.fdb_get_max_api_version())


def choose_api_version(binding_version: int, library_max: int) -> int:
    """The API version to select: the highest both sides support.

    Raises:
        StoreUnavailable: the library is older than the binding (it would refuse it) or
            than :data:`MIN_API_VERSION`.
    """
    if library_max < binding_version:
        raise StoreUnavailable(
            f"the FoundationDB binding needs a client library supporting API version {binding_version}, "
            f"but the installed libfdb_c supports at most {library_max}: install a binding of the "
            f"library's version (pip install 'foundationdb=={library_max // 100}.{library_max // 10 % 10}.*') "
            f"or a newer client library"
        )
    chosen = min(binding_version, library_max)
    if chosen < MIN_API_VERSION:
        raise StoreUnavailable(f"FoundationDB API version {chosen} is older than smoosh needs ({MIN_API_VERSION})")
    return chosen


def load_fdb() -> ModuleType:
    """Import ``fdb`` and select the API version (once per process).

    Returns:
        The ``fdb`` module, its API version selected.

    Raises:
        StoreUnavailable: the binding or the native client library is missing or unusable,
            or another part of the process selected an API version below :data:`MIN_API_VERSION`.
    """
    try:
        import fdb  # untyped: see [tool.mypy] overrides
    except ImportError as e:
        raise StoreUnavailable(f"FoundationDB binding not installed: {INSTALL_HINT}") from e
    with _api_lock:
        if fdb.is_api_version_selected():
            selected = fdb.get_api_version()
            if selected < MIN_API_VERSION:
                raise StoreUnavailable(f"FoundationDB API version {selected} was selected elsewhere; smoosh needs {MIN_API_VERSION}")
            return fdb
        version = choose_api_version(binding_api_version(fdb), client_max_api_version(fdb))
        try:
            fdb.api_version(version)
        except Exception as e:  # RuntimeError from the binding, a bare Exception without libfdb_c
            raise StoreUnavailable(f"FoundationDB client unusable ({e}): {INSTALL_HINT}") from e
    return fdb


@dataclass(frozen=True)
class FdbVersions:
    """What :func:`describe_versions` found (for ``smoosh doctor``).

    Attributes:
        binding: the ``foundationdb`` package version, e.g. ``"7.1.67"``.
        binding_api_version: the binding's header API version.
        client_library: the loaded ``libfdb_c`` version, e.g. ``"7.3.43"`` (None if unknown).
        client_max_api_version: the library's highest API version.
        api_version: the API version selected in this process.
        server_versions: versions the cluster's processes report, when a cluster was asked.
        cluster_error: why the cluster could not be asked, when it could not.
    """

    binding: str
    binding_api_version: int
    client_library: str | None
    client_max_api_version: int
    api_version: int
    server_versions: list[str] | None = None
    cluster_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _binding_package_version(fdb: ModuleType) -> str:
    version = getattr(fdb, "__version__", None)
    if version:
        return str(version)
    try:
        from importlib.metadata import version as dist_version

        return dist_version("foundationdb")
    except Exception:
        return "unknown"


def _client_library_version(fdb: ModuleType) -> str | None:
    """The ``libfdb_c`` version string's first field ("7.1.27" of "7.1.27,<hash>,<protocol>")."""
    import ctypes

    import fdb.impl as impl

    func = getattr(impl._capi, "fdb_get_client_version", None)
    if func is None:
        return None
    func.restype = ctypes.c_char_p
    raw = func()
    return raw.decode("utf-8", "replace").split(",")[0] if raw else None


def server_versions_from_status(status: dict[str, Any]) -> list[str]:
    """The distinct versions in a status document's ``cluster.processes`` (sorted)."""
    processes = (status.get("cluster") or {}).get("processes") or {}
    return sorted({str(p["version"]) for p in processes.values() if isinstance(p, dict) and p.get("version")})


def describe_versions(cluster_file: str | None = None, *, ask_cluster: bool = True, timeout_s: float = STATUS_TIMEOUT_S) -> FdbVersions:
    """Report the binding, client library and (where reachable) cluster versions.

    Parameters:
        cluster_file: the cluster to ask (None: the default cluster file).
        ask_cluster: False reports the client side only and opens no database.
        timeout_s: how long to wait for the cluster's status document.

    Returns:
        An :class:`FdbVersions`; a cluster that cannot be reached is reported in
        ``cluster_error``, not raised.

    Raises:
        StoreUnavailable: no binding or no client library.
    """
    fdb = load_fdb()
    versions = FdbVersions(
        binding=_binding_package_version(fdb),
        binding_api_version=binding_api_version(fdb),
        client_library=_client_library_version(fdb),
        client_max_api_version=client_max_api_version(fdb),
        api_version=fdb.get_api_version(),
    )
    if not ask_cluster:
        return versions
    try:
        db = fdb.open(cluster_file)
        tr = db.create_transaction()
        tr.options.set_timeout(int(timeout_s * 1000))
        raw = tr.get(STATUS_KEY).wait()
        status = json.loads(bytes(raw)) if raw is not None else {}
    except Exception as e:  # an unreachable or misconfigured cluster is a finding, not a crash
        return dataclasses.replace(versions, cluster_error=str(e) or type(e).__name__)
    return dataclasses.replace(versions, server_versions=server_versions_from_status(status))


class FdbWatch(Watch):
    """A watch future of the binding; :meth:`wait` honours a timeout via ``on_ready``."""

    def __init__(self, future: Any, fdb: ModuleType) -> None:
        self._future = future
        self._fdb = fdb
        self._event = threading.Event()
        future.on_ready(lambda _f: self._event.set())

    def wait(self, timeout: float | None = None) -> bool:
        """See :meth:`Watch.wait`."""
        if not self._event.wait(timeout):
            return False
        with _mapped(self._fdb):
            self._future.wait()
        return True

    def is_ready(self) -> bool:
        """See :meth:`Watch.is_ready`."""
        return self._event.is_set()

    def cancel(self) -> None:
        """See :meth:`Watch.cancel`."""
        self._future.cancel()

    def on_settled(self, fn: Callable[[], None]) -> None:
        """See :meth:`Watch.on_settled` (the binding's ``on_ready``, on its network thread)."""
        self._future.on_ready(lambda _f: fn())


@contextlib.contextmanager
def _mapped(fdb: ModuleType) -> Iterator[None]:
    try:
        yield
    except fdb.FDBError as e:
        raise StoreError(e.code, _description(e)) from e


def _description(error: Any) -> str | None:
    """The binding's description of an ``FDBError`` (None: the code's own, from our table).

    Not ``str(error)``: that already ends in the code (the StoreError adds it again), and the
    7.1 binding's description is the C library's ``bytes``, which would print as ``b'...'``.
    """
    try:
        description = error.description  # the binding asks libfdb_c for it
    except Exception:  # only a courtesy: without it the StoreError gives the code's own description
        return None
    if isinstance(description, bytes):
        description = description.decode("utf-8", "replace")
    return description or None


class _FdbReadView(ReadView):
    def __init__(self, tr: Any, fdb: ModuleType) -> None:
        self._r = tr
        self._fdb = fdb

    def _sel(self, s: bytes | KeySelector) -> Any:
        if isinstance(s, KeySelector):
            return self._fdb.KeySelector(s.key, s.or_equal, s.offset)
        return s

    def get(self, key: bytes) -> bytes | None:
        with _mapped(self._fdb):
            return self._r.get(key).value

    def get_key(self, selector: KeySelector) -> bytes:
        with _mapped(self._fdb):
            return self._r.get_key(self._sel(selector)).value

    def get_range(
        self, begin: bytes | KeySelector, end: bytes | KeySelector, limit: int = 0, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        with _mapped(self._fdb):
            rng = self._r.get_range(
                self._sel(begin), self._sel(end), limit=limit, reverse=reverse, streaming_mode=self._fdb.StreamingMode.want_all
            )
            return [(kv.key, kv.value) for kv in rng]


class FdbTransaction(_FdbReadView, Transaction):
    """One FoundationDB transaction behind the seam."""

    def __init__(self, tr: Any, fdb: ModuleType) -> None:
        super().__init__(tr, fdb)
        self._tr = tr
        self.snapshot = _FdbReadView(tr.snapshot, fdb)
        self._has_writes = False
        self._stamp_future: Any = None

    def _write(self) -> Any:
        self._has_writes = True
        return _mapped(self._fdb)

    def set(self, key: bytes, value: bytes) -> None:
        with self._write():
            self._tr.set(key, value)

    def clear(self, key: bytes) -> None:
        with self._write():
            self._tr.clear(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        with self._write():
            self._tr.clear_range(begin, end)

    def add(self, key: bytes, param: bytes) -> None:
        with self._write():
            self._tr.add(key, param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        with self._write():
            self._tr.set_versionstamped_key(key, value)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        with self._write():
            self._tr.set_versionstamped_value(key, value)

    def add_read_conflict_key(self, key: bytes) -> None:
        with _mapped(self._fdb):
            self._tr.add_read_conflict_key(key)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        with _mapped(self._fdb):
            self._tr.add_read_conflict_range(begin, end)

    def watch(self, key: bytes) -> Watch:
        with _mapped(self._fdb):
            return FdbWatch(self._tr.watch(key), self._fdb)

    def commit(self) -> None:
        with _mapped(self._fdb):
            # FDB hands out the stamp only to a request made before the commit.
            self._stamp_future = self._tr.get_versionstamp() if self._has_writes else None
            self._tr.commit().wait()

    def reset(self) -> None:
        self._tr.reset()
        self._forget_attempt()

    def _forget_attempt(self) -> None:
        self._has_writes = False
        self._stamp_future = None

    def set_retry_options(self, *, timeout_s: float | None = None, max_retry_delay_s: float = MAX_RETRY_DELAY_S) -> None:
        """FoundationDB's ``timeout`` and ``max_retry_delay`` options (both kept across ``on_error``)."""
        with _mapped(self._fdb):
            if timeout_s is not None:
                # 0 would mean "no timeout": a deadline already reached is 1 ms.
                self._tr.options.set_timeout(max(1, int(timeout_s * 1000)))
            self._tr.options.set_max_retry_delay(max(1, int(max_retry_delay_s * 1000)))

    def on_error(self, error: StoreError) -> None:
        """The binding's ``on_error``: its retryable set, its backoff; raises anything else."""
        with _mapped(self._fdb):
            self._tr.on_error(error.code).wait()
        self._forget_attempt()

    def cancel(self) -> None:
        self._tr.cancel()

    def get_versionstamp(self) -> bytes:
        if self._stamp_future is None:
            raise StoreError(CLIENT_INVALID_OPERATION, "no versionstamp: the transaction has not committed a write")
        with _mapped(self._fdb):
            return self._stamp_future.value

    @property
    def has_writes(self) -> bool:
        return self._has_writes


class FdbStore(Store):
    """A FoundationDB database handle.

    Parameters:
        cluster_file: the cluster file, or None for the default (``FDB_CLUSTER_FILE`` or the
            platform's default path).
        url: the URL it was opened with.
        binding: the ``fdb`` module to use, its API version already selected (None: import
            the binding and select one, :func:`load_fdb`). The tests pass a stand-in for the
            binding and a cluster, or the real binding behind a fence on test keys.

    Raises:
        StoreUnavailable: no binding, no native client, or the database cannot be opened.
    """

    def __init__(self, cluster_file: str | None = None, *, url: str | None = None, binding: ModuleType | None = None) -> None:
        self._fdb = binding if binding is not None else load_fdb()
        self.cluster_file = cluster_file
        self.url = url or f"fdb:{cluster_file or ''}"
        try:
            self._db = self._fdb.open(cluster_file)
        except self._fdb.FDBError as e:
            raise StoreUnavailable(f"cannot open FoundationDB cluster {cluster_file or '(default)'}: {e}") from e

    def create_transaction(self) -> FdbTransaction:
        """A new FoundationDB transaction."""
        with _mapped(self._fdb):
            return FdbTransaction(self._db.create_transaction(), self._fdb)

    def versions(self) -> FdbVersions:
        """Binding, client library and cluster versions (see :func:`describe_versions`)."""
        return describe_versions(self.cluster_file)
