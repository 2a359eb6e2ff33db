"""FoundationDB versions without a cluster: which API version is selected for which binding and
client library, what describe_versions reports, and the adapter's on_error and options.

A fake ``fdb`` module (tests/helpers/fake_fdb.py) stands in for the binding: no libfdb_c can be
installed here.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from helpers.fake_fdb import FakeBinding, install_fake_fdb
from smoosh.store import fdb as fdb_store
from smoosh.store.errors import StoreError, StoreUnavailable


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch):
    def put(binding: FakeBinding | None, *, impl_missing: bool = False) -> None:
        install_fake_fdb(monkeypatch, binding, impl_missing=impl_missing)

    return put


@pytest.mark.parametrize(
    ("binding", "library", "chosen"),
    [(710, 710, 710), (710, 730, 710), (710, 800, 710), (730, 730, 730), (730, 800, 730), (800, 800, 800)],
)
def test_the_highest_api_version_both_sides_support_is_chosen(binding: int, library: int, chosen: int) -> None:
    assert fdb_store.choose_api_version(binding, library) == chosen


@pytest.mark.parametrize(("binding", "library", "pin"), [(800, 730, "7.3"), (800, 710, "7.1"), (730, 710, "7.1")])
def test_a_library_older_than_the_binding_is_refused_naming_the_binding_to_install(binding: int, library: int, pin: str) -> None:
    with pytest.raises(StoreUnavailable) as e:
        fdb_store.choose_api_version(binding, library)
    assert f"pip install 'foundationdb=={pin}.*'" in str(e.value)
    assert f"supports at most {library}" in str(e.value)


def test_the_71_binding_has_no_latest_api_version_and_selects_710_on_an_80_library(install) -> None:
    binding = FakeBinding(None, 800)
    install(binding)
    assert fdb_store.load_fdb() is binding
    assert binding.selected == 710


def test_the_73_binding_on_an_80_library_selects_730(install) -> None:
    binding = FakeBinding(730, 800)
    install(binding)
    fdb_store.load_fdb()
    assert binding.selected == 730


def test_the_80_binding_on_a_73_library_is_unavailable_before_selecting_anything(install) -> None:
    binding = FakeBinding(800, 730)
    install(binding)
    with pytest.raises(StoreUnavailable) as e:
        fdb_store.load_fdb()
    assert "foundationdb==7.3.*" in str(e.value)
    assert binding.selected is None


def test_a_missing_client_library_names_what_to_install(install) -> None:
    install(FakeBinding(710, 710), impl_missing=True)
    with pytest.raises(StoreUnavailable) as e:
        fdb_store.load_fdb()
    assert fdb_store.INSTALL_HINT in str(e.value)


def test_a_missing_binding_names_what_to_install(install) -> None:
    install(None)
    with pytest.raises(StoreUnavailable) as e:
        fdb_store.load_fdb()
    assert fdb_store.INSTALL_HINT in str(e.value)


def test_an_api_version_selected_elsewhere_below_710_is_refused(install) -> None:
    binding = FakeBinding(710, 730)
    binding.selected = 630
    install(binding)
    with pytest.raises(StoreUnavailable) as e:
        fdb_store.load_fdb()
    assert "630" in str(e.value)


def test_describe_versions_reports_binding_client_and_cluster(install) -> None:
    binding = FakeBinding(710, 730, client="7.3.43,0123abcd,fdb00b073000000")
    binding.status = {"cluster": {"processes": {"a": {"version": "7.3.43"}, "b": {"version": "7.3.41"}, "c": {}}}}
    install(binding)
    v = fdb_store.describe_versions("/etc/foundationdb/fdb.cluster")
    assert (v.binding, v.binding_api_version, v.api_version) == ("7.1.67", 710, 710)
    assert (v.client_library, v.client_max_api_version) == ("7.3.43", 730)
    assert v.server_versions == ["7.3.41", "7.3.43"]
    assert v.cluster_error is None


def test_describe_versions_reports_an_unreachable_cluster_instead_of_raising(install) -> None:
    binding = FakeBinding(710, 710, client="7.1.27,ff,fdb00b071010000")
    binding.status = RuntimeError("Operation aborted because the transaction timed out")
    install(binding)
    v = fdb_store.describe_versions()
    assert v.client_library == "7.1.27"
    assert v.server_versions is None
    assert "timed out" in (v.cluster_error or "")
    assert fdb_store.describe_versions(ask_cluster=False).cluster_error is None


class FakeFDBError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"error {code}")
        self.code = code


class FakeTr:
    """The binding's transaction as the adapter uses it for retries."""

    RETRYABLE = {1007, 1009, 1020, 1021, 1037, 1038, 1039}

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        outer = self

        class Options:
            def set_timeout(self, ms: int) -> None:
                outer.calls.append(("timeout", ms))

            def set_max_retry_delay(self, ms: int) -> None:
                outer.calls.append(("max_retry_delay", ms))

        self.options = Options()
        self.snapshot = self

    def on_error(self, code: int) -> Any:
        self.calls.append(("on_error", code))

        class Future:
            def wait(self) -> None:
                if code not in FakeTr.RETRYABLE:
                    raise FakeFDBError(code)

        return Future()

    def set(self, key: bytes, value: bytes) -> None:
        self.calls.append(("set", key))


def _adapter() -> tuple[Any, FakeTr]:
    fake = types.SimpleNamespace(FDBError=FakeFDBError)
    tr = FakeTr()
    return fdb_store.FdbTransaction(tr, fake), tr  # type: ignore[arg-type]


def test_on_error_goes_to_the_binding_and_forgets_the_attempt() -> None:
    tr, raw = _adapter()
    tr.set(b"k", b"v")
    assert tr.has_writes
    tr.on_error(StoreError(1020))
    assert raw.calls[-1] == ("on_error", 1020)
    assert not tr.has_writes


def test_an_error_the_binding_does_not_retry_comes_back_with_its_code() -> None:
    tr, _ = _adapter()
    with pytest.raises(StoreError) as e:
        tr.on_error(StoreError(1031))
    assert e.value.code == 1031


def test_retry_options_become_the_transactions_timeout_and_max_retry_delay() -> None:
    tr, raw = _adapter()
    tr.set_retry_options(timeout_s=59.5, max_retry_delay_s=0.25)
    assert raw.calls == [("timeout", 59500), ("max_retry_delay", 250)]
    tr.set_retry_options(timeout_s=0.0)  # a deadline already reached: 1 ms, never 0 (= none)
    assert raw.calls[-2] == ("timeout", 1)


def test_a_binding_error_becomes_a_store_error_with_the_libraries_description_once() -> None:
    # The 7.1 binding's description is the C library's bytes, and its str() already ends in
    # the code: the StoreError must read like every other store's, not "b'...' (1039) (1039)".
    from helpers.fdb_standin import FDBError

    with pytest.raises(StoreError) as e:
        with fdb_store._mapped(types.SimpleNamespace(FDBError=FDBError)):  # type: ignore[arg-type]
            raise FDBError(1039)
    assert (e.value.code, str(e.value)) == (1039, "The protocol version of the cluster has changed (1039)")
