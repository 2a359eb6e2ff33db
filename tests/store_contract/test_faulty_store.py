"""The fault-injecting store: its URL, and that its faults strike before and after real commits."""

from __future__ import annotations

import pytest

from smoosh.store import open_store
from smoosh.store.errors import StoreError, StoreUnavailable
from smoosh.store.faulty import AFTER_COMMIT_CODES, BEFORE_COMMIT_CODES, READ_FAULT_WINDOW, FaultyStore, parse_url
from smoosh.store.memory import MemoryStore


@pytest.fixture(params=["memory", "sqlite"])
def inner_url(request, tmp_path):
    return "memory:" if request.param == "memory" else f"sqlite:{tmp_path / 'jobs.db'}"


def _read(store, key):
    return store.create_transaction().get(key)  # a direct transaction: never faulty


@pytest.mark.parametrize(
    ("rest", "expected"),
    [
        ("42:memory:", (42, 0.1, "memory:")),
        ("7:0.25:sqlite:/tmp/x/jobs.db", (7, 0.25, "sqlite:/tmp/x/jobs.db")),
        ("1:0:fdb:", (1, 0.0, "fdb:")),
        ("-3:1:fdb:/etc/fdb.cluster", (-3, 1.0, "fdb:/etc/fdb.cluster")),
    ],
)
def test_url_names_seed_optional_rate_and_inner_store(rest, expected):
    assert parse_url(rest) == expected


@pytest.mark.parametrize("url", ["faulty:", "faulty:x:memory:", "faulty:1", "faulty:1:2:memory:", "faulty:1:memory"])
def test_malformed_faulty_urls_are_unavailable(url):
    with pytest.raises(StoreUnavailable) as e:
        open_store(url)
    assert url in str(e.value)


def test_open_store_wraps_the_inner_url_and_closes_it(inner_url):
    store = open_store(f"faulty:5:0.5:{inner_url}")
    assert isinstance(store, FaultyStore)
    assert (store.seed, store.rate, store.inner.url) == (5, 0.5, inner_url)
    store.close()
    with pytest.raises(StoreError):
        store.inner.create_transaction().get(b"k")


def test_fault_after_commit_leaves_the_write_really_committed(inner_url):
    # Given a store whose every write commit fails after committing
    with FaultyStore(open_store(inner_url), seed=1, rate=1.0, after_share=1.0) as store:
        # When a transaction is run without retries
        with pytest.raises(StoreError) as e:
            store.transact(lambda tr: tr.set(b"k", b"v"), retry_limit=0)
        # Then the caller hears "may have committed", and the write is there
        assert e.value.code in AFTER_COMMIT_CODES and e.value.maybe_committed
        assert "[injected after a real commit]" in str(e.value)
        assert _read(store, b"k") == b"v"
        assert sum(store.faults.after_commit.values()) == 1


def test_fault_before_commit_leaves_nothing_written(inner_url):
    with FaultyStore(open_store(inner_url), seed=1, rate=1.0, after_share=0.0) as store:
        with pytest.raises(StoreError) as e:
            store.transact(lambda tr: tr.set(b"k", b"v"), retry_limit=0)
        assert e.value.code in BEFORE_COMMIT_CODES
        assert _read(store, b"k") is None


def test_blind_add_under_after_commit_faults_is_counted_once_per_real_commit():
    # The hazard the job layer's transaction ids exist for: a retry re-runs a body whose
    # earlier run did commit, so a blind add lands once per real commit.
    inner = MemoryStore()
    store = FaultyStore(inner, seed=9, rate=0.5, after_share=1.0, max_retry_delay_s=0.001)
    for _ in range(200):
        store.transact(lambda tr: tr.add(b"n", (1).to_bytes(4, "little")))
    after = sum(store.faults.after_commit.values())
    assert after > 0
    assert int.from_bytes(_read(store, b"n"), "little") == 200 + after


def test_read_only_commits_and_direct_transactions_are_never_faulted(inner_url):
    with FaultyStore(open_store(inner_url), seed=3, rate=1.0, read_rate=0.0) as store:
        assert store.transact(lambda tr: tr.get(b"k")) is None  # read-only: commits nothing
        tr = store.create_transaction()
        tr.set(b"k", b"v")
        tr.commit()  # outside transact: passed through
        assert store.faults.total() == 0


def test_a_read_fault_strikes_one_of_the_first_reads_of_a_transaction(inner_url):
    with FaultyStore(open_store(inner_url), seed=4, rate=0.0, read_rate=1.0) as store:
        with pytest.raises(StoreError) as e:
            store.transact(lambda tr: [tr.snapshot.get(b"k") for _ in range(READ_FAULT_WINDOW)], retry_limit=0)
        assert e.value.code in (1007, 1009, 1031)
        assert "[injected on a read]" in str(e.value)
    # At most one fault per attempt, whatever its size: a transaction of many reads commits.
    with FaultyStore(open_store(inner_url), seed=4, rate=0.0, read_rate=0.5, max_retry_delay_s=0.001) as store:
        for _ in range(10):
            assert store.transact(lambda tr: len([tr.get(b"k%d" % i) for i in range(1000)])) == 1000
        assert 0 < sum(store.faults.reads.values()) == store.retry_stats.retries


def test_the_same_seed_injects_the_same_faults():
    def run(seed):
        store = FaultyStore(MemoryStore(), seed=seed, rate=0.4, max_retry_delay_s=0.001)
        codes = []
        for i in range(50):
            store.transact(lambda tr, i=i: tr.set(b"k%d" % i, b""), on_retry=lambda e: codes.append(e.code))
        return codes

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_every_transact_still_commits_exactly_the_writes_of_one_attempt_under_faults(inner_url):
    with FaultyStore(open_store(inner_url), seed=6, rate=0.5, max_retry_delay_s=0.001) as store:
        for i in range(100):
            store.transact(lambda tr, i=i: [tr.clear_range(b"k", b"l"), tr.set(b"k%03d" % i, b"")])
        keys = [k for k, _ in store.create_transaction().get_range(b"k", b"l")]
        assert keys == [b"k099"]
        stats = store.retry_stats.snapshot()
        assert stats["retries"] > 0 and stats["gave_up"] == 0
