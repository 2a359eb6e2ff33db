"""The suites' guard on a shared cluster: a test writes under its own fresh prefix, or fails.

Checked through the ``fdb:`` adapter over the stand-in for the binding, so it holds without a
cluster; with one configured the same fence wraps the real binding.
"""

from __future__ import annotations

import pytest

from helpers.fdb_standin import Binding
from helpers.fdb_variants import fresh_raw_prefix, fresh_tuple_prefix
from helpers.key_fence import KeyFence, OutsideTestPrefix, fenced, refuse_unfenced_stores
from smoosh.jobs import Jobs
from smoosh.jobs.layer import DEFAULT_PREFIX
from smoosh.store import tuples
from smoosh.store.errors import StoreError
from smoosh.store.fdb import FdbStore


def _cluster_keys(binding: Binding) -> list[bytes]:
    return [k for k, _ in binding.cluster.store.create_transaction().get_range(b"", b"\xff")]


@pytest.mark.parametrize("prefix", [DEFAULT_PREFIX, b"", b"smoosh-test/", tuples.pack(("smoosh-test",)), b"app/"],
                         ids=["jobs-default", "root", "bare-raw-namespace", "bare-tuple-namespace", "other"])
def test_the_fence_refuses_any_prefix_but_a_fresh_test_one(prefix: bytes) -> None:
    with pytest.raises(OutsideTestPrefix) as e:
        KeyFence(prefix)
    assert str(e.value) == (f"test prefix {prefix!r} is not a fresh prefix under smoosh-test: on a cluster it "
                            "could touch a live deployment's keys")
    KeyFence(fresh_raw_prefix())
    KeyFence(fresh_tuple_prefix())


def test_a_job_layer_on_the_default_prefix_fails_before_writing_anything() -> None:
    binding = Binding()
    store = FdbStore(None, binding=fenced(binding, fresh_tuple_prefix()))
    jobs = Jobs(store, monitors=False)
    with pytest.raises(OutsideTestPrefix) as e:
        jobs.set_type_timeout("t", 30)
    assert "outside its prefix" in str(e.value)
    jobs.close()
    assert _cluster_keys(binding) == []


def test_writes_at_the_root_fail_and_writes_under_the_prefix_go_through() -> None:
    binding = Binding()
    prefix = fresh_raw_prefix()
    store = FdbStore(None, binding=fenced(binding, prefix))
    with pytest.raises(OutsideTestPrefix) as e:
        store.transact(lambda tr: tr.set(b"app/doc1", b"{}"))
    assert str(e.value) == (f"test wrote b'app/doc1' outside its prefix {prefix!r}: on a cluster it would stay "
                            "behind, or touch a live deployment's keys")
    with pytest.raises(OutsideTestPrefix):
        store.transact(lambda tr: tr.clear_range(prefix, b"\xfe"))
    with pytest.raises(OutsideTestPrefix):
        store.transact(lambda tr: tr.add(b"counter", b"\x01"))
    store.transact(lambda tr: (tr.set(prefix + b"a", b"1"), tr.add(prefix + b"n", b"\x01")))
    assert _cluster_keys(binding) == [prefix + b"a", prefix + b"n"]


def test_keys_the_client_refuses_itself_pass_the_fence_to_be_refused() -> None:
    store = FdbStore(None, binding=fenced(Binding(), fresh_raw_prefix()))
    with pytest.raises(StoreError) as e:
        store.transact(lambda tr: tr.set(b"\xff/x", b""))
    assert e.value.code == 2004


def test_with_a_cluster_configured_an_unfenced_store_fails_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_unfenced_stores(monkeypatch)
    with pytest.raises(OutsideTestPrefix) as e:
        FdbStore("/etc/foundationdb/fdb.cluster", binding=Binding())
    assert "without the key fence" in str(e.value)
    FdbStore("/etc/foundationdb/fdb.cluster", binding=fenced(Binding(), fresh_raw_prefix()))
