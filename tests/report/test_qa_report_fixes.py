"""Defects QA found in the report and in saving a result (docs/report.md, docs/python.md):
null per-request numbers in a results JSON, the per-class SLO table of a saved folder, the
over-time bin count, files kept when a result is saved again, the batch-size wording."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import simulator
from simulator.cli import app
from simulator.errors import OutputError
from simulator.metrics import persistence
from simulator.metrics.persistence import load_result, save_result
from simulator.report import write_report
from simulator.report.build import report_data
from simulator.report.run_data import time_series
from simulator.report.run_source import RequestColumns, RunSource
from tests.report.helpers import embedded

ROOT = Path(__file__).resolve().parents[2]
REPORT_DOC = ROOT / "docs" / "report.md"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


# --- 1. a results JSON with a missing or null per-request number ------------------------------


@pytest.fixture(scope="module")
def results_doc(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("doc") / "r.json"
    done = invoke("run", "--num-requests", 20, "--rate", 5, "--results-path", path, "--quiet")
    assert done.exit_code == 0, done.output
    return json.loads(path.read_text())


def _set_null(field):
    return lambda record: record.update({field: None})


def _drop(field):
    return lambda record: record.pop(field)


@pytest.mark.parametrize(
    "edit, needle",
    [
        # Cast from NaN to int64: an E2E mean of -4.6e13 ms on the page, with exit status 0.
        (_set_null("e2e_ms"), "requests[0].e2e_ms: invalid value None; must be a number from 0"),
        # Silently one request fewer in the TTFT distribution.
        (_set_null("arrived_at"), "requests[0].arrived_at: invalid value None; must be a number"),
        # Read as an arrival at t = 0.
        (_drop("arrived_at"), "requests[0].arrived_at: missing; must be a number from 0 to"),
        (_set_null("ttft_ms"), "requests[0].ttft_ms: invalid value None"),
        (_set_null("itl_ms"), "requests[0].itl_ms: invalid value None"),
        (_drop("num_decode_tokens"), "requests[0].num_decode_tokens: missing"),
        (_drop("scheduling_delay_ms"), "requests[0].scheduling_delay_ms: missing"),
    ],
    ids=[
        "null-e2e",
        "null-arrival",
        "no-arrival",
        "null-ttft",
        "null-itl",
        "no-tokens",
        "no-delay",
    ],
)
def test_a_missing_or_null_request_number_is_one_error(tmp_path, results_doc, edit, needle):
    doc = json.loads(json.dumps(results_doc))
    edit(doc["requests"][0])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    done = invoke("report", path, "-o", tmp_path / "bad.html")
    assert done.exit_code == 2, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert "Warning" not in done.stderr
    assert not (tmp_path / "bad.html").exists()


def test_a_results_document_given_in_python_is_checked_as_a_file_is(tmp_path, results_doc):
    """`write_report(doc, path)` on a document read in a notebook went straight to the page
    and read a missing arrival as 0."""
    from simulator.errors import ConfigError

    doc = json.loads(json.dumps(results_doc))
    doc["requests"][0].pop("arrived_at")
    with pytest.raises(ConfigError, match=r"^report: the results document: requests\[0\]"):
        write_report(doc, tmp_path / "bad.html")
    assert not (tmp_path / "bad.html").exists()
    with pytest.raises(ConfigError, match="is not a results file"):
        report_data({"requests": []})
    assert report_data(json.loads(json.dumps(results_doc)))["kind"] == "run"


def test_a_results_file_with_unfinished_requests_still_reports(tmp_path):
    """What a valid file holds for a request cut by the horizon (zeros, never null) draws."""
    path = tmp_path / "r.json"
    done = invoke(
        "run", "--num-requests", 200, "--rate", 50, "--horizon", 1_000_000, "--results-path",
        path, "--quiet",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    doc = json.loads(path.read_text())
    assert any(r["state"] != "completed" for r in doc["requests"])
    done = invoke("report", path, "-o", tmp_path / "r.html")
    assert done.exit_code == 0, done.output


# --- 2. a saved folder's per-class SLO attainment ---------------------------------------------

CLASSES = {
    "seed": 3,
    "slo": {
        "ttft_ms": 100,
        "e2e_ms": 2500,
        "classes": {"batch": {"e2e_ms": 1800, "ttft_ms": None}, "critical": {"itl_ms": 5}},
    },
    "workload": {
        "version": "2",
        "aggregate_rate": 40,
        "num_requests": 120,
        "clients": [
            {
                "id": name,
                "slo_class": name,
                "rate_fraction": 1,
                "arrival": {"process": "poisson"},
                "input_distribution": {
                    "type": "gaussian",
                    "params": {"mean": 512, "std_dev": 128, "min": 16, "max": 2048},
                },
                "output_distribution": {
                    "type": "gaussian",
                    "params": {"mean": 200, "std_dev": 50, "min": 1, "max": 1024},
                },
            }
            for name in ("critical", "batch")
        ],
    },
}


@pytest.fixture(scope="module")
def classes_run():
    return simulator.simulate(CLASSES)


def test_a_saved_folder_reports_the_slo_per_class(tmp_path, classes_run):
    live = classes_run
    assert len(live.slo["per_class"]) == 2
    folder = live.save(tmp_path / "saved")
    done = invoke("report", folder)
    assert done.exit_code == 0, done.output
    page = (folder / "report.html").read_text()
    data = embedded(page, "servesim-data")
    assert data["slo"] == json.loads(json.dumps(live.slo))
    assert data["slo"]["met_requests"] is not None
    assert "SLO attainment per class" in page
    assert report_data(load_result(folder))["slo"] == report_data(live)["slo"]


def test_a_folder_saved_without_an_slo_report_falls_back_to_the_summary(tmp_path, classes_run):
    """A folder from before 2026-12-07 has no `slo`: the summary's figures, as before."""
    live = classes_run
    folder = live.save(tmp_path / "old")
    doc = json.loads((folder / "summary.json").read_text())
    del doc["slo"]
    (folder / "summary.json").write_text(json.dumps(doc))
    slo = report_data(load_result(folder))["slo"]
    assert slo["slo_attainment"] == live.summary["slo_attainment"]
    assert "per_class" not in slo


def _edit_slo(change):
    def edit(doc: dict) -> None:
        change(doc["slo"])

    return edit


SLO_EDITS = [
    (_edit_slo(lambda s: s.update(per_class=5)), "slo.per_class: invalid value 5; must be a map"),
    (
        _edit_slo(lambda s: s["per_class"].update(batch=[1])),
        "slo.per_class.batch: invalid value [1]; must be a mapping",
    ),
    (
        _edit_slo(lambda s: s["per_class"]["batch"].update(targets="fast")),
        "slo.per_class.batch.targets: invalid value 'fast'; must be a mapping",
    ),
    (
        _edit_slo(lambda s: s["targets"].update(ttft_ms="100")),
        "slo.targets.ttft_ms: invalid value '100'; must be a number >= 0 or null",
    ),
    (
        _edit_slo(lambda s: s.update(slo_attainment=-1)),
        "slo.slo_attainment: invalid value -1; must be a number >= 0 or null",
    ),
]


@pytest.fixture(scope="module")
def classes_saved(tmp_path_factory, classes_run):
    return classes_run.save(tmp_path_factory.mktemp("classes") / "saved")


@pytest.mark.parametrize("edit, needle", SLO_EDITS)
def test_an_edited_slo_report_in_a_saved_folder_is_one_error(tmp_path, classes_saved, edit, needle):
    """The saved SLO report is drawn now, so an edit of it must not end in a traceback."""
    import shutil

    folder = tmp_path / "saved"
    shutil.copytree(classes_saved, folder)
    doc = json.loads((folder / "summary.json").read_text())
    edit(doc)
    (folder / "summary.json").write_text(json.dumps(doc))
    done = invoke("report", folder)
    assert done.exit_code == 2, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert "summary.json" in lines[0]
    assert not (folder / "report.html").exists()


@pytest.mark.parametrize("edit, needle", SLO_EDITS)
def test_an_edited_slo_report_in_a_results_file_is_one_error(tmp_path, classes_run, edit, needle):
    path = tmp_path / "r.json"
    doc = json.loads(json.dumps(classes_run.results_document()))
    edit(doc)
    path.write_text(json.dumps(doc))
    done = invoke("report", path, "-o", tmp_path / "r.html")
    assert done.exit_code == 2, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not (tmp_path / "r.html").exists()


# --- 3. the over-time bins --------------------------------------------------------------------


def _completions(n: int, end_s: float) -> RunSource:
    """`n` completed requests, the last at `end_s`, without a step log."""
    done = np.rint(np.linspace(end_s / n, end_s, n) * 1e6).astype(np.int64)
    requests = RequestColumns(
        arrival_us=np.zeros(n, dtype=np.int64),
        first_token_us=done // 2,
        completion_us=done,
        generated_tokens=np.full(n, 10),
        state=np.full(n, "completed", object),
        instance_id=np.full(n, "instance_0", object),
        slo_class=np.full(n, "", object),
        tpot_ms=np.full(n, 5.0),
    )
    return RunSource("document", {}, {}, requests)


@pytest.mark.parametrize(
    "n, end_s, bins, bin_s",
    [
        (300, 18.0, 18, 1.0),  # the doc's example: an aim of 30 bins
        (26, 48.1, 10, 5.0),  # the fewest: an aim of 24, 2 s widths give 25, 5 s ones 10
        (5000, 3600.0, 180, 20.0),  # an aim of 240 (capped): 15 s is not nice, 20 s is
    ],
)
def test_the_bin_count_is_what_the_doc_says(n, end_s, bins, bin_s):
    ts = time_series(_completions(n, end_s))
    assert (len(ts["t_s"]), ts["bin_s"]) == (bins, bin_s)
    assert ts["completed_in_bins"] == n


def test_the_doc_states_the_bin_rule_the_code_follows():
    """The doc promised "24 to 240 bins"; a run of 300 completions got 18."""
    text = " ".join(REPORT_DOC.read_text().split())
    assert "24 to 240 bins" not in text
    assert "10 to 240 bins" in text and "18 bins of 1 s" in text
    counts = []
    for n in (1, 26, 239, 300, 2400, 5000, 100_000):
        aim = min(max(n // 10, 24), 240)
        for end_s in np.geomspace(0.01, 100_000, 97):
            got = len(time_series(_completions(n, float(end_s)))["t_s"])
            assert math.ceil(0.4 * aim) <= got <= aim, (n, end_s, got)
            counts.append(got)
    assert min(counts) == 10 and max(counts) <= 240


# --- 4. saving over a saved result keeps the folder's other files ------------------------------


@pytest.fixture(scope="module")
def tiny():
    return simulator.simulate({"workload": {"num_requests": 20, "rate": 20}})


def test_saving_again_keeps_the_report_the_plots_and_the_users_files(tmp_path, tiny):
    folder = tiny.save(tmp_path / "run")
    assert invoke("report", folder).exit_code == 0
    (folder / "notes.txt").write_text("mine")
    (folder / "plots").mkdir()
    (folder / "plots" / "a.png").write_bytes(b"png")
    (folder / "link").symlink_to("notes.txt")
    report = (folder / "report.html").read_bytes()
    tiny.save(folder)
    assert (folder / "report.html").read_bytes() == report
    assert (folder / "notes.txt").read_text() == "mine"
    assert (folder / "plots" / "a.png").read_bytes() == b"png"
    assert os.readlink(folder / "link") == "notes.txt"
    assert load_result(folder).summary == tiny.summary
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no temporary folders left


def test_the_old_results_own_files_are_not_carried_over(tmp_path, tiny):
    """A table the new result does not write (an empty frame gets no file) must not be read
    back as the new run's."""
    folder = tiny.save(tmp_path / "run")
    assert not (folder / "transfers.parquet").exists()
    (folder / "transfers.parquet").write_bytes((folder / "requests.parquet").read_bytes())
    tiny.save(folder)
    assert not (folder / "transfers.parquet").exists()
    assert len(load_result(folder).transfers) == 0


def test_a_failure_while_keeping_the_files_leaves_the_old_folder_whole(tmp_path, tiny, monkeypatch):
    folder = tiny.save(tmp_path / "run")
    (folder / "notes.txt").write_text("mine")
    before = sorted(p.name for p in folder.iterdir())

    def full_disk(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persistence, "_link_or_copy", full_disk)
    with pytest.raises(OutputError, match="No space left on device"):
        save_result(tiny, folder)
    assert sorted(p.name for p in folder.iterdir()) == before
    assert (folder / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_files_are_copied_where_they_cannot_be_linked(tmp_path, tiny, monkeypatch):
    folder = tiny.save(tmp_path / "run")
    (folder / "notes.txt").write_text("mine")

    def no_links(self, target):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "hardlink_to", no_links)
    tiny.save(folder)
    assert (folder / "notes.txt").read_text() == "mine"


# --- 5. what the batch-size chart counts ------------------------------------------------------


def test_batch_size_is_described_as_steps_batch_size(tmp_path, tiny):
    """steps.batch_size counts every request with a prefill chunk or a decode in the step,
    also a chunk that gives no output token; the page and the doc said "got a token"."""
    page = write_report(tiny, tmp_path / "r.html").read_text()
    assert "got a token" not in page
    assert re.search(r"Requests that got tokens in each engine step[^\"]*prefill chunk", page)
    text = " ".join(REPORT_DOC.read_text().split())
    assert "got a token" not in text
    assert "*Batch size*: requests that got tokens in each step (`steps.batch_size`" in text
