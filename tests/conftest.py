"""Suite-wide pytest setup: slow soak/fault variants run only under `make soak` (SMOOSH_SOAK=1)."""

from __future__ import annotations

import os

import pytest

SOAK = os.environ.get("SMOOSH_SOAK") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SOAK:
        return
    skip_slow = pytest.mark.skip(reason="slow soak variant: run `make soak` (SMOOSH_SOAK=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


# Shared test helpers (tests/helpers/…) are importable as `helpers.…` from every test directory.
import sys  # noqa: E402

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
