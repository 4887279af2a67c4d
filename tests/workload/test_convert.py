"""`servesim convert servegen|inference-perf` (simulator/workload/convert.py): the printed
spec runs unchanged, and generates exactly the requests its source generates (round trip:
source -> convert -> YAML -> load -> the same arrivals, lengths and tags)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.cli import app
from simulator.workload.generator import WorkloadStream
from simulator.workload.spec import load_workload_spec, workload_spec_from_dict
from tests.workload.test_spec_current import write_servegen_day

runner = CliRunner()


def _requests(spec, seed: int = 42, base_dir: Path | None = None) -> list[tuple]:
    return [
        (r.arrival_us, r.input_tokens, r.output_tokens, r.client_id, r.slo_class, r.prefix_group)
        for r in WorkloadStream(spec, seed, base_dir=base_dir)
    ]


def _convert(tmp_path: Path, *args: str) -> Path:
    res = runner.invoke(app, ["convert", *args])
    assert res.exit_code == 0, res.stderr
    out = tmp_path / "converted.yaml"
    out.write_text(res.stdout)
    return out


def _runs(path: Path) -> dict:
    res = runner.invoke(
        app,
        [
            "run",
            "--workload-spec",
            str(path),
            "--latency-model",
            "roofline",
            "--total-kv-blocks",
            "20000",
            "-q",
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.stderr
    return res


INFERENCE_PERF = {
    "version": "2",
    "seed": 7,
    "inference_perf": {
        "stages": [{"rate": 5, "duration": 6}, {"rate": 10, "duration": 3}],
        "shared_prefix": {
            "num_unique_system_prompts": 2,
            "num_users_per_system_prompt": 2,
            "system_prompt_len": 100,
            "question_len": 50,
            "output_len": 20,
        },
    },
}


@pytest.mark.parametrize("multi_turn", [False, True])
def test_inference_perf_round_trip(tmp_path, multi_turn):
    source = dict(INFERENCE_PERF)
    if multi_turn:
        source = {
            **source,
            "inference_perf": {
                "stages": [{"rate": 4, "duration": 5}],
                "shared_prefix": {
                    **INFERENCE_PERF["inference_perf"]["shared_prefix"],
                    "enable_multi_turn_chat": True,
                },
            },
        }
    path = tmp_path / "ip.yaml"
    path.write_text(yaml.safe_dump(source))
    converted = _convert(tmp_path, "inference-perf", "--spec", str(path))
    spec = load_workload_spec(converted)
    assert spec.inference_perf is None and spec.clients
    assert _requests(spec) == _requests(load_workload_spec(path))
    _runs(converted)


def test_inference_perf_clients_keep_their_stage_rates(tmp_path):
    path = tmp_path / "ip.yaml"
    path.write_text(yaml.safe_dump(INFERENCE_PERF))
    spec = load_workload_spec(_convert(tmp_path, "inference-perf", "--spec", str(path)))
    # 4 clients per stage; stage s's clients share its rate: 5/4 and 10/4 req/s of 15 in all.
    assert spec.aggregate_rate == 15
    assert [c.rate_fraction for c in spec.clients] == [1.25] * 4 + [2.5] * 4
    assert spec.horizon == 9_000_000  # the stages end at 6 + 3 s
    assert {c.slo_class for c in spec.clients} == {"batch"}


def test_servegen_round_trip(tmp_path):
    data = tmp_path / "day"
    data.mkdir()
    write_servegen_day(data)
    converted = _convert(
        tmp_path, "servegen", "--path", str(data), "--window-duration-seconds", "20",
        "--drain-timeout-seconds", "5", "--seed", "9",
    )  # fmt: skip
    spec = load_workload_spec(converted)
    assert spec.servegen_data is None
    assert [c.id.split("-")[0] for c in spec.cohorts] == ["midnight"] * 2 + ["morning"] * 2 + [
        "afternoon"
    ] * 2
    # Periods start every 20 + 5 s.
    assert sorted({c.spike.start_time_us for c in spec.cohorts}) == [0, 25_000_000, 50_000_000]
    source = workload_spec_from_dict(
        {"version": "2", "seed": 9, "servegen_data": {
            "path": str(data), "window_duration_secs": 20, "drain_timeout_secs": 5}}
    )  # fmt: skip
    assert _requests(spec) == _requests(source)
    res = _runs(converted)
    # 3 periods × (⌈2 × 20⌉ + ⌈3 × 20⌉) requests.
    assert '"completed_requests": 300,' in res.stdout


def test_servegen_one_period(tmp_path):
    data = tmp_path / "day"
    data.mkdir()
    write_servegen_day(data)
    spec = load_workload_spec(
        _convert(tmp_path, "servegen", "--path", str(data), "--time", "afternoon")
    )
    assert {c.id.split("-")[0] for c in spec.cohorts} == {"afternoon"}
    # It keeps its place: the third period, at 2 × (600 + 180) s.
    assert {c.spike.start_time_us for c in spec.cohorts} == {1_560_000_000}


def test_servegen_single_span_round_trip(tmp_path):
    data = tmp_path / "day"
    data.mkdir()
    write_servegen_day(data)
    converted = _convert(
        tmp_path, "servegen", "--path", str(data), "--single-span", "--num-requests", "50"
    )
    spec = load_workload_spec(converted)
    assert [c.id for c in spec.clients] == ["servegen-chunk-0", "servegen-chunk-1"]
    source = workload_spec_from_dict(
        {"version": "2", "seed": 42, "num_requests": 50, "servegen_data": {"path": str(data)}}
    )
    assert _requests(spec) == _requests(source)
    _runs(converted)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["servegen", "--path", "{data}", "--time", "evening"], "--time: invalid value 'evening'"),
        (["servegen", "--path", "{data}", "--single-span"], "--num-requests: required"),
        (["servegen", "--path", "{data}", "--window-duration-seconds", "0"], "must be > 0"),
        (["servegen", "--path", "{tmp}/none"], "servegen_data.path: invalid value"),
        (["inference-perf", "--spec", "{tmp}/plain.yaml"], "has no inference_perf section"),
    ],
)
def test_bad_conversions_are_one_line_and_exit_2(tmp_path, args, needle):
    data = tmp_path / "day"
    data.mkdir()
    write_servegen_day(data)
    (tmp_path / "plain.yaml").write_text(
        yaml.safe_dump({"version": "2", "aggregate_rate": 1, "num_requests": 3, "clients": [{
            "rate_fraction": 1, "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 3}},
            "output_distribution": {"type": "constant", "params": {"value": 3}}}]})
    )  # fmt: skip
    args = [a.format(data=data, tmp=tmp_path) for a in args]
    res = runner.invoke(app, ["convert", *args])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
