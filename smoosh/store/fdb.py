"""``fdb:`` / ``fdb:CLUSTER_FILE`` — FoundationDB through the official binding, wrapped 1:1.

The seam mirrors FoundationDB's own transaction API, so this module only converts: our
:class:`~smoosh.store.base.KeySelector` to ``fdb.KeySelector``, futures to values,
``fdb.FDBError`` to :class:`~smoosh.store.errors.StoreError` with the same code, and watch
futures to :class:`~smoosh.store.base.Watch`. ``fdb`` is imported lazily, and the API version
is selected once per process (the binding allows nothing else).
"""

from __future__ import annotations

import contextlib
import threading
from types import ModuleType
from typing import Any, Iterator

from smoosh.store.base import KeySelector, ReadView, Store, Transaction, Watch
from smoosh.store.errors import CLIENT_INVALID_OPERATION, StoreError, StoreUnavailable

#: The FoundationDB API version smoosh is written against (lowered to the binding's latest if older).
API_VERSION = 710
#: What to do when the binding or the native client is missing.
INSTALL_HINT = "install smoosh[fdb] and the FoundationDB client library (libfdb_c)"

_api_lock = threading.Lock()


def load_fdb() -> ModuleType:
    """Import ``fdb`` and select the API version (once per process).

    Raises:
        StoreUnavailable: the binding or the native client library is missing or unusable.
    """
    try:
        import fdb
    except ImportError as e:
        raise StoreUnavailable(f"FoundationDB binding not installed: {INSTALL_HINT}") from e
    with _api_lock:
        if not fdb.is_api_version_selected():
            try:
                fdb.api_version(min(API_VERSION, fdb.LATEST_API_VERSION))
            except Exception as e:  # the binding raises a bare Exception when libfdb_c is missing
                raise StoreUnavailable(f"FoundationDB client unusable ({e}): {INSTALL_HINT}") from e
    return fdb


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


@contextlib.contextmanager
def _mapped(fdb: ModuleType) -> Iterator[None]:
    try:
        yield
    except fdb.FDBError as e:
        raise StoreError(e.code, str(e)) from e


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
        self._has_writes = False
        self._stamp_future = None

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

    Raises:
        StoreUnavailable: no binding, no native client, or the database cannot be opened.
    """

    def __init__(self, cluster_file: str | None = None, *, url: str | None = None) -> None:
        self._fdb = load_fdb()
        self.url = url or f"fdb:{cluster_file or ''}"
        try:
            self._db = self._fdb.open(cluster_file)
        except self._fdb.FDBError as e:
            raise StoreUnavailable(f"cannot open FoundationDB cluster {cluster_file or '(default)'}: {e}") from e

    def create_transaction(self) -> FdbTransaction:
        """A new FoundationDB transaction."""
        with _mapped(self._fdb):
            return FdbTransaction(self._db.create_transaction(), self._fdb)
