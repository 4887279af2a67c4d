"""A finished `Result` holds data, never the run's live objects (docs/architecture.md, "A
finished Result holds no live engine"; docs/python.md): the engines leave records, a PD run's
flow a `PDRecord` and a changing fleet a `FleetRecord`.

Laws, on a single instance, a cluster, a PD cluster, an autoscaled fleet and a multi-model
fleet (the shipped scenarios, shortened):
- nothing reachable from the result (following `gc.get_referents`, not into modules or
  classes) is an engine, an instance, a router, a disaggregator, an infrastructure, a link, a
  SimPy environment, event, process or resource, or a generator (a SimPy process body);
- a request object reachable from it is one the run keeps by design: unfinished when the run
  stopped at its horizon, or a sub-request of such a parent; a run that finishes every
  request keeps none;
- once the run's other references are dropped, no engine or instance is left alive;
- every view still works: the tables, the PD and fleet views, the report text, the results
  document, the HTML report, and a saved result that loads back.

The PD link's record gives the live link's figures exactly (lone transfer time, the
time-weighted concurrency up to any time), including transfers still on the link at a
horizon. `simulate(..., end_checks=True)` checks the live engines' own laws at the end, since
the result cannot.
"""

from __future__ import annotations

import gc
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import simpy

import simulator
from simulator import invariants
from simulator.cluster import cluster as cluster_module
from simulator.cluster import pd as pd_module  # PD runs import it when they build one
from simulator.cluster.infrastructure import Infrastructure
from simulator.cluster.kv_transfer import KVTransferLink
from simulator.cluster.pd import Disaggregator
from simulator.cluster.router import Router
from simulator.engine.batching import VLLMEngine
from simulator.engine.instance import Instance
from simulator.engine.request import Request
from simulator.metrics.fleet_record import FleetRecord
from simulator.metrics.pd_record import PDRecord

ROOT = Path(__file__).resolve().parents[2]
LLAMA = "meta-llama/llama-3.1-8b-instruct"

LIVE_TYPES = (
    VLLMEngine,
    Instance,
    Router,
    Disaggregator,
    Infrastructure,
    KVTransferLink,
    simpy.Environment,
    simpy.Event,
    simpy.resources.base.BaseResource,
    types.GeneratorType,
)
# A result of these small runs reaches a few thousand objects; far more means it reaches
# something it should not.
MAX_REACHABLE = 200_000


def _single(num_requests: int = 40) -> dict:
    return {
        "model": LLAMA,
        "hardware": "H100",
        "workload": {
            "rate": 20,
            "num_requests": num_requests,
            "prompt_tokens": {"distribution": "constant", "value": 256},
            "output_tokens": {"distribution": "constant", "value": 16},
        },
    }


def _cluster() -> dict:
    scenario = _single(60)
    scenario["cluster"] = {
        "num_instances": 3,
        "routing": {
            "policy": "weighted",
            "scorers": "prefix-affinity:2,queue-depth:1",
            "cache_signal_delay_us": 1000,
        },
    }
    return scenario


RUNS = {
    "single": (_single(), {}),
    "cluster": (_cluster(), {}),
    "pd_2p2d": (ROOT / "scenarios/pd_2p2d.yaml", {"workload__num_requests": 80}),
    "pd_2p2d_cut": (
        ROOT / "scenarios/pd_2p2d.yaml",
        {"workload__num_requests": 80, "horizon_us": 3_000_000},
    ),
    "autoscale_spike": (ROOT / "scenarios/autoscale_spike.yaml", {"workload__num_requests": 3000}),
    "multi_model": (ROOT / "scenarios/multi_model.yaml", {"workload__num_requests": 300}),
}


def _reachable(root: object) -> list[object]:
    """Every object reachable from `root`, not following modules, classes or a module's
    namespace (a function's globals), which lead to the whole interpreter."""
    namespaces = {id(vars(m)) for m in list(sys.modules.values()) if m is not None}
    seen = {id(root)}
    stack = [root]
    found = []
    while stack:
        obj = stack.pop()
        found.append(obj)
        assert len(found) <= MAX_REACHABLE, "the result reaches far more than its data"
        if isinstance(obj, type | types.ModuleType) or id(obj) in namespaces:
            continue
        for ref in gc.get_referents(obj):
            if id(ref) not in seen:
                seen.add(id(ref))
                stack.append(ref)
    return found


def _alive(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


def _kept_by_design(req: Request) -> bool:
    """A request object a result keeps: unfinished at the horizon, or a sub-request of a
    parent that is."""
    return not req.is_finished or (req.parent is not None and not req.parent.is_finished)


@pytest.mark.parametrize("name", RUNS)
def test_a_result_reaches_no_live_object_of_its_run(name):
    scenario, overrides = RUNS[name]
    engines_before, instances_before = _alive(VLLMEngine), _alive(Instance)
    result = simulator.simulate(scenario, warn_unsteady=False, **overrides)
    gc.collect()
    reached = _reachable(result)
    live = sorted({type(o).__name__ for o in reached if isinstance(o, LIVE_TYPES)})
    assert not live, f"the result reaches live objects of its run: {live}"
    requests = [o for o in reached if isinstance(o, Request)]
    assert all(_kept_by_design(r) for r in requests)
    if result.horizon_us is None or all(r.is_finished for r in result.request_records):
        assert not requests
    # Dropping everything but the result frees the run.
    assert _alive(VLLMEngine) <= engines_before
    assert _alive(Instance) <= instances_before
    if name.startswith("pd"):
        assert isinstance(result.pd, PDRecord)
    if name in ("autoscale_spike", "multi_model"):
        assert isinstance(result.infrastructure, FleetRecord)


def test_a_horizon_cut_pd_run_keeps_its_unfinished_parents():
    scenario, overrides = RUNS["pd_2p2d_cut"]
    result = simulator.simulate(scenario, warn_unsteady=False, **overrides)
    unfinished = [p for p in result.pd.parents if not p.is_finished]
    assert unfinished and all(isinstance(p, Request) for p in unfinished)


@pytest.mark.parametrize("name", RUNS)
def test_every_view_of_a_result_still_works(name, tmp_path):
    scenario, overrides = RUNS[name]
    result = simulator.simulate(scenario, warn_unsteady=False, **overrides)
    assert len(result.requests) == len(result.request_records) > 0
    assert len(result.steps) > 0
    assert len(result.instances) == len(result.instance_ids)
    pd_run, fleet_run = result.pd is not None, result.infrastructure is not None
    assert (len(result.transfers) > 0) == pd_run
    assert (result.pd_metrics is not None) == pd_run
    if pd_run:
        assert result.pd_metrics["transfers"] == len(result.transfers)
        assert result.pd.link.initiated >= len(result.pd.link.records) == len(result.transfers)
    assert (len(result.timeline) > 0) == fleet_run
    assert (len(result.nodes) > 0) == fleet_run
    assert (len(result.fleet_instances) > 0) == fleet_run
    assert (result.fleet_metrics is not None) == fleet_run
    if fleet_run:
        created = result.fleet_metrics["instances_created"]
        assert created == len(result.fleet_instances)
        for node in result.infrastructure.nodes:
            assert node.free_gpus == node.free_gpus_recorded
    text = result.report_text()
    assert ("PD Metrics" in text) == pd_run
    document = result.results_document()
    assert ("pd" in document) == pd_run
    saved = simulator.load_result(result.save(tmp_path / "saved"))
    assert saved.summary == result.summary
    for frame in ("requests", "transfers", "timeline", "nodes", "fleet_instances"):
        assert len(getattr(saved, frame)) == len(getattr(result, frame)), frame
    assert saved.pd_metrics == result.pd_metrics
    assert saved.fleet_metrics == result.fleet_metrics
    assert result.report(tmp_path / "report.html").stat().st_size > 0


def _run_keeping_the_link(scenario, **overrides):
    """The run's result and its live link (the test keeps the disaggregator alive)."""
    built: list[Disaggregator] = []
    original = pd_module.Disaggregator

    def capture(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    with mock.patch.object(pd_module, "Disaggregator", side_effect=capture):
        result = simulator.simulate(scenario, warn_unsteady=False, **overrides)
    return result, built[0].link


@pytest.mark.parametrize("horizon_us", [None, 2_000_000, 3_000_000, 5_000_000])
def test_the_link_record_gives_the_live_links_figures(horizon_us):
    result, link = _run_keeping_the_link(
        ROOT / "scenarios/pd_2p2d.yaml", workload__num_requests=80, horizon_us=horizon_us
    )
    record = result.pd.link
    assert record.records is link.records and record.initiated == link.initiated
    assert record.peak_concurrency == link.peak_concurrency
    assert record.mean_concurrency_at_start == link.mean_concurrency_at_start
    assert len(record.open_transfers) == len(link._on_link) + len(link._due)
    end_us = result.run_end_us
    for until_us in (0, 1, end_us // 3, end_us, end_us + 1, 2 * end_us + 7):
        figure = record.time_weighted_mean_concurrency(until_us)
        assert figure == link.time_weighted_mean_concurrency(until_us), until_us
    for size in (0, 1, 999.5, 131_072, 2**31, 3.7e9):
        assert record.lone_duration_us(size) == link.lone_duration_us(size), size


def test_some_horizon_leaves_a_transfer_on_the_link():
    """The cases above cover unfinished transfers: at some horizon one was on the link."""
    opened = 0
    for horizon_us in (2_000_000, 3_000_000, 5_000_000):
        result = simulator.simulate(
            ROOT / "scenarios/pd_2p2d.yaml",
            warn_unsteady=False,
            workload__num_requests=80,
            horizon_us=horizon_us,
        )
        opened += len(result.pd.link.open_transfers)
    assert opened > 0


@pytest.mark.parametrize("end_checks", [False, True])
def test_end_checks_check_the_live_engines_without_per_step_checks(monkeypatch, end_checks):
    """The result keeps no engine, so only the run can check the engines' own laws (KV
    blocks): `end_checks` does so once, at the end, and leaves the per-request and per-step
    checks of `check_invariants` off."""
    monkeypatch.setenv(invariants.ENVIRONMENT_SWITCH, "0")
    checked: list[type] = []
    real_check_engine = invariants.check_engine

    def check_engine(engine, instance_id, end_us):
        checked.append(type(engine))
        real_check_engine(engine, instance_id, end_us)

    finished: list[object] = []
    monkeypatch.setattr(invariants, "check_engine", check_engine)
    monkeypatch.setattr(cluster_module, "check_finished", lambda *args: finished.append(args))
    simulator.simulate(_cluster(), warn_unsteady=False, end_checks=end_checks)
    assert checked == ([VLLMEngine] * 3 if end_checks else [])
    assert not finished
