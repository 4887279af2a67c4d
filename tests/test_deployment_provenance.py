"""The Latency Model block names what priced each named deployment (docs/results.md,
"latency_provenance"): one entry per deployment when any differs from the scenario's
top-level one, nothing added when none does (a single-deployment run's block is unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

import simulator
from simulator.api import as_scenario, resolve_deployment
from simulator.cli import app
from simulator.metrics.results import LATENCY_HEADER

LLAMA = "meta-llama/llama-3.1-8b-instruct"
QWEN = "qwen/qwen3-14b"
FEW = {"rate": 5, "num_requests": 8}


def _latency_block(result: simulator.Result) -> dict:
    text = result.report_text()
    return json.loads(text[text.index(LATENCY_HEADER) + len(LATENCY_HEADER) :])


def _mixed() -> dict:
    """Three deployments that differ in model, GPU, layout and step-time model."""
    return {
        "model": LLAMA,
        "hardware": "H100",
        "deployments": [
            {"name": "llama", "num_instances": 1},
            {"name": "qwen", "model": QWEN, "tp": 2, "num_instances": 1},
            {"name": "amd", "hardware": "MI300X", "tp": 2, "num_instances": 1},
            {"name": "roof", "latency_model": "roofline", "num_instances": 1},
        ],
        "workload": FEW,
    }


def test_each_named_deployment_gets_its_own_entry() -> None:
    """Each entry says its model, role, GPU, layout (tp x pp GPUs), precision and where its
    efficiencies come from: physics on H100 is calibrated there, on MI300X it carries the H100
    fit over; roofline's entry is filled in with the GPU, layout and precision its own
    provenance does not name."""
    result = simulator.simulate(_mixed(), warn_unsteady=False)
    entries = result.latency_provenance["by_deployment"]
    assert list(entries) == ["llama", "qwen", "amd", "roof"]
    assert {k: e["model"] for k, e in entries.items()} == {
        "llama": LLAMA,
        "qwen": QWEN,
        "amd": LLAMA,
        "roof": LLAMA,
    }
    assert {e["role"] for e in entries.values()} == {"unified"}
    assert {k: e["gpu"] for k, e in entries.items()} == {
        "llama": "H100",
        "qwen": "H100",
        "amd": "MI300X",
        "roof": "H100",
    }
    assert {k: e["layout"]["gpus"] for k, e in entries.items()} == {
        "llama": 1,
        "qwen": 2,
        "amd": 2,
        "roof": 1,
    }
    assert entries["llama"]["source"] == "calibrated"
    assert entries["amd"]["source"] == "transferred"
    assert "carried over from the H100 fit" in entries["amd"]["efficiencies"]
    assert entries["roof"]["latency_model"] == "roofline"
    assert "MFU" in entries["roof"]["efficiencies"]
    for entry in entries.values():
        assert set(entry["precision"]) == {"weights", "kv_cache", "gemm"}
    # A per-role summary would merge four deployments of the one role: it is left out.
    assert "by_role" not in result.latency_provenance
    # The printed block and the results JSON say the same.
    assert _latency_block(result) == result.latency_provenance
    assert result.results_document()["latency_model"]["by_deployment"] == entries


def test_the_entry_is_the_deployments_own_step_model() -> None:
    """An entry's latency fields are exactly its step-time model's provenance."""
    sc = as_scenario({**_mixed(), "deployments": [], "model": QWEN, "tp": 2})
    own = resolve_deployment(sc).step_model.provenance()
    entry = simulator.simulate(_mixed(), warn_unsteady=False).latency_provenance["by_deployment"][
        "qwen"
    ]
    assert {k: v for k, v in entry.items() if k not in ("model", "role")} == own


def test_deployments_priced_like_the_top_level_add_nothing() -> None:
    """A named deployment that inherits everything (and two of them) leaves the block as a
    run without `deployments` prints it: the same text, no by_deployment."""
    plain = {"model": LLAMA, "hardware": "H100", "workload": FEW}
    named = {**plain, "deployments": [{"name": "a"}, {"name": "b", "num_instances": 2}]}
    want = simulator.simulate(plain, warn_unsteady=False)
    got = simulator.simulate(named, warn_unsteady=False)
    assert "by_deployment" not in got.latency_provenance
    assert _latency_block(got) == _latency_block(want)
    text = got.report_text()
    assert (
        text[text.index(LATENCY_HEADER) :]
        == want.report_text()[want.report_text().index(LATENCY_HEADER) :]
    )


def test_a_run_without_deployments_keeps_its_block() -> None:
    """The block of a plain run is its step model's provenance, key for key."""
    scenario = {"model": LLAMA, "hardware": "H100", "workload": FEW}
    result = simulator.simulate(scenario, warn_unsteady=False)
    own = resolve_deployment(as_scenario(scenario)).step_model.provenance()
    assert result.latency_provenance == own


def test_pd_deployments_say_their_roles() -> None:
    """Prefill TP1 and decode TP2 as named deployments: one entry each, with its role."""
    scenario = {
        "model": LLAMA,
        "hardware": "H100",
        "deployments": [
            {"name": "pre", "role": "prefill", "num_instances": 1},
            {"name": "dec", "role": "decode", "tp": 2, "num_instances": 1},
        ],
        "cluster": {"pd": {"decider": "always"}},
        "workload": FEW,
    }
    result = simulator.simulate(scenario, warn_unsteady=False)
    entries = result.latency_provenance["by_deployment"]
    assert {k: (e["role"], e["layout"]["tp"]) for k, e in entries.items()} == {
        "pre": ("prefill", 1),
        "dec": ("decode", 2),
    }


def test_the_cli_prints_and_saves_the_entries(tmp_path: Path) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(_mixed()))
    saved = tmp_path / "results.json"
    out = CliRunner().invoke(app, ["run", str(path), "--results-path", str(saved)])
    assert out.exit_code == 0, out.output
    assert '"by_deployment"' in out.output
    doc = json.loads(saved.read_text())
    assert list(doc["latency_model"]["by_deployment"]) == ["llama", "qwen", "amd", "roof"]
