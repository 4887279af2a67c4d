"""QA round 9, plan and sweep: what a PD plan/sweep says priced its steps (the pools, as a run's
Latency Model block says), the pools' batch limits, errors that name the command line's flags,
and a plan where no GPU could be planned."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.api import as_scenario, simulate, with_overrides
from simulator.errors import ConfigError
from simulator.plan import evidence, latency_model_text, mixed_evidence, plan
from simulator.sweeps import latency_entries, sweep

# Two PD pools of one instance each on Llama-3.1-8B; the top level and the pools name different
# step-time models (the QA fixtures ppd_rev.yaml and ppd_lm.yaml, shortened).
PD = {
    "seed": 1,
    "model": "meta-llama/llama-3.1-8b-instruct",
    "hardware": "H100",
    "tp": 1,
    "cluster": {
        "num_instances": 2,
        "pd": {"prefill_instances": 1, "decode_instances": 1, "decider": "always"},
    },
    "workload": {
        "rate": 5,
        "num_requests": 40,
        "prompt_tokens": {"distribution": "gaussian", "mean": 512, "stdev": 64, "min": 16,
                          "max": 1024},
        "output_tokens": {"distribution": "gaussian", "mean": 16, "stdev": 4, "min": 1,
                          "max": 32},
    },
}  # fmt: skip


def pd_scenario(top: str, prefill: str, decode: str) -> dict:
    pd = {
        **PD["cluster"]["pd"],
        "prefill": {"latency_model": prefill},
        "decode": {"latency_model": decode},
    }
    return {**PD, "latency": {"model": top}, "cluster": {**PD["cluster"], "pd": pd}}


# Roofline at the top, physics in both pools (ppd_rev.yaml); and the reverse (ppd_lm.yaml).
PHYSICS_POOLS = pd_scenario("roofline", "physics", "physics")
ROOFLINE_POOLS = pd_scenario("physics", "roofline", "roofline")
MIXED_POOLS = pd_scenario("roofline", "physics", "roofline")
GPUS = ["H100", "A100-80"]
# A bound every probe meets at its first count (2 instances: one per pool) and a short run:
# the median TTFT judged at 50 % attainment needs max(200, 10 / 0.5) = 200 requests per
# instance (plan.required_requests), so each plan here simulates one probe of 400 per GPU.
EASY = {"slos": {"ttft_p50_ms": 60_000.0}, "min_attainment": 0.5, "seeds": (1,)}


def run_block(scenario: dict, gpu: str) -> dict:
    """The Latency Model block `servesim run` prints for `scenario` on `gpu`."""
    return simulate(
        with_overrides(as_scenario(scenario), {"hardware": gpu}), warn_unsteady=False
    ).latency_provenance


@pytest.fixture(scope="module")
def physics_pools_plan():
    return plan(PHYSICS_POOLS, gpus=GPUS, max_instances=2, workers=1, **EASY)


@pytest.fixture(scope="module")
def roofline_pools_plan():
    return plan(ROOFLINE_POOLS, gpus=GPUS, max_instances=2, workers=1, **EASY)


# --- 1. plan reads the pools' latency model --------------------------------------------------


def test_plan_tables_the_pools_model_and_warns_of_their_mixed_evidence(physics_pools_plan):
    """Roofline at the top, physics in both pools: every step of a PD probe is a pool's (its
    split covers every instance), so H100 is physics fitted on itself (calibrated) and A100-80
    physics with the H100 fit carried over (transferred). The table read the top level,
    `roofline`/`analytical` on both, and said nothing of the mixed evidence."""
    res = physics_pools_plan
    assert list(res.per_gpu["latency_model"]) == ["physics", "physics"]
    assert list(res.per_gpu["evidence"]) == ["calibrated", "transferred"]
    (warning,) = res.warnings
    assert "different evidence (H100: calibrated; A100-80: transferred)" in warning
    assert res.table().count("warning: the GPUs' step times rest on different evidence") == 1


def test_plan_draws_no_false_warning_when_the_pools_run_roofline(roofline_pools_plan):
    """Physics at the top, roofline in both pools: no probe runs physics, both GPUs are
    analytical; the plan warned of H100 calibrated against A100-80 transferred."""
    res = roofline_pools_plan
    assert list(res.per_gpu["latency_model"]) == ["roofline", "roofline"]
    assert list(res.per_gpu["evidence"]) == ["analytical", "analytical"]
    assert res.warnings == []


@pytest.mark.parametrize("scenario", [PHYSICS_POOLS, ROOFLINE_POOLS, MIXED_POOLS])
def test_plan_agrees_with_the_run_latency_block(scenario):
    """The law: on every GPU, plan's two columns read what `servesim run` says priced the
    run (its Latency Model block, `by_role` included), though plan builds them from the
    deployments before any probe."""
    res = plan(scenario, gpus=GPUS, max_instances=2, workers=1, **EASY)
    for gpu, row in zip(GPUS, res.per_gpu.to_dict("records"), strict=True):
        block = run_block(scenario, gpu)
        assert row["evidence"] == evidence(block)
        assert row["latency_model"] == latency_model_text(block)
        pools = {e["latency_model"] for e in latency_entries(block).values()}
        # The top level never priced a PD step: only the pools' models appear.
        assert pools == {
            scenario["cluster"]["pd"][r]["latency_model"] for r in ("prefill", "decode")
        }


def test_pools_on_different_models_are_listed_and_any_pools_evidence_counts():
    """Prefill physics, decode roofline: each GPU's row lists both; the decode pools agree
    (analytical), the prefill pools do not (calibrated against transferred), and that one
    pool is enough for the warning."""
    blocks = {gpu: run_block(MIXED_POOLS, gpu) for gpu in GPUS}
    assert [evidence(b) for b in blocks.values()] == [
        "prefill calibrated, decode analytical",
        "prefill transferred, decode analytical",
    ]
    (warning,) = mixed_evidence(blocks)
    assert (
        "(H100: prefill calibrated, decode analytical; A100-80: prefill transferred, "
        "decode analytical)"
    ) in warning
    # One GPU alone compares nothing, whatever its pools.
    assert mixed_evidence({"H100": blocks["H100"]}) == []


def test_a_gpu_blind_model_in_one_pool_is_named_and_the_other_pool_still_compared():
    """crossmodel in the decode pool prices it alike on every GPU; the prefill pool on physics
    still differs in evidence (calibrated against transferred): both are said."""
    crossmodel = {"latency_model": "crossmodel", "coefficients": "BLIS's global crossmodel fit"}
    blocks = {
        gpu: {
            "latency_model": "roofline",
            "coefficients": "analytical: no fitted coefficients",
            "by_role": {
                "prefill": {"latency_model": "physics", "source": source},
                "decode": crossmodel,
            },
        }
        for gpu, source in (("H100", "calibrated"), ("A100-80", "transferred"))
    }
    blind, mixed = mixed_evidence(blocks)
    assert blind.startswith("latency model crossmodel prices the decode pool's steps alike")
    assert "H100: prefill calibrated, decode fitted" in mixed


# --- 2. the sweep's latency columns ---------------------------------------------------------


def test_sweep_columns_name_the_pools_model_as_the_run_block_does():
    """The sweep copied the top level of the block: `roofline` for runs whose every step
    physics priced. The law: one value when the pools agree (theirs), each pool labelled when
    they differ; and the `latency model:` line follows."""
    from simulator.metrics.study import latency_models_line

    res = sweep(PHYSICS_POOLS, {"cluster.pd.decode.latency_model": ["physics", "roofline"]},
                seeds=[1], workers=1)  # fmt: skip
    same = run_block(PHYSICS_POOLS, "H100")["by_role"]
    assert list(res.runs["latency_model"]) == ["physics", "prefill: physics; decode: roofline"]
    assert res.runs["latency_coefficients"][0] == same["prefill"]["coefficients"]
    assert res.runs["latency_coefficients"][1] == (
        f"prefill: {same['prefill']['coefficients']}; decode: analytical: no fitted coefficients"
    )
    assert list(res.points["latency_model"]) == list(res.runs["latency_model"])
    assert latency_models_line(res).startswith(
        f"latency model: physics ({same['prefill']['coefficients']}); prefill: physics; "
        "decode: roofline (prefill: "
    )


def test_sweep_without_pools_reads_the_top_level():
    res = sweep({**PD, "cluster": {"num_instances": 1}}, {}, seeds=[1], workers=1)
    block = run_block({**PD, "cluster": {"num_instances": 1}}, "H100")
    assert "by_role" not in block
    assert res.runs["latency_model"][0] == block["latency_model"] == "physics"
    assert res.runs["latency_coefficients"][0] == block["coefficients"]


# --- 3. the pools' batch limits -------------------------------------------------------------


def test_batch_limits_are_the_pools_when_they_agree_with_each_other(physics_pools_plan):
    """Physics pools on H100 run vLLM's limits there (1,024 seqs, 8,192 tokens), the roofline
    top level BLIS's (256, 2,048), which no PD instance runs; plan showed the latter."""
    assert list(physics_pools_plan.per_gpu["batch_limits"]) == [
        "1,024 seqs, 8,192 tokens (vLLM's default on H100)",
        "256 seqs, 2,048 tokens (vLLM's default on A100-80)",
    ]


def test_batch_limits_per_pool_when_the_pools_differ():
    from simulator.api import as_scenario
    from simulator.deployment import pool_deployments, resolve_deployment
    from simulator.plan import _limits_text

    sc = as_scenario(MIXED_POOLS)
    top = resolve_deployment(sc)
    assert _limits_text(top, pool_deployments(sc, top)) == (
        "prefill 1,024 seqs, 8,192 tokens (vLLM's default on H100); "
        "decode 256 seqs, 2,048 tokens (BLIS's default)"
    )
    assert _limits_text(top, {}) == "256 seqs, 2,048 tokens (BLIS's default)"


# --- 4. errors name the flags ---------------------------------------------------------------


@pytest.fixture
def pd_file(tmp_path: Path) -> Path:
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump(PD))
    return path


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    import simulator.sweeps

    def refuse(*_args, **_kwargs):
        raise AssertionError("the plan started simulating")

    monkeypatch.setattr(simulator.sweeps, "sweep", refuse)


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (["--max-instances", "0"], "error: --max-instances: invalid value 0; must be an integer"),
        (["--max-instances", "1"], "error: --max-instances: invalid value 1; a disaggregated "),
        (["--min-goodput", "2"], "error: --min-goodput: invalid value 2.0; must be a fraction"),
        (["--price", "H100=-1"], "error: --price H100: invalid value -1.0; must be a number"),
        (["--workers", "-1"], "error: --workers: invalid value -1; must be an integer >= 1"),
        (["--seeds", "1,1"], "error: --seeds: duplicate seeds in [1, 1]"),
        (["--min-attainment", "1"], "error: --min-attainment: invalid value 1.0"),
    ],
)
def test_plan_cli_errors_name_the_flag(pd_file, no_simulation, extra, line) -> None:
    from simulator.cli import app

    res = CliRunner().invoke(app, ["plan", str(pd_file), "--slo", "ttft_p99_ms=300", *extra])
    assert res.exit_code == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), res.stderr


@pytest.mark.parametrize(
    ("kwargs", "start"),
    [
        ({"max_instances": 0}, "max_instances: invalid value 0"),
        ({"min_goodput": 2}, "min_goodput: invalid value 2"),
        ({"prices": {"H100": -1}}, "price of H100: invalid value -1"),
        ({"workers": 0}, "workers: invalid value 0"),
        ({"seeds": (1, 1)}, "seeds: duplicate seeds"),
    ],
)
def test_the_python_api_keeps_its_keywords(no_simulation, kwargs, start) -> None:
    with pytest.raises(ConfigError) as err:
        plan(PD, {"ttft_p99_ms": 300.0}, **kwargs)
    assert str(err.value).startswith(start)


def test_sweep_cli_workers_error_names_the_flag(tmp_path: Path) -> None:
    from simulator.cli import app

    (tmp_path / "s.yaml").write_text(
        yaml.safe_dump({"base": PD, "grid": {"workload.rate": [5]}, "seeds": [1]})
    )
    for value in ("-1", "0"):
        res = CliRunner().invoke(app, ["sweep", str(tmp_path / "s.yaml"), "--workers", value])
        assert res.exit_code == 2 and res.stdout == ""
        assert res.stderr.strip() == (
            f"error: --workers: invalid value {value}; must be an integer >= 1"
        )


# --- 5. no GPU could be planned -------------------------------------------------------------

# Llama-3.1-70B at TP 1 needs 132 GiB: it fits no L40S (43 GiB usable), H100 (72) or H200 (126),
# but a B200 (172).
UNFIT_70B = {
    "seed": 1,
    "model": "meta-llama/llama-3.1-70b-instruct",
    "hardware": "H100",
    "tp": 1,
    "workload": {"rate": 2, "num_requests": 200},
}


def test_a_plan_where_no_gpu_could_be_planned_says_so(no_simulation) -> None:
    """Nothing was simulated, so "no GPU meets the SLOs with <= 2 instances" claimed a search
    that never ran; the rows read planned False."""
    res = plan(UNFIT_70B, {"ttft_p99_ms": 300.0}, gpus=["L40S", "H100", "H200"], seeds=(1,),
               max_instances=2, workers=1)  # fmt: skip
    assert res.best is None and len(res.frontier) == 0
    assert list(res.per_gpu["planned"]) == [False, False, False]
    assert list(res.per_gpu["feasible"]) == [False, False, False]
    assert set(res.not_planned) == {"L40S", "H100", "H200"}
    last = res.table().splitlines()[-1]
    assert last.startswith(
        "no GPU could be planned (L40S, H100, H200), nothing was simulated: the model does not "
        "fit its TP 1 layout"
    )
    assert "meets the SLOs" not in res.table()


def test_a_plan_where_some_gpus_were_searched_names_the_others() -> None:
    """B200 holds the model and is searched (it misses a 1 ms TTFT at one instance); H100 was
    not planned: the last line keeps "no GPU meets the SLOs" and names the GPU left out."""
    res = plan(UNFIT_70B, {"ttft_p50_ms": 1.0}, gpus=["H100", "B200"], seeds=(1,),
               max_instances=1, workers=1, min_attainment=0.5)  # fmt: skip
    assert list(res.per_gpu["planned"]) == [False, True]
    assert list(res.frontier["gpu"]) == ["B200"]
    assert res.table().splitlines()[-1] == (
        "no GPU meets the SLOs with <= 1 instances (H100 not planned: see the warnings)"
    )
