"""Cohort expansion (population, fractions, diurnal/spike/drain windows) and inference-perf."""

from __future__ import annotations

import pytest

import simulator
from simulator.errors import ConfigError
from simulator.workload.cohorts import (
    US_PER_HOUR,
    diurnal_multiplier,
    drain_windows,
    expand_cohorts,
    expand_inference_perf,
)
from simulator.workload.spec import DrainSpec, workload_spec_from_dict

LENGTH = {"type": "constant", "params": {"value": 10}}


def _client(cid: str, fraction: float) -> dict:
    return {
        "id": cid,
        "rate_fraction": fraction,
        "arrival": {"process": "poisson"},
        "input_distribution": LENGTH,
        "output_distribution": LENGTH,
    }


def _cohort(cid: str, population: int, fraction: float, **patterns) -> dict:
    return {**_client(cid, fraction), "population": population, **patterns}


def _spec(clients=(), cohorts=()) -> dict:
    return {
        "version": "2",
        "aggregate_rate": 10.0,
        "clients": list(clients),
        "cohorts": list(cohorts),
    }


def _active_us(windows, start_us: int, end_us: int) -> int:
    """Length of the union of windows inside [start_us, end_us)."""
    covered, cursor = 0, start_us
    for w in sorted(windows, key=lambda w: w.start_us):
        lo, hi = max(w.start_us, cursor), min(w.end_us, end_us)
        if hi > lo:
            covered += hi - lo
            cursor = hi
    return covered


def test_members_ids_fractions_and_copied_fields() -> None:
    cohort = _cohort(
        "web",
        4,
        0.6,
        tenant_id="t1",
        slo_class="sheddable",
        prefix_group="g",
        prefix_length=32,
        streaming=True,
    )
    spec = workload_spec_from_dict(_spec([_client("solo", 0.4)], [cohort]))
    clients = expand_cohorts(spec)
    assert [c.id for c in clients] == ["solo", "web-0", "web-1", "web-2", "web-3"]
    assert sum(c.rate_fraction for c in clients) == pytest.approx(1.0)
    for member in clients[1:]:
        assert member.rate_fraction == pytest.approx(0.15)
        assert (member.tenant_id, member.slo_class, member.prefix_group) == ("t1", "sheddable", "g")
        assert member.prefix_length == 32 and member.streaming
        assert member.lifecycle is None


def test_large_population_is_fast_and_exact() -> None:
    spec = workload_spec_from_dict(_spec(cohorts=[_cohort("big", 20_000, 1.0)]))
    clients = expand_cohorts(spec)
    assert len(clients) == 20_000
    assert clients[-1].id == "big-19999"
    assert sum(c.rate_fraction for c in clients) == pytest.approx(1.0)


def test_diurnal_windows() -> None:
    ratio = 4.0
    cohort = _cohort("d", 2, 1.0, diurnal={"peak_hour": 14, "peak_to_trough_ratio": ratio})
    member = expand_cohorts(workload_spec_from_dict(_spec(cohorts=[cohort])))[0]
    windows = member.lifecycle.windows
    assert len(windows) == 24
    for hour, w in enumerate(windows):
        assert w.start_us == hour * US_PER_HOUR
        assert US_PER_HOUR / ratio - 1 <= w.end_us - w.start_us <= US_PER_HOUR
    peak = windows[14].end_us - windows[14].start_us
    trough = windows[2].end_us - windows[2].start_us  # 12 h from the peak
    assert peak == US_PER_HOUR
    assert peak / trough == pytest.approx(ratio, rel=1e-6)
    # Monotone from the peak down to the trough on either side.
    lengths = [w.end_us - w.start_us for w in windows]
    assert lengths[14] > lengths[17] > lengths[20] > lengths[2]
    assert lengths[14] > lengths[11] > lengths[8] > lengths[2]


def test_diurnal_multiplier_extremes() -> None:
    assert diurnal_multiplier(5, 5, 3.0) == pytest.approx(1.0)
    assert diurnal_multiplier(17, 5, 3.0) == pytest.approx(1 / 3)
    assert diurnal_multiplier(11, 5, 3.0) == pytest.approx((1 + 1 / 3) / 2)


def test_spike_window() -> None:
    cohort = _cohort("s", 3, 0.3, spike={"start_time_us": 5_000_000, "duration_us": 2_000_000})
    members = expand_cohorts(workload_spec_from_dict(_spec(cohorts=[cohort])))
    for m in members:
        [w] = m.lifecycle.windows
        assert (w.start_us, w.end_us) == (5_000_000, 7_000_000)


def test_drain_windows_shrink() -> None:
    windows = drain_windows(DrainSpec(start_time_us=1_000_000, ramp_duration_us=10_000_000))
    assert (windows[0].start_us, windows[0].end_us) == (0, 1_000_000)
    ramp = windows[1:]
    assert len(ramp) == 10
    for i, w in enumerate(ramp):
        assert w.start_us == 1_000_000 + i * 1_000_000
        assert w.end_us - w.start_us == 1_000_000 * (10 - i) // 10
    assert ramp[-1].end_us <= 11_000_000


def test_drain_from_zero_has_no_pre_window() -> None:
    windows = drain_windows(DrainSpec(start_time_us=0, ramp_duration_us=5))
    assert len(windows) == 10  # segment floored at 1 µs, each active 1 µs
    assert all(w.end_us - w.start_us == 1 for w in windows)


def test_diurnal_plus_spike_is_a_union() -> None:
    cohort = _cohort(
        "ds",
        1,
        1.0,
        diurnal={"peak_hour": 0, "peak_to_trough_ratio": 10.0},
        spike={"start_time_us": 12 * US_PER_HOUR, "duration_us": US_PER_HOUR},
    )
    [member] = expand_cohorts(workload_spec_from_dict(_spec(cohorts=[cohort])))
    windows = member.lifecycle.windows
    assert len(windows) == 25
    # The trough hour (12) is fully active thanks to the spike; hour 11 keeps its diurnal share.
    assert _active_us(windows, 12 * US_PER_HOUR, 13 * US_PER_HOUR) == US_PER_HOUR
    assert _active_us(windows, 11 * US_PER_HOUR, 12 * US_PER_HOUR) < US_PER_HOUR / 2


def test_diurnal_active_time_ratio_peak_vs_trough() -> None:
    cohort = _cohort("d", 1, 1.0, diurnal={"peak_hour": 3, "peak_to_trough_ratio": 5.0})
    [member] = expand_cohorts(workload_spec_from_dict(_spec(cohorts=[cohort])))
    w = member.lifecycle.windows
    peak = _active_us(w, 3 * US_PER_HOUR, 4 * US_PER_HOUR)
    trough = _active_us(w, 15 * US_PER_HOUR, 16 * US_PER_HOUR)
    assert peak / trough == pytest.approx(5.0, rel=1e-6)


# --- inference-perf ---------------------------------------------------------------------------

SHARED = {
    "num_unique_system_prompts": 2,
    "num_users_per_system_prompt": 3,
    "system_prompt_len": 100,
    "question_len": 50,
    "output_len": 20,
}


def _ip(stages, **shared) -> dict:
    return {
        "version": "2",
        "seed": 5,
        "inference_perf": {"stages": stages, "shared_prefix": {**SHARED, **shared}},
    }


def test_inference_perf_single_stage() -> None:
    out = expand_inference_perf(workload_spec_from_dict(_ip([{"rate": 12, "duration": 60}])))
    assert out.inference_perf is None and out.seed == 5
    assert out.aggregate_rate == 12 and out.category == "language"
    assert out.horizon == 60_000_000
    assert len(out.clients) == 6
    assert out.clients[0].id == "prompt-0-user-0" and out.clients[-1].id == "prompt-1-user-2"
    for c in out.clients:
        assert c.rate_fraction == pytest.approx(1 / 6)
        assert c.prefix_group == c.tenant_id and c.prefix_group.startswith("prompt-")
        assert c.prefix_length == 100 and c.slo_class == "batch"
        assert c.input_distribution.params == {"value": 50}
        assert c.output_distribution.params == {"value": 20}
        assert c.lifecycle is None and c.reasoning is None
    assert {c.prefix_group for c in out.clients} == {"prompt-0", "prompt-1"}


def test_inference_perf_multi_stage_rates() -> None:
    stages = [{"rate": 6, "duration": 10}, {"rate": 18, "duration": 20}]
    out = expand_inference_perf(workload_spec_from_dict(_ip(stages)))
    assert len(out.clients) == 12
    assert out.aggregate_rate == 24
    total = sum(c.rate_fraction for c in out.clients)
    for stage, (rate, start, end) in enumerate(((6, 0, 10_000_000), (18, 10_000_000, 30_000_000))):
        members = [c for c in out.clients if c.id.startswith(f"stage-{stage}-")]
        assert len(members) == 6
        # Per-stage emitted rate after normalisation = the stage's rate.
        stage_rate = sum(out.aggregate_rate * c.rate_fraction / total for c in members)
        assert stage_rate == pytest.approx(rate)
        for c in members:
            [w] = c.lifecycle.windows
            assert (w.start_us, w.end_us) == (start, end)
    assert out.horizon == 30_000_000


def test_inference_perf_multi_turn() -> None:
    out = expand_inference_perf(
        workload_spec_from_dict(_ip([{"rate": 2, "duration": 100}], enable_multi_turn_chat=True))
    )
    assert out.category == "reasoning"
    mt = out.clients[0].reasoning.multi_turn
    assert mt.max_rounds == 34  # ceil(2 · 100 / 6)
    assert mt.think_time_us == 3_000_000  # 6 sessions / 2 per s
    assert mt.single_session and mt.context_growth == ""
    assert out.clients[0].is_closed_loop
    # The sessions' rounds end the workload: no horizon at the stage's end to cut them.
    assert out.horizon is None


def test_inference_perf_multi_turn_sends_every_round_even_when_late() -> None:
    """Six sessions of ceil(10 · 12 / 6) = 20 rounds, each sent 0.6 s (6 sessions / 10 per s)
    after the one before completed; a round's 400 output tokens take over a second, so most
    rounds come after the stage's 12 s end (the stage's end cut all but 41 of them until
    2026-12-07); inference-perf and BLIS send them all. Law: 6 · 20 = 120 requests, all
    completed; num_requests is not needed to end the traffic (nor, given 60, does it cut the
    sessions' rounds, as in BLIS)."""
    shared = {"output_len": 400, "enable_multi_turn_chat": True}
    for extra in ({}, {"num_requests": 60}):
        spec = {**_ip([{"rate": 10, "duration": 12}], **shared), **extra}
        result = simulator.simulate({"workload": spec, "latency": {"model": "roofline"}})
        assert result.summary["injected_requests"] == 120, extra
        assert result.summary["completed_requests"] == 120, extra
        arrivals_s = result.requests.arrival_us.to_numpy() / 1e6
        assert arrivals_s.max() > 12.0  # late rounds were sent, not cut at the stage's end


def test_inference_perf_missing_section() -> None:
    spec = workload_spec_from_dict(_spec([_client("a", 1.0)]))
    with pytest.raises(ConfigError, match="inference_perf"):
        expand_inference_perf(spec)
