"""Saving a run to a folder and loading it back (simulator.metrics.persistence)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

import simulator
from simulator.errors import ConfigError
from simulator.metrics.persistence import FRAME_NAMES, SavedResult, load_result, save_result

DOCS = Path(__file__).parents[2] / "docs" / "results.md"
TINY = {"workload": {"num_requests": 40, "rate": 20}, "cluster": {"num_instances": 2}}


@pytest.fixture(scope="module")
def result() -> simulator.Result:
    return simulator.simulate(TINY)


def test_round_trip_keeps_frames_and_dicts(result, tmp_path):
    folder = save_result(result, tmp_path / "run")
    assert folder == tmp_path / "run"
    assert (folder / "summary.json").is_file()
    assert not (folder / "transfers.parquet").exists()  # empty frames are skipped
    loaded = load_result(folder)
    assert isinstance(loaded, SavedResult)
    for name in FRAME_NAMES:
        pd.testing.assert_frame_equal(getattr(loaded, name), getattr(result, name))
    assert str(loaded.requests["completion_us"].dtype) == "Int64"
    assert str(loaded.requests["enqueue_us"].dtype) == "Int64"
    assert list(loaded.transfers.columns) == list(result.transfers.columns)
    assert loaded.summary == result.summary
    for name in ("per_slo", "kv_metrics", "anomalies", "pd_metrics", "session_counts"):
        assert getattr(loaded, name) == getattr(result, name)
    assert loaded.scenario == json.loads(json.dumps(result.scenario))
    # Every result names the model that produced it, a loaded one too.
    assert loaded.latency_provenance == json.loads(json.dumps(result.latency_provenance))
    assert loaded.latency_provenance["latency_model"] == "physics"


def test_nullable_timestamps_survive(result, tmp_path):
    frame = result.requests.copy()
    frame.loc[0, "completion_us"] = pd.NA
    fake = SavedResult(
        summary=result.summary,
        requests=frame,
        steps=result.steps,
        instances=result.instances,
        transfers=result.transfers,
    )
    loaded = load_result(save_result(fake, tmp_path / "r"))
    assert loaded.requests["completion_us"].isna().sum() == 1
    pd.testing.assert_frame_equal(loaded.requests, frame)


def test_save_replaces_existing_result_only_when_complete(result, tmp_path):
    target = tmp_path / "run"
    save_result(result, target)
    (target / "stale.txt").write_text("old")
    save_result(load_result(target), target)
    assert (target / "stale.txt").read_text() == "old"  # not part of the saved result: kept
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no temporary folders left


def test_save_refuses_foreign_folder(result, tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="mine"):
        save_result(result, target)
    assert (target / "notes.txt").read_text() == "keep me"


def test_load_without_summary_names_folder(tmp_path):
    with pytest.raises(
        ConfigError, match=re.escape(str(tmp_path / "nothing")) + "': no such folder"
    ):
        load_result(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty'? is not a saved result"):
        load_result(tmp_path / "empty")


def _documented_columns(section: str) -> set[str]:
    text = DOCS.read_text()
    start = text.index(f"## `{section}` columns")
    end = text.find("\n## ", start + 1)
    names: set[str] = set()
    for line in text[start : end if end >= 0 else None].splitlines():
        if line.startswith("| `"):
            cell = line.split("|")[1]
            names.update(re.findall(r"`([^`]+)`", cell))
    return names


@pytest.mark.parametrize("section", ["requests", "steps"])
def test_documented_columns_match_dataframes(result, section):
    assert _documented_columns(section) == set(getattr(result, section).columns)


def test_session_metrics_survive_a_round_trip(tmp_path):
    """A closed-loop run's session block (count, cold/warm TTFT, duration) is saved and read
    back as the live result has it; a run without sessions saves none."""
    run = simulator.simulate(
        {"workload": {"concurrency": 4, "think_time_us": 200_000, "num_requests": 30}}
    )
    assert run.session_metrics is not None
    loaded = load_result(save_result(run, tmp_path / "sessions"))
    assert loaded.session_metrics == json.loads(json.dumps(run.session_metrics))
    plain = load_result(save_result(simulator.simulate(TINY), tmp_path / "plain"))
    assert plain.session_metrics is None


def test_save_returns_the_path_it_was_given_whether_new_or_replaced(tmp_path, monkeypatch):
    import simulator

    monkeypatch.chdir(tmp_path)
    result = simulator.simulate({"workload": {"num_requests": 5, "rate": 5}})
    first = result.save("out/run")
    again = result.save("out/run")  # replaces the saved result
    assert first == again == Path("out/run")
    assert simulator.load_result(again).summary == result.summary


def _damaged(result, tmp_path, change) -> Path:
    folder = save_result(result, tmp_path / "run")
    change(folder)
    return folder


def _edit_summary(key, value):
    def change(folder: Path) -> None:
        doc = json.loads((folder / "summary.json").read_text())
        doc[key] = value
        (folder / "summary.json").write_text(json.dumps(doc))

    return change


def _retype_e2e(folder: Path) -> None:
    frame = pd.read_parquet(folder / "requests.parquet")
    frame["e2e_ms"] = frame["e2e_ms"].astype(str)
    frame.to_parquet(folder / "requests.parquet")


@pytest.mark.parametrize(
    "change, needle",
    [
        (_edit_summary("summary", [1]), "'summary' must be a mapping"),
        (_edit_summary("scenario", 5), "'scenario' must be a mapping"),
        (_edit_summary("kv_metrics", "x"), "'kv_metrics' must be a mapping"),
        (lambda f: pd.DataFrame({"a": [1]}).to_parquet(f / "steps.parquet"), "lacks the column"),
        (_retype_e2e, "e2e_ms (str, saved as float64)"),
        (lambda f: (f / "requests.parquet").unlink(), "is missing"),
    ],
    ids=["summary", "scenario", "kv_metrics", "steps-columns", "e2e-type", "no-requests"],
)
def test_a_folder_changed_after_saving_is_one_error_not_a_traceback(
    result, tmp_path, change, needle
):
    """The report and the plots failed deep inside (AttributeError, KeyError, ValueError)
    on these; `load_result` names what changed, and `plot` writes nothing."""
    from typer.testing import CliRunner

    from simulator.cli import app

    folder = _damaged(result, tmp_path, change)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_result(folder)
    for args in (["report", str(folder), "-o", str(tmp_path / "r.html")],
                 ["plot", str(folder), "--out", str(tmp_path / "png")]):  # fmt: skip
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and needle in res.output, res.output
    assert not (tmp_path / "png").exists() and not (tmp_path / "r.html").exists()


def test_slo_and_steady_state_survive_a_round_trip(tmp_path):
    run = simulator.simulate(
        {**TINY, "horizon_us": 1_500_000, "slo": {"ttft_ms": 50, "e2e_ms": 2000}}
    )
    loaded = load_result(save_result(run, tmp_path / "run"))
    assert loaded.slo == run.slo and loaded.slo["slo_attainment"] is not None
    assert loaded.steady_state == run.steady_state
    assert (loaded.horizon_us, loaded.not_arrived) == (run.horizon_us, run.not_arrived)
    assert loaded.horizon_us == 1_500_000  # the run's own, not the default None
    again = load_result(save_result(loaded, tmp_path / "again"))  # a loaded result saves too
    assert again.steady_state == run.steady_state and again.slo == run.slo


def test_a_result_saved_without_verdicts_loads_with_empty_ones(result, tmp_path):
    folder = save_result(result, tmp_path / "run")
    document = json.loads((folder / "summary.json").read_text())
    for key in ("slo", "steady_state", "horizon_us", "not_arrived"):
        del document[key]
    (folder / "summary.json").write_text(json.dumps(document))
    loaded = load_result(folder)
    assert (loaded.slo, loaded.steady_state, loaded.horizon_us, loaded.not_arrived) == (
        {},
        None,
        None,
        0,
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("steady_state", {"verdict": "steady", "bogus": 1}, "'steady_state' is not a verdict"),
        ("steady_state", [1], "'steady_state' is not a verdict"),
        ("not_arrived", -1, "'not_arrived' must be a whole number"),
        ("horizon_us", "x", "'horizon_us' must be a whole number"),
        ("slo", [1], "'slo' must be a mapping"),
    ],
)
def test_a_damaged_verdict_is_one_error(result, tmp_path, key, value, message):
    folder = save_result(result, tmp_path / "run")
    document = json.loads((folder / "summary.json").read_text())
    document[key] = value
    (folder / "summary.json").write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=message):
        load_result(folder)
