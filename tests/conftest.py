"""Test-suite settings: every simulation checks its invariants; hypothesis budgets by profile.

Profiles: "ci" (default; small budgets so the whole suite stays within minutes) and "fuzz"
(`make fuzz`, or HYPOTHESIS_PROFILE=fuzz): many more examples for the fuzz tests.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from simulator.invariants import ENVIRONMENT_SWITCH

# Inherited by the CLI subprocesses the tests start, too.
os.environ.setdefault(ENVIRONMENT_SWITCH, "1")

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# CI draws the same examples every run (derandomize), so a red build always reproduces;
# `make fuzz` (profile "fuzz") explores new ones.
settings.register_profile(
    "ci", deadline=None, suppress_health_check=_SLOW_OK, derandomize=True, database=None
)
settings.register_profile(
    "fuzz", deadline=None, suppress_health_check=_SLOW_OK, max_examples=2000, print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _cap_memory() -> None:
    """Under `make fuzz` (or with SERVESIM_MEMORY_CAP_MB set) the test process may map at most
    that much memory: an input that makes servesim allocate without bound then fails its test
    with MemoryError instead of taking the machine down. Default cap for the fuzz profile:
    6 GiB (the suite's own processes map well under 1 GiB)."""
    cap_mb = os.environ.get("SERVESIM_MEMORY_CAP_MB")
    if cap_mb is None and os.environ.get("HYPOTHESIS_PROFILE") == "fuzz":
        cap_mb = "6144"
    if not cap_mb:
        return
    try:
        import resource
    except ImportError:  # not on POSIX: no cap
        return
    limit = int(cap_mb) * 2**20
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


_cap_memory()


@pytest.fixture(autouse=True)
def _settings_warnings_said_anew():
    """A settings warning is said once per run (deployment.new_run_warnings); a test that
    resolves a deployment without a run still hears it, whatever ran before it."""
    from simulator.deployment import new_run_warnings

    new_run_warnings()
