"""QA round 9 leftovers (b): `observe`'s traffic-flag errors name the flag as `run`'s do;
`plan --gpu` names its flag; physics's choice of fit for a vLLM version it has no fit for is
told on stderr as well as in the provenance, and a version before vLLM's first release is
refused."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.catalog.hardware import get_gpu
from simulator.cli import app
from simulator.deployment import new_run_warnings
from simulator.errors import ConfigError

runner = CliRunner()
H100 = get_gpu("H100")


# --- 1. observe: a traffic flag's bad value names the flag ------------------------------------


@pytest.fixture
def listener():
    """A server socket nothing answers on: whether the command connected to it at all."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        yield server


def _connected(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


@pytest.mark.parametrize(
    ("traffic", "expected"),
    [
        (
            ["--rate", "1", "--num-requests", "0"],
            "--num-requests (workload.num_requests): must be from 1 to 100,000,000 requests "
            "(got 0)",
        ),
        (["--rate", "0", "--num-requests", "3"], "--rate (workload.rate): must be from"),
        (["--rate", "1", "--num-requests", "3", "--seed", "-1"], "--seed (seed): must be from"),
        (
            ["--rate", "1", "--num-requests", "3", "--horizon", "-5"],
            "--horizon (horizon_us): must be from 1",
        ),
        # Resolved when observe() builds the traffic, still before the pre-flight check.
        (
            ["--workload", "nope"],
            "--workload (workload.preset): unknown workload preset 'nope'; valid: ",
        ),
    ],
)
def test_observe_traffic_flag_errors_name_the_flag_before_any_connection(
    listener, tmp_path: Path, traffic: list[str], expected: str
) -> None:
    """Until this fix `observe --num-requests 0` said `workload.num_requests: ...`, the field
    only, where `run` says `--num-requests (workload.num_requests): ...`. The error is one
    line, exit 2, before the server is contacted and with no file written."""
    port = listener.getsockname()[1]
    args = [
        "observe", "--server-url", f"http://127.0.0.1:{port}", "--model", "m",
        "--trace-header", str(tmp_path / "h.yaml"), "--trace-data", str(tmp_path / "d.csv"),
        *traffic,
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0], lines[0]
    assert result.stdout == ""
    assert not _connected(listener)  # the pre-flight GET /v1/models never went out
    assert not list(tmp_path.iterdir())


def test_observe_and_run_tell_a_bad_traffic_flag_alike(listener, tmp_path: Path) -> None:
    """The same flag's refusal reads the same under both commands."""
    port = listener.getsockname()[1]
    bad = ["--rate", "2", "--num-requests", "0"]
    run = runner.invoke(app, ["run", *bad])
    observe = runner.invoke(
        app,
        [
            "observe", "--server-url", f"http://127.0.0.1:{port}", "--model", "m",
            "--trace-header", str(tmp_path / "h.yaml"), "--trace-data", str(tmp_path / "d.csv"),
            *bad,
        ],
    )  # fmt: skip
    assert run.exit_code == observe.exit_code == 2
    assert run.stderr == observe.stderr
    assert "--num-requests (workload.num_requests)" in observe.stderr


# --- 2. plan --gpu names its flag -------------------------------------------------------------


@pytest.fixture
def plan_scenario(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({"workload": {"rate": 5, "num_requests": 20}}))
    return path


@pytest.mark.parametrize(
    ("gpus", "refused"), [(["FOO"], "FOO"), (["h100", "BAR"], "BAR"), (["H100", "h1oo"], "h1oo")]
)
def test_plan_unknown_gpu_names_the_flag(
    plan_scenario: Path, monkeypatch, gpus: list[str], refused: str
) -> None:
    """`plan --gpu FOO` said `error: unknown GPU 'FOO'`, no flag; run's says `--hardware
    (hardware): unknown GPU ...`. Refused before any probe: plan() is never reached."""
    import simulator.plan

    def no_plan(*args, **kwargs):
        raise AssertionError("plan() reached with an unknown GPU")

    monkeypatch.setattr(simulator.plan, "plan", no_plan)
    flags = [x for g in gpus for x in ("--gpu", g)]
    res = runner.invoke(app, ["plan", str(plan_scenario), "--slo", "ttft_p99_ms=500", *flags])
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: --gpu: unknown GPU '{refused}'; valid: "), lines[0]
    assert "H100" in lines[0].split("valid: ")[1]


def test_plan_known_gpus_pass_the_check(plan_scenario: Path, monkeypatch) -> None:
    """Known GPUs, in any case, reach plan() as given (the check only refuses)."""
    import simulator.plan

    seen = {}

    def fake_plan(sc, slos, **kwargs):
        seen["gpus"] = kwargs["gpus"]
        raise ConfigError("stop here")

    monkeypatch.setattr(simulator.plan, "plan", fake_plan)
    args = ["plan", str(plan_scenario), "--slo", "ttft_p99_ms=500", "--gpu", "h100"]
    res = runner.invoke(app, [*args, "--gpu", "A100-SXM"])
    assert res.exit_code == 2 and res.stderr.strip() == "error: stop here", res.stderr
    assert seen["gpus"] == ["h100", "A100-SXM"]


# --- 3. physics and a vLLM version without a fit ----------------------------------------------


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings():
    new_run_warnings()  # warn_once says a text once per run: start this test's run
    handler = _Warnings()
    log = logging.getLogger("servesim")
    log.addHandler(handler)
    yield handler.messages
    log.removeHandler(handler)
    new_run_warnings()


@pytest.mark.parametrize(
    ("asked", "fit", "rule"),
    [
        ("0.24", "0.23.0", "the nearest older one"),
        ("0.99.0", "0.23.0", "the nearest older one"),
        ("1.2.3", "0.23.0", "the nearest older one"),
        ("0.20", "0.15.1", "the nearest older one"),
        ("v0.8.4", "0.15.1", "older than every fit"),  # blackbox_tp2.yaml's version
        ("0.1", "0.15.1", "older than every fit"),  # vLLM's first release: accepted
    ],
)
def test_a_version_of_an_unfitted_minor_release_warns_and_says_which_fit(
    warnings, asked: str, fit: str, rule: str
) -> None:
    """Another minor release's fit is a guess: the provenance names the version asked and the
    fit used, and one warning on stderr says so (it was told in the provenance only)."""
    from simulator.latency.physics import default_coefficients

    coefficients, source = default_coefficients(H100, asked)
    assert source.fit_vllm == fit
    assert coefficients == default_coefficients(H100, fit)[0]  # that fit's, unchanged
    assert f"no fit for vLLM {asked}, " in source.describe()
    assert f"vLLM {fit} (" in source.describe()
    said = [m for m in warnings if "no physics fit" in m]
    assert said == [
        f"no physics fit for vLLM {asked} (latency.vllm_version); the H100 vLLM {fit} fit is "
        f"used ({rule}; fits: 0.15.1, 0.23.0)"
    ]
    default_coefficients(H100, asked)  # a second instance of the same run: said once
    assert len([m for m in warnings if "no physics fit" in m]) == 1


@pytest.mark.parametrize(("asked", "fit"), [("0.23.1", "0.23.0"), ("0.15.3", "0.15.1")])
def test_a_patch_release_of_a_fitted_minor_is_told_in_the_provenance_only(
    warnings, asked: str, fit: str
) -> None:
    """Patch releases share their minor's engine (docs/latency-models.md): no warning."""
    from simulator.latency.physics import default_coefficients

    _, source = default_coefficients(H100, asked)
    assert source.fit_vllm == fit
    assert f"no fit for vLLM {asked}, the same minor release's used" in source.note
    assert not [m for m in warnings if "no physics fit" in m]


def test_a_fitted_version_and_no_version_warn_nothing(warnings) -> None:
    from simulator.latency.physics import default_coefficients

    for asked in (None, "0.23.0", "0.15.1", "v0.23", "0.23.0+cu128"):
        default_coefficients(H100, asked)
    assert not [m for m in warnings if "no physics fit" in m]


@pytest.mark.parametrize("version", ["0.0.1", "0", "0.0", "v0.0.9", "0.0.1rc1"])
def test_a_version_before_vllms_first_release_is_refused(version: str) -> None:
    """No vLLM was ever 0.0.x: it took the oldest fit silently; now one error naming the
    field, the value and what is allowed."""
    from simulator.latency.physics import default_coefficients, version_key

    with pytest.raises(ConfigError) as err:
        default_coefficients(H100, version)
    assert str(err.value) == (
        f"latency.vllm_version: invalid value '{version}'; must be a vLLM release: 0.1.0 "
        "(vLLM's first) or later"
    )
    assert version_key("0.1") == (0, 1) and version_key("0.1.0") == (0, 1)


def test_cli_refuses_a_version_before_the_first_release_naming_the_flag(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    res = runner.invoke(
        app,
        ["run", "--latency-model", "physics", "--vllm-version", "0.0.1", "--rate", "1",
         "--num-requests", "2", "--results-path", str(results)],
    )  # fmt: skip
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.strip() == (
        "error: --vllm-version (latency.vllm_version): invalid value '0.0.1'; must be a vLLM "
        "release: 0.1.0 (vLLM's first) or later"
    )
    assert not results.exists()


def test_cli_run_with_an_unfitted_version_uses_the_nearest_fit_and_says_so(
    tmp_path: Path, warnings
) -> None:
    """`--vllm-version 0.24` runs with the 0.23.0 fit: the same simulation as asking for 0.23.0
    (the same coefficients), the results JSON and the Latency Model block name both versions,
    and stderr warns once."""

    def run(version: str) -> tuple[dict, str, str]:
        results = tmp_path / f"{version}.json"
        res = runner.invoke(
            app,
            ["run", "--latency-model", "physics", "--vllm-version", version, "--rate", "4",
             "--num-requests", "20", "--results-path", str(results)],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        # The log's stderr handler is the process's (set up once), not the runner's capture.
        said = [m for m in warnings if "no physics fit" in m]
        warnings.clear()
        return json.loads(results.read_text()), res.stdout, "\n".join(said)

    asked, stdout, stderr = run("0.24")
    fitted, _, fitted_stderr = run("0.23.0")
    provenance = asked["latency_model"]
    assert provenance["fit_vllm_version"] == "0.23.0"
    assert provenance["coefficients"].endswith("; no fit for vLLM 0.24, the nearest older one used")
    block = stdout.split("=== Latency Model ===", 1)[1]
    assert "no fit for vLLM 0.24, the nearest older one used" in block
    assert '"fit_vllm_version": "0.23.0"' in block
    assert stderr.count("no physics fit for vLLM 0.24") == 1
    assert "the H100 vLLM 0.23.0 fit is used" in stderr
    assert "no physics fit" not in fitted_stderr
    # The fit, not the version, prices the steps: every request's figures are the same.
    assert asked["requests"] == fitted["requests"]
