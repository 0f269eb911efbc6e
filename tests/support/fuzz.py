"""The fuzz suites' seed and settings: every run draws new inputs from a seed it prints
(the report header: ``fuzz seed N``), and ``MEANCACHE_FUZZ_SEED=N`` replays that run.
CI runs a small share (``FUZZ_EXAMPLES``); benchmarks/fuzz_servers.py runs thousands."""

import os
import secrets
from collections.abc import Callable
from typing import TypeVar

from hypothesis import HealthCheck, seed, settings

FUZZ_SEED = int(os.environ.get("MEANCACHE_FUZZ_SEED") or secrets.randbits(32))
FUZZ_EXAMPLES = 60  # per property in CI: the benchmark runs the thousands

T = TypeVar("T", bound=Callable[..., object])


def fuzzed(max_examples: int = FUZZ_EXAMPLES) -> Callable[[T], T]:
    """Hypothesis settings for a fuzz property: drawn from FUZZ_SEED (not derandomised, so
    each run differs), no deadline (servers on loopback on a shared machine)."""
    def decorate(test: T) -> T:
        configured = settings(max_examples=max_examples, deadline=None, derandomize=False,
                              suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.function_scoped_fixture,
                                                     HealthCheck.data_too_large,
                                                     HealthCheck.filter_too_much])(test)
        return seed(FUZZ_SEED)(configured)

    return decorate
