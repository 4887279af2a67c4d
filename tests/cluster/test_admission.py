"""Admission policies (docs/behaviour.md §6.3): token-bucket arithmetic, defaults, validation,
registry."""

from __future__ import annotations

import math

import pytest

from simulator.cluster.admission import (
    ADMISSION_POLICIES,
    TokenBucket,
    make_admission_policy,
)
from simulator.engine.request import Request
from simulator.errors import ConfigError


def req(tokens: int) -> Request:
    return Request(f"r{tokens}", 0, tokens, 10)


def test_registry_names():
    assert sorted(ADMISSION_POLICIES) == ["always-admit", "reject-all", "token-bucket"]


def test_always_admit_and_reject_all():
    assert make_admission_policy("always-admit").admit(req(10**9), 0, [])[0] is True
    admitted, reason = make_admission_policy("reject-all").admit(req(1), 0, [])
    assert admitted is False
    assert reason == "reject-all"


def test_token_bucket_sequence():
    # capacity 100 tokens, refill 10 tokens/s; starts full with last refill at t = 0.
    tb = make_admission_policy(
        "token-bucket", token_bucket_capacity=100, token_bucket_refill_rate=10
    )
    steps = [
        # (now_us, cost, admitted, tokens left)
        (0, 60, True, 40.0),
        (0, 50, False, 40.0),  # 40 < 50: rejected, nothing taken
        (1_000_000, 50, True, 0.0),  # +10 -> 50
        (1_500_000, 6, False, 5.0),  # +5 -> 5 < 6
        (2_100_000, 11, True, 0.0),  # +6 -> 11, refill counted from the rejection at 1.5 s
        (100_000_000, 100, True, 0.0),  # refill capped at capacity 100
        (100_000_000, 1, False, 0.0),
    ]
    for now_us, cost, admitted, left in steps:
        got, _ = tb.admit(req(cost), now_us, [])
        assert got is admitted, (now_us, cost)
        assert tb.tokens == pytest.approx(left), (now_us, cost)


def test_token_bucket_admits_exact_balance():
    tb = TokenBucket(50, 1)
    assert tb.admit(req(50), 0, [])[0]
    assert tb.tokens == 0


def test_a_refusal_never_shows_the_balance_at_the_cost():
    """Capacity 250, refill 500 tokens/s, 100-token prompts: two admitted at 0 leave 50; at
    99.997 ms the bucket holds 50 + 500 x 0.099997 = 99.9985 < 100. The reason showed that
    rounded to 100.0 ('100.0 < 100'); rounded down it reads 99.9."""
    tb = TokenBucket(250, 500)
    assert tb.admit(req(100), 0, [])[0] and tb.admit(req(100), 0, [])[0]
    admitted, reason = tb.admit(req(100), 99_997, [])
    assert not admitted
    assert reason == "token-bucket: insufficient tokens (99.9 < 100)"


def test_token_bucket_settings_without_its_policy_are_warned_about(caplog):
    import logging

    import simulator

    scenario = {
        "workload": {"num_requests": 3, "rate": 10},
        "cluster": {"admission": {"token_bucket_capacity": 10, "token_bucket_refill_rate": 1}},
    }
    with caplog.at_level(logging.WARNING, logger="servesim"):
        simulator.simulate(scenario)
    assert (
        "admission.token_bucket_capacity is set but the admission policy 'always-admit' does "
        "not read it"
    ) in caplog.text


def test_token_bucket_must_be_sized_explicitly():
    """servesim decision: no silent 10,000 / 1,000 defaults (BLIS's) for the bucket."""
    with pytest.raises(ConfigError, match="token_bucket_capacity.*needs it"):
        make_admission_policy("token-bucket")
    with pytest.raises(ConfigError, match="token_bucket_refill_rate.*needs it"):
        make_admission_policy("token-bucket", token_bucket_capacity=5)
    tb = make_admission_policy("token-bucket", token_bucket_capacity=5, token_bucket_refill_rate=7)
    assert isinstance(tb, TokenBucket)
    assert (tb.capacity_tokens, tb.refill_rate_tokens_per_s) == (5, 7)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True, "10"])
def test_token_bucket_validation(bad):
    with pytest.raises(ConfigError, match="token_bucket_capacity"):
        make_admission_policy("token-bucket", token_bucket_capacity=bad, token_bucket_refill_rate=1)
    with pytest.raises(ConfigError, match="token_bucket_refill_rate"):
        make_admission_policy("token-bucket", token_bucket_capacity=1, token_bucket_refill_rate=bad)


def test_unknown_admission_policy():
    with pytest.raises(ConfigError) as exc:
        make_admission_policy("maybe")
    assert str(exc.value) == (
        "unknown admission policy 'maybe'; valid: always-admit, reject-all, token-bucket"
    )
