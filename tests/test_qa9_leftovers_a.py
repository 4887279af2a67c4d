"""QA round 9 leftovers (a): the start-up warning about initial instances no node will hold
reads the pools an autoscaler manages (docs/infrastructure.md "Node pools", "Autoscaler"); a
saved scenario whose `resolved` entries are null has a latency block (empty) instead of an
AttributeError; `plots.resample` refuses a bin width that would make more than MAX_POINTS bins
before allocating them (docs/python.md "Resampling")."""

from __future__ import annotations

import json
import logging
import tracemalloc
from pathlib import Path

import pytest

import simulator
from simulator.errors import ConfigError
from simulator.metrics import plots
from simulator.metrics.persistence import load_result, save_result
from simulator.metrics.views.text import latency_provenance
from simulator.report.build import write_report

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
LLAMA = "meta-llama/llama-3.1-8b-instruct"
QWEN = "qwen/qwen3-14b"
NEVER = "nothing adds a node"


# ---------------------------------------------------------------- 1. start-up overflow warning
def _pinned(llama_gpu: str, autoscaled: str | None) -> dict:
    """llama pinned to pool `a`, which starts empty (0 of at most 2 one-GPU nodes); qwen
    pinned to pool `b` (H100, one 2-GPU node to start, up to 3); `spare`, unpinned H100, with
    no initial instance. `autoscaled` names the deployment with an autoscaler (or none). Only
    qwen's clients send requests, so the run ends whether or not llama is ever placed."""
    scenario = {
        "seed": 3,
        "node_pools": [
            {"name": "a", "gpu_type": llama_gpu, "gpus_per_node": 1, "initial_nodes": 0,
             "max_nodes": 2, "provisioning_delay": {"mean_s": 4}, "cost_per_hour": 5},
            {"name": "b", "gpu_type": "H100", "gpus_per_node": 2, "initial_nodes": 1,
             "max_nodes": 3, "provisioning_delay": {"mean_s": 4}, "cost_per_hour": 20},
        ],
        "deployments": [
            {"name": "llama", "model": LLAMA, "num_instances": 1, "pool": "a"},
            {"name": "qwen", "model": QWEN, "num_instances": 1, "pool": "b"},
            {"name": "spare", "model": QWEN, "num_instances": 0},
        ],
        "workload": {"version": "2", "seed": 3, "aggregate_rate": 4, "num_requests": 40,
                     "clients": [{"id": "q", "model": QWEN, "rate_fraction": 1,
                                  "arrival": {"process": "poisson"},
                                  "input_distribution": {"type": "constant",
                                                         "params": {"value": 256}},
                                  "output_distribution": {"type": "constant",
                                                          "params": {"value": 16}}}]},
    }  # fmt: skip
    if autoscaled is not None:
        scenario["autoscaler"] = [
            {"deployment": autoscaled, "signal": "in_flight", "scale_up_threshold": 1000,
             "scale_down_threshold": 0, "min_instances": 0, "max_instances": 1,
             "interval_s": 5}
        ]  # fmt: skip
    return scenario


def _run(scenario: dict, caplog) -> simulator.Result:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="servesim"):
        return simulator.simulate(scenario, warn_unsteady=False)


def _llama_placed_s(result) -> float:
    rows = result.fleet_instances
    return rows[rows.deployment == "llama"].placed_s.iloc[0]


@pytest.mark.parametrize(
    ("llama_gpu", "autoscaled"),
    [
        # qwen's autoscaler manages pool b (H100) only: nothing ever orders an A100 node.
        # Before, any autoscaler silenced the warning for every pool.
        ("A100-80", "qwen"),
        # Same GPU type: qwen's autoscaler still manages only b, where llama (pinned to a)
        # may not go. Before, one autoscaler silenced it, and H100 demand was summed over
        # both pools (2 GPUs needed, b's 2 to start: "fits").
        ("H100", "qwen"),
        # No autoscaler at all, same GPU type: only the per-type sum hid it before.
        ("H100", None),
    ],
)
def test_instances_pinned_to_a_pool_no_autoscaler_manages_are_warned_about(
    llama_gpu, autoscaled, caplog
):
    result = _run(_pinned(llama_gpu, autoscaled), caplog)
    # Pool a is the only A100-80 pool (the pools of that type); of the H100 pools llama may
    # use a alone, so the warning names it.
    named = {"A100-80": "the node pools of that type", "H100": "the node pools they may use ('a')"}
    named = named[llama_gpu]
    assert (
        f"initial instances need 1 {llama_gpu} GPUs, but {named} start with 0 "
        f"(initial_nodes x gpus_per_node) and {NEVER}"
    ) in caplog.text
    # The warning tells the truth: llama's instance is never placed, pool a never gets a node,
    # and qwen's requests are all served (b's instance was placed at the start).
    assert _llama_placed_s(result) != _llama_placed_s(result)  # NaN: never placed
    nodes = result.timeline[result.timeline.kind == "node"]
    assert not nodes.id.str.startswith("a-").any()
    assert result.summary["completed_requests"] == 40


@pytest.mark.parametrize(
    "autoscaled",
    [
        "llama",  # its own autoscaler manages a: the initial instance's node is ordered
        "spare",  # an unpinned H100 deployment's manages every H100 pool, a too
    ],
)
def test_an_autoscaler_managing_the_pool_keeps_it_silent_and_orders_the_node(autoscaled, caplog):
    """A managed pool orders a node for any initial instance that waits for it (a cluster
    autoscaler serves every pending pod of its node group), so nothing is said, and the run
    shows why: llama's instance is placed on a node of a ordered by a scale-up, 4 s (the
    provisioning delay) after the start."""
    result = _run(_pinned("H100", autoscaled), caplog)
    assert NEVER not in caplog.text
    nodes = result.timeline[result.timeline.kind == "node"]
    ordered = nodes[nodes.id.str.startswith("a-") & (nodes.reason == "scale-up")]
    assert len(ordered) >= 1
    assert _llama_placed_s(result) == pytest.approx(4.0)


def test_the_warning_and_the_run_use_one_definition_of_managed_pools():
    """The pools of each case above that an autoscaler manages, by the one function both the
    plan's warning and the run's `Infrastructure.managed_pools` use: the pools the scaled
    deployment may be placed on (its pin, or every pool of its GPU type)."""
    from simulator.cluster import infrastructure
    from simulator.fleet_plan import plan_fleet
    from simulator.scenario import scenario_from_dict

    expected = {("A100-80", "qwen"): {"b"}, ("H100", "qwen"): {"b"}, ("H100", None): set(),
                ("H100", "llama"): {"a"}, ("H100", "spare"): {"a", "b"}}  # fmt: skip
    for (gpu, scaled), pools in expected.items():
        scenario = scenario_from_dict(_pinned(gpu, scaled))
        deployment = simulator.deployment.resolve_deployment(scenario)
        _, plan, _ = plan_fleet(scenario, deployment)
        assert infrastructure.managed_pools(plan) == pools, (gpu, scaled)


# ---------------------------------------------------------------- 2. null `resolved` entries
@pytest.fixture(scope="module")
def saved_small(tmp_path_factory):
    logging.disable(logging.WARNING)
    try:
        result = simulator.simulate(
            SCENARIOS / "quickstart.yaml", warn_unsteady=False, workload__num_requests=20
        )
    finally:
        logging.disable(logging.NOTSET)
    folder = tmp_path_factory.mktemp("small") / "saved"
    save_result(result, folder)
    return folder


@pytest.mark.parametrize(
    ("resolved", "block"),
    [
        (None, {}),
        ({"latency": None}, {}),
        ({"latency": {"latency_model": "physics"}, "latency_by_role": None},
         {"latency_model": "physics"}),
        ({"latency_by_deployment": None}, {}),
        ({"latency_by_deployment": {"x": None}}, {"by_deployment": {"x": {}}}),
    ],
)  # fmt: skip
def test_null_resolved_entries_give_a_latency_block_not_an_attribute_error(
    saved_small, tmp_path, resolved, block
):
    """load_result accepts null entries ("the run did not say"); latency_provenance crashed
    on them (AttributeError: 'NoneType' object has no attribute 'get' / 'items'). Null
    blocks are left out, as the report's readers do."""
    folder = tmp_path / "saved"
    folder.mkdir()
    for f in saved_small.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    doc = json.loads((folder / "summary.json").read_text())
    doc["scenario"]["resolved"] = resolved
    (folder / "summary.json").write_text(json.dumps(doc))
    loaded = load_result(folder)
    assert loaded.latency_provenance == block
    # The report reads the same block: it is written, not a crash.
    write_report(loaded, tmp_path / "r.html")
    assert (tmp_path / "r.html").stat().st_size > 0


def test_latency_provenance_of_no_scenario_is_empty():
    assert latency_provenance(None) == {}
    assert latency_provenance({"resolved": None}) == {}


# ---------------------------------------------------------------- 3. resample's bin bound
def test_a_tiny_bin_s_is_refused_before_allocating():
    """bin_s=1e-9 over a 12.3456 s series asked for 12,345,600,000 bins (~100 GB of float
    arrays); now a ConfigError naming bin_s and the smallest allowed width, with no real
    allocation (peak < 4 MB)."""
    times, values = [0.0, 1.0, 12.3456], [1.0, 2.0, 3.0]
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as err:
            plots.resample(times, values, 1e-9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000
    # 12.3456 s / 100,000 bins = 1.23456e-4 s, rounded up at 3 digits: 0.000124.
    assert str(err.value) == (
        "resample: invalid value bin_s=1e-09; this series of 12.3456 s would need "
        "12,345,600,000 bins, at most 100,000 are made: give bin_s >= 0.000124"
    )
    # The width it names is accepted (99,562 = ceil(12.3456 / 0.000124) bins) and the one
    # just below it, 0.000123 (100,371 bins), is not.
    assert len(plots.resample(times, values, 0.000124).mean) == 99_562
    with pytest.raises(ConfigError, match="give bin_s >= 0.000124"):
        plots.resample(times, values, 0.000123)
    # Exactly MAX_POINTS bins is fine (5 s / 5e-5 s = 100,000, float rounding aside).
    assert len(plots.resample([0.0, 5.0], [1.0, 1.0], 5.0 / plots.MAX_POINTS).mean) == 100_000
    # A huge end_s is the same bound; an infinite one says so instead of "bin_s >= inf".
    with pytest.raises(ConfigError, match=r"bin_s=1.*give bin_s >= 10"):
        plots.resample(times, values, 1, end_s=1e6)
    with pytest.raises(ConfigError, match="end must be finite"):
        plots.resample(times, values, 1, end_s=float("inf"))


def test_throughput_shares_the_bound(saved_small):
    """throughput's explicit bin_s goes through the same check (its own limit)."""
    loaded = load_result(saved_small)
    with pytest.raises(ConfigError, match=r"^throughput: invalid value bin_s=1e-09; this run"):
        plots.throughput(loaded, bin_s=1e-9)
