"""Runtime invariant checks (simulator/invariants.py): silent on correct runs, and the first
broken law is reported with the law, the request and the simulated time — in the API as an
InvariantViolation, on the command line as one line and exit status 3."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import simulator
from simulator.cli import INVARIANT_EXIT_CODE, app
from simulator.cluster.cluster import run_simulation
from simulator.engine.batching import EngineConfig, VLLMEngine
from simulator.engine.request import Request, RequestState
from simulator.invariants import InvariantViolation, check_finished
from simulator.latency.blackbox import BlackboxModel

STEP_MODEL = BlackboxModel([0, 0, 0], [1000, 10.0, 5.0])
PD = {
    "workload": {"num_requests": 40, "rate": 50},
    "cluster": {
        "num_instances": 4,
        "pd": {"prefill_instances": 2, "decode_instances": 2, "decider": "always"},
    },
}


def _requests(n: int = 12) -> list[Request]:
    return [Request(f"request_{i}", i * 2000, 300, 40, index=i) for i in range(n)]


@pytest.mark.parametrize(
    "scenario",
    [
        "scenarios/quickstart.yaml",
        "scenarios/pd_2p2d.yaml",
        "scenarios/kv_cpu_offload.yaml",
        "scenarios/agent_sessions.yaml",
    ],
)
def test_checked_runs_of_the_bundled_scenarios_pass_and_change_nothing(scenario):
    checked = simulator.simulate(scenario, check_invariants=True, workload__num_requests=60)
    plain = simulator.simulate(scenario, check_invariants=False, workload__num_requests=60)
    assert checked.report_text() == plain.report_text()


def test_a_kv_leak_is_reported_with_law_instance_and_time(monkeypatch):
    """Sabotage: completing requests keep their KV blocks. The first check after the first
    completion must name the KV law; the run must not finish silently."""
    original = VLLMEngine.finish_step

    def leaky_finish(self, step_us):
        done = original(self, step_us)
        self.kv.used_blocks += len(done)  # blocks the accounting lost track of
        return done

    monkeypatch.setattr(VLLMEngine, "finish_step", leaky_finish)
    with pytest.raises(InvariantViolation) as caught:
        run_simulation(_requests(), EngineConfig(total_kv_blocks=200), STEP_MODEL, None, None, True)
    violation = caught.value
    assert "KV-block conservation" in violation.law
    assert violation.time_us > 0
    assert "instance_0" in str(violation)
    assert "\n" not in str(violation)


def test_a_causality_break_names_the_request():
    req = Request("request_7", 5000, 10, 2)
    req.state = RequestState.COMPLETED
    req.enqueue_us = 5000
    req.first_schedule_us = 5000
    req.first_token_us = 4000  # before it was scheduled
    req.completion_us = 6000
    with pytest.raises(InvariantViolation) as caught:
        check_finished(req, 6000)
    assert caught.value.request_id == "request_7"
    assert caught.value.time_us == 6000
    assert str(caught.value).startswith("invariant violated: causality (INV-5): request request_7")


def test_a_lost_request_breaks_conservation(monkeypatch):
    """Sabotage: the summary forgets one completed request."""
    import simulator.cluster.cluster as cluster_mod

    original = cluster_mod.compute_summary

    def forgetful(scope, requests, engines, end_us):
        summary = original(scope, requests, engines, end_us)
        if scope == "cluster":
            summary["completed_requests"] -= 1
        return summary

    monkeypatch.setattr(cluster_mod, "compute_summary", forgetful)
    with pytest.raises(InvariantViolation, match="request conservation"):
        run_simulation(_requests(), EngineConfig(total_kv_blocks=200), STEP_MODEL, None, None, True)


def test_checks_are_off_unless_asked(monkeypatch):
    monkeypatch.delenv("SERVESIM_CHECK_INVARIANTS", raising=False)
    import simulator.cluster.cluster as cluster_mod

    original = cluster_mod.compute_summary

    def forgetful(scope, requests, engines, end_us):
        summary = original(scope, requests, engines, end_us)
        summary["completed_requests"] -= 1
        return summary

    monkeypatch.setattr(cluster_mod, "compute_summary", forgetful)
    run_simulation(_requests(), EngineConfig(total_kv_blocks=200), STEP_MODEL)  # no raise


def test_pd_runs_pass_the_pd_laws():
    result = simulator.simulate(PD, check_invariants=True)
    assert result.summary["completed_requests"] == 40
    assert result.pd_metrics["dropped_at_decode_kv"] == 0


def test_cli_flag_reports_a_violation_on_one_line_with_exit_3(monkeypatch, tmp_path):
    original = VLLMEngine.finish_step

    def leaky_finish(self, step_us):
        done = original(self, step_us)
        self.kv.used_blocks += len(done)
        return done

    monkeypatch.setattr(VLLMEngine, "finish_step", leaky_finish)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        app,
        ["run", "--num-requests", "10", "--check-invariants", "--results-path", str(out)],
    )
    assert res.exit_code == INVARIANT_EXIT_CODE, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: invariant violated: KV-block")
    assert "at t=" in lines[0]
    assert not out.exists()
    assert "Traceback" not in res.output


def test_cli_flag_is_accepted_by_run_replay_and_sweep(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["run", "--num-requests", "5", "--check-invariants"])
    assert ok.exit_code == 0, ok.output
    replayed = runner.invoke(
        app,
        [
            "replay",
            "--trace-header",
            "tests/data/blis/r1_fixed512.trace.yaml",
            "--trace-data",
            "tests/data/blis/r1_fixed512.trace.csv",
            "--check-invariants",
        ],
    )
    assert replayed.exit_code == 0, replayed.output
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(
        "base: {workload: {num_requests: 5, rate: 5}}\n"
        "grid: {cluster.num_instances: [1, 2]}\nseeds: [1]\nworkers: 1\n"
    )
    swept = runner.invoke(app, ["sweep", str(sweep_file), "--check-invariants", "--quiet"])
    assert swept.exit_code == 0, swept.output


@pytest.mark.parametrize("scenario", ["scenarios/quickstart.yaml", "scenarios/pd_2p2d.yaml"])
def test_check_run_on_a_finished_result_holds_and_catches_a_broken_count(scenario):
    """docs/python.md: after a run, `check_run(result)` checks the end-of-run laws without the
    engines (a result keeps none). It used to fail on every result with instances, pairing
    them with the engines it was not given."""
    from simulator.invariants import check_run

    result = simulator.simulate(scenario, workload__num_requests=60)
    check_run(result)
    result.summary["total_output_tokens"] += 1
    with pytest.raises(InvariantViolation, match="total_output_tokens|output tokens"):
        check_run(result)
