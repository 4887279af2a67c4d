"""Scenario-schema defects QA found (2026-12): unknown keys deep in an inline v2 workload and
under a mapping of models get the keys allowed there; a mapping key's error is placed at the
mapping; an unknown PD decider names its field; an unquoted `vllm_version` is refused with a
hint; a relative `model` path resolves from the scenario's folder; `run -h` states the
defaults docs/cli.md promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from simulator.api import simulate
from simulator.cli import app
from simulator.errors import ConfigError
from simulator.scenario import Scenario, load_scenario

DOCS = Path(__file__).parent.parent / "docs"
SCENARIOS = Path(__file__).parent.parent / "scenarios"


def _refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    return str(err.value)


_CLIENT = (
    "{id: a, rate_fraction: 1, %s: {process: poisson}, "
    "input_distribution: {type: constant, params: {value: 5}}, "
    "output_distribution: {type: constant, params: {value: 5}}}"
)


def test_an_unknown_key_inside_an_inline_v2_workload_is_told_with_the_keys_allowed(tmp_path):
    message = _refusal(
        tmp_path,
        'workload: {version: "2", aggregate_rate: 1, num_requests: 5, clients: [%s]}\n'
        % (_CLIENT % "arival"),
    )
    assert "workload.clients[0]: unknown key 'arival' (did you mean 'arrival'?)" in message
    assert "valid: adapter, arrival," in message


def test_the_workload_forms_are_still_told_apart_at_the_workload_itself(tmp_path):
    # The form filter, now applied only there, still gives the v2 keys for a v2 workload and
    # names a synthetic key given beside v2 ones as the other form's.
    typo = _refusal(tmp_path, "workload: {num_requests: 5, clients: [], foo: 1}\n")
    assert "workload: unknown key 'foo'; valid: aggregate_rate, category, clients," in typo
    assert "prompt_tokens" not in typo
    mixed = _refusal(tmp_path, "workload: {aggregate_rate: 1, prompt_tokens: {mean: 5}}\n")
    assert "key 'prompt_tokens' belongs to the other form of workload" in mixed
    synthetic = _refusal(tmp_path, "workload: {prompt_tokens: {mean: 5, stdevv: 3}}\n")
    assert "workload.prompt_tokens: unknown key 'stdevv' (did you mean 'stdev'?)" in synthetic


def test_an_unknown_key_under_an_slo_class_is_told_with_the_keys_allowed(tmp_path):
    message = _refusal(tmp_path, "slo: {classes: {batch: {e2e: 5}}}\n")
    assert message.endswith(
        "slo.classes.batch: unknown key 'e2e' (did you mean 'e2e_ms'?); "
        "valid: e2e_ms, itl_ms, ttft_ms"
    )


def test_a_bad_mapping_key_is_placed_at_the_mapping(tmp_path):
    message = _refusal(tmp_path, "engine: {slo_priorities: {urgent: 5}}\n")
    assert "[key]" not in message
    assert "engine.slo_priorities: key 'urgent': Input should be 'critical'" in message


def test_an_unknown_pd_decider_names_its_field(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "cluster: {num_instances: 2, pd: {prefill_instances: 1, decode_instances: 1, "
        "decider: sometimes}}\nworkload: {num_requests: 2}\n"
    )
    with pytest.raises(ConfigError) as err:
        simulate(path)
    assert str(err.value).startswith("cluster.pd.decider: unknown PD decider 'sometimes'; valid:")


@pytest.mark.parametrize("value", ["0.23", "1", "0.10"])
def test_an_unquoted_vllm_version_is_refused_with_a_hint_to_quote_it(tmp_path, value):
    message = _refusal(tmp_path, f"latency: {{vllm_version: {value}}}\n")
    assert (
        "latency.vllm_version: expected a version string, not a number: YAML reads an unquoted "
        'version as a number (0.10 as 0.1); quote it as written, e.g. vllm_version: "0.23.0"'
    ) in message
    # No version is suggested from the number, which may have lost digits (0.10 -> "0.1").
    assert 'vllm_version: "0.1"' not in message


def test_a_quoted_vllm_version_and_a_boolean_are_told_as_before(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text('latency: {vllm_version: "0.10"}\n')
    assert load_scenario(path).latency.vllm_version == "0.10"
    assert "Input should be a valid string" in _refusal(tmp_path, "latency: {vllm_version: true}\n")


def _model_folder(tmp_path: Path) -> Path:
    """A scenario folder holding a copy of a bundled config.json (mycfg/config.json)."""
    from simulator.catalog import models

    bundled = next(models._MODEL_CONFIGS_DIR.glob("*/config.json"))  # noqa: SLF001
    folder = tmp_path / "sub" / "mycfg"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(bundled.read_text())
    return tmp_path / "sub"


@pytest.mark.parametrize("model", ["./mycfg/config.json", "mycfg/config.json", "mycfg"])
def test_a_relative_model_path_resolves_from_the_scenarios_folder(tmp_path, monkeypatch, model):
    sub = _model_folder(tmp_path)
    path = sub / "s.yaml"
    path.write_text(f"model: {model}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    scenario = load_scenario(path)
    assert Path(scenario.model) == sub / model
    from simulator.deployment import resolve_deployment

    assert resolve_deployment(scenario).model.name == "mycfg"


def test_deployment_and_draft_model_paths_resolve_from_the_scenarios_folder(tmp_path, monkeypatch):
    """Every `model` a scenario names by path follows the same rule: a deployment's and the
    drafter's too (they resolved from the working folder)."""
    sub = _model_folder(tmp_path)
    path = sub / "s.yaml"
    path.write_text(
        "deployments: [{name: a, model: ./mycfg/config.json}]\n"
        "speculative: {method: draft_model, draft_model: ./mycfg, num_speculative_tokens: 2,"
        " acceptance_rate: 0.5}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    scenario = load_scenario(path)
    assert Path(scenario.deployments[0].model) == sub / "mycfg" / "config.json"
    assert Path(scenario.speculative.draft_model) == sub / "mycfg"


def test_a_missing_relative_model_path_is_told_from_the_scenarios_folder(tmp_path):
    from simulator.deployment import resolve_deployment

    path = tmp_path / "s.yaml"
    path.write_text("model: ./absent.json\n")
    scenario = load_scenario(path)
    assert scenario.model == str(tmp_path / "absent.json")
    with pytest.raises(ConfigError) as err:
        resolve_deployment(scenario)
    # The path told is the scenario folder's (an excerpt: tmp_path is long).
    message = str(err.value)
    assert message.startswith(f"model: path {str(tmp_path)[:30]!r}"[:-1])
    assert message.endswith(" does not exist")


def test_a_model_name_stays_a_name(tmp_path):
    sub = _model_folder(tmp_path)
    for text, expected in [
        ("model: meta-llama/llama-3.1-8b-instruct\n", "meta-llama/llama-3.1-8b-instruct"),
        ("model: llama-3.1-8b-instruct\n", "llama-3.1-8b-instruct"),
        ("hardware: H100\n", Scenario().model),  # not given: the default name, unresolved
        # Beside model_config_folder, `model` only names the model.
        ("model: mycfg\nmodel_config_folder: mycfg\n", "mycfg"),
    ]:
        path = sub / "s.yaml"
        path.write_text(text)
        assert load_scenario(path).model == expected, text
    absolute = sub / "mycfg" / "config.json"
    path.write_text(f"model: {absolute}\n")
    assert load_scenario(path).model == str(absolute)


def test_the_scenario_doc_lists_model_among_the_relative_paths():
    intro = (DOCS / "scenario.md").read_text().split("```", 1)[0]
    paths = " ".join(intro.split("Relative paths inside a", 1)[1].split())
    assert (
        "resolve from the scenario's folder, and so do `model`, `deployments[].model` and "
        "`speculative.draft_model` when they are paths"
    ) in paths


def _run_help() -> dict[str, str]:
    run = typer.main.get_command(app).commands["run"]
    return {p.opts[0]: " ".join(p.help.split()) for p in run.params if p.help}


def test_run_help_states_the_defaults():
    from simulator.cluster.infra_spec import DelaySpec
    from simulator.scenario import SyntheticWorkload

    helps = _run_help()
    assert f"(default {Scenario().model})" in helps["--model"]
    assert SyntheticWorkload().rate == 1 and "(default 1;" in helps["--rate"]
    assert DelaySpec().mean_s == 0 and "(default 0)" in helps["--loading-delay-s"]
    assert "default: the model's GPU in the defaults table, else H100" in helps["--hardware"]
    assert "default: the model's in the defaults table, else 1" in helps["--tp"]


def test_the_stated_gpu_and_tp_fallbacks_are_the_codes():
    from simulator.catalog.defaults import model_defaults
    from simulator.deployment import resolve_deployment

    model = "meta-llama/llama-2-7b-hf"
    assert model_defaults(model) is None  # not in the defaults table
    dep = resolve_deployment(Scenario(model=model))
    assert (dep.gpu.name, dep.tp) == ("H100", 1)


def test_cli_doc_lists_convert_servegen_periods():
    text = (DOCS / "cli.md").read_text()
    section = text.split("## `servesim convert servegen", 1)[1].split("\n## ", 1)[0]
    assert "--periods" in section
    for flag, field, note in [
        ("--rate", "workload.rate", "default 1"),
        ("--loading-delay-s", "instance_lifecycle.loading_delay.mean_s", "default 0"),
        ("--model", "model", "default meta-llama/llama-3.1-8b-instruct"),
    ]:
        row = re.search(rf"^\| `{flag}` \| `{re.escape(field)}` \| ([^\n]*)$", text, re.M)
        assert row and note in row.group(1), flag


def test_kv_cpu_offload_comment_quotes_the_figures_of_each_limit():
    text = (SCENARIOS / "kv_cpu_offload.yaml").read_text()
    comment = " ".join(
        line.strip().lstrip("#").strip()
        for line in text.splitlines()
        if line.strip().startswith("#")
    )
    assert "3,983 ms TTFT mean, 650 preemptions" in comment
    assert "4,613 ms TTFT mean, 123 preemptions" in comment
    assert "preempt less" in comment and "preempts more" not in comment


@pytest.mark.parametrize(
    ("text", "told"),
    [
        (
            "engine: {slo_priorities: [1, 2]}",
            "engine.slo_priorities: Input should be a valid dictionary (got [1, 2])",
        ),  # fmt: skip
        (
            "engine: {batch_formation: [chunked]}",
            "engine.batch_formation: Input should be a valid string (got ['chunked'])",
        ),  # fmt: skip
        ("engine: {preemption_policy: {a: 1}}", "(got {'a': 1})"),
    ],
)
def test_a_list_or_mapping_of_the_wrong_type_is_quoted(tmp_path, text, told):
    """QA: a wrong-type list or mapping was told without its value (`Input should be a valid
    string`), while a wrong-type scalar was quoted (`(got 5)`)."""
    assert told in _refusal(tmp_path, text + "\n")


def test_a_flag_given_an_integer_and_an_event_on_a_one_instance_fleet_read_well(tmp_path):
    """QA: `expected true or false, not a int (got 1)`, and `instances are instance_0 ..
    instance_0` for a one-instance fleet."""
    told = _refusal(tmp_path, "check_invariants: 1\n")
    assert "check_invariants: expected true or false, not an integer (got 1)" in told
    scenario = {
        "events": [{"at_s": 1, "action": "drain_instance", "target": "instance_7"}],
        "workload": {"num_requests": 2},
    }
    with pytest.raises(ConfigError) as err:
        simulate(scenario)
    assert str(err.value).endswith("unknown instance 'instance_7'; the only instance is instance_0")
