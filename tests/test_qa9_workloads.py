"""QA round 9, workloads: compose keeps every period's rate, closed-loop-only specs compose,
compose checks length laws, draws are capped at the request-size bound, --rate on an
absolute-rate spec is refused, errors name the field where it is written, help strings say
what is accepted, the empty-run warning, and a failed request ending its session/user."""

from __future__ import annotations

import logging
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from simulator.api import simulate
from simulator.cli import app
from simulator.engine.request import Request, RequestState
from simulator.errors import ConfigError
from simulator.limits import MAX_TOKENS
from simulator.workload.arrivals import ARRIVAL_PROCESSES
from simulator.workload.generator import Session, WorkloadStream
from simulator.workload.lengths import ConstantLength, EmpiricalLength, from_dist_spec
from simulator.workload.presets import compose_specs
from simulator.workload.spec import DistSpec, workload_spec_from_dict

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def const(value: int) -> dict:
    return {"type": "constant", "params": {"value": value}}


def client(cid: str, fraction: float = 1.0, **extra) -> dict:
    return {
        "id": cid,
        "rate_fraction": fraction,
        "arrival": {"process": "poisson"},
        "input_distribution": const(100),
        "output_distribution": const(20),
        **extra,
    }


# TV: aggregate 100, fractions summing to 2; client b's windows weigh 3 and 0.5.
TV = {
    "version": "2",
    "seed": 1,
    "aggregate_rate": 100,
    "horizon": 30_000_000,
    "clients": [
        client("a"),
        {
            **client("b"),
            "arrival": {"process": "gamma", "cv": 3},
            "lifecycle": {
                "windows": [
                    {"start_us": 0, "end_us": 10_000_000, "trace_rate": 3},
                    {
                        "start_us": 10_000_000,
                        "end_us": 20_000_000,
                        "trace_rate": 0.5,
                        "arrival": {"process": "constant"},
                    },
                ]
            },
        },
    ],
}
# A: aggregate 10, fractions summing to 2.
A = {
    "version": "2",
    "seed": 11,
    "aggregate_rate": 10,
    "num_requests": 3000,
    "clients": [client("x", 0.5), client("y", 1.5)],
}
# Cohort spike (a relative weight under an aggregate rate): 4 members share trace_rate 8.
COHORT_SPIKE = {
    "version": "2",
    "aggregate_rate": 20,
    "horizon": 30_000_000,
    "clients": [client("c", 1.0)],
    "cohorts": [
        {
            **{k: v for k, v in client("burst", 1.0).items() if k != "id"},
            "id": "burst",
            "population": 4,
            "spike": {"start_time_us": 5_000_000, "duration_us": 2_000_000, "trace_rate": 8},
        }
    ],
}
CLOSED = {
    "version": "2",
    "num_requests": 200,
    "clients": [
        {
            "id": "users",
            "concurrency": 4,
            "think_time_us": 100_000,
            "input_distribution": const(100),
            "output_distribution": const(20),
        }
    ],
}
ABSOLUTE = {
    "version": "2",
    "clients": [
        {
            **client("w"),
            "lifecycle": {
                "windows": [
                    {"start_us": 0, "end_us": 10_000_000, "trace_rate": 5},
                    {"start_us": 20_000_000, "end_us": 30_000_000, "trace_rate": 20},
                ]
            },
        }
    ],
}


def spec(data: dict):
    return workload_spec_from_dict(data)


def rates(data_or_spec) -> dict[str, tuple[float, list[float]]]:
    """Each client's base rate and its periods' rates (req/s), as the generator runs them."""
    s = spec(data_or_spec) if isinstance(data_or_spec, dict) else data_or_spec
    stream = WorkloadStream(s, seed=0, horizon_us=30_000_000)
    return {
        p.spec.id: (p.rate_per_s, [rate for _, _, rate in p.period_windows])
        for p in stream.plans
        if not p.spec.concurrency_users
    }


def period_counts(s, horizon_us: int = 30_000_000) -> Counter:
    """Requests per (client, 10-s period), without the spec's num_requests cut."""
    s = s.model_copy(update={"num_requests": None})
    stream = WorkloadStream(s, seed=1, horizon_us=horizon_us)
    return Counter((r.client_id, r.arrival_us // 10_000_000) for r in stream)


# --- 1. compose keeps every period's absolute rate ------------------------------------------


def test_compose_keeps_each_windows_rate():
    """b's windows alone: 100 × 3 / 2 = 150 req/s and 100 × 0.5 / 2 = 25 req/s, so ⌈150 × 10⌉
    = 1500 and 250 requests. Composed with A (10 req/s) the merged aggregate is 110; before
    the fix the weights stayed 3 and 0.5 against merged fractions summing to 1: 330 and 55
    req/s, 3300 and 550 requests."""
    alone = rates(TV)
    assert alone["b"][1] == pytest.approx([150.0, 25.0])
    merged = compose_specs([spec(TV), spec(A)])
    assert merged.aggregate_rate == 110
    composed = rates(merged)
    for cid, (base, periods) in {**alone, **rates(A)}.items():
        assert composed[cid][0] == pytest.approx(base), cid
        assert composed[cid][1] == pytest.approx(periods), cid
    # Generated requests per period: TV's clients unchanged by composing (same seed, ids).
    before = period_counts(spec(TV))
    after = period_counts(merged)
    assert before[("b", 0)] == 1500 and before[("b", 1)] == 250
    for key, n in before.items():
        assert after[key] == n, key


def test_compose_keeps_a_cohort_spikes_rate():
    """The spike's 8 is a weight: 20 × 8 / Σ fractions (1 + 4 × 1/4 = 2) = 80 req/s for the
    cohort, 20 per member, 2 s each: 40 requests per member, alone and composed."""
    alone = rates(COHORT_SPIKE)
    assert [alone[f"burst-{j}"][1] for j in range(4)] == [pytest.approx([20.0])] * 4
    merged = compose_specs([spec(A), spec(COHORT_SPIKE)])
    composed = rates(merged)
    for cid, (base, periods) in alone.items():
        assert composed[cid][0] == pytest.approx(base), cid
        assert composed[cid][1] == pytest.approx(periods), cid


# --- 2. closed-loop-only specs --------------------------------------------------------------


@pytest.mark.parametrize("closed_rate", [None, 5.0])
def test_closed_loop_only_spec_composes_and_takes_no_share(closed_rate):
    """Users have no rate: with or without an (unused) aggregate_rate the spec composes, and
    the other spec's clients keep their rates (x: 10 × 0.5 / 2 = 2.5, y: 7.5 req/s; with the
    5 counted they were 3.75 and 11.25)."""
    closed = {**CLOSED, **({"aggregate_rate": closed_rate} if closed_rate else {})}
    for order in ([closed, A], [A, closed]):
        merged = compose_specs([spec(d) for d in order])
        assert merged.aggregate_rate == 10
        got = rates(merged)
        assert got["x"][0] == pytest.approx(2.5) and got["y"][0] == pytest.approx(7.5)
        users = [c for c in merged.clients if c.concurrency_users]
        assert [c.concurrency for c in users] == [4]
    # With an absolute-rate spec too: its windows keep their req/s and no aggregate appears.
    merged = compose_specs([spec(closed), spec(ABSOLUTE)])
    assert not merged.aggregate_rate
    assert rates(merged)["w"][1] == pytest.approx([5.0, 20.0])


def test_closed_loop_only_specs_compose_together():
    merged = compose_specs([spec(CLOSED), spec({**CLOSED, "aggregate_rate": 5})])
    assert merged.aggregate_rate is None
    assert [c.id for c in merged.clients] == ["users", "users-1"]


# --- 3. compose checks the length laws ------------------------------------------------------

BAD_LAWS = {
    "negative std_dev": (
        {
            "clients": [
                client(
                    "a",
                    input_distribution={
                        "type": "gaussian",
                        "params": {"mean": 100, "std_dev": -1, "min": 1, "max": 200},
                    },
                )
            ]
        },  # fmt: skip
        "clients[0].input_distribution.params.std_dev",
    ),
    "min above max": (
        {
            "clients": [
                client(
                    "a",
                    input_distribution={
                        "type": "gaussian",
                        "params": {"mean": 100, "std_dev": 5, "min": 900, "max": 800},
                    },
                )
            ]
        },  # fmt: skip
        "clients[0].input_distribution.params.min",
    ),
    "exponential mean 0": (
        {
            "clients": [
                client("a", output_distribution={"type": "exponential", "params": {"mean": 0}})
            ]
        },  # fmt: skip
        "clients[0].output_distribution.params.mean",
    ),
    "negative sigma": (
        {
            "clients": [
                client(
                    "a", output_distribution={"type": "lognormal", "params": {"mu": 3, "sigma": -1}}
                )
            ]
        },  # fmt: skip
        "clients[0].output_distribution.params.sigma",
    ),
    "negative constant": (
        {"clients": [client("a"), client("b", input_distribution=const(-5))]},
        "clients[1].input_distribution.params.value",
    ),
    "negative probability": (
        {
            "clients": [
                client("a", input_distribution={"type": "empirical", "params": {"10": -1, "20": 1}})
            ]
        },  # fmt: skip
        "clients[0].input_distribution.params[10]",
    ),
    "missing table file": (
        {
            "clients": [client("a", input_distribution={"type": "empirical", "file": "nope.csv"})]
        },  # fmt: skip
        "clients[0].input_distribution.file",
    ),
    "cohort std_dev": (
        {
            "cohorts": [
                {
                    **client("day"),
                    "population": 3,
                    "input_distribution": {
                        "type": "gaussian",
                        "params": {"mean": 100, "std_dev": -3, "min": 1, "max": 200},
                    },
                }
            ]
        },  # fmt: skip
        "cohorts[0].input_distribution.params.std_dev",
    ),
    "window law": (
        {
            "clients": [
                client(
                    "a",
                    lifecycle={
                        "windows": [
                            {
                                "start_us": 0,
                                "end_us": 10,
                                "trace_rate": 3,
                                "input_distribution": {
                                    "type": "gaussian",
                                    "params": {"mean": 100, "std_dev": 10, "min": 50, "max": 20},
                                },
                            }
                        ]
                    },
                )
            ]
        },  # fmt: skip
        "clients[0].lifecycle.windows[0].input_distribution.params.min",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_LAWS))
def test_compose_refuses_a_bad_length_law_naming_file_and_field(tmp_path, case):
    data, field = BAD_LAWS[case]
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(A | {"clients": [client("x")]}))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"version": "2", "aggregate_rate": 10, **data}))
    res = invoke("compose", "--from", good, "--from", bad)
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert f"{bad}: {field}" in lines[0], lines[0]
    # The run names the same field, as the same check.
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        list(WorkloadStream(spec({"version": "2", "aggregate_rate": 10, "num_requests": 5,
                                  **data}), seed=0))  # fmt: skip


# --- 4 and 8. the request-size bound --------------------------------------------------------


@pytest.mark.parametrize(
    "law",
    [
        {"type": "exponential", "params": {"mean": 9e7}},
        {"type": "lognormal", "params": {"mu": 18, "sigma": 3}},
        {
            "type": "pareto_lognormal",
            "params": {"alpha": 0.3, "xm": 1e6, "mu": 3, "sigma": 1, "mix_weight": 1},
        },  # fmt: skip
    ],
)
def test_unbounded_laws_are_capped_at_the_request_size_bound(law):
    """Exp(9e7) exceeds 10^8 with probability e^(-10/9) ≈ 0.33; e^(18 + 3Z) does when
    Z > (ln 10^8 − 18) / 3 ≈ 0.14 (p ≈ 0.44); the Pareto 10^6 / U^(1/0.3) when U < 0.01^0.3
    ≈ 0.25. So 2000 draws all but surely reach the cap, and none passes it."""
    sampler = from_dist_spec(DistSpec.model_validate(law))
    draws = sampler.sample(np.random.default_rng(3), 2000)
    assert draws.max() == MAX_TOKENS
    assert draws.min() >= 1


def test_values_beyond_the_bound_are_refused_with_the_one_limit():
    with pytest.raises(ConfigError, match=r"must be from 0 to 100,000,000 tokens"):
        ConstantLength(MAX_TOKENS + 1)
    assert ConstantLength(MAX_TOKENS).sample(np.random.default_rng(0), 1)[0] == MAX_TOKENS
    with pytest.raises(ConfigError, match=r"token counts must be from 0 to 100,000,000"):
        EmpiricalLength({10: 1.0, MAX_TOKENS + 1: 1.0})
    with pytest.raises(ConfigError, match=r"mu: invalid value 20.0; must be <= ln\(100,000,000\)"):
        from_dist_spec(DistSpec(type="lognormal", params={"mu": 20, "sigma": 3}))
    from_dist_spec(DistSpec(type="lognormal", params={"mu": math.log(MAX_TOKENS), "sigma": 1}))


def test_trace_of_an_unbounded_law_replays(tmp_path):
    """The QA case: exponential mean 9e7 without max wrote prompts above 10^8 that replay
    refused."""
    data = {
        "version": "2",
        "seed": 5,
        "aggregate_rate": 10,
        "num_requests": 30,
        "clients": [
            client("a", input_distribution={"type": "exponential", "params": {"mean": 9e7}})
        ],  # fmt: skip
    }
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    prefix = tmp_path / "t"
    run = invoke("run", "--latency-model", "roofline", "--workload-spec", path,
                 "--trace-output", prefix)  # fmt: skip
    assert run.exit_code == 0, run.output
    rows = (tmp_path / "t.csv").read_text().splitlines()
    header = rows[0].split(",")
    col = header.index("input_tokens")
    sizes = [int(r.split(",")[col]) for r in rows[1:]]
    assert max(sizes) == MAX_TOKENS
    rep = invoke("replay", "--latency-model", "roofline", "--trace-data", f"{prefix}.csv",
                 "--trace-header", f"{prefix}.yaml")  # fmt: skip
    assert rep.exit_code == 0, rep.output


# --- 5. --rate on an absolute-rate spec -----------------------------------------------------


@pytest.mark.parametrize("aggregate", [None, 0])
def test_rate_on_an_absolute_rate_spec_is_refused(tmp_path, aggregate):
    """Windows 5 and 20 req/s × 10 s: 50 + 200 = 250 requests; --rate 10 made them weights
    (10 × 5 and 10 × 20 req/s: 2500) without a word."""
    data = ABSOLUTE | ({"aggregate_rate": aggregate} if aggregate is not None else {})
    path = tmp_path / "abs.yaml"
    path.write_text(yaml.safe_dump(data))
    assert sum(1 for _ in WorkloadStream(spec(data), seed=0)) == 250
    res = invoke("run", "--latency-model", "roofline", "--workload-spec", path, "--rate", 10)
    assert res.exit_code == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: --rate: invalid value 10; the workload spec gives absolute")
    scenario = {"latency": {"model": "roofline"}, "workload_spec": str(path)}
    with pytest.raises(ConfigError, match=r"^workload__rate: invalid value 10; .*absolute"):
        simulate(scenario, workload__rate=10)


def test_rate_on_a_shared_rate_spec_still_applies(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(A | {"num_requests": 20}))
    out = tmp_path / "r.json"
    res = invoke("run", "--latency-model", "roofline", "--workload-spec", path, "--rate", 5,
                 "--results-path", out)  # fmt: skip
    assert res.exit_code == 0, res.output


# --- 6. errors name the field where the user wrote it ---------------------------------------

BAD_STD = {"type": "gaussian", "params": {"mean": 100, "std_dev": -1, "min": 1, "max": 200}}


def test_a_cohorts_bad_law_is_named_by_its_cohort():
    """The cohort's members follow the spec's one client in the expanded list (clients[1..3]);
    the error names cohorts[0], where the field is written."""
    data = {
        "version": "2",
        "aggregate_rate": 10,
        "num_requests": 5,
        "clients": [client("a")],
        "cohorts": [{**client("day"), "population": 3, "input_distribution": BAD_STD}],
    }
    with pytest.raises(ConfigError) as err:
        WorkloadStream(spec(data), seed=0)
    assert str(err.value).startswith("cohorts[0].input_distribution.params.std_dev: invalid")


def test_an_inline_and_a_file_workloads_bad_law_is_named_where_written(tmp_path):
    workload = {
        "version": "2",
        "aggregate_rate": 10,
        "num_requests": 5,
        "clients": [client("a", input_distribution=BAD_STD)],
    }
    with pytest.raises(ConfigError) as err:
        simulate({"latency": {"model": "roofline"}, "workload": workload})
    assert str(err.value).startswith("workload.clients[0].input_distribution.params.std_dev")
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(workload))
    with pytest.raises(ConfigError) as err:
        simulate({"latency": {"model": "roofline"}, "workload_spec": str(path)})
    assert str(err.value).startswith(f"{path}: clients[0].input_distribution.params.std_dev")


# --- 7. help strings say what each command accepts ------------------------------------------


def test_convert_preset_arrival_help_lists_what_it_accepts():
    help_text = " ".join(invoke("convert", "preset", "--help").stdout.replace("│", " ").split())
    listed = help_text.split("arrival process: ", 1)[1].split(" (", 1)[0]
    assert set(listed.split(" | ")) == set(ARRIVAL_PROCESSES)
    for process in ARRIVAL_PROCESSES:
        res = invoke("convert", "preset", "--name", "chatbot", "--arrival", process)
        assert res.exit_code == 0, res.output
        assert yaml.safe_load(res.stdout)["clients"][0]["arrival"]["process"] == process


def test_run_arrival_help_lists_what_it_accepts():
    help_text = " ".join(invoke("run", "--help").stdout.replace("│", " ").split())
    listed = help_text.split("arrival process: ", 1)[1]
    assert "gamma" not in listed.split("--")[0]
    res = invoke("run", "--latency-model", "roofline", "--arrival", "gamma")
    assert res.exit_code == 2


# --- 9. the empty run's warning -------------------------------------------------------------


def test_an_empty_run_says_so_without_percentiles(caplog):
    """Prompts of 10^8 tokens fit no KV cache: every request is dropped, none completes."""
    workload = {
        "version": "2",
        "aggregate_rate": 10,
        "num_requests": 5,
        "clients": [client("a", input_distribution=const(MAX_TOKENS))],
    }
    with caplog.at_level(logging.WARNING, logger="servesim"):
        result = simulate({"latency": {"model": "roofline"}, "workload": workload})
    assert result.steady_state.verdict == "empty"
    said = [r.getMessage() for r in caplog.records if "the run is" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith("the run is empty: no request completed, so it has no latencies")
    assert "percentiles" not in said[0]
    assert "(5 dropped, timed out or failed; 0 still unfinished" in said[0]


# --- 10. a failed request ends its session or user ------------------------------------------


def _failing_cluster(workload: dict) -> dict:
    """Eight instances on two 4-GPU nodes; node h100-1 fails at 5 s and nothing retries."""
    return {
        "seed": 9,
        "model": "meta-llama/llama-3.1-8b-instruct",
        "node_pools": [
            {
                "name": "h100",
                "gpu_type": "H100",
                "gpus_per_node": 4,
                "initial_nodes": 2,
                "max_nodes": 2,
            }
        ],  # fmt: skip
        "deployments": [{"name": "llama", "num_instances": 8, "pool": "h100"}],
        "instance_lifecycle": {"initial_instances_loaded": True, "retry_on_failure": False},
        "events": [{"at_s": 5, "action": "fail_node", "node": "h100-1"}],
        "workload": workload,
    }


def test_a_failed_request_ends_its_closed_loop_user():
    """16 users with 2000-token replies are all mid-request at 5 s; the failed node's users
    lose theirs (failed) and stop: each is cancelled and sends nothing after."""
    workload = {"version": "2", "seed": 9, "horizon": 20_000_000, "clients": [
        {"id": "users", "concurrency": 16, "think_time_us": 100_000,
         "input_distribution": const(1000), "output_distribution": const(2000)}]}  # fmt: skip
    result = simulate(_failing_cluster(workload), warn_unsteady=False)
    df = result.requests
    failed = df[df.state == "failed"]
    assert len(failed) > 0
    assert result.session_counts["cancelled"] == failed.session_id.nunique() == len(failed)
    for sid, group in df.groupby("session_id"):
        if (group.state == "failed").any():
            last_failed = group[group.state == "failed"].arrival_us.max()
            assert (group.arrival_us <= last_failed).all(), sid


def test_a_failed_round_cancels_an_open_loop_session():
    """Open loop: every round is sent, and a session with a failed round is cancelled (it was
    counted horizon_interrupted before)."""
    rounds = [Request(f"r{i}", i, 10, 5) for i in range(3)]
    for r, state in zip(rounds, (RequestState.COMPLETED, RequestState.FAILED,
                                 RequestState.COMPLETED), strict=True):  # fmt: skip
        r.state = state
    session = Session("s", plan=None, rounds_total=3, rounds=rounds)
    assert session.open_loop_outcome() == "cancelled"
    rounds[1].state = RequestState.DROPPED_ON_DRAIN
    assert session.open_loop_outcome() == "cancelled"
    rounds[1].state = RequestState.RUNNING
    assert session.open_loop_outcome() == "horizon_interrupted"
    rounds[1].state = RequestState.COMPLETED
    assert session.open_loop_outcome() == "completed"
    workload = {"version": "2", "seed": 9, "aggregate_rate": 2, "horizon": 20_000_000,
                "clients": [{**client("chat"), "closed_loop": False,
                             "input_distribution": const(1000),
                             "output_distribution": const(2000),
                             "reasoning": {"multi_turn": {"max_rounds": 3,
                                                          "think_time_us": 100_000}}}]}  # fmt: skip
    result = simulate(_failing_cluster(workload), warn_unsteady=False)
    df = result.requests
    failed_sessions = df[df.state == "failed"].session_id.nunique()
    assert failed_sessions > 0
    assert result.session_counts["cancelled"] == failed_sessions


def test_docs_name_failed_requests_and_composes_count_rule():
    text = Path(__file__).parents[1].joinpath("docs", "workloads.md").read_text()
    assert "or failed with its node" in text
    assert "follows its *rate*, not its own count" in text
