"""Shared pieces of the fuzz suites: hypothesis settings sized for `make test` or `make soak`.

Import as ``from fuzz.fuzzlib import fuzz_settings, FAST, SOAK_EXAMPLES`` (``tests/`` is on
sys.path, see tests/conftest.py). Every property has a bounded variant that runs in
``make test`` and a ``@pytest.mark.slow`` variant with many more examples for ``make soak``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: Whether this run is `make soak` (SMOOSH_SOAK=1): the slow variants run, with more examples.
SOAK = os.environ.get("SMOOSH_SOAK") == "1"

#: Examples per property in `make test` (the whole of tests/fuzz stays well under 30 s).
FAST = 40
#: Examples per property in `make soak`.
SOAK_EXAMPLES = 2000


def fuzz_settings(max_examples: int) -> settings:
    """Hypothesis settings for a smoosh property: no deadline (CI machines stall), no example database.

    The example database is off so a run leaves no ``.hypothesis/`` directory in the checkout;
    a failure prints its minimal example and the ``@reproduce_failure`` blob instead.
    """
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    )
