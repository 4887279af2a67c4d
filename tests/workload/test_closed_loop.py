"""Closed-loop load (simulator/workload/closed_loop.py, docs/workloads.md "Closed-loop load"):
the laws every closed-loop run keeps, hand-computed cases, and bad input.

Laws (hypothesis, small random cases):
* a user has at most one request outstanding, so requests in flight never exceed the users;
* a user's next request arrives exactly its think time after its previous one finished;
* the queue never holds more than the users (a closed loop cannot overload a queue);
* every request ends in a counted state, and every user in one outcome;
* the same seed gives the same run.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from simulator.errors import ConfigError
from simulator.workload.closed_loop import (
    ConstantThink,
    LognormalThink,
    parse_duration_us,
    parse_think_time,
)
from simulator.workload.generator import WorkloadStream
from simulator.workload.spec import workload_spec_from_dict


def _client(users: int, think_us: int, prompt: int = 64, output: int = 4, **extra) -> dict:
    return {
        "id": "u",
        "concurrency": users,
        "think_time_us": think_us,
        "input_distribution": {"type": "constant", "params": {"value": prompt}},
        "output_distribution": {"type": "constant", "params": {"value": output}},
        **extra,
    }


def _scenario(client: dict, num_requests: int | None = 30, **extra) -> dict:
    workload = {"version": "2", "clients": [client]}
    if num_requests is not None:
        workload["num_requests"] = num_requests
    return {
        # Roofline has no per-token or post-decode overhead: a request's completion time is
        # the end of the step that produced its last token, the instant its user reacts to.
        "latency": {"model": "roofline"},
        "engine": {"total_kv_blocks": 4000},
        "workload": workload,
        **extra,
    }


def _max_in_flight(arrivals: np.ndarray, ends: np.ndarray) -> int:
    # At equal times an end frees its slot before an arrival takes one (think time 0).
    events = sorted([(int(t), 1) for t in arrivals] + [(int(t), -1) for t in ends])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    users=st.integers(1, 6),
    think_us=st.integers(0, 30_000),
    prompt=st.integers(1, 700),
    output=st.integers(1, 12),
    num_requests=st.integers(1, 40),
    instances=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_closed_loop_laws(users, think_us, prompt, output, num_requests, instances, seed):
    sc = _scenario(
        _client(users, think_us, prompt, output),
        num_requests,
        seed=seed,
        cluster={"num_instances": instances},
    )
    result = simulator.simulate(sc, check_invariants=True)
    req = result.requests
    # Conservation: exactly num_requests requests, every one completed (nothing can time
    # out in 300 s here), none lost.
    assert len(req) == num_requests
    assert (req["state"] == "completed").all()
    ends = req["completion_us"].to_numpy()
    assert _max_in_flight(req["arrival_us"].to_numpy(), ends) <= users
    # Each user's rounds follow one another by exactly the think time.
    for _, rounds in req.sort_values("round_index").groupby("session_id"):
        arrivals = rounds["arrival_us"].to_numpy()
        finished = rounds["completion_us"].to_numpy()
        assert list(rounds["round_index"]) == list(range(len(rounds)))
        assert (arrivals[1:] == finished[:-1] + think_us).all()
    # The queue holds at most the users; so does the running batch.
    assert result.steps["queue_length"].max() <= users
    assert result.steps["running_requests"].max() <= users
    # Every user ends in exactly one outcome.
    counts = result.session_counts
    assert counts["total"] == min(users, num_requests)
    assert sum(v for k, v in counts.items() if k != "total") == counts["total"]
    # Determinism.
    again = simulator.simulate(sc)
    assert again.requests[["request_id", "arrival_us", "completion_us"]].equals(
        req[["request_id", "arrival_us", "completion_us"]]
    )


def test_overload_cannot_grow_the_queue():
    # 64 users with no think time on a small KV cache: open loop at this load would queue
    # without bound; closed loop keeps at most 64 waiting and finishes all 2,000 requests.
    sc = _scenario(_client(64, 0, prompt=900, output=64), 2000)
    sc["engine"] = {"total_kv_blocks": 3000}
    result = simulator.simulate(sc)
    assert result.summary["completed_requests"] == 2000
    assert result.steps["queue_length"].max() <= 64
    assert result.steps["running_requests"].max() <= 64


def test_users_start_spread_over_one_think_time():
    # Hand computation: user u of N = 4 with think time 1,000 µs starts at u × 1000 / 4.
    stream = WorkloadStream(
        workload_spec_from_dict(
            {"version": "2", "num_requests": 10, "clients": [_client(4, 1000)]}
        ),
        seed=1,
    )
    firsts = list(stream)
    assert [r.arrival_us for r in firsts] == [0, 250, 500, 750]
    assert [r.session_id for r in firsts] == [f"concurrency_u_user_{u}" for u in range(4)]
    assert [r.request_id for r in firsts] == [f"request_{i}" for i in range(4)]
    # 10 requests in all: 4 first requests leave a follow-up budget of 6.
    assert stream.sessions.follow_up_budget == 6
    # With no think time (or one user) every user starts at once.
    stream = WorkloadStream(
        workload_spec_from_dict({"version": "2", "num_requests": 10, "clients": [_client(3, 0)]}),
        seed=1,
    )
    assert [r.arrival_us for r in stream] == [0, 0, 0]


def test_num_requests_counts_first_requests_and_follow_ups():
    # 3 users, 7 requests: 3 first requests + 4 follow-ups, then every user is out of budget.
    result = simulator.simulate(_scenario(_client(3, 500), 7))
    assert len(result.requests) == 7
    assert result.session_counts["budget_exhausted"] == 3
    # Fewer requests than users: only that many users start.
    result = simulator.simulate(_scenario(_client(5, 500), 2))
    assert len(result.requests) == 2
    assert result.session_counts["total"] == 2


def test_a_horizon_ends_a_run_without_num_requests():
    # Each request of 64 → 4 tokens takes a few ms; with a 100 ms think time and a 1 s horizon,
    # a user sends about 1 s / (100 ms + its latency) requests, and none arrives after 1 s.
    sc = _scenario(_client(2, 100_000), None, horizon_us=1_000_000)
    result = simulator.simulate(sc)
    req = result.requests
    assert req["arrival_us"].max() <= 1_000_000
    assert 2 * 8 <= len(req) <= 2 * 10
    assert result.session_counts["horizon_interrupted"] == 2


def test_open_loop_and_closed_loop_clients_share_a_workload():
    open_client = {
        "id": "o",
        "rate_fraction": 1,
        "arrival": {"process": "constant"},
        "input_distribution": {"type": "constant", "params": {"value": 32}},
        "output_distribution": {"type": "constant", "params": {"value": 2}},
    }
    spec = {
        "version": "2",
        "aggregate_rate": 10.0,
        "num_requests": 8,
        "clients": [open_client, _client(2, 1000)],
    }
    stream = WorkloadStream(workload_spec_from_dict(spec), seed=3)
    first = list(stream)
    # Open-loop requests take their share of num_requests first (BLIS generates them up
    # front); here they use it all (constant 10/s: at 100, 200, ... ms), so no user starts.
    assert [r.client_id for r in first] == ["o"] * 8
    assert stream.sessions.sessions == {}
    # A 350 ms horizon leaves the open-loop client 3 requests (99,999 µs apart: 1 / (10 /
    # 1e6) in floating point, as BLIS computes it): both users start (at 0 and 1000 / 2 =
    # 500 µs) and may send 8 - 3 - 2 = 3 follow-ups.
    spec["horizon"] = 350_000
    stream = WorkloadStream(workload_spec_from_dict(spec), seed=3)
    first = list(stream)
    assert [(r.client_id, r.arrival_us) for r in first] == [
        ("u", 0),
        ("u", 500),
        ("o", 99_999),
        ("o", 199_998),
        ("o", 299_997),
    ]
    assert stream.sessions.follow_up_budget == 3


def test_timed_out_request_ends_its_user():
    # A 1 µs deadline: every first request times out, and its user stops (cancelled).
    result = simulator.simulate(_scenario(_client(2, 0, timeout=1), 20))
    assert len(result.requests) == 2
    assert (result.requests["state"] == "timed_out").all()
    assert result.session_counts["cancelled"] == 2


def test_users_have_a_300_s_deadline_by_default():
    stream = WorkloadStream(
        workload_spec_from_dict({"version": "2", "num_requests": 4, "clients": [_client(2, 10)]}),
        seed=1,
    )
    assert [r.deadline_us - r.arrival_us for r in stream] == [300_000_000] * 2


@pytest.mark.parametrize(
    ("client", "needle"),
    [
        ({"rate_fraction": 1.0}, "concurrency and rate_fraction are mutually exclusive"),
        ({"concurrency": -1}, "clients[0].concurrency"),
        (
            {"reasoning": {"multi_turn": {"max_rounds": 2}}},
            "concurrency and reasoning.multi_turn are mutually exclusive",
        ),
        (
            {"lifecycle": {"windows": [{"start_us": 0, "end_us": 10}]}},
            "concurrency and lifecycle are mutually exclusive",
        ),
    ],
)
def test_bad_closed_loop_clients(client, needle):
    spec = {"version": "2", "num_requests": 5, "clients": [{**_client(2, 0), **client}]}
    with pytest.raises(ConfigError) as err:
        workload_spec_from_dict(spec)
    assert needle in str(err.value)


def test_open_loop_client_still_needs_a_rate_and_an_arrival():
    client = _client(0, 0)
    with pytest.raises(ConfigError, match=r"clients\[0\].rate_fraction: required"):
        workload_spec_from_dict({"version": "2", "aggregate_rate": 1, "clients": [client]})
    with pytest.raises(ConfigError, match=r"clients\[0\].arrival: required"):
        workload_spec_from_dict(
            {"version": "2", "aggregate_rate": 1, "clients": [{**client, "rate_fraction": 1}]}
        )


def test_closed_loop_and_multi_turn_clients_cannot_mix():
    multi = {
        "rate_fraction": 1,
        "arrival": {"process": "poisson"},
        "input_distribution": {"type": "constant", "params": {"value": 5}},
        "output_distribution": {"type": "constant", "params": {"value": 5}},
        "reasoning": {"multi_turn": {"max_rounds": 2}},
    }
    spec = {"version": "2", "aggregate_rate": 1, "clients": [_client(2, 0), multi]}
    with pytest.raises(ConfigError, match="cannot share a workload"):
        workload_spec_from_dict(spec)


def test_closed_loop_needs_an_end():
    with pytest.raises(ConfigError, match="neither num_requests .* nor a horizon"):
        WorkloadStream(workload_spec_from_dict({"version": "2", "clients": [_client(2, 0)]}), 1)


# --- think times -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500ms", 500_000), ("3s", 3_000_000), ("250us", 250), ("250", 250), ("1.5ms", 1500)],
)
def test_parse_duration(text, expected):
    assert parse_duration_us(text, "x") == expected


def test_parse_think_time():
    assert parse_think_time("constant:value=500ms") == ConstantThink(500_000)
    law = parse_think_time("lognormal:mu=2.0,sigma=0.6,min=3s,max=30s")
    assert law == LognormalThink(2.0, 0.6, 3_000_000, 30_000_000)
    rng = np.random.default_rng(5)
    draws = [law.sample_us(rng) for _ in range(2000)]
    assert min(draws) >= 3_000_000 and max(draws) <= 30_000_000
    # Median of exp(mu + sigma Z) s is e^2 s = 7.389 s (inside the clamps, so kept).
    assert np.median(draws) == pytest.approx(np.exp(2.0) * 1e6, rel=0.05)
    # sigma 0: exactly e^mu s, rounded to whole µs.
    assert LognormalThink(0.0, 0.0).sample_us(rng) == 1_000_000


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("uniform:a=1", "expected constant:value"),
        ("constant", "expected constant:value"),
        ("constant:value=5parsecs", "invalid time"),
        ("constant:val=5", "missing value"),
        ("lognormal:mu=1", "missing sigma"),
        ("lognormal:mu=1,sigma=-1", "sigma: invalid value -1"),
        ("lognormal:mu=1,sigma=1,min=5s,max=1s", "min (5000000 µs) must be <= max"),
        ("lognormal:mu=1,sigma=1,mu=2", "given twice"),
        ("lognormal:mu=x,sigma=1", "mu: invalid value 'x'"),
    ],
)
def test_bad_think_time(text, needle):
    with pytest.raises(ConfigError) as err:
        parse_think_time(text)
    assert needle in str(err.value)
    assert str(err.value).startswith("--think-time-dist")


# --- closed-loop replay of a trace's sessions ------------------------------------------------

from simulator.scenario import TraceSpec, scenario_from_dict  # noqa: E402
from simulator.workload.trace import TRACE_V3_COLUMNS  # noqa: E402


def _write_trace(folder, rows, think=None, accumulate=False):
    header = folder / "t.yaml"
    lines = ["trace_version: 3", "time_unit: microseconds", "mode: generated"]
    if accumulate:
        lines.append("session_context_growth: accumulate")
    header.write_text("\n".join(lines) + "\n")
    columns = [*TRACE_V3_COLUMNS] + (["think_time_us"] if think is not None else [])
    data = folder / "t.csv"
    out = [",".join(columns)]
    for i, (session, rnd, arrival, prompt, output) in enumerate(rows):
        values = dict.fromkeys(columns, "")
        values.update(
            request_id=str(i),
            session_id=session,
            round_index=str(rnd),
            prefix_length="0",
            streaming="false",
            input_tokens=str(prompt),
            output_tokens=str(output),
            arrival_time_us=str(arrival),
            send_time_us=str(arrival),
            status="ok",
        )
        for name in ("text_tokens", "image_tokens", "audio_tokens", "video_tokens"):
            values[name] = "0"
        for name in ("reason_ratio", "deadline_us", "server_input_tokens", "num_chunks"):
            values[name] = "0"
        for name in ("first_chunk_time_us", "last_chunk_time_us"):
            values[name] = "0"
        if think is not None:
            values["think_time_us"] = str(think[i])
        out.append(",".join(values[c] for c in columns))
    data.write_text("\n".join(out) + "\n")
    return header, data


ROWS = [
    ("s", 0, 0, 64, 3),
    ("s", 1, 1_000_000, 32, 2),
    ("", 0, 50_000, 16, 1),  # no session: sent at its own time
    ("s", 2, 1_500_000, 48, 4),
]


def _replay(tmp_path, think_time=None, think=None, accumulate=False, rows=ROWS):
    header, data = _write_trace(tmp_path, rows, think, accumulate)
    sc = scenario_from_dict({"latency": {"model": "roofline"}, "engine": {"total_kv_blocks": 500}})
    sc.trace = TraceSpec(
        header=header, data=data, session_mode="closed-loop", think_time=think_time
    )
    req = simulator.simulate(sc).requests
    session = req[req["session_id"] == "s"].sort_values("round_index")
    return req, session


@pytest.mark.parametrize(
    ("think_time", "think", "expected"),
    [
        # Nothing given: the recorded gaps between the rounds' arrivals.
        (None, None, [1_000_000, 500_000]),
        # A think_time_us column with a non-zero value for a later round: those values.
        (None, [0, 2000, 0, 3000], [2000, 3000]),
        # A think-time law wins over both.
        ("constant:value=700us", [0, 2000, 0, 3000], [700, 700]),
    ],
)
def test_replay_rounds_follow_completions(tmp_path, think_time, think, expected):
    req, session = _replay(tmp_path, think_time, think)
    arrivals = session["arrival_us"].to_numpy()
    ends = session["completion_us"].to_numpy()
    assert arrivals[0] == 0
    assert list(arrivals[1:] - ends[:-1]) == expected
    # The recorded lengths of each round; the row without a session at its recorded time.
    assert list(session["input_tokens"]) == [64, 32, 48]
    assert list(session["output_tokens"]) == [3, 2, 4]
    assert req.loc[req["session_id"] == "", "arrival_us"].tolist() == [50_000]
    # Follow-ups get BLIS's session deadline, 300 s from their own arrival.
    assert list(session["request_id"][1:]) == ["session_s_round_1_1", "session_s_round_2_2"]


def test_a_think_time_without_closed_loop_is_refused(tmp_path):
    """The CLI refuses --think-time-* without --session-mode closed-loop; from Python or a
    scenario file the think time was accepted and silently unused (the fixed mode sends
    every row at its recorded time)."""
    header, data = _write_trace(tmp_path, ROWS, None, False)
    with pytest.raises(ConfigError, match=r"^replay: think_time: invalid value 'garbage'; it "):
        simulator.replay(header, data, think_time="garbage")
    with pytest.raises(ConfigError, match=r"trace\.think_time: invalid value 'constant:"):
        simulator.simulate({"trace": {"header": str(header), "data": str(data),
                                      "think_time": "constant:value=5ms"}})  # fmt: skip


def test_replay_accumulates_context_when_the_trace_says_so(tmp_path):
    _, session = _replay(tmp_path, accumulate=True)
    # Round r's prompt: round r-1's prompt + its 3 (then 2) generated tokens + its own tokens.
    assert list(session["input_tokens"]) == [64, 64 + 3 + 32, 64 + 3 + 32 + 2 + 48]
    # The earlier context is in the KV cache: 64 + 3 + 32 = 99 tokens -> 6 full blocks of 16.
    assert session["cached_tokens"].tolist()[2] == 6 * 16


def test_replay_needs_consecutive_rounds(tmp_path):
    rows = [("s", 0, 0, 8, 1), ("s", 2, 10, 8, 1)]
    with pytest.raises(ConfigError, match=r"session 's': rounds 0, 2; closed-loop replay needs"):
        _replay(tmp_path, rows=rows)


def test_a_synthetic_workload_with_users():
    # The scenario's flag-style workload (`run --concurrency`): 3 users, 12 requests, and, as
    # for any synthetic workload, no deadline unless timeout_us gives one.
    workload = {"concurrency": 3, "think_time_us": 1000, "num_requests": 12}
    workload["prompt_tokens"] = {"distribution": "constant", "value": 40}
    workload["output_tokens"] = {"distribution": "constant", "value": 3}
    sc = {"latency": {"model": "roofline"}, "workload": workload}
    stream = WorkloadStream(simulator.api.workload_spec_of(simulator.api.as_scenario(sc)), 1)
    firsts = list(stream)
    assert [(r.arrival_us, r.deadline_us) for r in firsts] == [(0, 0), (333, 0), (666, 0)]
    result = simulator.simulate(sc)
    assert len(result.requests) == 12
    assert set(result.requests["session_id"]) == {
        f"concurrency_distribution_user_{u}" for u in range(3)
    }
    workload["timeout_us"] = 5_000_000
    stream = WorkloadStream(simulator.api.workload_spec_of(simulator.api.as_scenario(sc)), 1)
    assert [r.deadline_us for r in stream] == [5_000_000, 5_000_333, 5_000_666]


def test_concurrency_32_keeps_at_most_32_in_flight(tmp_path):
    import json

    from typer.testing import CliRunner

    from simulator.cli import app

    out = tmp_path / "m.json"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--concurrency",
            "32",
            "--think-time-ms",
            "0",
            "--num-requests",
            "400",
            "--latency-model",
            "roofline",
            "--prompt-tokens",
            "300",
            "--output-tokens",
            "20",
            "--metrics-path",
            str(out),
            "-q",
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.stderr
    requests = json.loads(out.read_text())["requests"]
    arrivals = np.array([round(r["arrived_at"] * 1e6) for r in requests])
    ends = arrivals + np.array([round(r["e2e_ms"] * 1e3) for r in requests])
    # With no think time every user is always busy: exactly 32 in flight, never more.
    assert _max_in_flight(arrivals, ends) == 32


def test_a_sessions_next_round_counts_its_think_time_from_the_step_end_as_blis():
    """Blackbox with α2 = 20 µs per output token: a round of 40 tokens completes for its
    client 40 x 20 = 800 µs after the engine step that produced its last token. The next
    round arrives think_time_us (50 ms) after that step's end, as closed-loop users do and
    as BLIS does (its completion tick): 49,200 µs after the previous round's completion. It
    counted from the completion (800 µs later than BLIS-Mar on every follow-up)."""
    import simulator

    spec = {
        "version": "2", "seed": 1, "aggregate_rate": 8, "num_requests": 30,
        "clients": [{
            "id": "s", "rate_fraction": 1.0, "arrival": {"process": "constant"}, "timeout": 0,
            "input_distribution": {"type": "constant", "params": {"value": 400}},
            "output_distribution": {"type": "constant", "params": {"value": 40}},
            "reasoning": {"multi_turn": {"max_rounds": 3, "think_time_us": 50_000}},
        }],
    }  # fmt: skip
    latency = {"model": "blackbox", "alpha_coeffs": [1000, 0.5, 20], "beta_coeffs": [3000, 3, 10]}
    frame = simulator.simulate({"latency": latency, "workload": spec}).requests
    follow_ups = 0
    for _session, rounds in frame.sort_values("round_index").groupby("session_id"):
        completions = rounds.completion_us.tolist()
        arrivals = rounds.arrival_us.tolist()
        for before, after in zip(completions, arrivals[1:], strict=False):
            assert after - before == 50_000 - 40 * 20
            follow_ups += 1
    assert follow_ups > 10
