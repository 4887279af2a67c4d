"""Arrival processes: realised rate, inter-arrival CV, constant spacing, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.workload.arrivals import (
    GammaArrivals,
    PoissonArrivals,
    make_arrivals,
    weibull_cv,
    weibull_shape_for_cv,
)

N_GAPS = 50_000
RATE_PER_S = 10.0  # mean gap 100 ms: the 1 µs floor barely touches the laws


def _gaps(name: str, cv: float | None = None, seed: int = 7) -> np.ndarray:
    return make_arrivals(name, RATE_PER_S, cv).gaps_us(np.random.default_rng(seed), N_GAPS)


@pytest.mark.parametrize(
    ("name", "cv"),
    [
        ("poisson", None),
        ("constant", None),
        ("gamma", 0.5),
        ("gamma", 2.0),
        ("weibull", 0.5),
        ("weibull", 2.0),
    ],
)
def test_realised_rate(name: str, cv: float | None) -> None:
    gaps = _gaps(name, cv)
    assert gaps.dtype == np.int64
    assert gaps.min() >= 1
    rate = N_GAPS / (gaps.sum() / 1e6)
    # Gamma cv 2 has a gap sd of 2 means: the sum of 50k gaps is within ~1 % at 1 sigma.
    assert rate == pytest.approx(RATE_PER_S, rel=0.03)


@pytest.mark.parametrize(
    ("name", "cv"),
    [
        ("poisson", None),
        ("gamma", 0.5),
        ("gamma", 2.0),
        ("gamma", 4.0),
        ("weibull", 0.5),
        ("weibull", 2.0),
    ],
)
def test_inter_arrival_cv(name: str, cv: float | None) -> None:
    gaps = _gaps(name, cv).astype(float)
    if cv == 4.0:
        # Heavy right tail: the sample CV converges slowly, so pool several streams.
        gaps = np.concatenate([_gaps(name, cv, seed=s) for s in range(8)]).astype(float)
    target = 1.0 if cv is None else cv
    assert gaps.std() / gaps.mean() == pytest.approx(target, rel=0.05)


def test_gamma_mean_for_cv4() -> None:
    gaps = np.concatenate([_gaps("gamma", 4.0, seed=s) for s in range(8)])
    assert gaps.mean() == pytest.approx(1e6 / RATE_PER_S, rel=0.03)


def test_constant_spacing_is_exact() -> None:
    gaps = make_arrivals("constant", 3.0).gaps_us(np.random.default_rng(0), 1000)
    assert set(gaps.tolist()) == {333_333}
    times = make_arrivals("constant", 3.0).arrival_times_us(np.random.default_rng(0), 3)
    assert times.tolist() == [333_333, 666_666, 999_999]


@pytest.mark.parametrize(
    "rate_per_s, gap_us",
    [
        # 10 / 1e6 is 1.0000000000000001e-05 in binary, so its inverse falls just short of
        # 100,000 and floors to 99,999: BLIS's gaps (both releases, measured side by side).
        (10.0, 99_999),
        (7.0, 142_857),
        (3.0, 333_333),
        # A third of 50 req/s, as BLIS normalises a fraction (50 * (1 / 3)), is 60,000 µs
        # apart; 50 * 1 / 3 would give 59,999.
        (50.0 * (1.0 / 3.0), 60_000),
    ],
)
def test_constant_gaps_are_blis_floor_of_one_over_the_rate_per_us(rate_per_s, gap_us) -> None:
    gaps = make_arrivals("constant", rate_per_s).gaps_us(np.random.default_rng(0), 4)
    assert gaps.tolist() == [gap_us] * 4
    assert gap_us == int(1.0 / (rate_per_s / 1e6))  # the formula, in BLIS's float steps


def test_a_clients_rate_is_normalised_as_blis_does() -> None:
    from simulator.workload.generator import WorkloadStream
    from simulator.workload.spec import workload_spec_from_dict

    client = {
        "rate_fraction": 1.0,
        "arrival": {"process": "constant"},
        "input_distribution": {"type": "constant", "params": {"value": 100}},
        "output_distribution": {"type": "constant", "params": {"value": 3}},
    }
    spec = {
        "version": "2",
        "aggregate_rate": 50,
        "num_requests": 6,
        "clients": [{**client, "id": f"c{i}"} for i in range(3)],
    }
    arrivals = [r.arrival_us for r in WorkloadStream(workload_spec_from_dict(spec), seed=1)]
    assert arrivals == [60_000] * 3 + [120_000] * 3


def test_very_high_rate_floors_at_one_us() -> None:
    assert set(make_arrivals("constant", 5e6).gaps_us(np.random.default_rng(0), 10)) == {1}
    assert make_arrivals("poisson", 5e6).gaps_us(np.random.default_rng(0), 1000).min() == 1


def test_default_cv_is_one() -> None:
    gamma = make_arrivals("gamma", 1.0)
    assert isinstance(gamma, GammaArrivals)
    assert gamma.shape == 1.0
    weibull = make_arrivals("weibull", 1.0)
    assert weibull.shape_k == pytest.approx(1.0, abs=0.01)


def test_gamma_tiny_shape_falls_back_to_poisson() -> None:
    gamma = make_arrivals("gamma", 10.0, cv=11.0)  # shape 1/121 < 0.01
    assert gamma.falls_back_to_poisson
    gaps = gamma.gaps_us(np.random.default_rng(1), N_GAPS).astype(float)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_a_fitted_gamma_law_is_sampled_as_given_however_small_its_shape() -> None:
    """The Poisson fallback is for a cv too large to sample; a fitted shape 0.005 with scale
    2e7 µs has mean gap shape x scale = 1e5 µs and CV 1/sqrt(0.005) ~ 14, whatever the rate
    (QA: it became Poisson at the rate, a mean gap of 1e6 µs and CV 1)."""
    gamma = make_arrivals("gamma", 1.0, shape=0.005, scale_us=2e7)
    assert not gamma.falls_back_to_poisson
    gaps = gamma.gaps_us(np.random.default_rng(1), 200_000).astype(float)
    assert gaps.mean() == pytest.approx(0.005 * 2e7, rel=0.15)
    assert gaps.std() / gaps.mean() > 8


def test_same_seed_same_gaps() -> None:
    a = _gaps("weibull", 2.0, seed=3)
    b = _gaps("weibull", 2.0, seed=3)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("cv", [0.01, 0.3, 1.0, 3.0, 10.4])
def test_weibull_shape_solves_cv(cv: float) -> None:
    assert weibull_cv(weibull_shape_for_cv(cv)) == pytest.approx(cv, abs=0.002)


def test_unknown_process_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="unknown arrival process 'bursty'.*gamma.*weibull"):
        make_arrivals("bursty", 1.0)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_rate(rate: float) -> None:
    with pytest.raises(ConfigError, match="rate"):
        PoissonArrivals(rate)


def test_bad_cv() -> None:
    with pytest.raises(ConfigError, match="arrival.cv"):
        make_arrivals("gamma", 1.0, cv=-1.0)
    with pytest.raises(ConfigError, match=r"arrival.cv.*\[0.01, 10.4\]"):
        make_arrivals("weibull", 1.0, cv=20.0)
