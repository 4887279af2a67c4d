"""QA round 9: reports, saved folders and plots.

Each test states the law it checks; pinned numbers carry their hand computation."""

from __future__ import annotations

import copy
import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.errors import ConfigError
from simulator.metrics import plots
from simulator.metrics.persistence import DOCUMENT_SHAPE, load_result, save_result
from simulator.report import write_report
from simulator.report.build import render_plan, report_data
from simulator.report.run_data import run_data

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"

# Two round-robin instances, every second request a long one that times out (1 s client
# timeout, 1000 output tokens at ~6 ms each): instance_0 gets every long request, instance_1
# every short one, so the routed counts are even and the completed ones are not.
SKEW = {
    "name": "skew",
    "seed": 1,
    "model": "meta-llama/llama-3.1-8b-instruct",
    "hardware": "H100",
    "cluster": {"num_instances": 2, "routing": {"policy": "round-robin"}},
    "workload": {
        "version": "2",
        "aggregate_rate": 20,
        "num_requests": 40,
        "clients": [
            {
                "id": "a",
                "rate_fraction": 0.5,
                "timeout": 1_000_000,
                "arrival": {"process": "constant"},
                "input_distribution": {"type": "constant", "params": {"value": 256}},
                "output_distribution": {"type": "constant", "params": {"value": 1000}},
            },
            {
                "id": "b",
                "rate_fraction": 0.5,
                "arrival": {"process": "constant"},
                "input_distribution": {"type": "constant", "params": {"value": 256}},
                "output_distribution": {"type": "constant", "params": {"value": 10}},
            },
        ],
    },
}


def _sim(scenario, **overrides):
    import logging

    logging.disable(logging.WARNING)
    try:
        return simulator.simulate(scenario, warn_unsteady=False, **overrides)
    finally:
        logging.disable(logging.NOTSET)


@pytest.fixture(scope="module")
def skew():
    return _sim(copy.deepcopy(SKEW))


@pytest.fixture(scope="module")
def multi_model():
    return _sim(SCENARIOS / "multi_model.yaml", workload__num_requests=200)


@pytest.fixture(scope="module")
def rejected():
    return _sim(
        SCENARIOS / "quickstart.yaml",
        workload__num_requests=20,
        cluster__admission__policy="reject-all",
    )


@pytest.fixture(scope="module")
def small():
    return _sim(SCENARIOS / "quickstart.yaml", workload__num_requests=20)


def _cli(*args):
    from typer.testing import CliRunner

    from simulator.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


# --- 1. routed counts of a results JSON -------------------------------------------------------


def test_document_routed_counts_are_the_live_ones(skew):
    """Law: a results JSON's per-instance routed counts (from each request's handled_by,
    completed or not) equal the live run's router counts, so Jain's index agrees. Hand: 40
    requests round-robin on 2 instances -> routed 20 / 20, Jain = 40² / (2 · (20² + 20²)) = 1;
    the completed counts 0 / 20 would give 20² / (2 · 20²) = 0.5, the bug's figure."""
    live = run_data(skew)["balance"]
    doc = report_data(skew.results_document())["balance"]
    live_routed = {r["instance_id"]: r["routed"] for r in live["instances"]}
    doc_routed = {r["instance_id"]: r["routed"] for r in doc["instances"]}
    assert doc_routed == live_routed == {"instance_0": 20, "instance_1": 20}
    completed = {r["instance_id"]: r["completed"] for r in doc["instances"]}
    assert completed == {"instance_0": 0, "instance_1": 20}
    assert live["jain_fairness_routed"] == doc["jain_fairness_routed"] == 1.0
    # Every request that reached an instance is routed somewhere, completed or not.
    assert sum(doc_routed.values()) == skew.summary["injected_requests"]


def test_document_without_routed_counts_judges_none(skew):
    """Law: completed counts are never labelled routed: a document whose instances cannot be
    counted (a PD run: handled_by names only the last of two instances) has no routed column
    and no fairness index."""
    doc = skew.results_document()
    doc["pd"] = {"disaggregated_requests": 0}
    bal = report_data(doc)["balance"]
    assert all("routed" not in r for r in bal["instances"])
    assert "jain_fairness_routed" not in bal


# --- 2. per-model table of a results JSON -----------------------------------------------------


def test_document_report_has_the_per_model_table(multi_model):
    """Law: the per-model table is the same from a live run and from its results JSON."""
    live = run_data(multi_model)["balance"]["per_model"]
    doc = report_data(multi_model.results_document())["balance"]["per_model"]
    assert [r["model"] for r in doc] == [r["model"] for r in live]
    assert [r["requests"] for r in doc] == [r["requests"] for r in live]
    assert sum(r["requests"] for r in doc) == 200


# --- 3. edited results JSON and saved folders -------------------------------------------------


@pytest.mark.parametrize("value", [5, [1], "x"])
def test_document_non_mapping_per_slo_class_is_one_error(skew, value):
    doc = skew.results_document()
    doc["per_slo_class"] = value
    with pytest.raises(ConfigError, match="per_slo_class: invalid value"):
        report_data(doc)
    doc["per_slo_class"] = {"gold": value}
    with pytest.raises(ConfigError, match=r"per_slo_class\.gold: invalid value"):
        report_data(doc)


@pytest.mark.parametrize(("key", "value"), [("per_model", 5), ("instances", {"a": 1})])
def test_document_non_list_rows_are_one_error(skew, key, value):
    doc = skew.results_document()
    doc[key] = value
    with pytest.raises(ConfigError, match=f"{key}: invalid value"):
        report_data(doc)
    doc[key] = [7]
    with pytest.raises(ConfigError, match=rf"{key}\[0\]: invalid value"):
        report_data(doc)


def _shape_paths(shape, prefix=()):
    """Every entry DOCUMENT_SHAPE names, as a key path (each's items under a made-up name)."""
    if isinstance(shape, dict):
        for name, inner in shape.items():
            yield (*prefix, name)
            yield from _shape_paths(inner, (*prefix, name))
    elif isinstance(shape, tuple) and shape[0] == "each":
        yield (*prefix, "x")
        yield from _shape_paths(shape[1], (*prefix, "x"))


def _set(doc, path, value):
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


@pytest.fixture(scope="module")
def saved_mm(multi_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("mm") / "saved"
    save_result(multi_model, folder)
    return folder


def test_every_nested_entry_readers_use_is_checked(saved_mm, tmp_path):
    """Law: each entry of summary.json the readers look into (DOCUMENT_SHAPE, at any depth),
    replaced by a number of no such kind, is one ConfigError naming that entry; the folder as
    saved loads."""
    load_result(saved_mm)
    original = json.loads((saved_mm / "summary.json").read_text())
    paths = list(_shape_paths(DOCUMENT_SHAPE))
    assert ("scenario", "resolved") in paths and ("per_slo", "x") in paths
    for path in paths:
        folder = tmp_path / "_".join(path)
        folder.mkdir()
        for f in saved_mm.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        doc = copy.deepcopy(original)
        # 1.5 is no mapping, list, string or whole number: wrong for every shape.
        _set(doc, path, 1.5)
        (folder / "summary.json").write_text(json.dumps(doc))
        where = ".".join(path)
        with pytest.raises(ConfigError, match=f"'{where}' must be"):
            load_result(folder)


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("scenario", "resolved"), 5, "scenario.resolved"),
        (("scenario", "resolved", "roles"), [1, 2, 3], "scenario.resolved.roles[0]"),
        (("scenario", "deployments"), [5], "scenario.deployments[0]"),
        (("scenario", "resolved", "total_kv_blocks"), "many", "scenario.resolved.total_kv_blocks"),
    ],
)
def test_changed_saved_folder_fails_report_and_plot_with_exit_2(
    saved_mm, tmp_path, path, value, where
):
    """The QA repro (scenario.resolved = 5 crashed `plot` and `report` with AttributeError):
    exit 2, one error line naming the entry, no output written."""
    folder = tmp_path / "saved"
    folder.mkdir()
    for f in saved_mm.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    doc = json.loads((folder / "summary.json").read_text())
    _set(doc, path, value)
    (folder / "summary.json").write_text(json.dumps(doc))
    for args in (("report", folder, "-o", tmp_path / "r.html"), ("plot", folder)):
        done = _cli(*args)
        assert done.exit_code == 2, done.output
        assert "Traceback" not in done.stderr
        assert f"'{where}' must be" in done.stderr
    assert not (tmp_path / "r.html").exists()
    assert not list(folder.glob("*.png"))


# --- 4. empty output paths --------------------------------------------------------------------


def test_save_to_empty_path_is_refused_and_the_cwd_kept(small, tmp_path, monkeypatch):
    """`Result.save("")` renamed the current working folder away; now a ConfigError, and the
    working folder keeps its inode and its files."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("keep")
    monkeypatch.chdir(work)
    inode = os.stat(".").st_ino
    for call in (lambda: small.save(""), lambda: save_result(small, "")):
        with pytest.raises(ConfigError, match=r"save_result: directory: invalid path ''"):
            call()
    # "." (and a folder holding the cwd) would be renamed away the same way.
    for name in (".", "..", str(work)):
        with pytest.raises(ConfigError, match="current working folder"):
            save_result(small, name)
    assert os.stat(".").st_ino == inode == os.stat(work).st_ino
    assert sorted(os.listdir(".")) == ["mine.txt"]
    # A subfolder is fine.
    assert save_result(small, "sub") == Path("sub")
    assert (work / "sub" / "summary.json").is_file()


def test_write_plots_and_report_refuse_empty_path(small, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"write_plots: directory: invalid path ''"):
        plots.write_plots(small, "")
    with pytest.raises(ConfigError, match=r"report: path: invalid path ''"):
        small.report("")
    with pytest.raises(ConfigError, match=r"report: path: invalid path ''"):
        write_report(small, "")
    assert os.listdir(tmp_path) == []


# --- 5. max_points bound ----------------------------------------------------------------------


def test_huge_max_points_is_refused_before_allocating(small):
    """max_points=10**9 was OOM-killed at ~22 GB; now a ConfigError naming max_points and the
    maximum, with no real allocation (peak < 20 MB, where 10**9 float bins are 8 GB)."""
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"max_points: invalid value 1000000000.*100,000"):
            plots.instance_timelines(small, max_points=10**9)
        with pytest.raises(ConfigError, match="max_points"):
            small.plot.instance_timelines(max_points=plots.MAX_POINTS + 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000
    assert plots.choose_bin_s(1.0, plots.MAX_POINTS) == pytest.approx(1e-5)


# --- 6. non-path report outputs ---------------------------------------------------------------


@pytest.mark.parametrize("path", [5, None, 2.5])
def test_report_writers_refuse_non_paths(small, saved_mm, path):
    for call in (
        lambda: small.report(path),
        lambda: write_report(load_result(saved_mm), path),
    ):
        with pytest.raises(ConfigError, match="report: path: expected a path"):
            call()


def test_sweep_report_refuses_non_path(tmp_path):
    base = SCENARIOS / "quickstart.yaml"
    sweep = simulator.sweep(base, {"workload.num_requests": [10]}, seeds=[1], workers=1)
    with pytest.raises(ConfigError, match="report: path: expected a path"):
        sweep.report(5)


# --- 7. no engine step ------------------------------------------------------------------------


def test_run_without_steps_says_no_engine_step_ran(rejected, tmp_path):
    """A live run or saved folder has a step log; an empty one means no engine stepped (all
    20 requests rejected), not "a results JSON has per-request rows only"."""
    folder = tmp_path / "saved"
    rejected.save(folder)
    for src in (rejected, load_result(folder)):
        assert run_data(src)["notes"]["timeseries"].startswith("no engine step ran")
    assert "results JSON" in report_data(rejected.results_document())["notes"]["timeseries"]


# --- 8. per-deployment scenario figures -------------------------------------------------------


def test_multi_model_scenario_rows_are_per_deployment(multi_model, saved_mm):
    """scenarios/multi_model.yaml: llama TP 1 x2 and qwen TP 2 x1 on H100. Each deployment's
    row carries its own layout and KV blocks (its engines': 29,205 for llama, 46,386 for
    qwen), and no top-level TP/KV row applies the first deployment's to every instance."""
    caps = plots.instance_capacities(multi_model).set_index("instance_id")["kv_blocks"]
    fleet = multi_model.fleet_instances.set_index("instance_id")["deployment"]
    expected = {d: sorted({int(caps[i]) for i in fleet.index[fleet == d]}) for d in set(fleet)}
    assert expected == {"llama": [29_205], "qwen": [46_386]}
    for src in (multi_model, load_result(saved_mm)):
        rows = dict(run_data(src)["scenario"])
        assert "tensor parallel (TP)" not in rows
        assert "KV cache per instance" not in rows
        assert "parallel layout per instance" not in rows
        assert "TP 2 × PP 1 × DP 1 × EP 1 (2 GPU(s))" in rows["deployment qwen"]
        assert "KV cache 46,386 blocks" in rows["deployment qwen"]
        assert "TP 1 × PP 1 × DP 1 × EP 1 (1 GPU(s))" in rows["deployment llama"]
        assert "KV cache 29,205 blocks" in rows["deployment llama"]


# --- 9. saved steady-state of a run with no requests ------------------------------------------


def test_saved_empty_run_keeps_its_steady_state_reasons(tmp_path):
    """Law: a saved folder's report shows the run's own verdict with its reasons and evidence
    (also for a run in which no request arrived), as the live report does."""
    empty = _sim(SCENARIOS / "quickstart.yaml", horizon_us=1000)
    assert len(empty.requests) == 0
    folder = tmp_path / "empty"
    empty.save(folder)
    live = run_data(empty)["steady"]
    saved = run_data(load_result(folder))["steady"]
    assert live is not None and live["reasons"]
    assert saved == live


# --- 10. plan with no GPU planned -------------------------------------------------------------


def _plan(not_planned):
    from simulator.plan import PlanResult

    return PlanResult(
        frontier=pd.DataFrame(),
        per_gpu=pd.DataFrame(
            {
                "gpu": ["H100", "A100-80"],
                "tp": [1, 1],
                "usd_per_gpu_hour": [3.0, 2.0],
                "planned": [g not in not_planned for g in ("H100", "A100-80")],
                "feasible": [False, False],
                "instances": [np.nan, np.nan],
                "layout": ["TP 1", "TP 1"],
                "total_gpus": [np.nan, np.nan],
                "cost_per_hour_usd": [np.nan, np.nan],
            }
        ),
        best=None,
        slos={"ttft_p99_ms": 500.0},
        min_goodput=None,
        seeds=[1],
        max_instances=8,
        not_planned=not_planned,
    )


def test_plan_page_says_no_gpu_could_be_planned():
    why = "the model does not fit"
    page = render_plan(report_data(_plan({"H100": why, "A100-80": why})))
    assert "no GPU could be planned (H100, A100-80), nothing was simulated: " + why in page
    assert "meets the SLOs" not in page
    page = render_plan(report_data(_plan({"H100": why})))
    assert "no GPU meets the SLOs with ≤ 8 instances (H100 not planned" in page


# --- 11. offered and rejected requests in the Overview ----------------------------------------


def test_overview_shows_offered_and_rejected(rejected, small):
    """20 offered, all rejected at admission: the card read "0 / 0 completed / injected"."""
    assert rejected.summary["offered_requests"] == 20
    assert rejected.summary["injected_requests"] == 0
    for source in (rejected, rejected.results_document()):
        page = write_html(source)
        assert "completed / injected; 20 offered, 20 rejected" in page
    # When everything offered was injected the card says nothing more.
    assert "offered" not in _requests_card(write_html(small))


def write_html(source):
    from simulator.report.build import render_report

    return render_report(source)


def _requests_card(page):
    start = page.index("completed / injected")
    return page[start : start + 60]


def test_document_scenario_section_has_the_latency_model(skew):
    """docs/report.md: a results JSON's Scenario section has what the file keeps (the latency
    model and the instance count), not "no scenario section"."""
    rows = dict(report_data(skew.results_document())["scenario"])
    assert rows["latency model"] == "physics"
    assert rows["instances (data-parallel replicas)"] == 2
