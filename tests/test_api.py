"""The Python API: simulate / replay, Result DataFrames, scenario overrides, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import simulator
from simulator.errors import ConfigError

SCENARIOS = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))
SMALL = dict(workload__num_requests=200, workload__rate=20)


@pytest.fixture(scope="module")
def quick():
    return simulator.simulate("scenarios/quickstart.yaml", **SMALL)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_shipped_scenario_validates_and_resolves(path):
    scenario = simulator.load_scenario(path)
    simulator.resolve_deployment(scenario)


def test_requests_frame_agrees_with_summary(quick):
    df = quick.requests
    s = quick.summary
    assert len(df) == 200
    done = df[df.state == "completed"]
    assert len(done) == s["completed_requests"]
    assert done.e2e_ms.mean() == pytest.approx(s["e2e_mean_ms"], rel=1e-12)
    assert df.ttft_ms.dropna().mean() == pytest.approx(s["ttft_mean_ms"], rel=1e-12)
    assert np.percentile(done.e2e_ms, 99) == pytest.approx(s["e2e_p99_ms"], rel=1e-12)
    assert df.generated_tokens.sum() == s["total_output_tokens"]


def test_steps_frame_accounts_for_every_token(quick):
    """Without preemption each token comes from a decode step or from a prefill completing."""
    assert quick.summary["preemption_count"] == 0
    steps = quick.steps
    first_tokens = quick.requests.first_token_us.notna().sum()
    assert steps.decode_tokens.sum() + first_tokens == quick.summary["total_output_tokens"]
    assert steps.prefill_tokens.sum() == quick.requests.input_tokens.sum()
    assert (steps.step_us >= 1).all()
    assert steps.start_us.is_monotonic_increasing


def test_same_seed_same_summary_different_seed_different_traffic():
    a = simulator.simulate("scenarios/quickstart.yaml", **SMALL)
    b = simulator.simulate("scenarios/quickstart.yaml", **SMALL)
    c = simulator.simulate("scenarios/quickstart.yaml", seed=7, **SMALL)
    assert json.dumps(a.summary) == json.dumps(b.summary)
    assert json.dumps(a.summary) != json.dumps(c.summary)


def test_overrides_reach_the_engine():
    result = simulator.simulate(
        "scenarios/quickstart.yaml", engine__max_num_running_reqs=4, **SMALL
    )
    assert result.scenario["engine"]["max_num_running_reqs"] == 4
    assert result.steps.running_requests.max() <= 4


def test_replay_api_matches_trace_lengths():
    data = Path(__file__).parent / "data" / "blis"
    result = simulator.replay(
        data / "r3_summ.trace.yaml", data / "r3_summ.trace.csv", engine__total_kv_blocks=1_000_000
    )
    assert result.summary["completed_requests"] == 300
    assert result.summary["total_input_tokens"] == 1_228_971  # sum of the trace's input_tokens


def test_kv_blocks_precedence_is_reported():
    explicit = simulator.resolve_deployment(simulator.Scenario(engine={"total_kv_blocks": 1234}))
    measured = simulator.resolve_deployment(simulator.Scenario())
    formula = simulator.resolve_deployment(simulator.Scenario(hardware="A100-SXM", tp=1))
    assert (explicit.engine.total_kv_blocks, explicit.kv_blocks_source) == (1234, "explicit")
    # BLIS's measured entry for llama-3.1-8b on H100 TP1 (defaults.yaml) wins over the formula.
    assert (measured.engine.total_kv_blocks, measured.kv_blocks_source) == (29205, "defaults.yaml")
    assert formula.kv_blocks_source in ("defaults.yaml", "auto")


def test_bad_scenario_dict_names_the_field():
    with pytest.raises(ConfigError, match=r"engine\.max_num_running_reqs"):
        simulator.simulate({"engine": {"max_num_running_reqs": 0}})
    with pytest.raises(ConfigError, match=r"engine: unknown key .schedular."):
        simulator.simulate({"engine": {"schedular": "fcfs"}})
    with pytest.raises(ConfigError, match="unknown scheduler 'lifo'"):
        simulator.simulate({"engine": {"scheduler": "lifo"}})


def test_horizon_cuts_the_run_and_conserves_requests():
    result = simulator.simulate(
        "scenarios/quickstart.yaml", horizon_us=2_000_000, workload__num_requests=200,
        workload__rate=50,
    )  # fmt: skip
    s = result.summary
    assert s["vllm_estimated_duration_s"] <= 2.0
    assert s["still_running"] + s["still_queued"] > 0
    # Generation stops at the horizon: what was generated is exactly what was injected.
    assert s["injected_requests"] == len(result.request_records) <= 200
    assert all(r.arrival_us <= 2_000_000 for r in result.request_records)


@pytest.mark.parametrize(
    "scenario",
    [
        {"workload": {"num_requests": 60, "rate": 20}, "cluster": {"num_instances": 2}},
        {"workload": {"num_requests": 200, "rate": 50}, "horizon_us": 2_500_000},
        "scenarios/pd_2p2d.yaml",
    ],
)
def test_progress_reporting_does_not_change_results(scenario):
    """Progress slices the event loop in simulated seconds; the run must be identical."""
    plain = (
        simulator.simulate(scenario, workload__num_requests=150)
        if isinstance(scenario, str)
        else simulator.simulate(scenario)
    )
    seen: list[tuple[int, int]] = []
    kwargs = {"workload__num_requests": 150} if isinstance(scenario, str) else {}
    sliced = simulator.simulate(scenario, progress=lambda t, c: seen.append((t, c)), **kwargs)
    assert sliced.report_text() == plain.report_text()
    assert seen and all(b >= a for a, b in zip(seen, seen[1:], strict=False))  # monotone
    s = plain.summary  # the count is of requests that left the system, in any final state
    assert (
        seen[-1][1]
        == s["completed_requests"]
        + s["dropped_unservable"]
        + s["timed_out_requests"]
        + plain.admission_rejections
        + plain.routing_rejections
    )


def test_default_quickstart_decodes_no_faster_than_reading_the_weights_once():
    """The default latency model is physics, and a decode step of Llama-3.1-8B on an H100 can
    never be shorter than streaming its weights once from HBM: 8.03e9 parameters x 2 bytes
    (BF16) = 16.06 GB at 3.35 TB/s = 4.79 ms. (roofline, BLIS's backend, printed 3.3 ms.)"""
    from simulator.catalog.hardware import get_gpu
    from simulator.catalog.models import load_model
    from simulator.latency.kv_capacity import model_param_count

    result = simulator.simulate("scenarios/quickstart.yaml", **SMALL)
    model = load_model("meta-llama/llama-3.1-8b-instruct")
    gpu = get_gpu("H100")
    weights_bytes = model_param_count(model) * model.effective_weight_bytes_per_param
    one_read_ms = weights_bytes / (gpu.bw_peak_tbs * 1e12) * 1e3
    assert 4.7 < one_read_ms < 4.9  # the hand computation above
    assert result.summary["itl_p50_ms"] >= one_read_ms
    provenance = result.latency_provenance
    assert provenance["latency_model"] == "physics"
    assert provenance["fit_gpu"] == "H100" and provenance["gpu_covered_by_fit"] is True
    assert "=== Latency Model ===" in result.report_text()


V2_WITH_ITS_OWN_SEED = {
    "workload": {
        "version": "2",
        "seed": 5,
        "aggregate_rate": 10,
        "num_requests": 40,
        "clients": [
            {
                "id": "a",
                "rate_fraction": 1,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 64}},
                "output_distribution": {"type": "constant", "params": {"value": 8}},
            }
        ],
    }
}


def test_a_seed_keyword_reseeds_a_v2_workload_as_the_command_line_and_a_sweep_do():
    """`simulate(spec, seed=N)` replaces the spec's own seed (as `--seed` and `sweep(seeds=)`
    do): different seeds, different arrivals; the same seed, the same run; no seed keyword,
    the spec's own."""

    def arrivals(**kw):
        return simulator.simulate(V2_WITH_ITS_OWN_SEED, **kw).requests.arrival_us.tolist()

    assert arrivals(seed=1) != arrivals(seed=2)
    assert arrivals(seed=1) == arrivals(seed=1)
    assert arrivals() == arrivals(seed=5)  # the spec's seed is 5
    points = simulator.sweep(V2_WITH_ITS_OWN_SEED, {"engine.block_size_tokens": [16]}, seeds=[1])
    swept = points.runs.iloc[0]["ttft_mean_ms"]
    alone = simulator.simulate(V2_WITH_ITS_OWN_SEED, seed=1).summary["ttft_mean_ms"]
    assert swept == pytest.approx(alone)


def test_workload_keywords_set_a_v2_workloads_rate_and_count():
    """`workload__rate` / `workload__num_requests` are a v2 spec's aggregate_rate and
    num_requests, as the flags --rate / --num-requests and a sweep's grid keys are."""
    result = simulator.simulate(V2_WITH_ITS_OWN_SEED, workload__rate=20, workload__num_requests=25)
    assert result.summary["injected_requests"] == 25
    assert result.scenario["workload"]["aggregate_rate"] == 20


@pytest.mark.parametrize(
    ("override", "inside"),
    [("workload__clients__0__rate_fraction", "workload.clients"), ("seed__x", "seed")],
)
def test_a_dotted_keyword_cannot_reach_inside_a_list_or_a_value(override, inside):
    with pytest.raises(ConfigError, match=f"{inside} is not a section"):
        simulator.simulate(V2_WITH_ITS_OWN_SEED, **{override: 0.5})


def test_itl_is_missing_where_a_request_has_no_gap_to_average():
    """A request with fewer than two generated tokens has no inter-token gap: its `itl_ms` is
    NaN in the requests frame (as ttft_ms of a request with no first token), so a mean over
    the column is a mean over requests that decoded; BLIS's per-request records keep 0.0."""
    result = simulator.simulate(
        {"workload": {"num_requests": 200, "rate": 200}, "horizon_us": 500_000}
    )
    df = result.requests
    decoded = (df.generated_tokens > 1) & df.first_token_us.notna()
    assert (~decoded).any() and decoded.any()  # the horizon leaves some undecoded
    assert df.loc[~decoded, "itl_ms"].isna().all()
    assert df.loc[decoded, "itl_ms"].notna().all()
    assert (df.loc[decoded, "itl_ms"] > 0).all()
    records = {r["requestID"]: r for r in result.blis_request_records()}
    assert all(records[i]["itl_ms"] == 0.0 for i in df.loc[~decoded, "request_id"])


def test_a_run_with_no_requests_has_typed_columns_that_survive_save_and_load(tmp_path):
    """pandas infers `object` from no rows; the requests frame of an empty run has the types
    a run with rows has (so `df[~df.length_capped]` keeps its columns), and saving and
    loading keeps every frame's types."""
    some = simulator.simulate({"workload": {"num_requests": 5, "rate": 5}})
    none = simulator.simulate({"workload": {"num_requests": 1, "rate": 1}, "horizon_us": 1})
    assert len(none.requests) == 0
    assert dict(none.requests.dtypes) == dict(some.requests.dtypes)
    assert list(none.requests[~none.requests.length_capped].columns) == list(some.requests.columns)
    loaded = simulator.load_result(none.save(tmp_path / "none"))
    for name in ("requests", "steps", "instances", "transfers"):
        assert dict(getattr(loaded, name).dtypes) == dict(getattr(none, name).dtypes), name


def test_public_helpers_refuse_bad_input_with_a_named_error(tmp_path):
    result = simulator.simulate({"workload": {"num_requests": 20, "rate": 10}})
    # resolve_deployment takes what simulate takes: a path, a dict or a Scenario.
    assert simulator.resolve_deployment({"hardware": "A100-80"}).gpu.name == "A100-80"
    assert simulator.resolve_deployment("scenarios/quickstart.yaml").gpu.name == "H100"
    with pytest.raises(ConfigError, match="scenario: expected"):
        simulator.resolve_deployment(3)
    # A grid value must be a list.
    with pytest.raises(ConfigError, match="needs a non-empty list of values, got 2"):
        simulator.sweep({"workload": {"num_requests": 5, "rate": 5}}, {"cluster.num_instances": 2})
    # Plots into a path that is a file: the error names it.
    existing = tmp_path / "a-file"
    existing.write_text("x")
    with pytest.raises(simulator.ServesimError, match="a-file"):
        result.plot.write(existing)
    # A bin width that would need millions of bins is refused, with the smallest allowed.
    with pytest.raises(ConfigError, match=r"bin_s=1e-06.*give bin_s >="):
        result.plot.throughput(bin_s=1e-6)
