"""Length distributions: means, clamps, mixtures, empirical tables (inline and file)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.workload.lengths import (
    ConstantLength,
    EmpiricalLength,
    GaussianLength,
    from_dist_spec,
    make_length,
    ratio_from_dist_spec,
)
from simulator.workload.spec import DistSpec

N = 50_000


def _rng(seed: int = 11) -> np.random.Generator:
    return np.random.default_rng(seed)


def _dist(type_: str, **params: float) -> DistSpec:
    return DistSpec(type=type_, params=params)


def test_legacy_constructors_still_work() -> None:
    assert make_length("constant", value=7).sample(_rng(), 3).tolist() == [7, 7, 7]
    g = make_length("gaussian", mean=100, stdev=10, min=90, max=110)
    values = g.sample(_rng(), N)
    assert values.min() >= 90 and values.max() <= 110


def test_gaussian_clamped_and_mean() -> None:
    law = from_dist_spec(_dist("gaussian", mean=256, std_dev=100, min=2, max=800))
    values = law.sample(_rng(), N)
    assert values.dtype == np.int64
    assert values.min() >= 2 and values.max() <= 800
    assert values.mean() == pytest.approx(256, rel=0.01)
    assert values.std() == pytest.approx(100, rel=0.03)


def test_gaussian_clamps_pile_up_at_bounds() -> None:
    law = from_dist_spec(_dist("gaussian", mean=100, std_dev=100, min=50, max=120))
    values = law.sample(_rng(), N)
    assert set(np.unique(values)) <= set(range(50, 121))
    # P(X < 50) = Φ(-0.5) ≈ 0.31, P(X > 120) = 1 − Φ(0.2) ≈ 0.42
    assert (values == 50).mean() == pytest.approx(0.31, abs=0.01)
    assert (values == 120).mean() == pytest.approx(0.42, abs=0.01)


def test_gaussian_min_equals_max_is_constant() -> None:
    law = from_dist_spec(_dist("gaussian", mean=500, std_dev=50, min=64, max=64))
    assert set(law.sample(_rng(), 100).tolist()) == {64}


def test_gaussian_floor_is_one() -> None:
    law = from_dist_spec(_dist("gaussian", mean=0, std_dev=1, min=0, max=3))
    assert law.sample(_rng(), N).min() == 1


def test_exponential_mean() -> None:
    values = from_dist_spec(_dist("exponential", mean=300)).sample(_rng(), N)
    assert values.min() >= 1
    assert values.mean() == pytest.approx(300, rel=0.02)


def test_pareto_lognormal_mixture() -> None:
    params = {"alpha": 2.5, "xm": 100, "mu": 5.0, "sigma": 0.5, "mix_weight": 0.3}
    law = from_dist_spec(DistSpec(type="pareto_lognormal", params=params))
    values = law.sample(_rng(), N)
    assert values.min() >= 1
    # 0.3 · 2.5·100/1.5 + 0.7 · exp(5.125) ≈ 50 + 117.7
    expected = 0.3 * 2.5 * 100 / 1.5 + 0.7 * np.exp(5.0 + 0.125)
    assert law.mean == pytest.approx(expected)
    assert values.mean() == pytest.approx(expected, rel=0.05)
    # Pareto draws never fall below xm: the share below 100 comes from the lognormal only.
    # P(lognormal < 99.5) = Φ((ln 99.5 − 5) / 0.5) (values are rounded).
    z = (np.log(99.5) - 5.0) / 0.5
    phi = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    assert (values < 100).mean() == pytest.approx(0.7 * phi, abs=0.01)


def test_pareto_only_and_lognormal_only() -> None:
    pareto = from_dist_spec(_dist("pareto_lognormal", alpha=3, xm=50, mu=0, sigma=1, mix_weight=1))
    assert pareto.sample(_rng(), N).min() >= 50
    logn = from_dist_spec(_dist("pareto_lognormal", alpha=3, xm=50, mu=4, sigma=0, mix_weight=0))
    assert set(logn.sample(_rng(), 100).tolist()) == {round(np.exp(4))}


def test_constant_floor() -> None:
    assert set(from_dist_spec(_dist("constant", value=0)).sample(_rng(), 5).tolist()) == {1}
    zero_ok = from_dist_spec(_dist("constant", value=0), minimum=0)
    assert set(zero_ok.sample(_rng(), 5).tolist()) == {0}


def test_empirical_inline_frequencies() -> None:
    dist = DistSpec(type="empirical", params={"10": 1, "20": 2, "40": 1, "80": 0})
    values = from_dist_spec(dist).sample(_rng(), N)
    assert set(np.unique(values).tolist()) == {10, 20, 40}
    for tokens, prob in ((10, 0.25), (20, 0.5), (40, 0.25)):
        assert (values == tokens).mean() == pytest.approx(prob, abs=0.01)


def test_empirical_single_bin() -> None:
    law = EmpiricalLength({128: 0.3})
    assert set(law.sample(_rng(), 10).tolist()) == {128}


def _check_table(law, expected: dict[int, float]) -> None:
    values = law.sample(_rng(), N)
    for tokens, prob in expected.items():
        assert (values == tokens).mean() == pytest.approx(prob, abs=0.01)


def test_empirical_yaml_file_relative_to_base_dir(tmp_path: Path) -> None:
    (tmp_path / "lens.yaml").write_text("100: 0.2\n200: 0.8\n")
    law = from_dist_spec(DistSpec(type="empirical", file="lens.yaml"), tmp_path)
    _check_table(law, {100: 0.2, 200: 0.8})


def test_empirical_json_file(tmp_path: Path) -> None:
    path = tmp_path / "lens.json"
    path.write_text(json.dumps({"5": 3, "7": 1}))
    _check_table(from_dist_spec(DistSpec(type="empirical", file=str(path))), {5: 0.75, 7: 0.25})


@pytest.mark.parametrize("header", ["tokens,probability\n", ""])
def test_empirical_csv_file(tmp_path: Path, header: str) -> None:
    (tmp_path / "lens.csv").write_text(header + "64, 0.5\n128,0.25\n256,0.25\n")
    law = from_dist_spec(DistSpec(type="empirical", file="lens.csv"), tmp_path)
    _check_table(law, {64: 0.5, 128: 0.25, 256: 0.25})


def test_ratio_distribution_percent_clamped() -> None:
    ratio = ratio_from_dist_spec(_dist("constant", value=50))
    assert set(ratio.sample(_rng(), 5).tolist()) == {0.5}
    zero = ratio_from_dist_spec(_dist("constant", value=0))
    assert set(zero.sample(_rng(), 5).tolist()) == {0.0}
    wide = ratio_from_dist_spec(_dist("gaussian", mean=50, std_dev=80, min=-100, max=300))
    values = wide.sample(_rng(), N)
    assert values.min() == 0.0 and values.max() == 1.0
    assert not np.all(values * 100 == np.round(values * 100))  # not rounded to whole percent


# --- bad input names the field ----------------------------------------------------------------

WHERE = "clients[0].input_distribution"


@pytest.mark.parametrize(
    ("dist", "field"),
    [
        (_dist("gaussian", mean=-5, std_dev=1, min=1, max=10), "params.mean"),
        (_dist("gaussian", mean=5, std_dev=-1, min=1, max=10), "params.std_dev"),
        (_dist("gaussian", mean=5, std_dev=1, min=10, max=1), "params.min"),
        (_dist("gaussian", mean=5, std_dev=1, min=1.5, max=10), "params.min"),
        (_dist("exponential", mean=0), "params.mean"),
        (_dist("exponential", mean=-3), "params.mean"),
        (_dist("pareto_lognormal", alpha=0, xm=1, mu=0, sigma=1, mix_weight=0.5), "params.alpha"),
        (_dist("pareto_lognormal", alpha=1, xm=-1, mu=0, sigma=1, mix_weight=0.5), "params.xm"),
        (
            _dist("pareto_lognormal", alpha=1, xm=1, mu=0, sigma=1, mix_weight=2),
            "params.mix_weight",
        ),
        (_dist("constant", value=-1), "params.value"),
        (DistSpec(type="empirical", params={"10": 0, "20": 0}), "params"),
        (DistSpec(type="empirical", params={"ten": 1}), "params"),
        (DistSpec(type="empirical", params={"10": -1}), "params"),
        (DistSpec(type="empirical", file="/nonexistent/lens.yaml"), "file"),
    ],
)
def test_bad_params_name_field(dist: DistSpec, field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{WHERE}.{field}")):
        from_dist_spec(dist, where=WHERE)


def test_bad_files(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "short.csv").write_text("10\n")
    (tmp_path / "bad.json").write_text("{nope")
    for name, pattern in (
        ("list.yaml", "mapping"),
        ("short.csv", "two columns"),
        ("bad.json", "not valid"),
    ):
        with pytest.raises(ConfigError, match=re.escape(f"{WHERE}.file") + f".*{pattern}"):
            from_dist_spec(DistSpec(type="empirical", file=name), tmp_path, where=WHERE)


def test_direct_constructor_errors() -> None:
    with pytest.raises(ConfigError, match="std_dev"):
        GaussianLength(10, -1, 1, 5)
    with pytest.raises(ConfigError, match="value"):
        ConstantLength(-2)
