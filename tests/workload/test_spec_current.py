"""Workload-spec fields current BLIS added since March, each with BLIS's meaning
(docs/workloads.md): lognormal and clamped exponential lengths, fitted arrival laws
(`shape`/`scale`), time-varying windows (`trace_rate` and per-window laws), absolute rates,
spike `trace_rate`, `prefix_sharing`, `slo_target_us`, `goodput_slo_targets` and the
multi-period ServeGen conversion.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import simulator
from simulator.cli import app
from simulator.errors import ConfigError
from simulator.workload.arrivals import make_arrivals
from simulator.workload.generator import WorkloadStream
from simulator.workload.lengths import from_dist_spec
from simulator.workload.spec import DistSpec, workload_spec_from_dict

DATA = Path(__file__).resolve().parent.parent / "data" / "workloads"
CONST = {"type": "constant", "params": {"value": 10}}


def _client(**extra) -> dict:
    return {
        "id": "c",
        "rate_fraction": 1,
        "arrival": {"process": "poisson"},
        "input_distribution": CONST,
        "output_distribution": CONST,
        **extra,
    }


def _stream(spec: dict, seed: int = 1) -> list:
    return list(WorkloadStream(workload_spec_from_dict({"version": "2", **spec}), seed))


# --- lengths ----------------------------------------------------------------------------------


def test_lognormal_length():
    law = from_dist_spec(DistSpec(type="lognormal", params={"mu": 5.0, "sigma": 0.5}))
    draws = law.sample(np.random.default_rng(0), 40_000)
    # Median of exp(mu + sigma Z) is e^mu = 148.4; rounding moves it by at most half a token.
    assert np.median(draws) == pytest.approx(math.exp(5.0), abs=1.0)
    assert law.mean == pytest.approx(math.exp(5.0 + 0.125))
    clamped = from_dist_spec(
        DistSpec(type="lognormal", params={"mu": 5.0, "sigma": 2.0, "min": 50, "max": 300})
    ).sample(np.random.default_rng(0), 5000)
    assert clamped.min() == 50 and clamped.max() == 300


def test_exponential_length_with_clamps():
    law = from_dist_spec(DistSpec(type="exponential", params={"mean": 100, "min": 20, "max": 60}))
    draws = law.sample(np.random.default_rng(0), 5000)
    assert draws.min() == 20 and draws.max() == 60


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"mu": 1.0}, "lognormal needs params mu, sigma; missing sigma"),
        ({"mu": 1.0, "sigma": 1.0, "cap": 3}, "unknown params cap"),
        ({"mu": 1.0, "sigma": 1.0, "min": 9, "max": 3}, "min (9) must be <= max (3)"),
    ],
)
def test_bad_lognormal(params, needle):
    client = _client(input_distribution={"type": "lognormal", "params": params})
    with pytest.raises(ConfigError) as err:
        workload_spec_from_dict({"version": "2", "aggregate_rate": 1, "clients": [client]})
    assert needle in str(err.value)


# --- fitted arrival laws ------------------------------------------------------------------------


def test_shape_and_scale_replace_the_rate():
    rng = np.random.default_rng(0)
    # Gamma(shape 2, scale 500,000 µs): mean gap 2 × 500,000 = 1 s, whatever the rate says.
    gamma = make_arrivals("gamma", 1000.0, 3.0, shape=2.0, scale_us=500_000.0)
    assert gamma.gaps_us(rng, 20_000).mean() == pytest.approx(1e6, rel=0.02)
    # Weibull(k 1.5, λ 1 s): mean gap Γ(1 + 1/1.5) s = 0.9027 s.
    weibull = make_arrivals("weibull", 1000.0, 50.0, shape=1.5, scale_us=1e6)
    expected = math.gamma(1 + 1 / 1.5) * 1e6
    assert weibull.gaps_us(rng, 20_000).mean() == pytest.approx(expected, rel=0.02)


def test_a_non_positive_shape_falls_back_to_the_cv(caplog):
    law = make_arrivals("gamma", 4.0, 2.0, shape=-1.0, scale_us=10.0)
    assert law.shape == pytest.approx(0.25)  # 1 / cv²
    assert "must both be > 0" in caplog.text


def test_weibull_cv_range_is_not_checked_with_a_fitted_law():
    spec = {"process": "weibull", "cv": 50, "shape": 1.2, "scale": 1000}
    workload_spec_from_dict(
        {"version": "2", "aggregate_rate": 1, "clients": [_client(arrival=spec)]}
    )
    with pytest.raises(ConfigError, match="weibull cv must be in"):
        workload_spec_from_dict(
            {
                "version": "2",
                "aggregate_rate": 1,
                "clients": [_client(arrival={**spec, "shape": 0})],
            }
        )


# --- time-varying windows and absolute rates -----------------------------------------------------


def test_windows_with_their_own_rate_and_lengths():
    windows = [
        {"start_us": 0, "end_us": 10_000_000, "trace_rate": 5.0},
        {
            "start_us": 20_000_000,
            "end_us": 30_000_000,
            "trace_rate": 2.5,
            "input_distribution": {"type": "constant", "params": {"value": 77}},
        },
    ]
    # No aggregate_rate: every window's trace_rate is its own req/s (absolute rates).
    requests = _stream({"clients": [_client(lifecycle={"windows": windows})]})
    first = [r for r in requests if r.arrival_us < 10_000_000]
    second = [r for r in requests if r.arrival_us >= 20_000_000]
    # Hand computation: ⌈5 × 10⌉ = 50 and ⌈2.5 × 10⌉ = 25 requests, nothing in between.
    assert (len(first), len(second), len(requests)) == (50, 25, 75)
    assert all(r.arrival_us < 30_000_000 for r in second)
    assert {r.input_tokens for r in first} == {10}
    assert {r.input_tokens for r in second} == {77}


def test_a_window_rate_is_a_weight_beside_an_aggregate_rate():
    # aggregate 10 req/s over fractions 1 + 1; the window's trace_rate 3 stands in for its
    # client's fraction: 10 × 3 / 2 = 15 req/s for 4 s = 60 requests.
    window = {"start_us": 0, "end_us": 4_000_000, "trace_rate": 3.0}
    spec = {
        "aggregate_rate": 10.0,
        "horizon": 4_000_000,
        "clients": [_client(id="w", lifecycle={"windows": [window]}), _client(id="o")],
    }
    requests = _stream(spec)
    assert sum(r.client_id == "w" for r in requests) == 60


def test_spike_trace_rate_is_shared_by_the_members():
    cohort = {
        **_client(),
        "id": "burst",
        "population": 4,
        "spike": {"start_time_us": 1_000_000, "duration_us": 2_000_000, "trace_rate": 10.0},
    }
    requests = _stream({"cohorts": [cohort]})
    # Each member: 10 / 4 = 2.5 req/s for 2 s -> ⌈5⌉ = 5 requests, all inside the spike.
    assert len(requests) == 20
    assert all(1_000_000 <= r.arrival_us < 3_000_000 for r in requests)
    assert {r.client_id for r in requests} == {f"burst-{j}" for j in range(4)}


def test_aggregate_rate_needed_unless_rates_are_absolute():
    window = {"start_us": 0, "end_us": 10}
    with pytest.raises(ConfigError, match="aggregate_rate .* is required"):
        workload_spec_from_dict({"version": "2", "clients": [_client()]})
    with pytest.raises(ConfigError, match="aggregate_rate .* is required"):
        workload_spec_from_dict(
            {"version": "2", "clients": [_client(lifecycle={"windows": [window]})]}
        )
    workload_spec_from_dict({"version": "2", "aggregate_rate": 0, "clients": [
        _client(lifecycle={"windows": [{**window, "trace_rate": 1.0}]})
    ]})  # fmt: skip


# --- prefix sharing, SLO targets ----------------------------------------------------------------


def test_prefix_sharing_per_member():
    cohort = {**_client(), "id": "co", "population": 3, "prefix_group": "sys",
              "prefix_length": 32, "prefix_sharing": "per_member"}  # fmt: skip
    spec = {"aggregate_rate": 30.0, "num_requests": 60, "cohorts": [cohort]}
    requests = _stream(spec)
    assert {r.prefix_group for r in requests} == {"sys-0", "sys-1", "sys-2"}
    with pytest.raises(ConfigError, match="per_member needs a prefix_group"):
        workload_spec_from_dict(
            {
                "version": "2",
                "aggregate_rate": 1,
                "cohorts": [{**cohort, "prefix_group": ""}],
            }  # fmt: skip
        )


def test_slo_target_us_is_accepted_and_checked():
    workload_spec_from_dict(
        {"version": "2", "aggregate_rate": 1, "clients": [_client(slo_target_us=150_000)]}
    )
    with pytest.raises(ConfigError, match=r"clients\[0\].slo_target_us"):
        workload_spec_from_dict(
            {"version": "2", "aggregate_rate": 1, "clients": [_client(slo_target_us=-5)]}
        )


def test_goodput_slo_targets_judge_the_run():
    spec = {
        "version": "2",
        "aggregate_rate": 2.0,
        "num_requests": 20,
        "goodput_slo_targets": {"critical": {"ttft_ms": 0.001}, "default": {"e2e_ms": 1e6}},
        "clients": [_client(id="a", slo_class="critical"), _client(id="b")],
    }
    result = simulator.simulate({"latency": {"model": "roofline"}, "workload": spec})
    # No request reaches its first token within 1 µs: every critical request misses; every
    # unlabelled one ("default") meets its 1,000 s E2E target.
    critical = sum(r.slo_class == "critical" for r in result.request_records)
    assert result.slo["met_requests"] == 20 - critical
    assert result.slo["targets"]["classes"]["critical"] == {"ttft_ms": 0.001}
    # A class target the scenario sets itself wins over the spec's.
    scenario = {
        "latency": {"model": "roofline"},
        "workload": spec,
        "slo": {"classes": {"critical": {"ttft_ms": 1e6}}},
    }
    assert simulator.simulate(scenario).slo["met_requests"] == 20


def test_a_current_blis_workload_file_runs_unchanged(tmp_path):
    """tests/data/workloads/blis_current_features.yaml uses concurrency, think_time_us,
    slo_target_us, a fitted gamma (shape, scale), lognormal and clamped exponential lengths
    and goodput targets; current BLIS runs it as it is, and so does servesim."""
    out = tmp_path / "m.json"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--workload-spec",
            str(DATA / "blis_current_features.yaml"),
            "--latency-model",
            "roofline",
            "--total-kv-blocks",
            "29205",
            "--metrics-path",
            str(out),
            "-q",
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.stderr
    doc = json.loads(out.read_text())
    # 8 users and a gamma stream for 30 s: a few hundred requests, the users' the most.
    assert doc["completed_requests"] > 300
    users = [r for r in doc["requests"] if r["client_id"] == "chat-users"]
    assert {r["session_id"] for r in users} == {
        f"concurrency_chat-users_user_{u}" for u in range(8)
    }
    assert doc["slo"]["targets"]["classes"]["critical"] == {"ttft_ms": 200, "e2e_ms": 2000}


# --- multi-period ServeGen ----------------------------------------------------------------------


def write_servegen_day(folder: Path) -> None:
    """Two chunks with a row every 600 s through a day: chunk 0 gamma at 2 req/s, chunk 1
    Weibull at 3 req/s (shape and scale in the trace's own units, s)."""
    for chunk, (rate, cv, pattern, shape, scale_s) in enumerate(
        [(2.0, 1.5, "Gamma", 0.444, 1.125), (3.0, 0.8, "Weibull", 1.562, 0.37)]
    ):
        rows = [f"{t},{rate},{cv},{pattern},{shape},{scale_s}" for t in range(0, 86_400, 600)]
        (folder / f"chunk-{chunk}-trace.csv").write_text("\n".join(rows) + "\n")
        tables = {"input_tokens": "{100: 0.25, 200: 0.75}", "output_tokens": "{50: 0.5, 70: 0.5}"}
        (folder / f"chunk-{chunk}-dataset.json").write_text(json.dumps({"0": tables}))


def test_multi_period_servegen(tmp_path):
    write_servegen_day(tmp_path)
    spec = {"servegen_data": {"path": str(tmp_path), "window_duration_secs": 60}, "seed": 3}
    requests = _stream(spec)
    # Three periods of 60 s, no gap (drain 0 in a spec): [0, 60), [60, 120), [120, 180) s,
    # each with both chunks: ⌈2 × 60⌉ + ⌈3 × 60⌉ = 300 requests per period.
    assert len(requests) == 900
    for k in range(3):
        inside = [r for r in requests if k * 60e6 <= r.arrival_us < (k + 1) * 60e6]
        assert len(inside) == 300
        assert {r.slo_class for r in inside} == {"critical", "standard"}
        assert {r.client_id.split("-")[0] for r in inside} == {
            ("midnight", "morning", "afternoon")[k]
        }
    assert all(r.streaming for r in requests)
    # Lognormal lengths fitted to the tables: median e^mu, mu = 0.25 ln 100 + 0.75 ln 200.
    mu = 0.25 * math.log(100) + 0.75 * math.log(200)
    assert np.median([r.input_tokens for r in requests]) == pytest.approx(math.exp(mu), rel=0.1)


def test_multi_period_servegen_one_period_and_gaps(tmp_path):
    write_servegen_day(tmp_path)
    spec = {"servegen_data": {"path": str(tmp_path), "window_duration_secs": 60,
                              "drain_timeout_secs": -1, "time_window": "morning"}}  # fmt: skip
    requests = _stream(spec)
    # A negative drain means BLIS's 180 s gap: morning (period 1) runs [240, 300) s.
    assert len(requests) == 300
    assert all(240e6 <= r.arrival_us < 300e6 for r in requests)


def test_a_trace_header_s_goodput_targets_judge_a_replay(tmp_path):
    source = Path(__file__).resolve().parent.parent / "data" / "blis_head" / "h5_closed_loop"
    header = tmp_path / "t.yaml"
    header.write_text(
        source.with_suffix(".trace.yaml").read_text()
        + "goodput_slo_targets:\n  default: {ttft_ms: 0.001}\n"
    )
    result = simulator.replay(
        header,
        source.with_suffix(".trace.csv"),
        {"latency": {"model": "roofline"}, "engine": {"total_kv_blocks": 29205}},
    )
    # No first token within 1 µs of arrival: none of the 1000 requests meets its target.
    assert result.slo["targets"]["classes"]["default"] == {"ttft_ms": 0.001}
    assert result.slo["met_requests"] == 0
