"""Test-suite settings: every simulation checks its invariants; hypothesis budgets by profile.

Profiles: "ci" (default; small budgets so the whole suite stays within minutes) and "fuzz"
(`make fuzz`, or HYPOTHESIS_PROFILE=fuzz): many more examples for the fuzz tests.
"""

from __future__ import annotations

import os

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
