"""`servesim observe` against a local OpenAI-compatible stub server (docs/behaviour.md §12.2).

Laws: every dispatched request yields exactly one trace row with a status; send ≥ scheduled
arrival, first chunk ≥ send, last chunk ≥ first chunk; the recorded TTFT/E2E can only exceed
the server's own timing, and by little; errors and timeouts are rows, not losses. Bad input
(server down, not OpenAI, unknown model) is one `error:` line, exit 2, nothing written.

The stub runs in its own process on 127.0.0.1; nothing is sent anywhere else. Tolerances are
medians over requests, because this machine's scheduling noise (a 2-core box shared with
other jobs) puts single sleeps several ms late.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from simulator.api import build_requests, replay
from simulator.cli import app
from simulator.errors import ConfigError
from simulator.observe import observe
from simulator.scenario import Scenario
from simulator.workload.trace import (
    STATUSES,
    load_trace,
    read_header,
    read_rows,
    trace_notes,
)
from tests.observe_stub_server import StubServer

runner = CliRunner()
MODEL = "stub-model"
# Median allowances, sized for a 2-core machine at load ~10 (measured medians there: about
# 3 ms accuracy and 5 ms excess; with three more CPU-bound processes on the 2 cores, up to
# 6.4 ms accuracy).
# Recorded minus actual server timing (loopback transits plus the client's wake-up):
ACCURACY_MEDIAN_MS = 8.0
# Recorded minus configured timing: adds the stub's own timer lateness under load.
MEDIAN_EXCESS_MS = 10.0
# Dispatch lateness: event-loop wake-up plus httpx building the request, which on a loaded
# 2-core machine is several ms (measured 2-12 ms per request at load 7).
SEND_LAG_MEDIAN_MS = 10.0
# A chunk can never arrive before the server sends it; allow timer granularity only.
EARLY_MS = 0.5


@pytest.fixture(scope="module")
def stub():
    server = StubServer()
    yield server
    server.stop()


def traffic(n: int = 10, rate: float = 40.0, prompt: int = 40, output: int = 6, **extra):
    """A constant-rate synthetic workload (exact lengths) as a scenario dict."""
    workload = {
        "rate": rate,
        "arrival": "constant",
        "num_requests": n,
        "prompt_tokens": {"mean": prompt, "stdev": 0},
        "output_tokens": {"mean": output, "stdev": 0},
        **extra,
    }
    return {"workload": workload}


def invoke(args: list) -> object:
    return runner.invoke(app, [str(a) for a in args])


def assert_causal(rows) -> None:
    for row in rows:
        assert row.status in STATUSES
        if row.send_time_us == 0:  # never sent: says so, and received nothing
            assert row.status != "ok" and row.error_message.startswith("not sent: "), row
            assert row.num_chunks == row.first_chunk_time_us == row.last_chunk_time_us == 0
            continue
        assert row.send_time_us >= row.arrival_time_us, row
        if row.num_chunks:
            assert row.first_chunk_time_us >= row.send_time_us, row
            assert row.last_chunk_time_us >= row.first_chunk_time_us, row


# ------------------------------------------------------------------------------- timing


def test_recorded_timing_matches_the_servers_clock(stub):
    ttft_ms, itl_ms, output = 30.0, 3.0, 8
    stub.configure(ttft_ms=ttft_ms, itl_ms=itl_ms)
    scenario = traffic(n=12, rate=40, output=output)
    obs = observe(scenario, server_url=stub.url, model=MODEL)
    scheduled = build_requests(Scenario.model_validate(scenario))

    # Conservation: one ok row per scheduled request, in dispatch (= arrival) order.
    assert [r.request_id for r in obs.rows] == [str(i) for i in range(len(scheduled))]
    assert [r.arrival_time_us for r in obs.rows] == [r.arrival_us for r in scheduled]
    assert all(r.status == "ok" for r in obs.rows), obs.summary_text()
    assert_causal(obs.rows)
    assert all(r.num_chunks == output and r.output_tokens == output for r in obs.rows)
    assert all(r.server_input_tokens == r.input_tokens == 40 for r in obs.rows)
    assert all(r.finish_reason == "length" for r in obs.rows)

    frame = obs.frame()
    log = {int(entry["request"]): entry for entry in stub.log()}
    # Accuracy: what the client recorded against what the server actually did (its own
    # monotonic stamps). The client's TTFT adds only the two loopback transits.
    server_ttft_ms = np.array(
        [(log[i]["first_token_sent_us"] - log[i]["received_us"]) / 1000 for i in range(12)]
    )
    server_stream_ms = np.array(
        [(log[i]["last_token_sent_us"] - log[i]["first_token_sent_us"]) / 1000 for i in range(12)]
    )
    ttft_error = frame.ttft_ms.to_numpy() - server_ttft_ms
    stream_error = (frame.e2e_ms - frame.ttft_ms).to_numpy() - server_stream_ms
    assert ttft_error.min() >= 0, ttft_error
    assert np.median(ttft_error) <= ACCURACY_MEDIAN_MS, ttft_error
    assert np.median(np.abs(stream_error)) <= ACCURACY_MEDIAN_MS, stream_error
    # Against the configured timing, which the stub itself keeps only as well as its timers.
    ttft_excess = frame.ttft_ms - ttft_ms
    e2e_excess = frame.e2e_ms - (ttft_ms + (output - 1) * itl_ms)
    assert ttft_excess.min() >= -EARLY_MS and e2e_excess.min() >= -EARLY_MS
    assert ttft_excess.median() <= MEDIAN_EXCESS_MS, ttft_excess.describe()
    assert e2e_excess.median() <= MEDIAN_EXCESS_MS, e2e_excess.describe()
    # Sent on schedule, as the client measured it ...
    assert frame.send_lag_ms.median() <= SEND_LAG_MEDIAN_MS, frame.send_lag_ms.describe()
    # ... and as the server saw it: arrival gaps at the server follow the schedule.
    received = np.array([log[i]["received_us"] for i in range(12)])
    planned = np.array([r.arrival_us for r in scheduled])
    # Offsets against their median, not against request 0: the first request also opens the
    # connection pool, and its lateness alone would shift every other request's drift.
    offset_ms = (received - planned) / 1000
    drift_ms = offset_ms - np.median(offset_ms)
    assert np.median(np.abs(drift_ms)) <= SEND_LAG_MEDIAN_MS, drift_ms


def test_request_body_forces_the_output_length_and_asks_for_usage(stub):
    stub.configure()
    reports: list[dict] = []
    observe(traffic(n=1, output=7), server_url=stub.url, model=MODEL, progress=reports.append)
    # Progress: once when the request is sent, once when it finished.
    assert reports[0]["sent"] == 1 and reports[0]["ok"] == 0
    assert reports[-1] == {"sent": 1, "ok": 1, "error": 0, "timeout": 0, "incomplete": 0,
                           "in_flight": 0}  # fmt: skip
    body = stub.log()[0]["body"]
    assert body["max_tokens"] == body["min_tokens"] == 7
    assert body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == MODEL and len(body["prompt"].split()) == 40


def test_unconstrained_output_lets_the_model_stop_early(stub):
    stub.configure(natural_output_tokens=3)
    obs = observe(traffic(n=2, output=9), server_url=stub.url, model=MODEL, force_output=False)
    assert "min_tokens" not in stub.log()[0]["body"]
    assert [r.output_tokens for r in obs.rows] == [3, 3]


@pytest.mark.parametrize(
    ("api_format", "streaming"), [("chat", True), ("chat", False), ("completions", False)]
)
def test_chat_and_non_streaming_responses(stub, api_format, streaming):
    stub.configure(ttft_ms=10, itl_ms=2)
    obs = observe(
        traffic(n=3, output=5),
        server_url=stub.url,
        model=MODEL,
        api_format=api_format,
        streaming=streaming,
    )
    assert all(r.status == "ok" for r in obs.rows), obs.summary_text()
    assert_causal(obs.rows)
    assert all(r.output_tokens == 5 and r.server_input_tokens == 40 for r in obs.rows)
    # A chat stream's role announcement is not a token chunk; a whole response is one chunk.
    assert all(r.num_chunks == (5 if streaming else 1) for r in obs.rows)
    assert all(r.streaming is streaming for r in obs.rows)
    if not streaming:
        # Everything arrives at the end: TTFT ≈ E2E ≈ server's total time (10 + 4·2 ms).
        assert obs.frame().ttft_ms.min() >= 18 - EARLY_MS


# ------------------------------------------------------------------------------- faults


def test_errors_and_timeouts_are_recorded_not_lost(stub, tmp_path):
    stub.configure(
        ttft_ms=5,
        itl_ms=2,
        faults={
            "1": {"kind": "http_500"},
            "2": {"kind": "disconnect", "after_tokens": 3},
            "3": {"kind": "error_event", "after_tokens": 2},
            "4": {"kind": "slow_start", "extra_ms": 1500},
        },
    )
    # Every request has a 400 ms client deadline: only the slow start misses it.
    obs = observe(traffic(n=6, rate=50, output=6, timeout_us=400_000), server_url=stub.url,
                  model=MODEL)  # fmt: skip
    by_id = {r.request_id: r for r in obs.rows}
    assert sorted(by_id) == [str(i) for i in range(6)]
    assert_causal(obs.rows)
    assert by_id["0"].status == by_id["5"].status == "ok"
    assert by_id["1"].status == "error" and "HTTP 500" in by_id["1"].error_message
    assert "injected failure" in by_id["1"].error_message
    assert by_id["2"].status == "error" and by_id["2"].num_chunks == 3
    assert "closed" in by_id["2"].error_message
    assert by_id["3"].status == "error" and "mid-stream" in by_id["3"].error_message
    assert by_id["3"].num_chunks == 2
    assert by_id["4"].status == "timeout" and by_id["4"].num_chunks == 0
    assert all("\n" not in r.error_message for r in obs.rows)
    assert obs.counts() == {"ok": 2, "error": 3, "timeout": 1, "incomplete": 0}
    # Failed rows still replay: the server saw their load (output = tokens it produced).
    obs.write_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert len(replay(tmp_path / "t.yaml", tmp_path / "t.csv").requests) == 6


def test_max_concurrency_queues_requests_at_the_client(stub):
    stub.configure(ttft_ms=60, itl_ms=1)
    obs = observe(traffic(n=4, rate=1000, output=2), server_url=stub.url, model=MODEL,
                  max_concurrency=1)  # fmt: skip
    rows = obs.rows
    assert all(r.status == "ok" for r in rows)
    # One at a time: each request is sent only after the previous one finished.
    for prev, nxt in zip(rows, rows[1:], strict=False):
        assert nxt.send_time_us >= prev.last_chunk_time_us


# ------------------------------------------------------------------------------- workloads


def test_prefix_groups_share_prompt_text_and_replay_with_their_length(stub, tmp_path):
    stub.configure(ttft_ms=5, itl_ms=1)
    spec = {
        "version": "2",
        "aggregate_rate": 50,
        "num_requests": 6,
        "clients": [
            {
                "id": "rag",
                "rate_fraction": 1,
                "prefix_group": "docs",
                "prefix_length": 30,
                "arrival": {"process": "constant"},
                "input_distribution": {"type": "constant", "params": {"value": 10}},
                "output_distribution": {"type": "constant", "params": {"value": 3}},
            }
        ],
    }
    obs = observe({"workload": spec}, server_url=stub.url, model=MODEL)
    prompts = [entry["body"]["prompt"].split() for entry in stub.log()]
    assert all(p[:30] == prompts[0][:30] for p in prompts)
    assert len({" ".join(p[30:]) for p in prompts}) == len(prompts)
    assert all((r.prefix_group, r.prefix_length, r.input_tokens) == ("docs", 30, 10)
               for r in obs.rows)  # fmt: skip
    obs.write_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert read_rows(tmp_path / "t.csv") == obs.rows  # the file holds exactly the record
    _, replayed = load_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert all(r.input_tokens == 40 for r in replayed)


def test_closed_loop_sessions_send_the_next_round_after_the_previous_one(stub):
    stub.configure(ttft_ms=5, itl_ms=1)
    think_us = 50_000
    spec = {
        "version": "2",
        "aggregate_rate": 20,
        "num_requests": 2,
        "clients": [
            {
                "id": "agent",
                "rate_fraction": 1,
                "arrival": {"process": "constant"},
                "input_distribution": {"type": "constant", "params": {"value": 20}},
                "output_distribution": {"type": "constant", "params": {"value": 4}},
                "reasoning": {
                    "multi_turn": {
                        "max_rounds": 3,
                        "think_time_us": think_us,
                        "context_growth": "accumulate",
                    }
                },
            }  # fmt: skip
        ],
    }
    obs = observe({"workload": spec}, server_url=stub.url, model=MODEL)
    assert all(r.status == "ok" for r in obs.rows)
    sessions: dict[str, list] = {}
    for row in obs.rows:
        sessions.setdefault(row.session_id, []).append(row)
    assert len(sessions) == 2 and all(len(rounds) == 3 for rounds in sessions.values())
    for rounds in sessions.values():
        rounds.sort(key=lambda r: r.round_index)
        assert [r.round_index for r in rounds] == [0, 1, 2]
        for prev, nxt in zip(rounds, rounds[1:], strict=False):
            assert nxt.arrival_time_us >= prev.last_chunk_time_us + think_us
            # Accumulated context: the next prompt holds the previous prompt and answer.
            assert nxt.input_tokens == prev.input_tokens + prev.output_tokens + 20


# ------------------------------------------------------------------------------- CLI


def observe_args(stub, tmp_path, *extra, url: str | None = None) -> list:
    return [
        "observe",
        "--server-url",
        url or stub.url,
        "--model",
        MODEL,
        "--trace-header",
        tmp_path / "trace.yaml",
        "--trace-data",
        tmp_path / "trace.csv",
        *extra,
    ]


TRAFFIC_FLAGS = [
    "--rate", 40, "--arrival", "constant", "--num-requests", 8, "--prompt-tokens", 30,
    "--prompt-tokens-stdev", 0, "--output-tokens", 5, "--output-tokens-stdev", 0,
]  # fmt: skip


def test_observe_then_replay_end_to_end(stub, tmp_path):
    """observe → replay: the recorded pair replays request for request, and the replay's
    per-request file joins the trace by request id (what calibrate consumes)."""
    stub.configure(ttft_ms=15, itl_ms=2)
    result = invoke(
        observe_args(stub, tmp_path, *TRAFFIC_FLAGS, "--warmup-requests", 2, "--record-itl")
    )
    assert result.exit_code == 0, result.output
    assert "8 ok" in result.stdout
    header = read_header(tmp_path / "trace.yaml")
    assert header["mode"] == "real" and header["warm_up_requests"] == 2
    assert header["server"]["model"] == MODEL
    assert header["network"]["measured_rtt_ms"] > 0
    rows = read_rows(tmp_path / "trace.csv")
    assert len(rows) == 8 and all(r.status == "ok" for r in rows)

    # Per-chunk times: one line per chunk, between the row's first and last chunk.
    chunks: dict[str, list[int]] = {}
    lines = (tmp_path / "trace.itl.csv").read_text().splitlines()
    assert lines[0] == "request_id,chunk_index,time_us"
    for line in lines[1:]:
        rid, _, t = line.split(",")
        chunks.setdefault(rid, []).append(int(t))
    for row in rows:
        times = chunks[row.request_id]
        assert len(times) == row.num_chunks == 5
        assert times[0] == row.first_chunk_time_us and times[-1] == row.last_chunk_time_us
        assert times == sorted(times)

    results_path = tmp_path / "replay.json"
    replay = invoke(
        [
            "replay",
            "--trace-header",
            tmp_path / "trace.yaml",
            "--trace-data",
            tmp_path / "trace.csv",
            "--results-path",
            results_path,
        ]
    )
    assert replay.exit_code == 0, replay.output
    simulated = json.loads(results_path.read_text())["requests"]
    assert [s["requestID"] for s in simulated] == [f"request_{r.request_id}" for r in rows]
    for sim, row in zip(simulated, rows, strict=True):
        assert sim["num_prefill_tokens"] == row.input_tokens
        assert sim["num_decode_tokens"] == row.output_tokens
        assert sim["state"] == "completed" and sim["ttft_ms"] > 0 and sim["e2e_ms"] > 0

    # → calibrate: fit physics to the recorded trace (the stub's model name is not a real
    # model, so the deployment's model is named), then report a replay with the fit.
    coeffs = tmp_path / "coeffs.yaml"
    fit = invoke(
        ["calibrate", "--trace-header", tmp_path / "trace.yaml", "--trace-data",
         tmp_path / "trace.csv", "--model", "meta-llama/llama-3.1-8b-instruct",
         "--hardware", "H100", "--rounds", "1", "--output", coeffs]
    )  # fmt: skip
    assert fit.exit_code == 0, fit.output
    assert coeffs.is_file() and "physics" in coeffs.read_text()
    replayed = invoke(
        ["replay", "--trace-header", tmp_path / "trace.yaml", "--trace-data",
         tmp_path / "trace.csv", "--latency-coeffs", coeffs, "--trace-output", tmp_path / "sim"]
    )  # fmt: skip
    assert replayed.exit_code == 0, replayed.output
    report = invoke(
        ["calibrate", "--trace-header", tmp_path / "trace.yaml", "--trace-data",
         tmp_path / "trace.csv", "--sim-trace", tmp_path / "sim.csv"]
    )  # fmt: skip
    assert report.exit_code == 0, report.output
    assert "MAPE" in report.output or "mape" in report.output
    # → run: the fitted file drives a simulation of new traffic.
    run = invoke(["run", "--latency-coeffs", coeffs, "--num-requests", "20", "--quiet"])
    assert run.exit_code == 0, run.output


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("refused", "--server-url: cannot connect to http://127.0.0.1:"),
        ("not_openai", "does not look like an OpenAI-compatible server"),
        ("unknown_model", "unknown model at http://127.0.0.1:"),
        ("bad_key", "--api-key: http://127.0.0.1:"),
    ],
)
def test_unusable_server_is_one_error_line_and_exit_2(stub, tmp_path, case, expected):
    stub.configure(openai=case != "not_openai", api_key="secret" if case == "bad_key" else None)
    args = observe_args(stub, tmp_path, *TRAFFIC_FLAGS)
    if case == "refused":
        args[2] = f"http://127.0.0.1:{free_port()}"
    if case == "unknown_model":
        args[4] = "no-such-model"
    if case == "bad_key":
        args += ["--api-key", "wrong"]
    result = invoke(args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert "Traceback" not in result.output
    assert not list(tmp_path.iterdir())
    assert stub.log() == []  # nothing was sent


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--api-format", "grpc"], "unknown API format (--api-format) 'grpc'"),
        (["--max-concurrency", 0], "--max-concurrency: invalid value 0; must be >= 1"),
        (["--warmup-requests", -1], "--warmup-requests: invalid value -1"),
        (["--rtt-ms", -2], "--rtt-ms: invalid value -2.0"),
        (["--server-url", "localhost:8000"], "--server-url: invalid value 'localhost:8000'"),
        # Refused before any connection: these raised from the HTTP client mid-run.
        (["--server-url", "http://127.0.0.1:abc"], "not a valid URL (Port could not be cast"),
        (["--server-url", "http://127.0.0.1:99999"], "not a valid URL (Port out of range"),
        (["--server-url", "http://[::1"], "not a valid URL (Invalid IPv6 URL)"),
        (["--server-url", "http://:80"], "--server-url: invalid value 'http://:80'; names no host"),
    ],
)
def test_bad_flags_are_one_error_line(stub, tmp_path, extra, expected):
    result = invoke(observe_args(stub, tmp_path, *TRAFFIC_FLAGS, *extra))
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [f"error: {result.stderr.strip()[7:]}"]
    assert expected in result.stderr
    assert not list(tmp_path.iterdir())


def test_no_workload_is_an_error(stub, tmp_path):
    result = invoke(observe_args(stub, tmp_path))
    assert result.exit_code == 2
    assert "observe: no workload; give --workload-spec FILE" in result.stderr


def test_unknown_python_option_is_a_config_error(stub):
    with pytest.raises(ConfigError, match="unknown observe option 'stream'"):
        observe(traffic(n=1), server_url=stub.url, model=MODEL, stream=False)


def test_ctrl_c_writes_what_was_measured_marked_incomplete(stub, tmp_path):
    """SIGINT mid-run: exit 130, a readable trace whose in-flight requests are incomplete.
    The signal goes to this process once the run is under way; observe's handler takes it."""
    stub.configure(ttft_ms=5, itl_ms=1, faults={"3": {"kind": "slow_start", "extra_ms": 60_000}})
    args = observe_args(stub, tmp_path, *TRAFFIC_FLAGS[:4], "--num-requests", 1000)

    def interrupt_when_request_3_is_stuck() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(stub.log()) < 6:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    trigger = threading.Thread(target=interrupt_when_request_3_is_stuck)
    trigger.start()
    result = invoke(args)
    trigger.join()
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.stdout
    rows = read_rows(tmp_path / "trace.csv")
    read_header(tmp_path / "trace.yaml")
    by_id = {r.request_id: r for r in rows}
    assert by_id["3"].status == "incomplete" and by_id["3"].num_chunks == 0
    assert 6 <= len(rows) < 1000
    assert [r.request_id for r in rows] == [str(i) for i in range(len(rows))]
    assert_causal(rows)


def test_workload_spec_file_with_num_requests_override(stub, tmp_path):
    stub.configure(ttft_ms=5, itl_ms=1)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "version: '2'\naggregate_rate: 50\nnum_requests: 100\nclients:\n"
        "  - id: a\n    rate_fraction: 1\n    arrival: {process: poisson}\n"
        "    input_distribution: {type: constant, params: {value: 12}}\n"
        "    output_distribution: {type: constant, params: {value: 2}}\n"
    )
    out = tmp_path / "new" / "folder"  # created when the trace is written
    args = observe_args(stub, out, "--workload-spec", spec, "--num-requests", 3, "--quiet")
    result = invoke(args)
    assert result.exit_code == 0, result.output
    rows = read_rows(out / "trace.csv")
    assert len(rows) == 3 and all(r.client_id == "a" and r.input_tokens == 12 for r in rows)
    assert read_header(out / "trace.yaml")["workload_spec"] == str(spec)


def test_ctrl_c_during_the_preflight_check_writes_nothing(tmp_path):
    """A server that accepts the connection but never answers; Ctrl-C while waiting."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        args = observe_args(None, tmp_path, *TRAFFIC_FLAGS, url=url)
        result = invoke(args)
        timer.join()
    assert result.exit_code == 130, result.output
    assert "interrupted by SIGINT; no request was sent; nothing written" in result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("header", "data", "record_itl"),
    [("same.csv", "same.csv", False), ("x.itl.csv", "x.csv", True)],
    ids=["header-is-data", "header-is-itl-file"],
)
def test_outputs_naming_one_file_are_refused_before_sending(
    stub, tmp_path, header, data, record_itl
):
    """--trace-header, --trace-data and --record-itl's DATA.itl.csv must be three files: one
    would silently replace another (a header overwritten by chunk times cannot be replayed)."""
    stub.configure()  # the module's stub: a clean log
    args = observe_args(stub, tmp_path, *TRAFFIC_FLAGS)
    args[args.index("--trace-header") + 1] = tmp_path / header
    args[args.index("--trace-data") + 1] = tmp_path / data
    if record_itl:
        args.append("--record-itl")
    result = invoke(args)
    assert result.exit_code == 2, result.output
    assert "give each output its own path" in result.stderr
    assert not list(tmp_path.iterdir())
    assert stub.log() == []  # nothing was sent


# ------------------------------------------------------------------------------- reasoning


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_tokens_are_chunks_and_the_first_one_is_the_ttft(stub, field):
    """A reasoning model streams its thinking first (`delta.reasoning` in current vLLM,
    `delta.reasoning_content` before): those are output tokens, so TTFT ends at the first of
    them, not at the first answer token three 60 ms gaps later."""
    ttft_ms, itl_ms = 10.0, 60.0
    stub.configure(ttft_ms=ttft_ms, itl_ms=itl_ms, reasoning_tokens=3, reasoning_field=field)
    obs = observe(traffic(n=3, rate=20, output=6), server_url=stub.url, model=MODEL,
                  api_format="chat")  # fmt: skip
    assert all(r.status == "ok" and r.num_chunks == 6 for r in obs.rows), obs.summary_text()
    assert_causal(obs.rows)
    frame = obs.frame()
    # The first answer token comes at ttft + 3 * itl = 190 ms; the first thought at 10 ms.
    assert frame.ttft_ms.max() < ttft_ms + itl_ms, frame.ttft_ms.tolist()
    assert frame.e2e_ms.min() >= ttft_ms + 5 * itl_ms - EARLY_MS


# ------------------------------------------------------------------------------- never sent


def test_a_deadline_that_passes_while_waiting_for_a_slot_is_recorded_not_sent(stub):
    """--max-concurrency 1: requests 1 and 2 (50 ms deadlines) are due while request 0 holds
    the only slot for 300 ms. They are rows `timeout`, never sent (send_time_us 0), recorded
    when their deadline passes rather than after waiting for the slot; the server never sees
    them, and request 3 (no deadline) goes out as soon as the slot is free."""
    import asyncio

    from simulator.observe import ObserveOptions
    from simulator.observe.observation import observe_requests

    stub.configure(ttft_ms=300, itl_ms=1)
    requests = build_requests(Scenario.model_validate(traffic(n=4, rate=100, output=2)))
    for req in requests[1:3]:
        req.deadline_us = req.arrival_us + 50_000
    started = time.monotonic()
    timed_out_at: list[float] = []

    def progress(counts: dict) -> None:
        if counts["timeout"] > len(timed_out_at):
            timed_out_at.append(time.monotonic() - started)

    options = ObserveOptions(server_url=stub.url, model=MODEL, max_concurrency=1)
    obs = asyncio.run(observe_requests(requests, options, progress=progress))
    by_id = {r.request_id: r for r in obs.rows}
    assert sorted(by_id) == ["0", "1", "2", "3"]
    assert_causal(obs.rows)
    for rid in ("1", "2"):
        row = by_id[rid]
        assert (row.status, row.send_time_us, row.num_chunks) == ("timeout", 0, 0), row
        assert row.error_message == (
            "not sent: its deadline passed while it waited for a free slot (--max-concurrency 1)"
        )
        assert row.deadline_us == row.arrival_time_us + 50_000
    assert by_id["0"].status == by_id["3"].status == "ok"
    assert sorted(entry["request"] for entry in stub.log()) == ["0", "3"]
    # Recorded at their deadlines (~0.07 s), long before the slot came free (~0.3 s).
    assert len(timed_out_at) == 2 and max(timed_out_at) < 0.25, timed_out_at
    assert obs.not_sent() == 2 and "not sent: 2 request(s) never went out" in obs.summary_text()
    assert obs.frame().send_lag_ms.isna().sum() == 2


class _ModelsThenGone:
    """Answers the pre-flight check (GET /v1/models) and then stops listening, like a server
    that went down as the run began: every request then fails to connect."""

    PREFLIGHT_GETS = 4  # the check and three RTT probes

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        gone = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                gone.gets += 1
                if gone.gets == gone.PREFLIGHT_GETS:
                    threading.Thread(target=gone.stop).start()

        self.gets = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,))
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_request_that_cannot_connect_is_recorded_not_sent(tmp_path):
    gone = _ModelsThenGone()
    try:
        # Arrivals 0.5 s apart from 0.5 s: the listener is closed by then.
        obs = observe(traffic(n=3, rate=2), server_url=gone.url, model=MODEL)
    finally:
        gone.stop()
        gone.thread.join()
    assert len(obs.rows) == 3
    assert_causal(obs.rows)
    for row in obs.rows:
        assert (row.status, row.send_time_us) == ("error", 0), row
        assert row.error_message.startswith("not sent: ConnectError"), row
    assert obs.counts()["error"] == 3 and obs.not_sent() == 3
    obs.write_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert [r.send_time_us for r in read_rows(tmp_path / "t.csv")] == [0, 0, 0]
    # A replay offers every row, as BLIS's does, at its scheduled arrival, and says how many
    # never reached the recorded server (docs/observe.md, "Requests that never went out").
    notes = trace_notes(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert [n for n in notes if n.startswith("not sent:")] == [
        "not sent: 3 request(s) never went out to the recorded server; replayed at their "
        "arrival_time_us like every row, as BLIS replays every row (the load offered, not only "
        "what the server saw; docs/observe.md)"
    ]
    _, replayed = load_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert [r.arrival_us for r in replayed] == [row.arrival_time_us for row in obs.rows]


def test_sent_requests_have_a_positive_send_time(stub):
    """0 means never sent, so a request that went out is stamped at 1 µs or later."""
    stub.configure(ttft_ms=5, itl_ms=1)
    obs = observe(traffic(n=2, output=2), server_url=stub.url, model=MODEL)
    assert all(r.status == "ok" and r.send_time_us > 0 for r in obs.rows)
    assert obs.not_sent() == 0 and "not sent" not in obs.summary_text()


# ------------------------------------------------------------------------------- deadlines


def test_the_client_timeout_is_recorded_as_the_deadline(stub, tmp_path):
    """--request-timeout-s is the deadline of a request the workload gives none: deadline_us
    holds the instant the client gave up (request_timeout_s after it started the request),
    so a replay times the request out where the real client did; a workload deadline is
    recorded as it was."""
    stub.configure(ttft_ms=5, itl_ms=1, faults={"1": {"kind": "slow_start", "extra_ms": 1500}})
    obs = observe(traffic(n=3, rate=50, output=3), server_url=stub.url, model=MODEL,
                  request_timeout_s=0.4)  # fmt: skip
    by_id = {r.request_id: r for r in obs.rows}
    assert by_id["1"].status == "timeout" and by_id["1"].num_chunks == 0
    for row in obs.rows:
        # Started (the deadline's origin) at or before the send, and within the send lag.
        assert 0 <= row.deadline_us - row.send_time_us <= 400_000, row
        assert row.deadline_us - row.arrival_time_us >= 400_000, row
        assert row.deadline_us - row.send_time_us >= 400_000 - 50_000, row
    obs.write_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    _, replayed = load_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert [r.deadline_us for r in replayed] == [r.deadline_us for r in obs.rows]

    workload_deadline = observe(traffic(n=2, rate=50, output=3, timeout_us=250_000),
                                server_url=stub.url, model=MODEL)  # fmt: skip
    assert all(r.deadline_us == r.arrival_time_us + 250_000 for r in workload_deadline.rows)


def test_a_client_timeout_beyond_the_clock_is_refused(stub, tmp_path):
    result = invoke(observe_args(stub, tmp_path, *TRAFFIC_FLAGS, "--request-timeout-s", 1e10))
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: --request-timeout-s: invalid value 10000000000.0; must be at most 9007199254"
    ]
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------- outputs


@pytest.mark.parametrize(
    ("header", "data", "record_itl", "refused"),
    [
        ("bad/x.yaml", "bad", False, "--trace-data: 'bad' is the folder --trace-header"),
        ("h.yaml", "d/x.csv", False, None),  # control: nothing nested
        ("x.itl.csv/h.yaml", "x.csv", True, "--record-itl (DATA.itl.csv): 'x.itl.csv' is the"),
    ],
    ids=["data-is-header-folder", "control", "itl-file-is-data-folder"],
)
def test_an_output_that_is_another_outputs_folder_is_refused_before_sending(
    stub, tmp_path, monkeypatch, header, data, record_itl, refused
):
    """`--trace-header bad/x.yaml --trace-data bad`: one of the two cannot be written. Found
    after the measurement it lost the whole run and left an empty folder behind; now it is
    one error line before anything is sent, and nothing is created."""
    stub.configure(ttft_ms=5, itl_ms=1)
    monkeypatch.chdir(tmp_path)
    args = observe_args(stub, tmp_path, *TRAFFIC_FLAGS[:4], "--num-requests", 2)
    args[args.index("--trace-header") + 1] = header
    args[args.index("--trace-data") + 1] = data
    if record_itl:
        args.append("--record-itl")
    result = invoke(args)
    if refused is None:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {refused}"), lines
    assert lines[0].endswith("give each output its own path")
    assert not list(tmp_path.iterdir())
    assert stub.log() == []  # nothing was sent


def test_write_trace_refuses_nested_outputs_before_creating_anything(stub, tmp_path):
    stub.configure(ttft_ms=5, itl_ms=1)
    obs = observe(traffic(n=1, output=2), server_url=stub.url, model=MODEL)
    with pytest.raises(ConfigError, match="^data_path: .* is the folder header_path"):
        obs.write_trace(tmp_path / "bad" / "x.yaml", tmp_path / "bad")
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------- signals


@pytest.mark.parametrize(
    ("signals", "status"),
    [(["SIGTERM"], 143), (["SIGINT"], 130), (["SIGINT", "SIGTERM"], 130)],
    ids=["sigterm", "sigint", "sigint-then-sigterm"],
)
def test_a_signal_mid_run_keeps_the_measurement(stub, tmp_path, signals, status):
    """The `servesim` program (its own process, with the entry point's signal handling):
    SIGTERM from a scheduler mid-run is what Ctrl-C is, in-flight requests `incomplete`, the
    trace written, the summary ending `interrupted: ...`, exit 128 + 15; it once lost the run
    and said no request was sent. The first signal decides: a SIGTERM right after a Ctrl-C
    changes neither the status nor the trace."""
    import subprocess
    import sys

    stub.configure(ttft_ms=5, itl_ms=1, faults={"3": {"kind": "slow_start", "extra_ms": 60_000}})
    args = observe_args(stub, tmp_path, *TRAFFIC_FLAGS[:4], "--num-requests", 1000, "--quiet")
    process = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(stub.log()) < 6:
            time.sleep(0.05)
        sent_before = len(stub.log())
        assert sent_before >= 6, "the run did not get under way"
        for name in signals:
            process.send_signal(getattr(signal, name))
            time.sleep(0.05)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == status, (out, err)
    assert "Traceback" not in err and "error:" not in err, err
    assert out.strip().splitlines()[-1].startswith("interrupted: "), out
    rows = read_rows(tmp_path / "trace.csv")
    read_header(tmp_path / "trace.yaml")
    assert sent_before <= len(rows) < 1000
    assert [r.request_id for r in rows] == [str(i) for i in range(len(rows))]
    by_id = {r.request_id: r for r in rows}
    assert by_id["3"].status == "incomplete" and by_id["3"].num_chunks == 0
    assert_causal(rows)


def test_a_signal_while_the_record_is_built_keeps_the_measurement(stub, monkeypatch):
    """Once the requests are done and observe's own signal handling is over, a first signal
    (here raised where the rows are sorted, as its handler would raise it) used to escape
    with the finished measurement lost: the command then said "no request was sent". The
    record is kept, marked interrupted by that signal."""
    import builtins

    from simulator.interruption import Interrupted
    from simulator.observe import observation

    stub.configure(ttft_ms=2, itl_ms=1)
    real_sorted = builtins.sorted
    raised = []

    def sorted_then_signal(*args, **kwargs):
        if not raised:
            raised.append(True)
            raise Interrupted(signal.SIGTERM)
        return real_sorted(*args, **kwargs)

    monkeypatch.setattr(observation, "sorted", sorted_then_signal, raising=False)
    obs = observe(traffic(n=3, output=2), server_url=stub.url, model=MODEL)
    assert raised and len(obs.rows) == 3 and obs.counts()["ok"] == 3
    assert obs.interrupted and obs.signal_number == signal.SIGTERM
