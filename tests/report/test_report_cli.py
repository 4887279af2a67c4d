"""`servesim report` and `--report` on run, replay, sweep and plan (docs/report.md,
docs/cli.md): each writes one page; bad input is one `error:` line and exit status 2, before
anything is simulated or written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import simulator
from simulator.cli import app
from tests.report.helpers import embedded

ROOT = Path(__file__).resolve().parents[2]
CHATBOT = ROOT / "scenarios" / "chatbot.yaml"
TRACE = ROOT / "tests" / "data" / "blis"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _is_page(path: Path) -> dict:
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    return embedded(text, "servesim-data")


def test_run_report(tmp_path):
    out = tmp_path / "out" / "chatbot.html"
    done = invoke("run", CHATBOT, "--num-requests", 200, "--quiet", "--report", out)
    assert done.exit_code == 0, done.output
    assert "=== Simulation Metrics ===" in done.stdout
    data = _is_page(out)
    assert data["kind"] == "run" and data["summary"]["completed_requests"] == 200


def test_replay_report(tmp_path):
    out = tmp_path / "replay.html"
    done = invoke(
        "replay",
        "--trace-header",
        TRACE / "r1_fixed512.trace.yaml",
        "--trace-data",
        TRACE / "r1_fixed512.trace.csv",
        "--total-kv-blocks",
        1_000_000,
        "--latency-model",
        "roofline",
        "--quiet",
        "--report",
        out,
    )
    assert done.exit_code == 0, done.output
    assert _is_page(out)["kind"] == "run"


@pytest.fixture(scope="module")
def saved(tmp_path_factory, chatbot):
    return chatbot.save(tmp_path_factory.mktemp("saved") / "run")


def test_report_of_a_saved_result_defaults_to_report_html(saved):
    done = invoke("report", saved)
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == str(saved / "report.html")
    assert _is_page(saved / "report.html")["source"] == "saved"


def test_report_of_a_results_file(tmp_path, chatbot):
    from simulator.atomic_io import write_json_atomically

    results = write_json_atomically(tmp_path / "run.json", chatbot.results_document())
    done = invoke("report", results, "-o", tmp_path / "page.html")
    assert done.exit_code == 0, done.output
    assert _is_page(tmp_path / "page.html")["source"] == "document"
    assert invoke("report", results).exit_code == 0
    assert (tmp_path / "run.html").is_file()  # the file's name, .html


def test_sweep_report_and_report_of_its_folder(tmp_path):
    """`sweep --report` and `report OUT_FOLDER` give the same points (rebuilt from
    runs.parquet)."""
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        f"base: {CHATBOT}\ngrid:\n  workload.rate: [10, 20]\n  workload.num_requests: [100]\n"
        "seeds: [1]\nworkers: 1\n"
    )
    page = tmp_path / "sweep.html"
    done = invoke("sweep", sweep_file, "--out", tmp_path / "out", "--quiet", "--report", page)
    assert done.exit_code == 0, done.output
    live = _is_page(page)
    assert live["kind"] == "sweep" and live["load"] == "workload.rate"
    assert invoke("report", tmp_path / "out").exit_code == 0
    again = _is_page(tmp_path / "out" / "report.html")
    assert again["points"] == live["points"] and again["curves"] == live["curves"]


def test_a_sweep_folder_with_a_truncated_runs_csv_is_one_error(tmp_path):
    """A runs.csv cut mid-row (no runs.parquet beside it) crashed the report with a
    traceback (a float among the text cells); it is one error line, exit 2, nothing
    written."""
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        f"base: {CHATBOT}\ngrid:\n  workload.rate: [10, 20]\n  workload.num_requests: [60]\n"
        "seeds: [1, 2]\nworkers: 1\n"
    )
    out = tmp_path / "out"
    assert invoke("sweep", sweep_file, "--out", out, "--quiet").exit_code == 0
    (out / "runs.parquet").unlink()
    text = (out / "runs.csv").read_text()
    (out / "runs.csv").write_text(text[: len(text) * 2 // 3])
    done = invoke("report", out, "-o", tmp_path / "page.html")
    assert done.exit_code == 2
    assert done.stderr.startswith("error: report: ") and "is incomplete" in done.stderr
    assert "Traceback" not in done.output and not (tmp_path / "page.html").exists()


def test_plan_report(tmp_path):
    """A loose bound one instance meets: one probe (200 requests: the plan's minimum)."""
    page = tmp_path / "plan.html"
    done = invoke(
        "plan",
        CHATBOT,
        "--slo",
        "ttft_p50_ms=2000",
        "--min-attainment",
        0.5,
        "--seeds",
        "1",
        "--max-instances",
        2,
        "--workers",
        1,
        "--quiet",
        "--report",
        page,
    )
    assert done.exit_code == 0, done.output
    data = _is_page(page)
    assert data["kind"] == "plan" and data["best"]["instances"] == 1
    # The answer names the instance's layout, as the text answer does (TP x PP when PP > 1).
    assert data["best"]["layout"].startswith(f"TP {data['best']['tp']}")
    assert data["best"]["layout"] in page.read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "/nonexistent/run"], "does not exist"),
        (["report", "{tmp}"], "neither a saved result"),
        (["report", "{tmp}/other.json"], "is not a results file"),
        (["report", "{saved}", "-o", "/proc/report.html"], "proc file system"),
        (["run", str(CHATBOT), "--report", "/proc/report.html"], "--report"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, saved, args, message):
    (tmp_path / "other.json").write_text('{"a": 1}')
    args = [a.format(tmp=tmp_path, saved=saved) for a in args]
    done = invoke(*args)
    assert done.exit_code == 2, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "=== Simulation Metrics ===" not in done.stdout


def test_python_api(tmp_path, chatbot):
    assert chatbot.report(tmp_path / "r.html") == tmp_path / "r.html"
    study = simulator.sweep(CHATBOT, {"workload.num_requests": [50]}, seeds=[1], workers=1)
    assert _is_page(study.report(tmp_path / "s.html"))["kind"] == "sweep"


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda d: d.update(requests=[1, 2]), "requests[0]: invalid value 1; must be a mapping"),
        (lambda d: d.update(slo=5), "slo: invalid value 5; must be a mapping"),
        (lambda d: d.update(steady_state_detail="x"), "steady_state_detail: invalid value 'x'"),
        (lambda d: d["requests"][0].update(ttft_ms="fast"), "requests[0].ttft_ms: invalid value"),
        # NaN and a time past the clock drew a page of nonsense (numpy cast warnings, exit 0).
        (
            lambda d: d["requests"][0].update(arrived_at=float("nan")),
            "requests[0].arrived_at: invalid value nan; must be from 0 to 9,007,199,254",
        ),
        (
            lambda d: d["requests"][1].update(ttft_ms=1e308),
            "requests[1].ttft_ms: invalid value 1e+308; must be from 0 to",
        ),
        (lambda d: d["requests"][0].update(e2e_ms=-1), "requests[0].e2e_ms: invalid value -1"),
        # The Overview's figures and the fleet block (printed "many / 800", "-1 s").
        (lambda d: d.update(completed_requests="many"), "completed_requests: invalid value 'm"),
        (
            lambda d: d.update(vllm_estimated_duration_s=-1),
            "vllm_estimated_duration_s: invalid value -1; must be a number >= 0",
        ),
        (lambda d: d.update(fleet=[1]), "fleet: invalid value [1]; must be a mapping"),
    ],
)
def test_an_edited_results_file_is_one_error(tmp_path, damage, needle):
    """Each of these raised an AttributeError or ValueError from inside the page's tables."""
    import json

    results = tmp_path / "r.json"
    res = invoke("run", "--num-requests", "5", "--rate", "5", "--results-path", str(results))
    assert res.exit_code == 0, res.output
    doc = json.loads(results.read_text())
    damage(doc)
    results.write_text(json.dumps(doc))
    res = invoke("report", str(results), "-o", str(tmp_path / "r.html"))
    assert res.exit_code == 2 and needle in res.output, res.output
    assert not (tmp_path / "r.html").exists()


def test_a_sweep_folder_with_an_empty_runs_table_is_one_error(tmp_path):
    (tmp_path / "runs.csv").write_text("")
    res = invoke("report", str(tmp_path))
    assert res.exit_code == 2 and "not a readable CSV table" in res.output, res.output


def test_a_results_file_of_a_changing_fleet_shows_its_totals(tmp_path):
    """A results JSON keeps the fleet's totals (`fleet`) but not its transitions: its page
    said "a fixed fleet: no node or instance changed state" of a fleet that scaled up five
    times. It shows the totals and says where the transitions are."""
    from simulator.atomic_io import write_json_atomically

    scenario = ROOT / "scenarios" / "autoscale_spike.yaml"
    run = simulator.simulate(scenario, workload__num_requests=300, warn_unsteady=False)
    results = write_json_atomically(tmp_path / "run.json", run.results_document())
    assert invoke("report", results, "-o", tmp_path / "page.html").exit_code == 0
    data = _is_page(tmp_path / "page.html")
    assert data["lifecycle"]["fleet"] == run.results_document()["fleet"]
    assert data["lifecycle"]["events"] == []
    assert "keeps only its totals" in data["notes"]["lifecycle"]


def test_every_source_s_overview_shows_the_summary_s_itl(tmp_path, chatbot):
    """A results JSON keeps the summary but not the token gaps: its ITL card showed the
    per-request mean (TPOT) instead of the summary's ITL p50 / p99."""
    from simulator.atomic_io import write_json_atomically
    from simulator.report.build import fmt

    results = write_json_atomically(tmp_path / "run.json", chatbot.results_document())
    assert invoke("report", results, "-o", tmp_path / "page.html").exit_code == 0
    page = (tmp_path / "page.html").read_text()
    s = chatbot.summary
    assert f"{fmt(s['itl_p50_ms'])} / {fmt(s['itl_p99_ms'])} ms" in page


def test_a_changing_fleet_s_kv_capacity_follows_the_instances_serving(tmp_path):
    """The pooled KV chart drew every instance the run ever made as capacity from t = 0;
    a fleet that scaled up serves with one instance's capacity until the next is routable."""
    run = simulator.simulate(
        ROOT / "scenarios" / "autoscale_spike.yaml",
        workload__num_requests=1500,
        warn_unsteady=False,
    )
    data = _is_page(run.report(tmp_path / "page.html"))
    live = data["timeseries"]["pooled"]["kv_capacity_blocks_live"]
    one = int(run.instances["kv_blocks"].iloc[0]) if "kv_blocks" in run.instances else None
    fleet = run.fleet_instances
    assert len(fleet) > 1  # the autoscaler added instances
    first_routable = fleet["routable_s"].dropna().sort_values().to_list()
    assert live[0] > 0 and max(live) >= 2 * live[0]
    assert one is None or live[0] == one
    assert first_routable[1] > 0  # the second instance was not there from the start


@pytest.mark.parametrize(
    ("scenario", "title", "prefix"),
    [("speculative_decoding.yaml", "Speculative decoding", "spec_"),
     ("lora_adapters.yaml", "LoRA adapters", "lora_")],
)  # fmt: skip
def test_speculation_and_adapters_have_their_figures_on_the_page(tmp_path, scenario, title, prefix):
    """A speculative or LoRA run's page looked like a plain run's: its spec_* / lora_*
    summary figures (acceptance rate, cold loads, ...) were nowhere on it."""
    from simulator.report.build import fmt

    run = simulator.simulate(ROOT / "scenarios" / scenario, workload__num_requests=100)
    page = run.report(tmp_path / "page.html").read_text()
    assert title in page
    for key, value in run.summary.items():
        if key.startswith(prefix):
            assert key in page and (fmt(value) in page or str(value) in page), key


def test_routing_reasons_are_grouped_by_reason_not_by_score(tmp_path):
    """Weighted routing's reason carries the chosen score ("weighted (score=0.5690)"); the
    'most frequent reasons' table grouped by the whole string had one row per score."""
    scenario = {
        "cluster": {"num_instances": 3, "routing": {"policy": "weighted"},
                    "trace": {"level": "decisions"}},
        "workload": {"num_requests": 60},
    }  # fmt: skip
    run = simulator.simulate(scenario, warn_unsteady=False)
    data = _is_page(run.report(tmp_path / "page.html"))
    assert data["balance"]["decisions"]["reasons"] == [{"reason": "weighted", "decisions": 60}]
