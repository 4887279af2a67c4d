"""Every count, size, time, rate and bandwidth is bounded at parse time (simulator/limits.py),
no string or boolean is read as a number, and durations computed at run time are checked
against the clock.

Each pinned number is derived from the limit it exercises; the comments show how.
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from simulator.cluster.kv_transfer import KVTransferLink
from simulator.engine.batching import EngineConfig
from simulator.engine.request import RequestState
from simulator.errors import ConfigError
from simulator.limits import (
    MAX_BANDWIDTH_GB_PER_S,
    MAX_BLOCK_SIZE_TOKENS,
    MAX_BYTES_PER_TOKEN,
    MAX_GPUS_PER_NODE,
    MAX_INSTANCES,
    MAX_KV_BLOCKS,
    MAX_NODES,
    MAX_RATE_PER_S,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_TIME_MS,
    MAX_TIME_S,
    MAX_TIME_US,
    MAX_TOKENS,
    MIN_BANDWIDTH_GB_PER_S,
    MIN_INTERVAL_S,
    MIN_RATE_PER_S,
    duration_us,
)
from simulator.scenario import Scenario, apply_overrides, scenario_from_dict
from simulator.workload.arrivals import make_arrivals
from simulator.workload.cohorts import expand_inference_perf
from simulator.workload.generator import WorkloadStream
from simulator.workload.presets import compose_specs
from simulator.workload.spec import MAX_COHORT_POPULATION, workload_spec_from_dict

# --------------------------------------------------------------------------- the limits


def test_the_limits_follow_from_the_representation():
    # The clock: whole µs, exact in float64 up to 2^53 (about 285 years).
    assert MAX_TIME_US == 2**53 == 9_007_199_254_740_992
    assert float(MAX_TIME_US) == MAX_TIME_US and float(MAX_TIME_US + 1) != MAX_TIME_US + 1
    assert 284 < MAX_TIME_US / 1e6 / 3600 / 24 / 365.25 < 286
    # Seconds and milliseconds are the whole units below it: converted, they stay on it.
    assert MAX_TIME_S * 10**6 <= MAX_TIME_US < (MAX_TIME_S + 1) * 10**6
    assert MAX_TIME_MS * 10**3 <= MAX_TIME_US < (MAX_TIME_MS + 1) * 10**3
    assert round(float(MAX_TIME_S) * 1e6) <= MAX_TIME_US
    # The slowest rate's mean gap (10^6 / rate µs) fits the clock; 10 of them do not.
    assert 1e6 / MIN_RATE_PER_S <= MAX_TIME_US < 10 * 1e6 / MIN_RATE_PER_S
    # The slowest link moves 10^-3 bytes per µs (1 GB/s = 10^3 bytes/µs).
    assert pytest.approx(1e-3) == MIN_BANDWIDTH_GB_PER_S * 1e3
    # An instance takes about 13 KB: the most instances take about 1.3 GB.
    assert pytest.approx(1.3e9) == MAX_INSTANCES * 13e3
    assert np.iinfo(np.int64).max == MAX_SEED


# --------------------------------------------------------------------------- command line


def _servesim(args: list[str], cwd: Path | None = None) -> tuple[int, str, str, float]:
    """Run the real CLI in a subprocess whose memory is capped at 2 GiB, so a bound that
    regresses fails this test with MemoryError instead of taking the machine down."""

    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, resource.RLIM_INFINITY))

    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "simulator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap if os.name == "posix" else None,
        cwd=cwd,
    )
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def _assert_one_line_error(rc: int, out: str, err: str, seconds: float, *needles: str) -> None:
    assert rc == 2, (rc, err[-2000:])
    assert out == ""
    assert "Traceback" not in err and "OverflowError" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    # Refused before anything runs: the time is the interpreter's start-up and imports
    # (about 1 s on a loaded 2-core machine); an unbounded run took minutes or ran out of
    # memory.
    assert seconds < 20, seconds


PD = ["--num-instances", "2", "--prefill-instances", "1", "--decode-instances", "1"]
PD += ["--pd-decider", "always", "--num-requests", "5"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        # 10^6 = 10 × MAX_INSTANCES: it ran out of memory (24 GB) before.
        (
            ["--num-instances", str(10 * MAX_INSTANCES), "--num-requests", "5"],
            ["cluster.num_instances", "100,000", "13 KB"],
        ),
        # 2^63, one past int64: an OverflowError traceback before.
        (["--num-instances", str(2**63), "--num-requests", "5"], ["cluster.num_instances"]),
        # 10^-12 req/s: a mean gap of 10^18 µs, 100 times the clock's range.
        (["--rate", "1e-12", "--num-requests", "5"], ["workload.rate", "1e-09"]),
        (PD + ["--pd-transfer-bandwidth", "1e-300"], ["transfer_bandwidth_gb_per_s", "1e-06"]),
        (PD + ["--pd-transfer-base-latency", "1e300"], ["transfer_base_latency_ms"]),
    ],
    ids=["instances-oom", "instances-int64", "rate", "pd-bandwidth", "pd-base-latency"],
)
def test_cli_repros_are_one_line_errors(args, needles):
    _assert_one_line_error(*_servesim(["run", *args]), *needles)


def test_cli_v2_spec_with_too_many_requests(tmp_path):
    # 99999999999999999999999 ≈ 10^23 requests; the bound is MAX_REQUESTS = 10^8.
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "version: '2'\naggregate_rate: 10\nnum_requests: 99999999999999999999999\n"
        "clients:\n  - id: c\n    rate_fraction: 1\n    arrival: {process: poisson}\n"
        "    input_distribution: {type: constant, params: {value: 10}}\n"
        "    output_distribution: {type: constant, params: {value: 10}}\n"
    )
    _assert_one_line_error(
        *_servesim(["run", "--workload-spec", str(spec)]), "num_requests", "100,000,000"
    )


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ('cluster:\n  num_instances: "10"\n', ["cluster.num_instances", "not a string"]),
        ("tp: true\n", ["tp", "expected an integer, not a boolean"]),
        ("check_invariants: yes\n", ["check_invariants"]),  # YAML 1.1 reads `yes` as true
        ('check_invariants: "yes"\n', ["check_invariants", "expected true or false"]),
        ("engine:\n  enable_prefix_caching: 1\n", ["engine.enable_prefix_caching"]),
    ],
)
def test_cli_scenario_file_types(tmp_path, text, needles):
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    rc, out, err, seconds = _servesim(["run", str(path), "--num-requests", "2"])
    if text == "check_invariants: yes\n":
        # PyYAML turns the bare word into a real boolean before servesim sees it: accepted.
        assert rc == 0, err
        return
    _assert_one_line_error(rc, out, err, seconds, *needles)


# --------------------------------------------------------------------------- scenario bounds


def _at(path: str, value: Any, context: dict | None = None) -> dict:
    """{"a": {"b": value}} for path "a.b", merged into a copy of `context`."""
    data: dict = _deep_copy(context or {})
    node = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return data


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _item(section: str, item: dict, key: str) -> Callable[[Any], dict]:
    """A builder for a field of the first element of a list section."""
    return lambda v: {section: [{**item, key: v}]}


# (name in the error, builder value -> scenario dict, lowest allowed, highest allowed)
IntField = tuple[str, Callable[[Any], dict], int, int]
_CONSTANT = {"distribution": "constant", "value": 10}
_SCALER = {"scale_up_threshold": 5, "max_instances": 2}
_POOL = {"name": "p", "gpu_type": "H100", "initial_nodes": 0}
_POOL_AT_MOST = {**_POOL, "max_nodes": MAX_NODES}

SCENARIO_INTS: list[IntField] = [
    ("seed", lambda v: {"seed": v}, 0, MAX_SEED),
    ("horizon_us", lambda v: {"horizon_us": v}, 1, MAX_TIME_US),
    ("tp", lambda v: {"tp": v}, 1, MAX_GPUS_PER_NODE),
    *[
        (f"engine.{key}", lambda v, key=key: _at(f"engine.{key}", v), lo, hi)
        for key, lo, hi in [
            ("total_kv_blocks", 1, MAX_KV_BLOCKS),
            ("kv_cpu_blocks", 0, MAX_KV_BLOCKS),
            ("block_size_tokens", 1, MAX_BLOCK_SIZE_TOKENS),
            ("max_num_running_reqs", 1, MAX_REQUESTS),
            ("max_num_scheduled_tokens", 1, MAX_TOKENS),
            ("long_prefill_token_threshold", 0, MAX_TOKENS),
            ("max_model_len", 0, MAX_TOKENS),
            ("kv_transfer_base_latency_us", 0, MAX_TIME_US),
        ]
    ],
    *[
        (f"workload.{key}", lambda v, key=key: _at(f"workload.{key}", v), lo, hi)
        for key, lo, hi in [
            ("num_requests", 1, MAX_REQUESTS),
            ("prefix_tokens", 0, MAX_TOKENS),
            ("timeout_us", 0, MAX_TIME_US),
        ]
    ],
    (
        "workload.prompt_tokens.value",
        lambda v: {"workload": {"prompt_tokens": {**_CONSTANT, "value": v}}},
        0,
        MAX_TOKENS,
    ),
    (
        "workload.output_tokens.max",
        lambda v: {"workload": {"output_tokens": {"min": 1, "max": v}}},
        1,
        MAX_TOKENS,
    ),
    *[
        (f"cluster.{key}", lambda v, key=key: _at(f"cluster.{key}", v), lo, hi)
        for key, lo, hi in [
            ("num_instances", 1, MAX_INSTANCES),
            ("admission.latency_us", 0, MAX_TIME_US),
            ("routing.latency_us", 0, MAX_TIME_US),
            ("routing.snapshot_refresh_interval_us", 0, MAX_TIME_US),
            ("trace.counterfactual_k", 0, MAX_INSTANCES),
            ("pd.prefix_threshold", 0, MAX_TOKENS),
            ("pd.prompt_length_threshold", 0, MAX_TOKENS),
            ("pd.kv_bytes_per_token", 1, MAX_BYTES_PER_TOKEN),
            ("pd.transfer_slots", 1, MAX_REQUESTS),
            ("pd.prefill.tp", 1, MAX_GPUS_PER_NODE),
            ("pd.decode.max_model_len", 0, MAX_TOKENS),
            ("pd.decode.total_kv_blocks", 1, MAX_KV_BLOCKS),
        ]
    ],
    *[
        (f"deployments[0].{key}", _item("deployments", {"name": "d"}, key), lo, hi)
        for key, lo, hi in [
            ("num_instances", 0, MAX_INSTANCES),
            ("tp", 1, MAX_GPUS_PER_NODE),
            ("total_kv_blocks", 1, MAX_KV_BLOCKS),
            ("max_model_len", 0, MAX_TOKENS),
        ]
    ],
    *[
        (f"node_pools[0].{key}", _item("node_pools", _POOL_AT_MOST, key), lo, hi)
        for key, lo, hi in [
            ("gpus_per_node", 1, MAX_GPUS_PER_NODE),
            ("initial_nodes", 0, MAX_NODES),
            ("min_nodes", 0, MAX_NODES),
        ]
    ],  # fmt: skip
    ("node_pools[0].max_nodes", _item("node_pools", _POOL, "max_nodes"), 0, MAX_NODES),
    (
        "instance_lifecycle.warm_up_request_count",
        lambda v: _at("instance_lifecycle.warm_up_request_count", v),
        0,
        MAX_REQUESTS,
    ),
    ("autoscaler[0].max_instances", _item("autoscaler", _SCALER, "max_instances"), 1,
     MAX_INSTANCES),
    (
        "autoscaler[0].min_instances",
        _item("autoscaler", {**_SCALER, "max_instances": MAX_INSTANCES}, "min_instances"),
        0,
        MAX_INSTANCES,
    ),
]  # fmt: skip

# (name, builder, lowest, highest, lowest excluded)
FloatField = tuple[str, Callable[[Any], dict], float, float, bool]
SCENARIO_FLOATS: list[FloatField] = [
    ("workload.rate", lambda v: _at("workload.rate", v), MIN_RATE_PER_S, MAX_RATE_PER_S, False),
    ("workload.prompt_tokens.mean", lambda v: _at("workload.prompt_tokens.mean", v), 0,
     MAX_TOKENS, False),
    ("engine.gpu_memory_utilization", lambda v: _at("engine.gpu_memory_utilization", v), 0, 1,
     True),
    ("engine.kv_transfer_bandwidth_gb_per_s",
     lambda v: _at("engine.kv_transfer_bandwidth_gb_per_s", v), MIN_BANDWIDTH_GB_PER_S,
     MAX_BANDWIDTH_GB_PER_S, False),
    ("cluster.pd.transfer_bandwidth_gb_per_s",
     lambda v: _at("cluster.pd.transfer_bandwidth_gb_per_s", v), MIN_BANDWIDTH_GB_PER_S,
     MAX_BANDWIDTH_GB_PER_S, False),
    ("cluster.pd.transfer_base_latency_ms",
     lambda v: _at("cluster.pd.transfer_base_latency_ms", v), 0, MAX_TIME_MS, False),
    ("cluster.admission.token_bucket_capacity",
     lambda v: _at("cluster.admission.token_bucket_capacity", v), 0, 2**53, True),
    ("instance_lifecycle.loading_delay.mean_s",
     lambda v: _at("instance_lifecycle.loading_delay.mean_s", v), 0, MAX_TIME_S, False),
    ("instance_lifecycle.warm_up_ttft_factor",
     lambda v: _at("instance_lifecycle.warm_up_ttft_factor", v), 1, 1e6, False),
    ("events[0].at_s", _item("events", {"action": "drain_instance", "target": "instance_0"},
                             "at_s"), 0, MAX_TIME_S, False),
    ("autoscaler[0].interval_s", _item("autoscaler", _SCALER, "interval_s"), MIN_INTERVAL_S,
     MAX_TIME_S, False),
    ("autoscaler[0].scale_down_stabilization_s",
     _item("autoscaler", _SCALER, "scale_down_stabilization_s"), 0, MAX_TIME_S, False),
    ("latency.alpha_coeffs[1]",
     lambda v: {"latency": {"model": "blackbox", "alpha_coeffs": [1, v, 1],
                            "beta_coeffs": [1, 1, 1]}}, -float(MAX_TIME_US), MAX_TIME_US, False),
]  # fmt: skip

FLAGS = [
    "check_invariants",
    "engine.enable_prefix_caching",
    "engine.kv_reload_blocking",
    "cluster.trace.summarize",
    "cluster.pd.transfer_contention",
    "instance_lifecycle.retry_on_failure",
    "instance_lifecycle.initial_instances_loaded",
]


def _refused(data: dict, *needles: str) -> str:
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(data)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


@pytest.mark.parametrize("field", SCENARIO_INTS, ids=[f[0] for f in SCENARIO_INTS])
def test_scenario_int_bound_at_its_limit(field: IntField):
    name, build, lo, hi = field
    scenario_from_dict(build(hi))
    scenario_from_dict(build(lo))
    message = _refused(build(hi + 1), name, f"{hi:,}")
    assert f"(got {hi + 1})" in message
    below = _refused(build(lo - 1), name, f"from {lo:,} to {hi:,}")
    # The reason a bound is what it is explains the upper bound only ("a run keeps every
    # finished request ..." is no reason to refuse 0 requests).
    reason = message.split(f"{hi:,}", 1)[1].split(" (got")[0].partition(": ")[2]
    assert reason and reason not in below, (message, below)


@pytest.mark.parametrize("field", SCENARIO_FLOATS, ids=[f[0] for f in SCENARIO_FLOATS])
def test_scenario_float_bound_at_its_limit(field: FloatField):
    name, build, lo, hi, lo_open = field
    scenario_from_dict(build(hi))
    scenario_from_dict(build(lo if not lo_open else math.nextafter(lo, math.inf)))
    _refused(build(math.nextafter(hi, math.inf)), name)
    _refused(build(lo if lo_open else math.nextafter(lo, -math.inf)), name)
    for bad in (math.inf, -math.inf, math.nan, 10**400):
        _refused(build(bad), name)


@given(data=st.data())
def test_any_int_outside_its_bound_is_refused_naming_the_field(data):
    name, build, lo, hi = data.draw(st.sampled_from(SCENARIO_INTS))
    value = data.draw(st.integers(min_value=hi + 1) | st.integers(max_value=lo - 1))
    _refused(build(value), name)


@given(data=st.data())
def test_any_int_inside_its_bound_is_accepted(data):
    name, build, lo, hi = data.draw(st.sampled_from(SCENARIO_INTS))
    scenario_from_dict(build(data.draw(st.integers(lo, hi))))


@given(data=st.data())
def test_any_float_inside_its_bound_is_accepted_and_outside_refused(data):
    name, build, lo, hi, lo_open = data.draw(st.sampled_from(SCENARIO_FLOATS))
    inside = data.draw(st.floats(lo, hi, exclude_min=lo_open))
    scenario_from_dict(build(inside))
    outside = data.draw(
        st.floats(min_value=hi, exclude_min=True) | st.floats(max_value=lo, exclude_max=not lo_open)
    )
    _refused(build(outside), name)


@pytest.mark.parametrize("field", SCENARIO_INTS, ids=[f[0] for f in SCENARIO_INTS])
def test_scenario_int_fields_refuse_strings_bools_and_fractions(field: IntField):
    name, build, lo, hi = field
    _refused(build(str(lo)), name, "expected an integer, not a string", f"(got '{lo}')")
    _refused(build(True), name, "expected an integer, not a boolean")
    _refused(build(lo + 0.5), name, "expected an integer, not the fraction")
    # A float without a fractional part is an integer written as a float.
    scenario_from_dict(build(float(lo)))


@pytest.mark.parametrize("field", SCENARIO_FLOATS, ids=[f[0] for f in SCENARIO_FLOATS])
def test_scenario_float_fields_refuse_strings_and_bools(field: FloatField):
    name, build, lo, hi, _ = field
    _refused(build(str(hi)), name, "expected a number, not a string")
    _refused(build(False), name, "expected a number, not a boolean")
    _refused(build([hi]), name, "expected a number, not a list")


def test_floats_may_be_written_as_integers():
    assert scenario_from_dict({"workload": {"rate": 5}}).workload.rate == 5.0
    assert isinstance(scenario_from_dict({"workload": {"rate": 5}}).workload.rate, float)


@pytest.mark.parametrize("path", FLAGS)
def test_flags_are_true_or_false_only(path):
    for good in (True, False):
        scenario_from_dict(_at(path, good))
    for bad in ("yes", "true", "on", 1, 0, "1", None):
        _refused(_at(path, bad), path, "expected true or false")


def test_paths_stay_strings():
    sc = scenario_from_dict({"hardware_file": "gpus.yaml", "trace": {"data": "x.csv"}})
    assert sc.hardware_file == Path("gpus.yaml") and sc.trace.data == Path("x.csv")


def test_every_numeric_field_is_bounded():
    """Walk the schema: no plain int/float/bool field is left without a bounding validator."""
    import typing

    from pydantic import BaseModel

    from simulator.workload.spec import WorkloadSpec

    unbounded = []

    def leaves(annotation: Any, bounded: bool = False):
        """(type, bounded) for every type inside an annotation; Annotated[...] carries the
        validator that bounds it."""
        if typing.get_origin(annotation) is typing.Annotated:
            yield from leaves(typing.get_args(annotation)[0], True)
            return
        args = typing.get_args(annotation)
        if not args:
            yield annotation, bounded
        for arg in args:
            yield from leaves(arg, bounded)

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            where = f"{prefix}{name}"
            bounded_here = bool(info.metadata)  # Annotated metadata lands here for plain fields
            for t, bounded in leaves(info.annotation):
                if isinstance(t, type) and issubclass(t, BaseModel):
                    walk(t, f"{where}.")
                elif t in (int, float, bool) and not (bounded or bounded_here):
                    unbounded.append(where)

    walk(Scenario, "")
    walk(WorkloadSpec, "workload.")
    assert unbounded == []


def test_overrides_and_sweeps_revalidate_the_dumped_scenario():
    """apply_overrides re-validates model_dump(mode="python"): values at their limits,
    flags, paths and an inline v2 workload all survive the round trip."""
    data = {
        "seed": MAX_SEED,
        "horizon_us": MAX_TIME_US,
        "hardware_file": "gpus.yaml",
        "engine": {"total_kv_blocks": MAX_KV_BLOCKS, "kv_reload_blocking": True},
        "cluster": {"num_instances": MAX_INSTANCES, "pd": {"transfer_base_latency_ms": 0}},
        "workload": _v2(num_requests=MAX_REQUESTS, aggregate_rate=MAX_RATE_PER_S),
    }
    sc = scenario_from_dict(data)
    again = apply_overrides(sc, {"engine.scheduler": "sjf", "cluster.routing.latency_us": 7})
    assert again.cluster.num_instances == MAX_INSTANCES
    assert again.workload.num_requests == MAX_REQUESTS
    assert again.engine.kv_reload_blocking is True
    with pytest.raises(ConfigError, match="cluster.num_instances"):
        apply_overrides(sc, {"cluster.num_instances": MAX_INSTANCES + 1})
    with pytest.raises(ConfigError, match="cluster.num_instances: expected an integer"):
        apply_overrides(sc, {"cluster.num_instances": "2"})
    # numpy integers (a sweep grid built with numpy) are integers.
    assert apply_overrides(sc, {"cluster.num_instances": np.int64(3)}).cluster.num_instances == 3


def test_the_whole_fleet_is_bounded():
    half = MAX_INSTANCES // 2 + 1  # two deployments of this many: one past the limit
    deployments = [{"name": "a", "num_instances": half}, {"name": "b", "num_instances": half}]
    _refused({"deployments": deployments}, f"{2 * half:,} instances", "at most 100,000")
    deployments[1]["num_instances"] = MAX_INSTANCES - half
    scenario_from_dict({"deployments": deployments})
    # Autoscaler headroom counts: max_instances above the deployment's initial count.
    one = [{"name": "a", "num_instances": 1}]
    scaler = {"scale_up_threshold": 5, "max_instances": MAX_INSTANCES}
    scenario_from_dict({"deployments": one, "autoscaler": [scaler]})
    add = {"action": "add_instance", "at_s": 1}
    _refused(
        {"deployments": one, "autoscaler": [scaler], "events": [add]}, f"{MAX_INSTANCES + 1:,}"
    )
    pools = [{**_POOL, "name": n, "max_nodes": MAX_NODES // 2 + 1} for n in "ab"]
    _refused({"node_pools": pools}, "node_pools: max_nodes add up to")


# --------------------------------------------------------------------------- v2 workload spec


def _client(**extra: Any) -> dict:
    return {
        "id": "c",
        "rate_fraction": 1,
        "arrival": {"process": "constant"},
        "input_distribution": {"type": "constant", "params": {"value": 10}},
        "output_distribution": {"type": "constant", "params": {"value": 2}},
        **extra,
    }


def _v2(clients: list | None = None, **top: Any) -> dict:
    return {"version": "2", "aggregate_rate": 1, "clients": clients or [_client()], **top}


def _spec_refused(data: dict, *needles: str) -> str:
    with pytest.raises(ConfigError) as info:
        workload_spec_from_dict(data)
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)
    return message


_MT = {"max_rounds": 2}
_STAGE = {"rate": 1, "duration": 10}
_SHARED = {
    "num_unique_system_prompts": 1,
    "num_users_per_system_prompt": 1,
    "system_prompt_len": 10,
    "question_len": 10,
    "output_len": 10,
}


def _ip(stage: dict | None = None, **shared: Any) -> dict:
    return {
        "version": "2",
        "inference_perf": {"stages": [stage or _STAGE], "shared_prefix": {**_SHARED, **shared}},
    }


def _cohort(**extra: Any) -> dict:
    return _v2([], cohorts=[{**_client(), "population": 1, **extra}])


SPEC_INTS: list[IntField] = [
    ("num_requests", lambda v: _v2(num_requests=v), 0, MAX_REQUESTS),
    ("horizon", lambda v: _v2(horizon=v), 1, MAX_TIME_US),
    ("seed", lambda v: _v2(seed=v), 0, MAX_SEED),
    ("clients[0].timeout", lambda v: _v2([_client(timeout=v)]), 0, MAX_TIME_US),
    ("clients[0].prefix_length", lambda v: _v2([_client(prefix_length=v)]), 0, MAX_TOKENS),
    (
        "clients[0].reasoning.multi_turn.max_rounds",
        lambda v: _v2([_client(reasoning={"multi_turn": {"max_rounds": v}})]),
        1,
        MAX_REQUESTS,
    ),
    (
        "clients[0].reasoning.multi_turn.think_time_us",
        lambda v: _v2([_client(reasoning={"multi_turn": {**_MT, "think_time_us": v}})]),
        0,
        MAX_TIME_US,
    ),
    # (end_us 0 is refused by the window's own rule, end > start, named at the window)
    (
        "clients[0].lifecycle.windows[0]",
        lambda v: _v2([_client(lifecycle={"windows": [{"start_us": 0, "end_us": v}]})]),
        1,
        MAX_TIME_US,
    ),
    ("cohorts[0].population", lambda v: _cohort(population=v), 1, MAX_COHORT_POPULATION),
    (
        "cohorts[0].spike.duration_us",
        lambda v: _cohort(spike={"start_time_us": 0, "duration_us": v}),
        1,
        MAX_TIME_US,
    ),
    (
        "cohorts[0].drain.ramp_duration_us",
        lambda v: _cohort(drain={"start_time_us": 0, "ramp_duration_us": v}),
        1,
        MAX_TIME_US,
    ),
    (
        "inference_perf.stages[0].duration",
        lambda v: _ip({"rate": 1, "duration": v}),
        1,
        MAX_TIME_S,
    ),
    ("inference_perf.shared_prefix.question_len", lambda v: _ip(question_len=v), 1, MAX_TOKENS),
    (
        "inference_perf.shared_prefix.system_prompt_len",
        lambda v: _ip(system_prompt_len=v),
        0,
        MAX_TOKENS,
    ),
    (
        "servegen_data.span_end",
        lambda v: {"version": "2", "servegen_data": {"path": "x", "span_end": v}},
        0,
        MAX_TIME_S,
    ),
]

SPEC_FLOATS: list[FloatField] = [
    ("aggregate_rate", lambda v: _v2(aggregate_rate=v), MIN_RATE_PER_S, MAX_RATE_PER_S, False),
    ("clients[0].rate_fraction", lambda v: _v2([_client(rate_fraction=v)]), 0, MAX_RATE_PER_S,
     True),
    ("clients[0].arrival.cv", lambda v: _v2([_client(arrival={"process": "gamma", "cv": v})]),
     1e-6, 1e3, False),
    ("clients[0].network.rtt_ms", lambda v: _v2([_client(network={"rtt_ms": v})]), 0,
     MAX_TIME_MS, False),
    ("clients[0].input_distribution.params.value",
     lambda v: _v2([_client(input_distribution={"type": "constant", "params": {"value": v}})]),
     -MAX_TOKENS, MAX_TOKENS, False),
    ("inference_perf.stages[0].rate", lambda v: _ip({"rate": v, "duration": 10}),
     MIN_RATE_PER_S, MAX_RATE_PER_S, False),
    ("cohorts[0].diurnal.peak_to_trough_ratio",
     lambda v: _cohort(diurnal={"peak_hour": 0, "peak_to_trough_ratio": v}), 1, 3.6e9, False),
]  # fmt: skip

SPEC_FLAGS: list[tuple[str, Callable[[Any], dict]]] = [
    ("clients[0].streaming", lambda v: _v2([_client(streaming=v)])),
    ("clients[0].closed_loop", lambda v: _v2([_client(closed_loop=v)])),
    (
        "clients[0].reasoning.multi_turn.single_session",
        lambda v: _v2([_client(reasoning={"multi_turn": {**_MT, "single_session": v}})]),
    ),
    ("inference_perf.shared_prefix.enable_multi_turn_chat",
     lambda v: _ip(enable_multi_turn_chat=v)),
]  # fmt: skip


@pytest.mark.parametrize("field", SPEC_INTS, ids=[f[0] for f in SPEC_INTS])
def test_spec_int_bound_at_its_limit(field: IntField):
    name, build, lo, hi = field
    workload_spec_from_dict(build(hi))
    workload_spec_from_dict(build(lo))
    _spec_refused(build(hi + 1), name, f"{hi:,}")
    _spec_refused(build(lo - 1), name)
    _spec_refused(build(str(lo)), name, "expected an integer, not a string")
    _spec_refused(build(True), name, "expected an integer, not a boolean")


@given(data=st.data())
def test_spec_any_int_outside_its_bound_is_refused(data):
    name, build, lo, hi = data.draw(st.sampled_from(SPEC_INTS))
    value = data.draw(st.integers(min_value=hi + 1) | st.integers(max_value=lo - 1))
    _spec_refused(build(value), name)


@given(data=st.data())
def test_spec_any_int_inside_its_bound_is_accepted(data):
    name, build, lo, hi = data.draw(st.sampled_from(SPEC_INTS))
    workload_spec_from_dict(build(data.draw(st.integers(lo, hi))))


@pytest.mark.parametrize("field", SPEC_FLOATS, ids=[f[0] for f in SPEC_FLOATS])
def test_spec_float_bound_at_its_limit(field: FloatField):
    name, build, lo, hi, lo_open = field
    workload_spec_from_dict(build(hi))
    workload_spec_from_dict(build(lo if not lo_open else math.nextafter(lo, math.inf)))
    _spec_refused(build(math.nextafter(hi, math.inf)), name)
    _spec_refused(build(lo if lo_open else math.nextafter(lo, -math.inf)), name)
    _spec_refused(build("5"), name, "expected a number, not a string")
    _spec_refused(build(True), name, "expected a number, not a boolean")
    _spec_refused(build(math.nan), name)


@pytest.mark.parametrize("field", SPEC_FLAGS, ids=[f[0] for f in SPEC_FLAGS])
def test_spec_flags_are_true_or_false_only(field):
    name, build = field
    workload_spec_from_dict(build(True))
    for bad in ("yes", "on", 1, "false"):
        _spec_refused(build(bad), name, "expected true or false")


def test_spec_windows_and_stages_stay_on_the_clock():
    # A spike starting one µs before the clock's end may last that µs, not two.
    workload_spec_from_dict(_cohort(spike={"start_time_us": MAX_TIME_US - 1, "duration_us": 1}))
    _spec_refused(
        _cohort(spike={"start_time_us": MAX_TIME_US - 1, "duration_us": 2}),
        "cohorts[0].spike",
        "start_time_us + duration_us",
    )
    _spec_refused(
        _cohort(drain={"start_time_us": MAX_TIME_US, "ramp_duration_us": 1}),
        "cohorts[0].drain",
    )
    # Stages run back to back: two of MAX_TIME_S / 2 + 1 s add up past the clock.
    stage = {"rate": 1, "duration": MAX_TIME_S // 2 + 1}
    spec = _ip(stage)
    spec["inference_perf"]["stages"].append(stage)
    _spec_refused(spec, "inference_perf", "durations add up")


# --------------------------------------------------------------------------- run-time guards


def test_kv_transfer_beyond_the_clock_is_refused():
    # 1 GB/s = 10^3 bytes/µs: 10^3 · MAX_TIME_US bytes take exactly the clock's range.
    link = KVTransferLink(simpy.Environment(), 1.0, 0.0)
    link.start("fits", 1e3 * MAX_TIME_US, lambda _end: None)
    link = KVTransferLink(simpy.Environment(), 1.0, 0.0)
    with pytest.raises(ConfigError, match="cluster.pd.transfer_bandwidth_gb_per_s") as info:
        link.start("past", 1e3 * (MAX_TIME_US + 10), lambda _end: None)
    assert "beyond the simulator's clock range" in str(info.value)
    # The base latency counts too: MAX_TIME_MS ms plus 10^6 bytes at 1 GB/s (10^3 µs) is
    # 2^53 - 992 + 1000 µs, past the clock.
    link = KVTransferLink(simpy.Environment(), 1.0, float(MAX_TIME_MS))
    with pytest.raises(ConfigError, match="transfer_base_latency_ms"):
        link.start("slow", 1e6, lambda _end: None)
    # An instance's host link names the engine's settings.
    link = KVTransferLink(
        simpy.Environment(),
        1.0,
        0.0,
        bandwidth_field="engine.kv_transfer_bandwidth_gb_per_s",
        base_latency_field="engine.kv_transfer_base_latency_us",
    )
    with pytest.raises(ConfigError, match="engine.kv_transfer_bandwidth_gb_per_s"):
        link.start("reload", 1e3 * (MAX_TIME_US + 10), lambda _end: None)


def test_kv_transfers_stretched_by_sharing_beyond_the_clock_are_refused():
    # Two transfers of 0.6 of the clock's range each, sharing the link, end at 1.2 of it.
    env = simpy.Environment()
    link = KVTransferLink(env, 1.0, 0.0, contention=True)
    for name in ("a", "b"):
        link.start(name, 0.6 * 1e3 * MAX_TIME_US, lambda _end: None)
    with pytest.raises(ConfigError, match="2 KV transfers sharing the link"):
        env.run()


def test_cpu_tier_reload_beyond_the_clock_is_refused():
    # 10^9 bytes per token × 16 tokens per block at 10^-6 GB/s (10^-3 bytes/µs): one block
    # takes 1.6·10^13 µs; 563 blocks 9.008·10^15 µs, just past 2^53 ≈ 9.007·10^15.
    config = EngineConfig(
        kv_bytes_per_block=16 * MAX_BYTES_PER_TOKEN,
        kv_transfer_bandwidth_gb_per_s=MIN_BANDWIDTH_GB_PER_S,
    )
    per_block_us = 16 * MAX_BYTES_PER_TOKEN / (MIN_BANDWIDTH_GB_PER_S * 1e3)
    fits = MAX_TIME_US // math.ceil(per_block_us)
    assert config.reload_us(fits) <= MAX_TIME_US
    with pytest.raises(ConfigError, match="engine.kv_transfer_bandwidth_gb_per_s") as info:
        config.reload_us(fits + 1)
    assert "CPU-tier reload" in str(info.value)


def test_arrival_times_beyond_the_clock_are_refused():
    # The slowest rate, evenly spaced: gaps of 10^6 / 10^-9 = 10^15 µs; 9 of them fit
    # (9·10^15 <= 2^53 ≈ 9.007·10^15), the 10th does not.
    arrivals = make_arrivals("constant", MIN_RATE_PER_S)
    gap = arrivals.gaps_us(np.random.default_rng(0), 1)[0]
    assert 9 * gap <= MAX_TIME_US < 10 * gap
    assert arrivals.arrival_times_us(np.random.default_rng(0), 9)[-1] == 9 * gap
    with pytest.raises(ConfigError, match="rate 1e-09"):
        arrivals.arrival_times_us(np.random.default_rng(0), 10)
    # A vanishing rate's gaps are capped at the first float64 past the clock, 2^53 + 2 (no
    # int64 overflow), and their sum is refused without wrapping around: 1024 capped gaps
    # exceed 2^63.
    vanishing = make_arrivals("poisson", 1e-300)
    assert vanishing.gaps_us(np.random.default_rng(0), 1024).min() == MAX_TIME_US + 2
    with pytest.raises(ConfigError, match="rate 1e-300"):
        vanishing.arrival_times_us(np.random.default_rng(0), 1024)


def _stream(**top: Any) -> WorkloadStream:
    spec = workload_spec_from_dict({"version": "2", "clients": [_client()], **top})
    return WorkloadStream(spec, seed=1)


def test_generated_arrivals_beyond_the_clock_are_refused():
    # Same gaps as above through the generator: 9 requests fit, the 10th is refused.
    assert len(list(_stream(aggregate_rate=MIN_RATE_PER_S, num_requests=9))) == 9
    with pytest.raises(ConfigError) as info:
        list(_stream(aggregate_rate=MIN_RATE_PER_S, num_requests=10))
    message = str(info.value)
    assert "aggregate_rate" in message and "num_requests 10" in message
    assert "request 9" in message and "beyond the simulator's clock range" in message


def test_deadlines_beyond_the_clock_are_refused():
    # 1 req/s evenly spaced: arrivals at 10^6 and 2·10^6 µs. A timeout of 2^53 - 10^6 puts
    # the first deadline exactly at the clock's end and the second 10^6 µs past it.
    timeout = MAX_TIME_US - 10**6
    spec = workload_spec_from_dict(_v2([_client(timeout=timeout)], num_requests=2))
    first = next(iter(WorkloadStream(spec, seed=1)))
    assert first.deadline_us == MAX_TIME_US
    with pytest.raises(ConfigError, match="timeout") as info:
        list(WorkloadStream(spec, seed=1))
    assert "deadline" in str(info.value)


def test_closed_loop_think_time_beyond_the_clock_is_refused():
    # The next round arrives at (finish time + think time): at most 2^53.
    mt = {"max_rounds": 2, "think_time_us": MAX_TIME_US - 10}
    client = _client(reasoning={"multi_turn": mt}, timeout=0)
    spec = workload_spec_from_dict(_v2([client], num_requests=1))
    for finished_at, refused in ((10, False), (11, True)):
        stream = WorkloadStream(spec, seed=1)
        first = next(iter(stream))
        first.state = RequestState.COMPLETED
        if refused:
            with pytest.raises(ConfigError, match="think_time_us"):
                stream.sessions.on_finished(first, finished_at)
        else:
            assert stream.sessions.on_finished(first, finished_at).arrival_us == MAX_TIME_US


def test_derived_values_of_expanded_specs_are_refused_cleanly():
    # inference-perf multi-turn: 10 sessions at 10^-9 req/s are 10 / 10^-9 s = 10^16 µs
    # apart, past 2^53 ≈ 9.007·10^15 (the stage gives 10^-9 · 2·10^9 = 2 requests).
    spec = workload_spec_from_dict(
        _ip({"rate": MIN_RATE_PER_S, "duration": 2 * 10**9}, num_unique_system_prompts=10,
            enable_multi_turn_chat=True)
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"inference_perf.stages\[0\].*think time"):
        expand_inference_perf(spec)
    # Two specs at 0.6 of the largest rate each compose to 1.2 of it.
    half = workload_spec_from_dict(_v2(aggregate_rate=0.6 * MAX_RATE_PER_S))
    with pytest.raises(ConfigError, match="aggregate_rate"):
        compose_specs([half, half])


def test_duration_guard():
    assert duration_us(MAX_TIME_US - 0.5, "x") == MAX_TIME_US
    # 2^53 + 2 is the first float64 past the clock (2^53 + 1 rounds back to 2^53).
    assert float(MAX_TIME_US + 1) == MAX_TIME_US
    for bad in (float(MAX_TIME_US + 2), math.inf, math.nan):
        with pytest.raises(ConfigError, match="x: takes"):
            duration_us(bad, "x")


def test_parse_time_refusal_is_fast():
    # The repro values, validated in-process: each refusal takes well under a millisecond.
    cases = [
        {"cluster": {"num_instances": 10 * MAX_INSTANCES}},
        {"workload": {"num_requests": 99999999999999999999999}},
        {"workload": {"rate": 1e-12}},
        {"cluster": {"pd": {"transfer_bandwidth_gb_per_s": 1e-300}}},
    ]
    start = time.perf_counter()
    for data in itertools.islice(itertools.cycle(cases), 400):
        with pytest.raises(ConfigError):
            scenario_from_dict(data)
    assert (time.perf_counter() - start) / 400 < 0.01


def test_a_horizon_bounded_workload_may_not_promise_more_requests_than_a_run_holds():
    """No num_requests: the horizon alone ends the traffic, so rate x horizon is its expected
    size. 20,000 req/s for 6 hours is 20,000 x 21,600 = 432 million requests > 10^8; 4,000
    req/s for the same 6 hours is 86.4 million, allowed."""
    from simulator.workload.generator import WorkloadStream
    from simulator.workload.spec import workload_spec_from_dict

    def stream(rate: float) -> WorkloadStream:
        client = {
            "id": "c",
            "rate_fraction": 1,
            "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 10}},
            "output_distribution": {"type": "constant", "params": {"value": 10}},
        }
        spec = workload_spec_from_dict(
            {"version": "2", "aggregate_rate": rate, "clients": [client]}
        )
        return WorkloadStream(spec, seed=1, horizon_us=21_600_000_000)

    with pytest.raises(ConfigError, match=r"about 4\.32e\+08 requests; at most 100,000,000"):
        stream(20_000)
    assert next(iter(stream(4_000))).arrival_us >= 0
