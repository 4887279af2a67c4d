"""Prefill/decode disaggregation end to end: PD invariants on random small clusters, a
hand-checked timeline, and behaviour that shows why PD exists."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import simulator
from simulator.engine.request import RequestState
from simulator.metrics.views import pd as pd_views
from tests.specs import one_prefill_one_decode


def _pd_scenario(workload: dict, n_prefill: int = 2, n_decode: int = 2, **pd):
    return {
        "workload": workload,
        "cluster": {
            "num_instances": n_prefill + n_decode,
            "pd": {"prefill_instances": n_prefill, "decode_instances": n_decode, **pd},
        },
    }


def _synthetic(n: int, rate: float, prompt: float, output: float, timeout_us: int = 0) -> dict:
    return {
        "rate": rate,
        "num_requests": n,
        "timeout_us": timeout_us,
        "prompt_tokens": {"mean": prompt, "stdev": prompt / 3, "min": 1, "max": int(3 * prompt)},
        "output_tokens": {"mean": output, "stdev": output / 3, "min": 1, "max": int(3 * output)},
    }


@st.composite
def pd_scenarios(draw):
    decider = draw(st.sampled_from(["always", "prefix-threshold", "prompt-length", "never"]))
    return {
        "seed": draw(st.integers(0, 100)),
        "workload": _synthetic(
            draw(st.integers(1, 30)),
            draw(st.sampled_from([5.0, 50.0])),
            draw(st.sampled_from([40.0, 400.0])),
            draw(st.sampled_from([5.0, 40.0])),
            draw(st.sampled_from([0, 0, 200_000])),
        ),
        "engine": {"total_kv_blocks": draw(st.sampled_from([40, 200, 5000]))},
        "cluster": {
            "num_instances": 4 + draw(st.integers(0, 1)),
            "routing": {"policy": draw(st.sampled_from(["round-robin", "least-loaded"]))},
            "pd": {
                "prefill_instances": 2,
                "decode_instances": 2,
                "decider": decider,
                "prompt_length_threshold": 100 if decider == "prompt-length" else None,
                "transfer_bandwidth_gb_per_s": draw(st.sampled_from([1.0, 25.0])),
                "transfer_contention": draw(st.booleans()),
                "transfer_slots": draw(st.sampled_from([None, None, 1, 2])),
                # 0.3 µs: requested + base is not a whole number, and no wait must read as 0.
                "transfer_base_latency_ms": draw(st.sampled_from([0.05, 0.0003])),
            },
        },
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pd_scenarios())
def test_pd_invariants(scenario):
    result = simulator.simulate(scenario)
    roles = dict(zip(result.instance_ids, result.instance_roles, strict=True))
    parents = result.pd.parents
    for p in parents:
        pre, dec = p.prefill_sub, p.decode_sub
        assert roles[pre.instance_id] == "prefill"  # INV-PD-2
        if dec is not None:
            assert roles[dec.instance_id] == "decode"  # INV-PD-2
            assert dec.enqueue_us >= p.transfer_end_us  # INV-PD-1
        # INV-PD-4: arrival <= prefill enqueue <= prefill complete <= transfer start
        #           <= transfer complete <= decode enqueue <= completion
        chain = [p.arrival_us] + ([pre.enqueue_us] if pre.enqueue_us >= 0 else [])
        if pre.state is RequestState.COMPLETED:
            chain += [pre.completion_us, p.transfer_start_us]
            if p.transfer_end_us >= 0:
                chain.append(p.transfer_end_us)
                if dec is not None and dec.enqueue_us >= 0:
                    chain.append(dec.enqueue_us)
                    if dec.state is RequestState.COMPLETED:
                        chain.append(p.completion_us)
        assert chain == sorted(chain), chain
        assert p.transfer_start_us < 0 or p.transfer_start_us == pre.completion_us  # A4
    # INV-PD-3: every transfer that started completed (no horizon)
    assert result.pd.link.initiated == len(result.pd.link.records)
    slots = scenario["cluster"]["pd"]["transfer_slots"]
    if slots is not None:  # no more transfers on the link than it has slots
        assert result.pd.link.peak_concurrency <= slots
        assert (result.transfers.slot_wait_us >= 0).all()
    else:
        assert (result.transfers.slot_wait_us == 0).all()
    # The PD metrics read durations and slot waits from the link's records, not the frame
    # users read: the two must agree to the bit (and types), whatever the base latency.
    durations, _starts, waits = pd_views._link_columns(result.pd)
    frame = result.transfers
    assert durations.dtype == np.int64 and waits.dtype == np.float64
    assert np.array_equal(durations, frame.duration_us.to_numpy(dtype=np.int64))
    assert np.array_equal(waits, frame.slot_wait_us.to_numpy(dtype=np.float64))
    assert result.pd_metrics["transfers"] == len(frame)
    # The frame is built column by column; the row-by-row reference gives the same frame.
    reference = pd_views.transfer_rows_frame(result.pd, result.instance_ids)
    assert frame.equals(reference) and list(frame.dtypes) == list(reference.dtypes)
    assert all(p.transfer_end_us >= 0 for p in parents if p.transfer_start_us >= 0)
    # INV-PD-5: pools are fixed: prefill first, then decode, then unified
    assert result.instance_roles[:4] == ["prefill", "prefill", "decode", "decode"]
    # INV-PD-6: user-facing tables hold parents only
    ids = list(result.requests.request_id)
    assert not any(i.endswith(("_prefill", "_decode")) for i in ids)
    s = result.summary
    assert s["injected_requests"] == len(result.request_records)
    completed = [r for r in result.request_records if r.state is RequestState.COMPLETED]
    assert s["completed_requests"] == len(completed)
    assert s["total_output_tokens"] == sum(r.generated_tokens for r in result.request_records)
    # dropped at decode KV: counted, and the parent is a dropped request
    dropped_kv = [p for p in parents if p.dropped_at_decode_kv]
    assert result.pd_metrics["dropped_at_decode_kv"] == len(dropped_kv)
    assert all(p.state is RequestState.DROPPED for p in dropped_kv)
    # sub-request conservation per instance, separately from parents
    for per in result.instance_summaries:
        parts = (
            "completed_requests",
            "still_queued",
            "still_running",
            "dropped_unservable",
            "timed_out_requests",
        )
        assert per["injected_requests"] == sum(per[k] for k in parts)
    assert result.in_flight_at_end == [0] * len(result.instance_ids)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pd_scenarios(), st.integers(0, 10**6), st.floats(0, 1))
def test_a_horizon_finds_every_transfer_that_joined_the_link_on_it(scenario, pick, at):
    """The link applies a transfer's join (its bytes reaching the link, after the base
    latency) at its next wake-up, not at the join; a run stopped at a horizon settles them.
    Stopped while one transfer's bytes are on the link, the link must hold it there, and
    hold as open exactly the transfers whose join came by the horizon and that had not
    ended."""
    from simulator.cluster.kv_transfer import ceil_us

    full = simulator.simulate(scenario)
    pd_spec = scenario["cluster"]["pd"]
    base_us = pd_spec["transfer_base_latency_ms"] * 1000.0
    transfers = [
        (record.start_us, record.requested_us + record.duration_us)
        for record in full.pd.link.records
        if ceil_us(record.start_us) < record.requested_us + record.duration_us
    ]
    assume(transfers)
    joined_us, end_us = transfers[pick % len(transfers)]
    horizon_us = ceil_us(joined_us) + int(at * (end_us - 1 - ceil_us(joined_us)))
    result = simulator.simulate({**scenario, "horizon_us": horizon_us})
    link = result.pd.link
    assert (joined_us, None) in link.open_transfers
    started = [p for p in result.pd.parents if p.transfer_start_us >= 0]
    done = [p for p in started if p.transfer_end_us >= 0]
    assert len(link.records) == len(done) and link.initiated == len(started)
    if pd_spec["transfer_slots"] is None:  # a join is the request plus the base latency
        open_ = [p for p in started if p.transfer_end_us < 0]
        joined = [p for p in open_ if ceil_us(p.transfer_start_us + base_us) <= horizon_us]
        assert len(link.open_transfers) == len(joined)
    assert all(start <= horizon_us for start, _end in link.open_transfers)
    assert 1 <= link.peak_concurrency <= len(started)


def test_decode_kv_failures_are_counted():
    # Decode instances with 20 blocks (320 tokens) cannot take a 600-token prompt's KV.
    scenario = _pd_scenario(
        _synthetic(10, 5, 600, 10), decider="always", decode={"total_kv_blocks": 20}
    )
    result = simulator.simulate(scenario)
    assert result.pd_metrics["dropped_at_decode_kv"] > 0
    assert result.summary["dropped_unservable"] >= result.pd_metrics["dropped_at_decode_kv"]
    # Each instance's row accounts for what was routed to it: the decode instances' drops
    # are theirs, as their per-instance summaries say.
    rows = result.instances.set_index("instance_id")
    decode_ids = rows.index[2:]
    assert (
        rows.loc[decode_ids, "dropped_unservable"].sum()
        == (result.pd_metrics["dropped_at_decode_kv"])
    )
    for summary in result.instance_summaries:
        assert (
            rows.loc[summary["instance_id"], "dropped_unservable"]
            == (summary["dropped_unservable"])
        )


def _one_request_through_pd(**overrides):
    """1 request, 2 prefill + 2 decode instances, blackbox steps, a 1 GB/s link (the timeline
    of `test_one_request_timeline_by_hand`)."""
    trace_rows = "0,c0,,,,0,,false,100,3,0,0,0,0,0,,0,0,0,0,0,0,0,ok,,\n"
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        header = Path(tmp) / "t.yaml"
        data = Path(tmp) / "t.csv"
        header.write_text("trace_version: 2\ntime_unit: microseconds\nmode: generated\n")
        from simulator.workload.trace import TRACE_COLUMNS

        data.write_text(",".join(TRACE_COLUMNS) + "\n" + trace_rows)
        return simulator.replay(
            header,
            data,
            latency={"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [1000, 10, 5]},
            engine__total_kv_blocks=1000,
            cluster={
                "num_instances": 4,
                "pd": {
                    "prefill_instances": 2,
                    "decode_instances": 2,
                    "decider": "always",
                    "transfer_bandwidth_gb_per_s": 1.0,
                    "transfer_base_latency_ms": 0.5,
                    "kv_bytes_per_token": 1000,
                },
            },
            **overrides,
        )


def test_one_request_timeline_by_hand():
    """step_us = 1000 + 10·prefill_tokens + 5·decode_requests (beta), alpha all zero.
    prefill of 100 tokens:  1000 + 10·100            = 2000 µs  -> prefill ends at 2,000
    transfer: 100 tok × 1000 B = 100,000 B at 1 GB/s = 100 µs, + 0.5 ms base latency
                                                      = 600 µs  -> KV on decode at 2,600
    decode steps (1 request): 1000 + 5·1             = 1005 µs each, 3 output tokens
    token 1 at 2,600 + 1,005 = 3,605  (TTFT)
    token 3 at 2,600 + 3·1,005 = 5,615 (E2E)
    """
    result = _one_request_through_pd()
    (req,) = result.request_records
    assert req.prefill_sub.completion_us == 2_000
    assert (req.transfer_start_us, req.transfer_end_us) == (2_000, 2_600)
    assert req.first_token_us - req.arrival_us == 3_605
    assert req.completion_us - req.arrival_us == 5_615
    assert result.summary["ttft_mean_ms"] == 3.605 and result.summary["e2e_mean_ms"] == 5.615


@pytest.mark.parametrize(
    ("horizon_us", "open_transfers", "peak"),
    [
        (2_499, [], 0),  # requested at 2,000, still in its 0.5 ms base latency
        (2_500, [(2_500.0, None)], 1),  # its bytes joined the link at 2,500
        (2_599, [(2_500.0, None)], 1),  # and drain until 2,600
    ],
)
def test_a_horizon_mid_transfer_finds_it_where_it_is(horizon_us, open_transfers, peak):
    # The link applies a join at its next wake-up (here the transfer's end, 2,600), not at
    # the join itself; a run stopped at a horizon first applies the joins made by then.
    result = _one_request_through_pd(horizon_us=horizon_us)
    (req,) = result.request_records
    assert (req.transfer_start_us, req.transfer_end_us) == (2_000, -1)
    link = result.pd.link
    assert list(link.open_transfers) == open_transfers
    assert link.peak_concurrency == peak and len(link.records) == 0
    assert result.pd_metrics["link_peak_concurrency"] == peak


def _mixed_prefill_heavy(pd: bool):
    workload = {
        "version": "2",
        "aggregate_rate": 14,
        "num_requests": 700,
        "clients": [
            {
                "id": "long",
                "rate_fraction": 1,
                "arrival": {"process": "poisson"},
                "input_distribution": {
                    "type": "gaussian",
                    "params": {"mean": 3000, "std_dev": 800, "min": 500, "max": 6000},
                },
                "output_distribution": {
                    "type": "gaussian",
                    "params": {"mean": 250, "std_dev": 80, "min": 20, "max": 600},
                },
            }
        ],
    }
    cluster = {"num_instances": 4, "routing": {"policy": "least-loaded"}}
    if pd:
        cluster["pd"] = {"prefill_instances": 2, "decode_instances": 2, "decider": "always"}
    return simulator.simulate({"seed": 3, "workload": workload, "cluster": cluster})


def test_moving_prefill_off_decode_instances_lowers_itl_tail():
    colocated = _mixed_prefill_heavy(pd=False)
    disaggregated = _mixed_prefill_heavy(pd=True)
    # Co-located, 3,000-token prefills share steps with decodes and stretch their ITL;
    # on dedicated decode instances every step is a short decode step.
    # Measured (seed 3, physics, a stock vLLM server's 8,192-token steps): ITL p99 85.6 ms
    # co-located vs 9.5 ms with 2P+2D (TTFT mean 113 -> 133 ms: half the prefill capacity plus
    # the transfer).
    itl_co = colocated.summary["itl_p99_ms"]
    itl_pd = disaggregated.summary["itl_p99_ms"]
    assert itl_pd < 0.5 * itl_co, (itl_co, itl_pd)


def test_decode_cache_mode_keeps_cached_prompts_local():
    """1P+1D, one prefix group with a 2,000-token shared prompt: once the decode instance
    holds the prefix, only ~12 tokens are new (<= 16), so later requests stay on decode."""
    workload = {
        "version": "2",
        "aggregate_rate": 2,
        "num_requests": 20,
        "clients": [
            {
                "id": "rag",
                "rate_fraction": 1,
                "prefix_group": "doc",
                "prefix_length": 2000,
                "arrival": {"process": "constant"},
                "input_distribution": {"type": "constant", "params": {"value": 12}},
                "output_distribution": {"type": "constant", "params": {"value": 20}},
            }
        ],
    }
    result = simulator.simulate(
        _pd_scenario(workload, 1, 1, decider="prefix-threshold", prefix_mode="decode-cache")
    )
    flags = [r.disaggregated for r in sorted(result.request_records, key=lambda r: r.arrival_us)]
    assert flags[0] is True  # cold: the whole prompt is new
    assert not any(flags[1:])  # the decode instance's real cache holds the prefix
    assert result.summary["completed_requests"] == 20


def _two_simultaneous_prompts() -> dict:
    """Two clients each sending one 1,000-token prompt at t = 0 (5 output tokens)."""
    return {
        "version": "2",
        "aggregate_rate": 1,
        "num_requests": 2,
        "clients": [
            {
                "id": f"c{i}",
                "rate_fraction": 1,
                "arrival": {"process": "constant"},
                "input_distribution": {"type": "constant", "params": {"value": 1000}},
                "output_distribution": {"type": "constant", "params": {"value": 5}},
            }
            for i in range(2)
        ],
    }


@pytest.mark.parametrize("contention, factor", [(True, 2.0), (False, 1.0)])
def test_simultaneous_transfers_share_the_link(contention, factor):
    """Two equal prompts finish prefill together on two prefill instances: with contention
    each transfer takes twice as long as alone; without it, as long as alone."""
    result = simulator.simulate(
        _pd_scenario(
            _two_simultaneous_prompts(),
            decider="always",
            transfer_contention=contention,
            transfer_base_latency_ms=0,
            transfer_bandwidth_gb_per_s=1.0,
        )
    )
    t = result.transfers
    assert len(t) == 2 and t.requested_us.nunique() == 1  # both started together
    assert np.allclose(t.contention_delay_us, (factor - 1) * 131_072, atol=1)
    alone_us = 1000 * 131_072 / 1e3  # 1000 tokens × 131,072 B/token at 1 GB/s = 131,072 µs
    assert np.allclose(t.duration_us, factor * alone_us, atol=1)


@pytest.mark.parametrize("contention", [True, False])
def test_one_transfer_slot_makes_the_second_transfer_wait_its_turn(contention, tmp_path):
    """The two transfers above with `transfer_slots: 1`: the first runs alone (131,072 µs),
    the second waits exactly that long for the slot and then runs alone too, whatever the
    contention model (nothing shares the link). The same from a scenario file."""
    scenario = _pd_scenario(
        _two_simultaneous_prompts(),
        decider="always",
        transfer_contention=contention,
        transfer_base_latency_ms=0,
        transfer_bandwidth_gb_per_s=1.0,
        transfer_slots=1,
    )
    result = simulator.simulate(scenario)
    t = result.transfers.sort_values("start_us")
    alone_us = 131_072  # 1000 tokens × 131,072 B/token at 1 GB/s
    assert t.requested_us.nunique() == 1
    assert t.slot_wait_us.tolist() == [0, alone_us]
    assert t.duration_us.tolist() == [alone_us, 2 * alone_us]
    assert t.concurrency_at_start.tolist() == [1, 1]
    metrics = result.pd_metrics
    assert metrics["link_transfer_slots"] == 1 and metrics["link_peak_concurrency"] == 1
    assert metrics["transfer_slot_wait_mean_us"] == alone_us / 2
    path = tmp_path / "slots.yaml"
    path.write_text(yaml.safe_dump(scenario))
    assert simulator.simulate(path).transfers.equals(result.transfers)


@pytest.mark.parametrize(
    "cluster, needle",
    [
        ({"pd": {"decider": "always"}}, "needs both pools"),
        (
            {
                "num_instances": 2,
                "pd": {"prefill_instances": 1, "decode_instances": 1, "transfer_slots": 0},
            },
            r"cluster\.pd\.transfer_slots",
        ),  # fmt: skip
        ({"num_instances": 3, "pd": {"prefill_instances": 2, "decode_instances": 2}}, "exceeds"),
        ({"num_instances": 2, "pd": {"prefill_instances": 1}}, "must both be > 0"),
        (
            {
                "num_instances": 2,
                "pd": {"prefill_instances": 1, "decode_instances": 1, "decider": "x"},
            },
            "unknown PD decider 'x'",
        ),
        # A pool's own setting is named by its path, not as the top level's field.
        (one_prefill_one_decode(prefill={"tp": 3}), r"^cluster\.pd\.prefill: tp: invalid value 3"),
        (
            one_prefill_one_decode(prefill={"hardware": "H900"}),
            r"^cluster\.pd\.prefill: hardware: unknown GPU 'H900'",
        ),
        (
            one_prefill_one_decode(decode={"dp": 2}),
            r"^cluster\.pd\.decode: dp: .*give cluster\.pd\.decode_instances "
            r"\(--decode-instances\) instead",
        ),
        (
            one_prefill_one_decode(decode={"routing_scorers": "foo:1"}),
            r"^cluster\.pd\.decode\.routing_scorers \(--decode-routing-scorers\): unknown "
            "scorer 'foo'",
        ),
    ],
)
def test_bad_pd_configuration_is_rejected(cluster, needle):
    with pytest.raises(simulator.ConfigError, match=needle):
        simulator.simulate({"workload": {"num_requests": 2}, "cluster": cluster})


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--pd-decider", "always"], "needs both pools"),
        (
            ["--num-instances", "2", "--prefill-instances", "2", "--decode-instances", "1"],
            "exceeds",
        ),
        (
            [
                "--num-instances",
                "2",
                "--prefill-instances",
                "1",
                "--decode-instances",
                "1",
                "--pd-decider",
                "sometimes",
            ],
            "unknown PD decider 'sometimes'",
        ),  # fmt: skip
        (["--pd-transfer-contention", "maybe"], "--pd-transfer-contention"),
        (["--pd-transfer-slots", "0"], "transfer_slots"),
        (
            [
                "--num-instances",
                "2",
                "--prefill-instances",
                "1",
                "--decode-instances",
                "1",
                "--decode-hardware",
                "X9",
            ],
            "unknown GPU 'X9'",
        ),  # fmt: skip
    ],
)
def test_bad_pd_flags_exit_2_with_one_line(args, needle, tmp_path):
    from typer.testing import CliRunner

    from simulator.cli import app

    out = tmp_path / "out.json"
    res = CliRunner().invoke(app, ["run", "--num-requests", "4", *args, "--results-path", str(out)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    assert "Traceback" not in res.output and not out.exists()


def test_pd_flags_run_end_to_end(tmp_path):
    from typer.testing import CliRunner

    from simulator.cli import app

    res = CliRunner().invoke(
        app,
        ["run", "--num-requests", "30", "--rate", "10", "--num-instances", "3",
         "--prefill-instances", "1", "--decode-instances", "1", "--pd-decider", "prompt-length",
         "--pd-prompt-length-threshold", "400", "--prefill-hardware", "H200"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "=== PD Metrics ===" in res.stdout


def test_transfer_slots_flag_runs_end_to_end(tmp_path):
    from typer.testing import CliRunner

    from simulator.cli import app

    out = tmp_path / "out.json"
    res = CliRunner().invoke(
        app,
        ["run", "--num-requests", "200", "--rate", "20", "--num-instances", "4",
         "--prefill-instances", "2", "--decode-instances", "2", "--pd-decider", "always",
         "--prompt-tokens", "4000", "--pd-transfer-slots", "1", "--results-path", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    metrics = json.loads(out.read_text())["pd"]
    assert metrics["link_transfer_slots"] == 1
    assert metrics["link_peak_concurrency"] == 1
    assert metrics["transfer_slot_wait_mean_us"] > 0  # 21 ms transfers at 20 req/s do meet


def test_sub_requests_inherit_the_private_mark_and_each_instance_sees_one_phase():
    """The KV cache defers hashing a sub-request's private content; that is exact only if no
    instance ever holds two phases of one parent (the pools are disjoint and PD runs on a
    fixed fleet), which is what this checks, with the marks themselves."""
    result = simulator.simulate(_pd_scenario(_synthetic(60, 20, 300, 20), decider="always"))
    parents = result.pd.parents
    assert len(parents) == 60
    for parent in parents:
        assert parent.private_from_token == 0  # a plain synthetic prompt: all its own
        prefill, decode = parent.prefill_sub, parent.decode_sub
        assert prefill.private_from_token in (0, -1)  # -1 once a preemption hashed it
        assert prefill.instance_id != decode.instance_id
    roles = dict(zip(result.instance_ids, result.instance_roles, strict=True))
    assert {roles[p.prefill_sub.instance_id] for p in parents} == {"prefill"}
    assert {roles[p.decode_sub.instance_id] for p in parents} == {"decode"}
    assert sum(p.decode_sub.private_from_token == 0 for p in parents) > 50


def test_lifecycle_settings_that_change_nothing_keep_the_pdone_prefill_one_decode():
    """Found by the random-configuration fuzzer: a lifecycle field (here retry_on_failure,
    which no failure exercises) sent the scenario down the fleet path, which built every
    instance as unified, so prefill sub-requests ran outside the prefill pool (INV-PD-2)."""
    scenario = _pd_scenario(_synthetic(20, 10, 200, 20), n_prefill=1, n_decode=1)
    scenario["cluster"]["pd"]["decider"] = "always"
    plain = simulator.simulate(scenario)
    scenario["instance_lifecycle"] = {"retry_on_failure": True}
    with_lifecycle = simulator.simulate(scenario)
    assert with_lifecycle.instance_roles == ["prefill", "decode"]
    assert with_lifecycle.summary == plain.summary
    for parent in with_lifecycle.request_records:
        assert parent.prefill_sub.instance_id == "instance_0"
        assert parent.decode_sub.instance_id == "instance_1"


def test_pd_statistics_of_no_samples_are_null():
    """No request disaggregated (admission refuses every one): the PD block's latency and
    transfer statistics have no samples, so they are null (docs/results.md), not 0."""
    scenario = _pd_scenario(_synthetic(10, 5, 600, 10), decider="always")
    scenario["cluster"]["admission"] = {"policy": "reject-all"}
    metrics = simulator.simulate(scenario).pd_metrics
    assert metrics["disaggregated_requests"] == 0 and metrics["transfers"] == 0
    empty = [k for k in metrics if k.startswith(("parent_ttft_", "transfer_duration_"))]
    assert empty and all(metrics[k] is None for k in empty)
    assert metrics["transfer_slot_wait_mean_us"] is None


def test_the_decode_pools_scorers_learn_every_disaggregated_request():
    """Every request shares one 2,048-token prefix: prefix-affinity sends every prefill to
    one instance, and, since the decode choice is observed when it is made (decode-first
    routing), every decode to one instance too (before, the decode pool never learnt a
    disaggregated request and split them at random)."""
    shared = {
        "id": "docs",
        "rate_fraction": 1,
        "prefix_group": "g1",
        "prefix_length": 2048,
        "arrival": {"process": "poisson"},
        "input_distribution": {"type": "constant", "params": {"value": 12}},
        "output_distribution": {"type": "constant", "params": {"value": 50}},
    }
    result = simulator.simulate(
        "scenarios/pd_2p2d.yaml",
        workload__num_requests=120,
        workload__clients=[shared],
        cluster__routing__policy="weighted",
        cluster__routing__scorers="prefix-affinity:1",
        cluster__pd__decider="always",
    )
    requests = result.requests
    assert requests.prefill_instance.nunique() == 1
    assert requests.decode_instance.nunique() == 1


def test_a_decode_pool_without_room_drops_before_it_looks_at_the_deadline():
    """BLIS §7.2 step 5: the decode instance reserves the prompt's KV first (no room: dropped
    at decode KV), and only a request that got its KV is timed out by a deadline already
    past. A 1,000-token prompt needs 63 blocks; the decode pool has 10, and the 36 ms client
    timeout has passed when the transfer lands, so every request is a decode-KV drop."""
    scenario = {
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "seed": 1,
        "cluster": one_prefill_one_decode(decode={"total_kv_blocks": 10}),
        "workload": {
            "num_requests": 3,
            "rate": 1,  # one at a time: each reaches the decode pool just after its deadline
            "timeout_us": 36_000,
            "prompt_tokens": {"distribution": "constant", "value": 1000},
            "output_tokens": {"distribution": "constant", "value": 10},
        },
    }
    result = simulator.simulate(scenario, warn_unsteady=False)
    assert result.pd_metrics["dropped_at_decode_kv"] == 3
    assert result.summary["timed_out_requests"] == 0


def test_a_decode_pool_with_a_shorter_context_than_the_prefill_pool_is_warned_about(caplog):
    scenario = {
        "model": "meta-llama/llama-3.1-8b-instruct",
        "cluster": one_prefill_one_decode(decode={"max_model_len": 500}),
        "workload": {"num_requests": 2},
    }
    with caplog.at_level("WARNING", logger="servesim"):
        simulator.simulate(scenario, warn_unsteady=False)
    warned = [
        r.getMessage() for r in caplog.records if "decode pool's context limit" in r.getMessage()
    ]
    assert (
        len(warned) == 1 and "(500 tokens) is below the prefill pool's (131072 tokens)" in warned[0]
    )


@pytest.mark.parametrize(
    ("cluster", "warned"),
    [
        # Pool and link settings with no PD pools: a unified fleet ran without a word.
        (
            {"num_instances": 2, "pd": {"decode": {"hardware": "H200", "tp": 2}}},
            "cluster.pd.decode is set",
        ),
        (
            {"num_instances": 2, "pd": {"transfer_bandwidth_gb_per_s": 5, "transfer_slots": 2}},
            "cluster.pd.transfer_bandwidth_gb_per_s, cluster.pd.transfer_slots are set",
        ),
        # A prefix mode the decider does not read, as its thresholds are.
        (
            {"num_instances": 3, "pd": {"prefill_instances": 1, "decode_instances": 1,
                                        "decider": "prompt-length", "prefix_mode": "decode-cache"}},
            "pd.prefix_mode is set but the decider 'prompt-length' does not read it",
        ),
    ],
)  # fmt: skip
def test_pd_settings_that_change_nothing_are_warned_about(cluster, warned, caplog):
    with caplog.at_level("WARNING", logger="servesim"):
        simulator.simulate(
            {"cluster": cluster, "workload": {"num_requests": 2}}, warn_unsteady=False
        )
    assert [r.getMessage() for r in caplog.records if warned in r.getMessage()]


def test_pd_pools_from_deployments_read_the_link_settings_without_a_warning(caplog):
    scenario = {
        "deployments": [
            {"name": "dec", "role": "decode", "num_instances": 1},
            {"name": "pre", "role": "prefill", "num_instances": 1},
        ],
        "cluster": {"pd": {"decider": "always", "transfer_bandwidth_gb_per_s": 5}},
        "workload": {"num_requests": 2},
    }
    with caplog.at_level("WARNING", logger="servesim"):
        simulator.simulate(scenario, warn_unsteady=False)
    assert not [r for r in caplog.records if "no PD pools" in r.getMessage()]


@pytest.mark.parametrize("layout", [{"tp": 2}, {"cluster": {"pd": {"prefill": {"tp": 2}}}}])
def test_a_transfer_moves_one_prefill_gpu_s_share_of_the_kv(layout):
    """The current BLIS sizes a transfer with the prefill pool's per-GPU KV (SPEC-current
    §8.4): Llama-3.1-8B at TP 2 holds 131,072 / 2 = 65,536 B per token on each GPU. A
    512-token prompt (32 whole blocks) is 33,554,432 B; at 25 GB/s (25,000 B/µs) plus the
    0.05 ms base: ceil(50 + 1,342.18) = 1,393 µs, BLIS's figure (servesim sent twice that)."""
    cluster = one_prefill_one_decode()
    cluster["pd"] |= {"transfer_contention": False, **layout.get("cluster", {}).get("pd", {})}
    scenario = {
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "latency": {"model": "roofline"},
        "engine": {"total_kv_blocks": 29205},
        **{k: v for k, v in layout.items() if k != "cluster"},
        "cluster": cluster,
        "workload": {
            "num_requests": 3,
            "rate": 1,
            "prompt_tokens": {"distribution": "constant", "value": 512},
            "output_tokens": {"distribution": "constant", "value": 8},
        },
    }
    result = simulator.simulate(scenario, warn_unsteady=False)
    assert result.pd_metrics["transfer_duration_mean_us"] == 1393
