"""Capacity planning (`simulator.plan`): a scenario whose answer is known by construction,
SLO validation, infeasibility, GPU ranking by price and the `plan` command."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from simulator.cli.plan import register
from simulator.errors import ConfigError
from simulator.plan import _search, plan
from tests.specs import CAPACITY_25_RPS, one_prefill_one_decode

STEP_MS = 10
# tests/specs.py: every step 10 ms, 40 ms per request, one at a time: 25 req/s per instance.
BASE = {
    **CAPACITY_25_RPS,
    "workload": {**CAPACITY_25_RPS["workload"], "rate": 60, "num_requests": 120},
}
SLO = {"ttft_p99_ms": 50.0}


@pytest.fixture(scope="module")
def result():
    return plan(BASE, SLO, seeds=(1, 2), max_instances=16, workers=1)


def test_known_answer(result) -> None:
    """Constant arrivals at L = 60 req/s, round-robin over n instances: each instance gets a
    request every n / 60 s and needs 40 ms for it. No queue forms iff n / 60 s >= 40 ms, i.e.
    n >= 60 * 0.040 = 2.4, so N = 3: then TTFT is one step (10 ms) for every request. With
    n = 2 an instance gets a request every 33.3 ms, the backlog grows by 6.7 ms per request
    and over 60 requests per instance the TTFT p99 reaches ~400 ms >> 50 ms."""
    assert result.best is not None
    assert (result.best.gpu, result.best.instances, result.best.tp) == ("H100", 3, 1)
    assert result.best.cost_per_hour == pytest.approx(3 * 3.00)
    f = result.frontier
    # Exponential 1, 2, 4 (meets), then bisection between 2 and 4 probes 3.
    assert list(f["instances"]) == [1, 2, 3, 4]
    assert list(f["meets"]) == [False, False, True, True]
    meeting = f[f["meets"]]
    assert (meeting["ttft_p99_ms_worst"] == STEP_MS).all()
    assert f.loc[f["instances"] == 2, "ttft_p99_ms_worst"].item() > 300
    assert (f["goodput_worst"] == 1.0).all()
    text = result.table()
    assert "best: H100 x 3 instance(s)" in text and "worst of seeds [1, 2]" in text


def test_frontier_plot(result, tmp_path) -> None:
    fig = result.plot()
    (ax,) = fig.axes
    assert len(ax.lines) == 2  # the H100 frontier and the dashed SLO bound
    assert list(ax.lines[0].get_xdata()) == [1, 2, 3, 4]
    assert ax.lines[1].get_ydata()[0] == 50.0
    fig.savefig(tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").stat().st_size > 1000


def test_infeasible_is_reported_not_raised() -> None:
    res = plan(BASE, SLO, seeds=(1,), max_instances=2, workers=1)
    assert res.best is None
    assert list(res.frontier["instances"]) == [1, 2]
    assert not res.per_gpu["feasible"].item()
    assert math.isnan(res.per_gpu["instances"].item())
    assert "no GPU meets the SLOs" in res.table()


def test_cheapest_gpu_wins() -> None:
    """Explicit coefficients make the step time GPU-independent, so every GPU needs 3
    instances and the cheapest per GPU-hour wins; a price override changes the winner."""
    res = plan(BASE, SLO, gpus=["H100", "l40s"], seeds=(1,), max_instances=8, workers=1)
    assert list(res.per_gpu["instances"]) == [3, 3]
    assert res.best is not None and res.best.gpu == "L40S"
    res = plan(
        BASE, SLO, gpus=["H100", "L40S"], seeds=(1,), max_instances=8, workers=1,
        prices={"h100": 0.5},
    )  # fmt: skip
    assert res.best is not None and (res.best.gpu, res.best.cost_per_hour) == ("H100", 1.5)


def test_min_goodput() -> None:
    """With a 100 ms client deadline, n = 2 lets the backlog exceed it and requests time out
    (goodput < 1); n >= 3 never queues, so goodput 1 is met first at N = 3."""
    base = {**BASE, "workload": {**BASE["workload"], "timeout_us": 100_000}}
    res = plan(base, {}, min_goodput=1.0, seeds=(1,), max_instances=8, workers=1)
    assert res.best is not None and res.best.instances == 3
    two = res.frontier[res.frontier["instances"] == 2]
    assert two["goodput_worst"].item() < 1.0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"slos": {"ttft_p99": 5}}, "unknown SLO metric 'ttft_p99'; valid: "),
        # An SLO is an upper bound: on throughput it would fail a fleet for serving more.
        ({"slos": {"responses_per_sec": 100}}, "SLO metric: invalid value 'responses_per_sec'"),
        ({"slos": {"tokens_per_sec": 100}}, "more is better here"),
        ({"slos": {"ttft_p99_ms": "x"}}, "SLO ttft_p99_ms: invalid value 'x'"),
        ({"slos": {}}, "at least one SLO"),
        # Bounds no run can meet: refused before the search simulates every probe for nothing.
        ({"slos": {"ttft_mean_ms": -5}}, "SLO ttft_mean_ms: invalid value -5; a latency bound"),
        ({"slos": {"ttft_p50_ms": 0}}, "SLO ttft_p50_ms: invalid value 0; a latency bound"),
        ({"slos": {"preemption_count": -1}}, "SLO preemption_count: invalid value -1; a count"),
        ({"slos": SLO, "min_goodput": 1.5}, "min_goodput: invalid value 1.5"),
        ({"slos": SLO, "max_instances": 0}, "max_instances: invalid value 0"),
        ({"slos": SLO, "gpus": ["H1000"]}, "unknown GPU 'H1000'"),
        # A price for a GPU neither priced nor planned: a misspelling, not silently ignored.
        ({"slos": SLO, "prices": {"H1OO": 2.0}}, "plan: a price for GPU 'H1OO'"),
    ],
)
def test_bad_input(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        plan(BASE, workers=1, **kwargs)
    assert needle in str(err.value)
    if "valid:" in needle:
        assert "itl_p99_ms" in str(err.value) and "e2e_p99_ms" in str(err.value)


def test_search_bisects() -> None:
    for answer in range(1, 40):
        calls: list[int] = []

        def probe(n: int, answer: int = answer, calls: list[int] = calls) -> bool:
            calls.append(n)
            return n >= answer

        assert _search(probe, 39) == answer
        assert len(calls) == len(set(calls))
    assert _search(lambda n: False, 5) is None


@pytest.fixture
def cli_app() -> typer.Typer:
    app = typer.Typer()

    @app.command("noop")
    def _noop() -> None:  # a second command keeps `plan` a named subcommand
        pass

    register(app)
    return app


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return path


def test_cli_plan(cli_app: typer.Typer, scenario_file: Path) -> None:
    args = ["plan", str(scenario_file), "--slo", "ttft_p99_ms=50", "--seeds", "1"]
    res = CliRunner().invoke(cli_app, [*args, "--max-instances", "8", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "best: H100 x 3 instance(s)" in res.stdout


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--slo", "ttft_p99_ms"], "error: --slo: invalid value 'ttft_p99_ms'"),
        (["--slo", "ttft_p99_ms=fast"], "error: --slo: invalid value 'ttft_p99_ms=fast'"),
        (["--slo", "ttft_p99=5"], "error: unknown SLO metric 'ttft_p99'"),
        (["--slo", "ttft_p99_ms=5", "--gpu", "X9"], "error: --gpu: unknown GPU 'X9'; valid: "),
        (["--slo", "ttft_p99_ms=5", "--seeds", "1,a"], "error: --seeds: invalid value"),
    ],
)
def test_cli_bad_input(
    cli_app: typer.Typer, scenario_file: Path, extra: list[str], needle: str
) -> None:
    res = CliRunner().invoke(cli_app, ["plan", str(scenario_file), *extra])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(needle), res.stderr


def test_registered_on_main_app() -> None:
    from simulator.cli import app

    res = CliRunner().invoke(app, ["plan", "--help"])
    assert res.exit_code == 0 and "--slo" in res.stdout


def test_plan_says_when_gpus_rest_on_different_evidence() -> None:
    """physics on H100 uses a fit measured there; on A100 the H100 fit is transferred. The
    plan must say so instead of comparing them silently; with one kind of evidence (blackbox
    on both) it says nothing."""
    physics = {
        **BASE,
        "latency": {"model": "physics"},
        "workload": {**BASE["workload"], "rate": 5, "num_requests": 20},
    }
    res = plan(
        physics, {"ttft_p99_ms": 5_000.0}, gpus=["H100", "A100-SXM"], seeds=(1,),
        max_instances=2, workers=1,
    )  # fmt: skip
    assert list(res.per_gpu["evidence"]) == ["calibrated", "transferred"]
    # An unset token budget is a stock vLLM server's on each GPU (>= 70 GiB and not an A100:
    # 8,192; an A100: 2,048); BASE sets one sequence. Each GPU's row says what it ran with.
    assert list(res.per_gpu["batch_limits"]) == [
        "1 seqs, 8,192 tokens (max_num_running_reqs set; max_num_scheduled_tokens: "
        "vLLM's default on H100)",
        "1 seqs, 2,048 tokens (max_num_running_reqs set; max_num_scheduled_tokens: "
        "vLLM's default on A100-SXM)",
    ]
    assert len(res.warnings) == 1
    assert "H100: calibrated; A100-SXM: transferred" in res.warnings[0]
    assert res.table().count("warning: the GPUs' step times rest on different evidence") == 1
    same = plan(BASE, SLO, gpus=["H100", "L40S"], seeds=(1,), max_instances=8, workers=1)
    assert same.warnings == [] and len(set(same.per_gpu["evidence"])) == 1


@pytest.mark.parametrize(
    "coefficients, kind",
    [
        ("analytical: no fitted coefficients", "analytical"),
        ("given alpha/beta coefficients", "given"),
        ("BLIS's fit for H100 TP2, vLLM v0.8.4 (defaults.yaml)", "fitted"),
        ("BLIS's fit for A100-80 TP2, vLLM v0.8.4 (defaults.yaml)", "fitted"),
        ("BLIS's global crossmodel fit (defaults.yaml)", "fitted"),
    ],
)
def test_evidence_of_blis_backends_is_a_kind_not_the_fits_name(coefficients, kind) -> None:
    """Blackbox's per-GPU fits are named after their GPU; read as evidence, every pair of GPUs
    looked like different evidence and drew the mixed-evidence warning."""
    from simulator.plan import evidence, mixed_evidence

    assert evidence({"latency_model": "blackbox", "coefficients": coefficients}) == kind
    fits = {
        gpu: {"latency_model": "blackbox", "coefficients": f"BLIS's fit for {gpu} TP2 (x)"}
        for gpu in ("H100", "A100-80")
    }
    assert mixed_evidence(fits) == []


def test_a_plan_under_a_gpu_blind_model_says_so() -> None:
    """crossmodel's fit has no GPU term: an L40S prices a step as a B200 does, so a plan over
    GPUs would pick the cheapest one as if it were as fast. The warning says so."""
    from simulator.catalog.hardware import get_gpu
    from simulator.catalog.models import load_model
    from simulator.latency import build_step_time_model
    from simulator.latency.base import StepBatch
    from simulator.plan import mixed_evidence

    model = load_model("meta-llama/llama-3.1-8b-instruct")
    models = {
        g: build_step_time_model("crossmodel", model, get_gpu(g), 1) for g in ("B200", "L40S")
    }
    batch = StepBatch([], 64, 128_000)
    assert models["B200"].step_time_us(batch) == models["L40S"].step_time_us(batch)
    (warning,) = mixed_evidence({g: m.provenance() for g, m in models.items()})
    assert warning.startswith("latency model crossmodel prices every GPU alike")
    assert mixed_evidence({"B200": models["B200"].provenance()}) == []


# ------------------------------------------------ plans that used to pass and must not


def test_a_short_overloaded_run_no_longer_passes() -> None:
    """Quickstart traffic at 60 req/s on one H100 looked fine over 300 requests (TTFT p99
    367 ms) while its queue grew without bound. The plan now runs 1,000 requests per probe
    (p99 needs ten samples beyond it), sees the TTFT trend, and answers 2."""
    base = {
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "workload": {
            "arrival": "poisson",
            "rate": 60,
            "num_requests": 300,
            "prompt_tokens": {"distribution": "gaussian", "mean": 512, "stdev": 128,
                              "min": 16, "max": 2048},
            "output_tokens": {"distribution": "gaussian", "mean": 256, "stdev": 64,
                              "min": 1, "max": 1024},
        },
    }  # fmt: skip
    res = plan(base, {"ttft_p99_ms": 500.0}, seeds=(1, 2), max_instances=4, workers=1)
    assert res.run_requests == 1000
    one = res.frontier[res.frontier["instances"] == 1].iloc[0]
    assert not one["meets"] and not one["steady"]
    assert "steady-state verdict: saturated" in one["reason"]
    assert res.best is not None and res.best.instances == 2


def test_timeouts_fail_on_attainment_not_latency() -> None:
    """With a 50 ms deadline (4 steps of 10 ms = 40 ms of service, so any wait times a request
    out) the completed requests are fast but many offered ones time out: the latency bound
    holds, attainment does not, and the probe says so."""
    base = {**BASE, "workload": {**BASE["workload"], "arrival": "poisson", "rate": 20,
                                 "timeout_us": 50_000}}  # fmt: skip
    res = plan(base, {"ttft_p99_ms": 1_000.0}, seeds=(1,), max_instances=1, workers=1)
    row = res.frontier.iloc[0]
    assert not row["meets"] and row["ttft_p99_ms_worst"] <= 1_000.0
    assert "SLO attainment" in row["reason"] and row["attainment_worst"] < 0.99
    assert res.best is None


def test_the_scenarios_own_slo_targets_are_shown_with_the_plans() -> None:
    """The scenario's `slo.itl_ms` of 5 ms (every request's ITL is 10 ms here: one step a
    token) fails every probe on attainment while the plan's TTFT p99 bound holds; the
    criterion printed must name that target, not only the plan's own (it did not)."""
    base = {**BASE, "slo": {"itl_ms": 5.0, "classes": {"gold": {"ttft_ms": 30.0}}}}
    res = plan(base, {"ttft_p99_ms": 1_000.0}, seeds=(1,), max_instances=1, workers=1)
    assert res.targets == {"itl_ms": 5.0, "ttft_ms": 1_000.0}
    row = res.frontier.iloc[0]
    assert not row["meets"] and "SLO attainment" in row["reason"]
    text = res.table()
    assert "(per request: itl_ms <= 5, ttft_ms <= 1000)" in text
    assert (
        "note: the scenario's own SLO targets count towards the attainment too: itl_ms <= 5; "
        "per SLO class gold: ttft_ms <= 30"
    ) in text


def test_no_completions_never_pass() -> None:
    """Prompts beyond the KV cache are dropped: nothing completes, latencies are unknown (not
    0 ms), and the probe fails for that reason."""
    huge = {"distribution": "constant", "value": 200_000}
    base = {**BASE, "workload": {**BASE["workload"], "prompt_tokens": huge}}
    res = plan(base, {"ttft_p99_ms": 500.0}, seeds=(1,), max_instances=2, workers=1)
    assert not res.frontier["meets"].any()
    assert all("no request completed" in r for r in res.frontier["reason"])
    assert res.frontier["ttft_p99_ms_worst"].isna().all()
    assert res.best is None


def test_a_disaggregated_scenario_is_planned_over_total_and_split() -> None:
    """A PD scenario used to fail (`grid: cluster.num_instances = 1`); now each total from 2
    is probed over its prefill:decode splits, and the answer names the split."""
    base = yaml.safe_load(Path("scenarios/pd_2p2d.yaml").read_text())
    del base["cluster"]["pd"]["decode"]["hardware"]  # one GPU type: what plan compares
    res = plan(base, {"ttft_mean_ms": 2_000.0}, seeds=(1,), max_instances=4, workers=1)
    assert (res.frontier["instances"] >= 2).all()
    splits = res.frontier["prefill_instances"] + res.frontier["decode_instances"]
    assert (splits == res.frontier["instances"]).all()
    answer = res.per_gpu.iloc[0]
    assert answer["feasible"]
    assert answer["prefill_instances"] + answer["decode_instances"] == answer["instances"]


def test_saturation_rate_per_instance_is_within_capacity() -> None:
    """One instance serves 25 req/s at most (tests/specs.py); the rate it sustains within a
    200 ms TTFT p99 is below that, and above zero. Bisection over (0, 60] in 5 halvings: the
    answer is a multiple of 60 / 32."""
    base = {**BASE, "workload": {**BASE["workload"], "arrival": "poisson", "num_requests": 300}}
    res = plan(base, {"ttft_p99_ms": 200.0}, seeds=(1,), max_instances=8, workers=1,
               saturation_rate=True)  # fmt: skip
    rate = res.per_gpu["saturation_rps_per_instance"].item()
    assert 0 < rate < 25.0
    assert (rate / (60 / 32)).is_integer()


def test_attainment_interval_and_when_a_probe_is_extended() -> None:
    """Wilson's 95 % interval for 50 of 100: 0.5 ± 1.96·sqrt(0.25/100 + 1.96²/40000) / (1 +
    1.96²/100) = 0.5 ± 0.0942 (centre 0.5). 990 of 1,000 meeting a 0.99 target is too close to
    call (the interval holds 0.99 and values below it); 1,000 of 1,000 is not."""
    from simulator.plan import undecided, wilson_interval

    low, high = wilson_interval(0.5, 100)
    assert (round(low, 4), round(high, 4)) == (0.4038, 0.5962)
    assert wilson_interval(0.3, 0) == (0.0, 1.0)
    keys = ("attainment_ci_low", "attainment_ci_high")
    close = dict(zip(keys, wilson_interval(0.99, 1000), strict=True))
    assert undecided(close, 0.99)
    clear = dict(zip(keys, wilson_interval(1.0, 1000), strict=True))
    assert not undecided(clear, 0.99) and not undecided(clear, 0.5)


def test_probes_report_their_length_and_attainment_interval(result) -> None:
    frontier = result.frontier
    assert (frontier["requests"] >= result.run_requests).all()
    assert (frontier["attainment_ci_low"] <= frontier["attainment_worst"]).all()
    assert (frontier["attainment_worst"] <= frontier["attainment_ci_high"]).all()


# --- GPUs per instance follow the layout (docs/planning.md, "GPUs per instance") ---------

LIGHT = {
    "model": "meta-llama/llama-3.1-8b-instruct",
    "hardware": "H100",
    "workload": {
        "rate": 2,
        "num_requests": 200,
        "prompt_tokens": {"distribution": "constant", "value": 64},
        "output_tokens": {"distribution": "constant", "value": 8},
    },
}
GENEROUS = {"e2e_mean_ms": 60_000.0}


def test_gpu_count_and_cost_follow_the_pipeline() -> None:
    """TP2 x PP2 (physics prices the stages): one instance takes 2 x 2 = 4 GPUs, so the light
    load met by one instance costs 4 x $3.00 = $12.00/h, not the 2 x $3.00 of counting TP
    alone. Every probe counts instances x 4."""
    res = plan({**LIGHT, "tp": 2, "pp": 2}, GENEROUS, seeds=(1,), max_instances=2, workers=1)
    f = res.frontier
    assert (f["gpus"] == f["instances"] * 4).all()
    answer = res.per_gpu.iloc[0]
    assert (answer["instances"], answer["gpus_per_instance"], answer["total_gpus"]) == (1, 4, 4)
    assert answer["layout"] == "TP 2 x PP 2"
    assert answer["cost_per_hour_usd"] == pytest.approx(4 * 3.00)
    assert res.best is not None and (res.best.total_gpus, res.best.tp) == (4, 2)
    assert "best: H100 x 1 instance(s) (TP 2 x PP 2, 4 GPUs), $12.00/h" in res.table()


def test_pd_pools_count_at_their_own_size() -> None:
    """Prefill instances of TP1 and decode instances of TP2: a split of p + d instances takes
    p x 1 + d x 2 GPUs (the first probe, 1 + 1, takes 3)."""
    pd_scenario = {
        **LIGHT,
        "cluster": one_prefill_one_decode(decode={"tp": 2}),
    }
    res = plan(pd_scenario, GENEROUS, seeds=(1,), max_instances=3, workers=1)
    f = res.frontier
    assert (f["gpus"] == f["prefill_instances"] * 1 + f["decode_instances"] * 2).all()
    assert f["gpus"].iloc[0] == 3
    answer = res.per_gpu.iloc[0]
    assert answer["layout"] == "prefill TP 1; decode TP 2"
    assert math.isnan(answer["gpus_per_instance"])  # the pools differ
    assert answer["cost_per_hour_usd"] == pytest.approx(answer["total_gpus"] * 3.00)


def test_a_scenario_with_named_deployments_is_refused() -> None:
    """Its instance counts are the deployments', so probing cluster.num_instances would
    change nothing and every probe would give the same verdict."""
    named = {**LIGHT, "deployments": [{"name": "a", "num_instances": 1}]}
    with pytest.raises(ConfigError, match="plan: the scenario lists `deployments`"):
        plan(named, GENEROUS, seeds=(1,), workers=1)


def test_only_a_percentile_at_the_attainment_becomes_a_per_request_target():
    """p99 <= B is "at least 99 % within B", which a per-request target at 99 % attainment
    checks exactly; p50 <= B asks only half the requests, and a mean no share at all, so those
    stay summary bounds (turned into targets, they made the plan ask p99 <= B)."""
    from simulator.plan import per_request_targets

    assert per_request_targets({"ttft_p99_ms": 500, "itl_p50_ms": 20}) == {"ttft_ms": 500}
    assert per_request_targets({"ttft_p50_ms": 60, "e2e_mean_ms": 900}) == {}
    assert per_request_targets({"ttft_p90_ms": 300}, min_attainment=0.9) == {"ttft_ms": 300}


def test_a_pool_on_its_own_gpu_is_refused_rather_than_priced_as_another():
    """pd_2p2d's decode pool runs on H200: a plan over --gpu H100 would price it as H100 and
    label a mixed fleet as one GPU type, so plan refuses it, naming the field."""
    with pytest.raises(ConfigError, match=r"cluster.pd.decode.hardware \(H200\) runs on its own"):
        plan("scenarios/pd_2p2d.yaml", {"ttft_p99_ms": 1_000.0}, seeds=(1,), workers=1)


# Llama-3.1-70B at TP 1 (132 GiB of weights): fits neither an H100 (80 GiB) nor an L40S (48).
UNFIT_70B = {
    **BASE,
    "model": "meta-llama/llama-3.1-70b-instruct",
    "tp": 1,
    "latency": {"model": "physics"},
    "engine": {},
}


def test_a_gpu_the_model_does_not_fit_is_not_planned() -> None:
    """Llama-3.1-70B at TP 1 needs 132 GiB; one L40S offers 43. Its KV capacity fell back to
    1,000,000 blocks and `plan` chose "L40S x 1 instance, $1/h", a machine that cannot
    exist. Such a GPU is now reported infeasible with a warning, and nothing is simulated."""
    res = plan(UNFIT_70B, {"ttft_p90_ms": 2000.0}, gpus=["H100", "L40S"], seeds=(1,),
               max_instances=2, workers=1)  # fmt: skip
    assert res.best is None
    assert list(res.per_gpu["feasible"]) == [False, False]
    assert len(res.frontier) == 0  # nothing simulated
    for gpu in ("H100", "L40S"):
        assert any(
            w.startswith(f"{gpu}: not planned: the model does not fit") for w in res.warnings
        )


def test_a_batching_server_is_not_passed_at_twice_its_capacity() -> None:
    """120 req/s of 512 -> 256 tokens on Llama-3.1-8B (one H100 sustains about 33): with
    1,000-request probes `plan` answered 2 H100, whose probe looked steady (first tokens stay
    prompt while the batch grows); 5,000-request probes answer 4. Short probes are now judged
    `too short` and extended, and the answer does not depend on the probe's length."""
    from tests.metrics.test_slo_steady import BATCHING

    scenario = {**BATCHING, "workload": {**BATCHING["workload"], "rate": 120,
                                         "num_requests": 1000}}  # fmt: skip
    res = plan(scenario, {"ttft_p99_ms": 1000.0}, seeds=(42,), max_instances=6, workers=1)
    assert res.best is not None and res.best.instances == 4
    assert not res.frontier[res.frontier.instances < 4].meets.any()


# --- the probe length grows with the instance count ----------------------------------------

# Llama-3.1-8B on H100 (vLLM's default batch limits: 1,024 sequences), Poisson arrivals: a
# batching server whose batch takes several seconds to fill near its capacity.
BATCHING = {
    "model": "meta-llama/llama-3.1-8b-instruct",
    "hardware": "H100",
    "workload": {
        "arrival": "poisson",
        "rate": 48,
        "num_requests": 1000,
        "prompt_tokens": {"distribution": "gaussian", "mean": 512, "stdev": 128,
                          "min": 16, "max": 2048},
        "output_tokens": {"distribution": "gaussian", "mean": 128, "stdev": 32,
                          "min": 1, "max": 512},
    },
}  # fmt: skip


def test_k_times_the_load_needs_at_most_k_times_the_instances() -> None:
    """Law: if n instances serve rate r within the SLO, k x n serve k x r (round-robin hands
    each the same share, arriving more regularly than Poisson), so the answer at k x r is at
    most k times the answer at r, and no less than the answer at r. One H100 holds 48 req/s;
    at 240 req/s a probe of 5 instances once ran 1,000 requests, 200 per instance, judged the
    filling batch saturated and the plan answered 6 (here, with at most 5: infeasible)."""
    answers = {}
    for rate in (48, 96, 240):
        base = {**BATCHING, "workload": {**BATCHING["workload"], "rate": rate}}
        res = plan(base, {"ttft_p99_ms": 500.0}, seeds=(1, 2), max_instances=5, workers=1)
        assert res.best is not None, f"{rate} req/s: {res.table()}"
        answers[rate] = res.best.instances
    assert answers[48] == 1
    for rate in (96, 240):
        k = rate // 48
        assert answers[48] <= answers[rate] <= k * answers[48], answers
    probes = res.frontier  # at 240 req/s: each instance of a probe serves >= 1,000 requests
    assert (probes["requests"] >= 1000 * probes["instances"]).all()


# --- QA fixes: evidence off the fit's GPUs, attainment bounds, events, prices, legend -------


def test_a_fit_that_never_saw_the_gpu_is_transferred_evidence() -> None:
    """trained-physics' fit saw H100 only: an A100's step times are that fit on the A100's
    peaks. Both read `fitted` and the plan compared them without a word (QA: "best: A100-80
    x 1"); the uncovered GPU is now `fitted (transferred)` and the plan warns."""
    from simulator.catalog.hardware import get_gpu
    from simulator.catalog.models import load_model
    from simulator.latency import build_step_time_model
    from simulator.plan import evidence, mixed_evidence

    model = load_model("meta-llama/llama-3.1-8b-instruct")
    provenance = {
        g: build_step_time_model("trained-physics", model, get_gpu(g), 1).provenance()
        for g in ("H100", "A100-80")
    }
    assert [evidence(p) for p in provenance.values()] == ["fitted", "fitted (transferred)"]
    (warning,) = mixed_evidence(provenance)
    assert "H100: fitted; A100-80: fitted (transferred)" in warning
    # A fit that records no GPUs (blackbox's per-GPU fits) is not read as uncovered.
    assert evidence({"latency_model": "blackbox", "coefficients": "BLIS's fit for H100"}) == (
        "fitted"
    )


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan that gets as far as simulating fails at once rather than running for hours."""
    import simulator.sweeps

    def refuse(*_args, **_kwargs):
        raise AssertionError("the plan started simulating")

    monkeypatch.setattr(simulator.sweeps, "sweep", refuse)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (1, "min_attainment: invalid value 1; a 100 % attainment cannot be shown by a finite"),
        (1.0, "use a fraction below 1, e.g. 0.999"),
        (0.99999, "each probe would run 1,000,000 requests per instance"),
        (1.5, "min_attainment: invalid value 1.5; must be a fraction in [0, 1)"),
    ],
)
def test_an_attainment_no_finite_run_can_show_is_refused_up_front(
    no_simulation, value: float, needle: str
) -> None:
    """QA: min_attainment 1 made every probe 10,000,000 requests per instance (the plan was
    silent for minutes, and from 11 instances a probe exceeded a run's request limit)."""
    with pytest.raises(ConfigError) as err:
        plan(BASE, SLO, min_attainment=value, workers=1)
    assert needle in str(err.value)


def test_the_strictest_attainment_allowed_needs_a_round_number_of_requests() -> None:
    from simulator.plan import MAX_REQUESTS_PER_INSTANCE, required_requests

    assert required_requests({}, 0.9999) == MAX_REQUESTS_PER_INSTANCE == 100_000
    assert required_requests({"ttft_p99_ms": 1.0}, 0.99) == 1_000


def test_a_fleet_whose_probe_would_exceed_a_runs_requests_is_refused_up_front(
    no_simulation,
) -> None:
    """At 10,000 requests per instance (0.999), a probe of 20,000 instances would run 2 x 10^8
    requests, more than one run holds: said before the search, not when it gets there."""
    with pytest.raises(ConfigError, match=r"max_instances: invalid value 20000; a probe of "
                       r"20,000 instances would run 200,000,000 requests"):  # fmt: skip
        plan(BASE, SLO, min_attainment=0.999, max_instances=20_000, workers=1)


def test_cli_refuses_a_full_attainment_naming_the_flag(
    cli_app: typer.Typer, scenario_file: Path, no_simulation
) -> None:
    args = ["plan", str(scenario_file), "--slo", "ttft_p99_ms=50", "--min-attainment", "1"]
    res = CliRunner().invoke(cli_app, args)
    assert res.exit_code == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: --min-attainment: invalid value 1.0; a 100 % attainment")


def test_a_scenario_with_events_is_refused_as_plan_does_not_search_them(no_simulation) -> None:
    """QA: events naming instance_2 failed the first probe (1 instance) with a message that
    read as a sweep grid's error. Plan sizes cluster.num_instances from 1 up, so an event's
    instance may not exist and an added one would go unpriced: refused, saying why."""
    scenario = {
        **BASE,
        "cluster": {"num_instances": 3},
        "events": [{"at_s": 5, "action": "drain_instance", "target": "instance_2"}],
    }
    with pytest.raises(ConfigError) as err:
        plan(scenario, SLO, workers=1)
    text = str(err.value)
    assert text.startswith(
        "plan: the scenario lists `events` (events[0]: drain_instance instance_2 at 5 s), "
        "which plan does not take"
    )
    assert "grid" not in text


@pytest.fixture
def unpriced_gpu_scenario(tmp_path: Path) -> Path:
    """BASE with a hardware_file defining MyGPU, which has no default price."""
    spec = {"TFlopsPeak": 989.5, "TFlopsFP8": 1979.0, "BwPeakTBs": 3.35, "mfuPrefill": 0.45,
            "mfuDecode": 0.3, "MemoryGiB": 80}  # fmt: skip
    (tmp_path / "gpus.yaml").write_text(yaml.safe_dump({"MyGPU": spec}))
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({**BASE, "hardware_file": "gpus.yaml"}))
    return path


def test_cli_asks_for_a_missing_price_as_a_flag(
    cli_app: typer.Typer, unpriced_gpu_scenario: Path, no_simulation
) -> None:
    """QA: the command line said `pass prices={'MyGPU': USD/h}`, a Python argument."""
    args = ["plan", str(unpriced_gpu_scenario), "--slo", "ttft_p99_ms=50", "--gpu", "H100"]
    res = CliRunner().invoke(cli_app, [*args, "--gpu", "MyGPU"])
    assert res.exit_code == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: --price: no price for GPU 'MyGPU'")
    assert "pass --price MyGPU=USD_PER_HOUR" in lines[0] and "prices=" not in lines[0]
    # The Python API keeps its own wording.
    with pytest.raises(ConfigError, match=r"pass prices=\{'MyGPU': USD/h\}"):
        plan(unpriced_gpu_scenario, SLO, gpus=["H100", "MyGPU"], workers=1)


def test_an_unpriced_winner_says_so_rather_than_nan(result) -> None:
    """QA: a single GPU from a hardware_file won with `$nan/h`."""
    from dataclasses import replace

    from simulator.plan import PlanChoice

    alone = replace(result, best=PlanChoice("MyGPU", 3, 1, math.nan, gpus=3))
    last = alone.table().splitlines()[-1]
    assert last == "best: MyGPU x 3 instance(s) (TP 1, 3 GPUs), (no price)"


def test_the_legend_names_only_what_the_plot_shows(result) -> None:
    """QA: with no probe meeting the SLOs the legend still read "meets every SLO"."""

    def legend(res) -> list[str]:
        return [t.get_text() for t in res.plot().axes[0].get_legend().get_texts()]

    assert "meets every SLO" in legend(result)
    none_meet = plan(BASE, SLO, seeds=(1,), max_instances=2, workers=1)
    assert not none_meet.frontier["meets"].any()
    assert "meets every SLO" not in legend(none_meet)


def test_gpus_never_planned_draw_no_evidence_warning() -> None:
    """Neither GPU fits Llama-3.1-70B at TP 1, so neither is simulated: the warning that their
    evidence differs (H100 calibrated, L40S transferred) compared nothing."""
    res = plan(UNFIT_70B, {"ttft_p90_ms": 2000.0}, gpus=["H100", "L40S"], seeds=(1,),
               max_instances=2, workers=1)  # fmt: skip
    assert list(res.per_gpu["evidence"]) == ["calibrated", "transferred"]
    assert len(res.warnings) == 2
    assert all(": not planned: " in w for w in res.warnings)


@pytest.mark.parametrize(
    ("extra", "start"),
    [
        (
            {
                "autoscaler": [
                    {
                        "signal": "in_flight",
                        "scale_up_threshold": 24,
                        "scale_down_threshold": 6,
                        "min_instances": 1,
                        "max_instances": 3,
                    }  # fmt: skip
                ]
            },
            "plan: the scenario has an `autoscaler` (autoscaler[0]: in_flight, 1-3 instances), "
            "which plan does not take",
        ),
        (
            {
                "node_pools": [
                    {
                        "name": "h100",
                        "gpu_type": "H100",
                        "gpus_per_node": 2,
                        "initial_nodes": 1,
                        "min_nodes": 1,
                        "max_nodes": 1,
                    }  # fmt: skip
                ]
            },
            "plan: the scenario has `node_pools` (node_pools[0]: h100, 1 x 2 H100), which plan "
            "does not take",
        ),
    ],
)
def test_autoscaled_or_node_pool_fleets_are_refused(extra, start, no_simulation) -> None:
    """QA: an autoscaled scenario's one-instance probe, grown to three by its autoscaler at
    60 req/s, "met the SLOs at 1 instance" priced as one GPU; node pools price per node and
    bound the count plan searches. Both are refused, saying why, before any probe runs."""
    with pytest.raises(ConfigError) as err:
        plan({**BASE, **extra}, SLO, workers=1)
    assert str(err.value).startswith(start)
