"""Traces as BLIS's current `observe` writes them (TraceV2 version 3, docs/traces.md),
the prefix-caching default taken from what the recorded server did, and the replay's client
(`max_in_flight`) with its default taken from what the recorded client did."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from simulator.api import client_replay, replay, simulate
from simulator.catalog.hardware import get_gpu
from simulator.catalog.models import load_model
from simulator.cli import app
from simulator.cluster.cluster import run_simulation
from simulator.engine.batching import EngineConfig
from simulator.engine.request import Request, RequestState
from simulator.errors import ConfigError
from simulator.latency.roofline import RooflineModel
from simulator.workload import trace as tr
from simulator.workload.server_settings import recorded_prefix_caching
from simulator.workload.trace import (
    TRACE_V3_COLUMNS,
    _most_outstanding,
    injection_origin_shift,
    load_requests_file,
    load_trace,
    prefix_key,
    read_header,
    read_rows,
    recorded_client,
    requests_from_rows,
    trace_notes,
    trace_spans,
    write_trace,
)

OBSERVE = Path(__file__).resolve().parents[1] / "data" / "observe_v3"
CELL = OBSERVE / "sweep_rate-agg_2rps"
HEADER, DATA = CELL / "trace.yaml", CELL / "trace.csv"
# The dataset README's replay: one H100, the server's settings.
SERVER = {
    "model": "qwen/qwen3-14b",
    "hardware": "H100",
    "tp": 1,
    "latency__model": "roofline",
    "engine__total_kv_blocks": 18038,
    "engine__max_num_scheduled_tokens": 8192,
    "engine__max_num_running_reqs": 256,
    "engine__max_model_len": 40960,
}


def _raw(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


# ------------------------------------------------------------------------ the observe trace


def test_observe_trace_header_and_columns_are_read_as_written():
    header = read_header(HEADER)
    assert header["trace_version"] == 3 and header["time_unit"] == "us"
    assert (header["mode"], header["workload_seed"], header["network"]) == ("real", 42, {})
    rows = read_rows(DATA)
    assert len(rows) == 200
    first = rows[0]
    assert (first.prefix_length, first.server_input_tokens, first.input_tokens) == (0, 1010, 1024)
    assert first.x_request_id == "75842fad-5a94-45bf-a5b1-a5df68bad65f"
    assert first.send_time_us == 1_782_183_938_210_545 and first.arrival_time_us == 506_090


def test_requests_arrive_at_their_send_times_relative_to_the_first_send():
    """send_time_us is Unix-epoch µs, arrival_time_us counts from the run's start: replay
    injects at the send times re-based so that the first send lands on the first arrival."""
    raw = _raw(DATA)
    sends = [int(r["send_time_us"]) for r in raw]
    first_arrival = min(int(r["arrival_time_us"]) for r in raw)
    _, requests = load_trace(HEADER, DATA)
    assert len(requests) == 200
    assert [r.arrival_us for r in requests] == [s - min(sends) + first_arrival for s in sends]
    assert requests[0].arrival_us == 506_090
    # Prompt = the server's own count (chat template included), output = output_tokens.
    assert [r.input_tokens for r in requests] == [int(r["server_input_tokens"]) for r in raw]
    assert all(r.output_tokens == 128 and r.streaming for r in requests)
    assert [r.tenant_id for r in requests[:3]] == ["tenant_A", "tenant_A", "tenant_B"]


def test_replay_matches_blis_current_request_by_request():
    """BLIS f90a1e3a replayed the same 200 rows (tests/data/observe_v3/README.md): the same
    prompt lengths, and with the roofline the same TTFT and E2E to the microsecond."""
    reference = {r["request_id"]: r for r in _raw(OBSERVE / "blis_current_replay.csv")}
    result = replay(HEADER, DATA, **SERVER)
    records = result.request_records
    assert len(records) == len(reference) == 200
    shift = min(int(r["arrived_at_us"]) for r in reference.values()) - records[0].arrival_us
    for rec in records:
        ref = reference[rec.request_id]
        assert rec.arrival_us == int(ref["arrived_at_us"]) - shift
        assert (rec.input_tokens, rec.output_tokens) == (
            int(ref["input_tokens"]),
            int(ref["output_tokens"]),
        )
        assert rec.first_token_us - rec.arrival_us == int(ref["ttft_us"])
        assert rec.completion_us - rec.arrival_us == int(ref["e2e_us"])


def test_cli_replays_the_observe_pair_unchanged(tmp_path):
    results = tmp_path / "results.json"
    outcome = CliRunner().invoke(
        app,
        [
            "replay",
            "--trace-header", str(HEADER),
            "--trace-data", str(DATA),
            "--model", "qwen/qwen3-14b",
            "--total-kv-blocks", "18038",
            "--max-num-scheduled-tokens", "8192",
            "--max-model-len", "40960",
            "--results-path", str(results),
            "--quiet",
        ],
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.output
    assert "prefix caching: on (server_config.json)" in outcome.stderr
    assert "send_time_us: requests are injected at their send times moved by" in outcome.stderr
    assert "(send_time_us is Unix-epoch time" in outcome.stderr
    summary = json.loads(results.read_text())
    assert summary["injected_requests"] == summary["completed_requests"] == 200


# -------------------------------------------------------------------------- header keys


def _v2_pair(tmp_path: Path) -> tuple[Path, Path]:
    return write_trace(tmp_path / "t", [], created_at="2026-01-01T00:00:00Z")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("time_unit", "us"),
        ("time_unit", "microseconds"),
        ("mode", "replayed"),
        ("mode", "real"),
        ("workload_seed", 42),
        ("session_context_growth", "accumulate"),
        ("goodput_slo_targets", {"critical": {"ttft_ms": 100, "itl_ms": 20, "e2e_ms": 5000}}),
        (
            "kv_offload",
            {
                "cpu_bytes_to_use": 10**9,
                "per_block_bytes": 65536,
                "block_size": 16,
                "blocks_per_chunk": 4,
                "tokens_per_hash": 16,
                "eviction_policy": "lru",
                "offload_prompt_only": False,
                "self_describing_kv_events": True,
                "secondary_tiers": [],
            },
        ),
        (
            "observed_kv_metrics",
            {
                "source": "vllm:kv_offload_tiering",
                "hit_rate": 0.4,
                "block_hits": 40,
                "block_queries": 100,
                "read_time_total": 1.5,
                "write_time_total": 2.5,
                "vllm_commit": "abc123",
            },
        ),
        ("server", {"type": "vllm", "model": "Qwen/Qwen3-14B", "tensor_parallel": 1}),
        ("network", {}),
        ("created_at", "2026-06-23T03:15:39Z"),
        ("workload_spec", "/data/residency/workload.yaml"),
    ],
)
def test_each_header_key_of_blis_current_is_accepted(tmp_path, key, value):
    header_path, _ = _v2_pair(tmp_path)
    data = yaml.safe_load(header_path.read_text()) | {"trace_version": 3, key: value}
    header_path.write_text(yaml.safe_dump(data))
    assert read_header(header_path)[key] == value


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("timing", 1, r"unknown key\(s\) \['timing'\]"),
        ("time_unit", "ms", "time_unit: invalid value 'ms'; must be microseconds or us"),
        ("workload_seed", "abc", "workload_seed: invalid value 'abc'; must be an integer"),
        ("session_context_growth", "Accumulate", "session_context_growth: invalid value"),
        ("kv_offload", {"cpu_bytes": 1}, r"kv_offload: unknown key\(s\) \['cpu_bytes'\]"),
        ("observed_kv_metrics", {"hits": 1}, r"observed_kv_metrics: unknown key\(s\)"),
        ("goodput_slo_targets", {"critical": {"ttft": 1}}, r"goodput_slo_targets.'critical'"),
        ("goodput_slo_targets", {"critical": {"ttft_ms": -1}}, "must be a number >= 0"),
        ("goodput_slo_targets", [1], "must be a mapping of SLO class"),
        ("server", {"max_num_batched_tokens": 8192}, r"server: unknown key\(s\)"),
        ("network", {"bandwidth": 1}, r"network: unknown key\(s\)"),
    ],
)
def test_bad_v3_header_values_are_one_line_errors(tmp_path, key, value, problem):
    header_path, _ = _v2_pair(tmp_path)
    data = yaml.safe_load(header_path.read_text()) | {"trace_version": 3, key: value}
    header_path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=rf"t\.yaml.*{problem}") as err:
        read_header(header_path)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------ optional columns


def _with_columns(tmp_path: Path, extra: dict[str, list[str]], after: dict[str, str]) -> Path:
    """The fixture's first three rows with `extra` columns, each placed after the column
    `after` names (BLIS's positions) or at the end."""
    raw = _raw(DATA)[:3]
    columns = list(raw[0])
    for name in extra:
        anchor = after.get(name)
        columns.insert(columns.index(anchor) + 1 if anchor else len(columns), name)
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for i, row in enumerate(raw):
            values = row | {name: values[i] for name, values in extra.items()}
            writer.writerow([values[c] for c in columns])
    return path


def test_each_optional_column_is_read_by_name(tmp_path):
    path = _with_columns(
        tmp_path,
        {
            "vllm_priority": ["0", "2", "4"],
            "slo_target_us": ["0", "250000", "0"],
            "adapter": ["", "lora-a", "lora-b"],
            "think_time_us": ["", "0", "1500000"],
        },
        {"vllm_priority": "slo_class", "slo_target_us": "deadline_us"},
    )
    rows = read_rows(path)
    assert [r.vllm_priority for r in rows] == [0, 2, 4]
    assert [r.slo_target_us for r in rows] == [0, 250_000, 0]
    assert [r.adapter for r in rows] == ["", "lora-a", "lora-b"]
    # A recorded 0 is not an absent think time (BLIS #1608).
    assert [r.think_time_us for r in rows] == [None, 0, 1_500_000]
    assert [r.x_request_id != "" for r in rows] == [True, True, True]
    # Accepted and replayed; servesim has no place for these on a request yet.
    assert len(requests_from_rows(rows)) == 3
    notes = " ".join(trace_notes(HEADER, path))
    # Every optional column present gets its note (x_request_id had none).
    for column in ("vllm_priority", "slo_target_us", "adapter", "think_time_us", "x_request_id"):
        assert f"{column}:" in notes


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("think_time_us", "-5", "think_time_us: invalid value '-5'; must be an integer >= 0"),
        ("slo_target_us", "soon", "slo_target_us: invalid value 'soon'"),
        ("vllm_priority", "-1", "vllm_priority: invalid value '-1'"),
        ("prefix_length", "-3", "prefix_length: invalid value '-3'"),
    ],
)
def test_bad_optional_column_values(tmp_path, column, value, problem):
    if column == "prefix_length":
        path = tmp_path / "t.csv"
        raw = _raw(DATA)[:2]
        raw[1]["prefix_length"] = value
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, list(raw[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(raw)
    else:
        path = _with_columns(tmp_path, {column: ["0", value, "0"]}, {})
    with pytest.raises(ConfigError, match=rf"t\.csv' line 3: column {problem}"):
        read_rows(path)


def test_a_v2_file_still_has_26_columns_and_no_prefix_length(tmp_path):
    _, data_path = _v2_pair(tmp_path)
    columns = data_path.read_text().splitlines()[0].split(",")
    assert len(columns) == 26 and "prefix_length" not in columns
    assert len(TRACE_V3_COLUMNS) == 27


# ------------------------------------------------------------- input length and injection


def test_input_length_rule_is_blis_effective_input_token_count():
    rows = [
        tr.TraceRow("a", 0, 1024, 8, server_input_tokens=1010),  # server's count wins
        tr.TraceRow("b", 0, 1024, 8),  # not recorded: input_tokens
        # In a group the server's count includes the prefix replay prepends: input_tokens.
        tr.TraceRow("c", 0, 40, 8, prefix_group="g", prefix_length=64, server_input_tokens=104),
    ]
    requests = requests_from_rows(rows)
    assert [r.input_tokens for r in requests] == [1010, 1024, 64 + 40]
    assert requests[2].segments == [(prefix_key("g"), 64), (("req", "request_c"), 40)]


def test_an_unsent_first_row_does_not_move_the_sent_rows_before_their_schedule():
    # Wall-clock sends beside a row that never went out (send 0), scheduled first: the first
    # sent row lands at its own scheduled arrival, not at the unsent row's.
    rows = [
        tr.TraceRow("unsent", 500_000, 5, 1, send_time_us=0),
        tr.TraceRow("a", 780_000, 5, 1, send_time_us=1_782_000_000_000_000),
        tr.TraceRow("b", 900_000, 5, 1, send_time_us=1_782_000_000_150_000),
    ]
    shift = injection_origin_shift(rows)
    assert rows[1].send_time_us - shift == 780_000
    assert rows[2].send_time_us - shift == 930_000  # the sends' spacing kept: 150 ms


def test_injection_shift_is_zero_for_simulated_traces_and_keeps_deadlines():
    generated = [tr.TraceRow("a", 100, 5, 1, send_time_us=100), tr.TraceRow("b", 300, 5, 1)]
    assert injection_origin_shift(generated) == 0
    assert [r.arrival_us for r in requests_from_rows(generated)] == [100, 300]
    # A client that sent late: its requests arrive when they were sent; the deadline stays
    # on the arrival clock (BLIS), so the lateness eats into it.
    late = [
        tr.TraceRow("a", 1_000, 5, 1, send_time_us=1_000, deadline_us=50_000),
        tr.TraceRow("b", 2_000, 5, 1, send_time_us=9_000, deadline_us=60_000),
    ]
    requests = requests_from_rows(late)
    assert [r.arrival_us for r in requests] == [1_000, 9_000]
    assert [r.deadline_us for r in requests] == [50_000, 60_000]
    # Epoch sends: re-based so the first send is at the first arrival.
    epoch = [
        tr.TraceRow("a", 500, 5, 1, send_time_us=1_782_000_000_000_700),
        tr.TraceRow("b", 900, 5, 1, send_time_us=1_782_000_000_000_500),
    ]
    assert [r.arrival_us for r in requests_from_rows(epoch)] == [700, 500]


def test_sessions_are_accepted_and_replayed_open_loop(tmp_path):
    header_path, data_path = _v2_pair(tmp_path)
    data = yaml.safe_load(header_path.read_text())
    data |= {"trace_version": 3, "session_context_growth": "accumulate"}
    header_path.write_text(yaml.safe_dump(data))
    path = _with_columns(tmp_path, {"think_time_us": ["", "2000000", "2000000"]}, {})
    raw = _raw(path)
    for i, row in enumerate(raw):
        row["session_id"], row["round_index"] = "s1", str(i)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(raw[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(raw)
    requests = load_requests_file(path, header_path)
    assert [(r.session_id, r.round_index) for r in requests] == [("s1", 0), ("s1", 1), ("s1", 2)]
    notes = trace_notes(header_path, path)
    assert any(
        n.startswith("session_context_growth: accumulate: replay is open-loop") for n in notes
    )


# ------------------------------------------------------------------ prefix-caching default


def test_prefix_caching_comes_from_server_config(tmp_path):
    assert recorded_prefix_caching(HEADER, DATA).line() == "prefix caching: on (server_config.json)"
    dataset = tmp_path / "d"
    shutil.copytree(OBSERVE, dataset)
    config = json.loads((dataset / "server_config.json").read_text())
    config["enable_prefix_caching"] = False
    (dataset / "server_config.json").write_text(json.dumps(config))
    cell = dataset / "sweep_rate-agg_2rps"
    choice = recorded_prefix_caching(cell / "trace.yaml")
    assert (choice.enabled, choice.source) == (False, "server_config.json")
    config["enable_prefix_caching"] = "yes"
    (dataset / "server_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"server_config\.json'.*enable_prefix_caching.*'yes'"):
        recorded_prefix_caching(cell / "trace.yaml")


def test_prefix_caching_from_a_run_config_or_vllm_default(tmp_path):
    dataset = tmp_path / "vllm-0.15.1-h100"
    requests = dataset / "requests" / "run1.requests.csv"
    requests.parent.mkdir(parents=True)
    requests.write_text("index,arrival_time_us,input_tokens,output_tokens\n0,0,5,5\n")
    # No configuration anywhere: vLLM's default.
    nothing = recorded_prefix_caching(requests)
    assert nothing.enabled and "no server configuration found" in nothing.source
    exp = dataset / "runs" / "run1" / "exp-config.yaml"
    exp.parent.mkdir(parents=True)
    exp.write_text("model: meta-llama/Llama-2-7b-hf\nmax_num_seqs: 128\n")
    silent = recorded_prefix_caching(requests)
    assert (
        silent.line() == "prefix caching: on (vLLM's default; exp-config.yaml records no setting)"
    )
    exp.write_text("model: m\nno-enable-prefix-caching: true\n")
    assert recorded_prefix_caching(requests).line() == "prefix caching: off (exp-config.yaml)"
    assert not recorded_prefix_caching(exp.parent).enabled


def test_cli_replay_prefix_caching_flag_and_scenario_win(tmp_path):
    common = ["replay", "--trace-header", str(HEADER), "--trace-data", str(DATA)]
    common += ["--model", "qwen/qwen3-14b", "--total-kv-blocks", "18038", "--quiet"]
    off = CliRunner().invoke(app, [*common, "--no-prefix-caching"])
    assert off.exit_code == 0, off.output
    assert "prefix caching: off (--no-prefix-caching)" in off.stderr
    scenario = tmp_path / "s.yaml"
    scenario.write_text("engine:\n  enable_prefix_caching: false\n")
    by_file = CliRunner().invoke(app, [*common, "--scenario", str(scenario)])
    assert by_file.exit_code == 0, by_file.output
    assert f"prefix caching: off (scenario {scenario})" in by_file.stderr


# ------------------------------------------- the replay's client: max_in_flight and its default


def _step_model() -> RooflineModel:
    return RooflineModel.from_deployment(load_model("qwen/qwen3-14b"), get_gpu("H100"), 1)


def _burst(n: int, gap_us: int = 1_000, output_tokens: int = 40) -> list[Request]:
    return [Request(f"r{i}", i * gap_us, 300, output_tokens, index=i) for i in range(n)]


def _outstanding_peak(records) -> int:
    """The most user requests between send (arrival_us) and completion at any instant."""
    return _most_outstanding(
        [r.arrival_us for r in records], [max(r.completion_us, 1) for r in records]
    )


def test_most_outstanding_by_hand():
    # Sends at 0, 1, 2, 5 and last chunks at 4, 3, 6, 7: in flight 1, 2, 3 (t=2), then 3
    # ends, 1 ends (t=4), then 5 starts: 2. Peak 3.
    assert _most_outstanding([0, 1, 2, 5], [4, 3, 6, 7]) == 3
    # A completion at the very instant of a send frees its slot first.
    assert _most_outstanding([0, 4], [4, 8]) == 1
    assert _most_outstanding([0, 1], [0, 0]) == 0  # no completions recorded


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 40),
    cap=st.integers(1, 12),
    gap_us=st.integers(0, 20_000),
    output_tokens=st.integers(1, 60),
)
def test_cap_bounds_outstanding_requests_and_conserves_them(n, cap, gap_us, output_tokens):
    scheduled = {f"r{i}": i * gap_us for i in range(n)}
    result = run_simulation(
        _burst(n, gap_us, output_tokens),
        EngineConfig(),
        _step_model(),
        max_in_flight=cap,
    )
    records = list(result.request_records)
    # Conservation: every request arrived and completed; none was lost to the cap.
    assert len(records) == n
    assert all(r.state is RequestState.COMPLETED for r in records)
    # The law of the cap: never more than `cap` outstanding at once.
    assert _outstanding_peak(records) <= cap
    # Causality: a request is sent at or after its scheduled time, and sends keep their order.
    assert all(r.arrival_us >= scheduled[r.request_id] for r in records)
    sends = [r.arrival_us for r in sorted(records, key=lambda r: r.index)]
    assert sends == sorted(sends)
    late = sum(r.arrival_us > scheduled[r.request_id] for r in records)
    assert result.client_delayed_requests == late
    assert result.client_wait_us == sum(r.arrival_us - scheduled[r.request_id] for r in records)


def test_a_cap_never_reached_changes_nothing():
    plain = run_simulation(_burst(30), EngineConfig(), _step_model())
    capped = run_simulation(_burst(30), EngineConfig(), _step_model(), max_in_flight=30)
    assert capped.client_delayed_requests == 0
    assert [(r.first_token_us, r.completion_us) for r in capped.request_records] == [
        (r.first_token_us, r.completion_us) for r in plain.request_records
    ]


def test_a_cap_of_one_serves_requests_one_after_another():
    result = run_simulation(_burst(5, gap_us=0), EngineConfig(), _step_model(), max_in_flight=1)
    records = sorted(result.request_records, key=lambda r: r.index)
    for before, after in zip(records, records[1:], strict=False):
        assert after.arrival_us >= before.completion_us
    assert result.client_delayed_requests == 4


def _stretched_trace(tmp_path: Path, factor: float) -> Path:
    """The fixture's rows with send times spread `factor` times wider than scheduled, as a
    client that fell behind writes them."""
    with DATA.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows, fields = list(reader), reader.fieldnames
    first_send = min(int(r["send_time_us"]) for r in rows)
    first_arrival = min(int(r["arrival_time_us"]) for r in rows)
    for r in rows:
        offset = int(r["arrival_time_us"]) - first_arrival
        sent_later_us = first_send + int(offset * factor) - int(r["send_time_us"])
        r["send_time_us"] = str(int(r["send_time_us"]) + sent_later_us)
        for chunk in ("first_chunk_time_us", "last_chunk_time_us"):  # same latencies
            if int(r[chunk] or 0) > 0:
                r[chunk] = str(int(r[chunk]) + sent_later_us)
    out = tmp_path / "trace.csv"
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return out


def test_recorded_client_keeps_send_times_when_the_client_kept_up():
    client = recorded_client(DATA)
    assert (client.at_schedule, client.max_in_flight) == (False, None)
    assert "kept to its schedule" in client.line()


def test_recorded_client_replays_a_client_that_fell_behind_through_its_cap(tmp_path):
    data = _stretched_trace(tmp_path, 1.5)
    spans = trace_spans(data)
    assert spans.client_fell_behind and spans.max_in_flight > 0
    client = recorded_client(data)
    assert client.at_schedule and client.max_in_flight == spans.max_in_flight
    assert f"at most {spans.max_in_flight:,} requests outstanding" in client.line()
    result = replay(HEADER, data, **SERVER)
    assert result.scenario["trace"]["timing"] == "schedule"
    assert result.client_cap["max_in_flight"] == spans.max_in_flight
    off = replay(HEADER, data, max_in_flight="off", **SERVER)
    assert off.client_cap is None and off.scenario["trace"]["timing"] == "sends"


def test_max_in_flight_choices_and_errors():
    assert client_replay("off", DATA).max_in_flight is None
    assert client_replay(7, DATA).max_in_flight == 7
    assert client_replay("7", DATA).at_schedule
    for bad in (0, -1, "many", True, 2.5):
        with pytest.raises(ConfigError, match="max_in_flight: invalid value"):
            client_replay(bad, DATA)


def test_cli_prints_the_client_and_reports_what_the_cap_held_back(tmp_path):
    runner = CliRunner()
    replay_args = ["replay", "--trace-header", str(HEADER), "--trace-data", str(DATA)]
    out = runner.invoke(
        app,
        [
            *replay_args,
            "--model",
            "qwen/qwen3-14b",
            "--latency-model",
            "roofline",
            "--max-in-flight",
            "2",
        ],  # fmt: skip
    )
    assert out.exit_code == 0, out.output
    assert "client: at the scheduled times, at most 2 requests outstanding" in out.stderr
    assert "=== Client ===" in out.stdout and '"max_in_flight": 2' in out.stdout
    bad = runner.invoke(app, [*replay_args, "--max-in-flight", "lots"])
    assert bad.exit_code == 2 and "max_in_flight: invalid value 'lots'" in bad.stderr


def test_scenario_file_sends_through_the_client_cap(tmp_path):
    """`trace.timing` and `trace.max_in_flight` in a scenario file reach the run (its paths
    resolved from the file's folder), and the report says what the cap held back."""
    scenario = tmp_path / "capped.yaml"
    scenario.write_text(
        "model: qwen/qwen3-14b\nlatency: {model: roofline}\n"
        f"trace:\n  header: {HEADER}\n  data: {DATA}\n  timing: schedule\n  max_in_flight: 1\n"
    )
    result = simulate(scenario)
    assert result.scenario["trace"]["timing"] == "schedule"
    assert result.client_cap["max_in_flight"] == 1
    assert result.client_delayed_requests > 0
    assert _outstanding_peak(result.request_records) == 1
    assert "=== Client ===" in result.report_text()


def test_calibrate_replays_each_case_as_its_recorded_client_did(tmp_path):
    """calibrate decides a case's client once, when the case is built, and every replay of
    the fit uses it: the cap for a client that fell behind, the send times otherwise."""
    from simulator import calibrate as cal
    from simulator.latency.physics import PhysicsCoefficients

    behind = _stretched_trace(tmp_path, 1.5)
    for data, cap, timing in (
        (behind, trace_spans(behind).max_in_flight, "schedule"),
        (DATA, "off", "sends"),
    ):
        case = cal.trace_case(HEADER, data, None, **SERVER)
        assert case.max_in_flight == cap
        replayed = cal.replay_case(case, PhysicsCoefficients())
        assert replayed.scenario["trace"]["timing"] == timing
