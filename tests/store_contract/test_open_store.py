"""Opening stores by URL, and the error when FoundationDB's client is missing."""

from __future__ import annotations

import ctypes.util
import os

import pytest

from smoosh.store import open_store
from smoosh.store.errors import StoreUnavailable


@pytest.mark.parametrize("url", ["nothing", "redis://x", "sqlite:"])
def test_bad_urls_are_unavailable(url):
    with pytest.raises(StoreUnavailable):
        open_store(url)


@pytest.mark.skipif(
    bool(os.environ.get("SMOOSH_TEST_FDB_CLUSTER")) or ctypes.util.find_library("fdb_c") is not None,
    reason="the FoundationDB client library is installed here",
)
def test_fdb_without_the_native_client_names_what_to_install():
    with pytest.raises(StoreUnavailable) as e:
        open_store("fdb:")
    assert "install smoosh-compactor[fdb] and the FoundationDB client library (libfdb_c)" in str(e.value)


def test_a_sqlite_store_creates_its_directory(tmp_path) -> None:
    from smoosh.store import open_store

    with open_store(f"sqlite:{tmp_path / 'new' / 'dir' / 'jobs.db'}") as store:
        store.transact(lambda tr: tr.set(b"k", b"v"))
    assert (tmp_path / "new" / "dir" / "jobs.db").exists()
