"""Keys: traversal, symlinks out of roots, huge, non-UTF-8, NUL, ``cleanup:`` -> accepted inside roots or InvalidKey."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.conftest import Target
from fuzz.fuzzlib import FAST, SOAK_EXAMPLES, fuzz_settings
from smoosh.errors import InvalidKey
from smoosh.daemon.intake.intake import MAX_KEY_BYTES
from smoosh.daemon.intake.router import CLEANUP_PREFIX

COMPONENTS = st.sampled_from(
    ["..", ".", "", "dbs", "inside.db", "escape", "secret.db", "secret-link.db", "slash", "etc", "passwd",
     "sub", "sub-link", "loop", "outside", "state", "jobs.db", "jobs.db-wal", "x.db", "\x00", "..\x00",
     "a" * 300, "\udcff\udcfe", "é", "\ud800", "~", "*", "?"]
) | st.text(max_size=10)


@st.composite
def keys(draw: st.DrawFn, target_base: str) -> str:
    """A key built from hostile path pieces, rooted at the fuzz dir, at /, or relative."""
    start = draw(st.sampled_from([target_base, target_base + "/dbs", "/", "", "dbs", "cleanup:", "cleanup:" + target_base + "/dbs"]))
    parts = draw(st.lists(COMPONENTS, max_size=8))
    key = "/".join([start, *parts]) if parts else start
    if draw(st.integers(0, 20)) == 0:
        key = key + "/" + "x" * draw(st.integers(MAX_KEY_BYTES - 100, MAX_KEY_BYTES + 100))
    if draw(st.booleans()):
        # A file name from bytes that are not UTF-8, as os.fsdecode gives it (surrogateescape).
        key = key + "/" + draw(st.binary(min_size=1, max_size=8)).decode("utf-8", "surrogateescape")
    return key


def key_property(target: Target, key: object) -> None:
    """enqueue accepts the key only if its canonical form lies inside roots; else InvalidKey with a reason."""
    server = target.server
    try:
        canonical = server.canonical_key(key)
        server.validate(canonical)
    except InvalidKey as e:
        assert e.reason, "InvalidKey without a reason"
        with pytest.raises(InvalidKey):
            server.enqueue(key)  # type: ignore[arg-type]
        return
    path = canonical[len(CLEANUP_PREFIX):] if canonical.startswith(CLEANUP_PREFIX) else canonical
    assert os.path.realpath(path) == path, "a canonical key still holds a symlink or '..'"
    root = str(target.root)
    assert os.path.commonpath([path, root]) == root, f"{key!r} accepted outside roots as {canonical!r}"
    assert not path.startswith(str(target.base / "state")), "smoosh's own state accepted"
    server.enqueue(key)  # type: ignore[arg-type]  # must not raise anything


def test_symlinks_and_dotdot_out_of_roots_are_refused(target: Target) -> None:
    root = target.root
    for key in (f"{root}/escape/secret.db", f"{root}/secret-link.db", f"{root}/slash/etc/passwd",
                f"{root}/../outside/secret.db", f"cleanup:{root}/escape/secret.db", f"{root}/sub/../../outside/secret.db"):
        with pytest.raises(InvalidKey, match="outside roots"):
            target.server.enqueue(key)
    with pytest.raises(InvalidKey, match="smoosh's own file|outside roots"):
        target.server.enqueue(str(target.base / "state" / "jobs.db"))
    # Symlinks that stay inside are followed, and the key becomes the real path.
    assert target.server.canonical_key(f"{root}/sub-link/x.db") == f"{root}/sub/x.db"


def test_nul_huge_relative_and_non_utf8_keys_are_refused_with_reasons(target: Target) -> None:
    cases = {
        f"{target.root}/a\x00.db": "NUL",
        f"{target.root}/" + "x" * MAX_KEY_BYTES: "longer than",
        "relative.db": "absolute",
        "": "empty",
        f"{target.root}/" + b"\xff.db".decode("utf-8", "surrogateescape"): "UTF-8",
        "cleanup:relative.db": "absolute",
    }
    for key, reason in cases.items():
        with pytest.raises(InvalidKey, match=reason):
            target.server.enqueue(key)
    with pytest.raises(InvalidKey, match="string"):
        target.server.enqueue(b"/bytes/key.db")  # type: ignore[arg-type]


@fuzz_settings(FAST * 5)
@given(data=st.data())
def test_any_key_is_accepted_only_inside_roots(target: Target, data: st.DataObject) -> None:
    key_property(target, data.draw(keys(str(target.base))))


@fuzz_settings(FAST)
@given(key=st.text(max_size=60) | st.binary(max_size=30).map(lambda b: b.decode("utf-8", "surrogateescape")))
def test_random_text_keys_are_accepted_only_inside_roots(target: Target, key: str) -> None:
    key_property(target, key)


@pytest.mark.slow
@fuzz_settings(SOAK_EXAMPLES * 2)
@given(data=st.data())
def test_any_key_is_accepted_only_inside_roots_soak(target: Target, data: st.DataObject) -> None:
    key_property(target, data.draw(keys(str(target.base))))
