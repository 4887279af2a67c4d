"""What `simulate` / `as_scenario` accept as a scenario (simulator/api.py).

The law: a Scenario, a dict of its fields or the path of a YAML file; anything else is one
ConfigError naming what was given ("scenario: expected a path to a YAML file, a dict or a
Scenario; got int 5"), never a TypeError or ValueError from deep inside, and a NUL byte in a
path is a ConfigError too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import simulator
from simulator.api import as_scenario
from simulator.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = "scenario: expected a path to a YAML file, a dict or a Scenario; got "


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (5, "int 5"),
        (1.5, "float 1.5"),
        (True, "bool True"),
        (None, "None"),
        (["scenarios/quickstart.yaml"], "list ['scenarios/quickstart.yaml']"),
        (b"scenarios/quickstart.yaml", "bytes b'scenarios/quickstart.yaml'"),
        (("a", "b"), "tuple ('a', 'b')"),
    ],
)
def test_wrong_type_is_one_config_error(value, shown):
    for entry in (simulator.simulate, as_scenario):
        with pytest.raises(ConfigError) as caught:
            entry(value)
        assert str(caught.value) == EXPECTED + shown


def test_a_huge_value_is_cut_in_the_message():
    with pytest.raises(ConfigError) as caught:
        simulator.simulate(list(range(10_000)))
    assert len(str(caught.value)) < 200 and "\n" not in str(caught.value)


@pytest.mark.parametrize("path", ["a\x00b.yaml", Path("a\x00b.yaml")])
def test_nul_byte_in_a_scenario_path_is_one_config_error(path):
    with pytest.raises(ConfigError) as caught:
        simulator.simulate(path)
    assert "NUL byte" in str(caught.value) and "\n" not in str(caught.value)


def test_the_accepted_forms_still_work():
    scenario = as_scenario({"workload": {"num_requests": 3}})
    assert as_scenario(scenario) is scenario
    assert as_scenario("scenarios/quickstart.yaml").workload is not None
    assert simulator.simulate({"workload": {"num_requests": 3}}).summary["completed_requests"] == 3


def _save_none() -> None:
    from simulator.metrics.persistence import save_result

    save_result(None, "unused")


TINY = {"workload": {"num_requests": 3, "rate": 5}}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: simulator.replay(None, None), "trace_data: expected a path"),
        (lambda: simulator.replay(5, "t.csv"), "trace_header: expected a path"),
        (lambda: simulator.load_scenario(None), "load_scenario: expected a path"),
        (lambda: simulator.load_result(5), "load_result: expected a path"),
        (lambda: simulator.sweep(TINY, {"seed": [1]}, seeds=None), "seeds: expected a list"),
        (lambda: simulator.sweep(TINY, {5: [1]}), "grid: keys are dotted scenario paths"),
        (lambda: simulator.sweep(TINY, {"seed": [1]}, out=5), "out: expected a path"),
        (lambda: simulator.simulate(TINY, progress=5), "progress: expected a function"),
        (lambda: simulator.simulate(TINY, on_deployment=5), "on_deployment: expected a function"),
        (lambda: simulator.simulate(TINY, options=5), "options: expected an EngineOptions"),
        (_save_none, "save_result: expected a Result or a SavedResult"),
    ],
)
def test_public_functions_name_a_wrong_argument(call, message):
    """Each raised a TypeError or AttributeError from inside (some after the run had
    started); the law is the module's: one ConfigError naming the argument."""
    with pytest.raises(ConfigError, match=message):
        call()


@pytest.mark.parametrize("flag", ["warn_unsteady", "reference", "end_checks"])
@pytest.mark.parametrize("value", ["no", "false", 1, None])
def test_an_on_off_argument_must_be_a_bool(flag, value):
    # A truthy string must not switch a check on: `end_checks="no"` ran the checks.
    with pytest.raises(ConfigError, match=f"^{flag}: invalid value .*; expected True or False$"):
        simulator.simulate("scenarios/quickstart.yaml", **{flag: value})


def test_numpy_scalars_are_the_values_they_hold():
    import numpy as np

    plain = simulator.simulate(
        "scenarios/quickstart.yaml", workload__num_requests=20, check_invariants=True
    )
    numpy_given = simulator.simulate(
        "scenarios/quickstart.yaml",
        workload__num_requests=np.int64(20),
        check_invariants=np.bool_(True),
        end_checks=np.bool_(False),
    )
    assert numpy_given.summary == plain.summary


def test_outputs_and_plots_name_a_wrong_argument(tmp_path, monkeypatch):
    from simulator.metrics import plots

    monkeypatch.chdir(tmp_path)
    run = simulator.simulate(str(ROOT / "scenarios/quickstart.yaml"), workload__num_requests=5)
    with pytest.raises(ConfigError, match="^prefix: expected a path"):
        run.write_trace(None)
    # As the CLI's --trace-output: a prefix without a file name wrote `.yaml`/`.csv` (hidden),
    # `out/.yaml` or `..yaml`.
    for prefix in ("", "out/", "."):
        with pytest.raises(ConfigError, match="^prefix: invalid value .*; expected a path prefix"):
            run.write_trace(prefix)
    with pytest.raises(ConfigError, match="^write_plots: directory: expected a path"):
        plots.write_plots(run, 6)
    with pytest.raises(ConfigError, match="^result: expected a Result .*; got str 'x'"):
        plots.latency_cdfs("x")
    # QA: these two raised AttributeError ('int' object has no attribute 'requests'/'steps').
    with pytest.raises(ConfigError, match=r"^compare_latency_cdfs: results\['a'\]: expected a "):
        plots.compare_latency_cdfs({"ok": run, "a": 5})
    with pytest.raises(ConfigError, match="^result: expected a Result .*; got int 5"):
        plots.instance_capacities(5)
    assert list(tmp_path.iterdir()) == []  # nothing written into the working folder


def test_an_unknown_key_is_told_with_the_nearest_allowed_one_and_the_allowed_keys():
    with pytest.raises(ConfigError) as caught:
        simulator.simulate("scenarios/quickstart.yaml", engine__max_num_seq=3)
    text = str(caught.value)
    assert text.startswith(
        "keyword arguments: engine: unknown key 'max_num_seq' (did you mean "
        "'max_num_running_reqs'?); valid: batch_formation, block_size_tokens, "
    )
    with pytest.raises(ConfigError, match=r"\(top level\): unknown key 'worklaod' \(did you mean"):
        simulator.simulate({"worklaod": {"rate": 1}})


def test_a_key_of_the_other_workload_form_is_told_as_such():
    """A workload is synthetic (rate, prompt_tokens, ...) or a v2 spec (clients, horizon,
    ...); `horizon` makes it a v2 spec, where `rate` is no key. It was told as "unknown key
    'rate' (did you mean 'rate'?)", listing both forms' keys, rate among them."""
    with pytest.raises(ConfigError) as caught:
        simulator.simulate({"workload": {"rate": 5, "num_requests": 10, "horizon": 10**6}})
    text = str(caught.value)
    assert "did you mean 'rate'" not in text
    assert "workload: key 'rate' belongs to the other form of workload" in text
    assert "read as a v2 workload (it has one of " in text and "horizon" in text
    # A misspelt key of the form given is offered that form's keys only.
    with pytest.raises(ConfigError) as caught:
        simulator.simulate({"workload": {"rate": 5, "rte": 3}})
    text = str(caught.value)
    assert "unknown key 'rte' (did you mean 'rate'?); valid: arrival, " in text
    assert "clients" not in text


@pytest.mark.parametrize(
    ("overrides", "starts"),
    [
        ({"engine__scheduler": "bogus"}, "engine.scheduler: unknown scheduler 'bogus'; valid: "),
        ({"engine__priority_policy": "x"}, "engine.priority_policy: unknown priority policy"),
        ({"engine__preemption_policy": "x"}, "engine.preemption_policy: unknown preemption"),
        ({"engine__batch_formation": "x"}, "engine.batch_formation: unknown batch formation"),
        ({"hardware": "H999"}, "hardware: unknown GPU 'H999'; valid: "),
        ({"latency__model": "foo"}, "latency.model: unknown latency model 'foo'; valid: "),
        ({"model": "nope/nope"}, "model: unknown model 'nope/nope'; valid: "),
        ({"cluster__routing__policy": "x"}, "cluster.routing.policy: unknown routing policy"),
        ({"cluster__admission__policy": "x"}, "cluster.admission.policy: unknown admission"),
    ],
)
def test_an_unknown_name_is_told_with_the_field_it_came_from(overrides, starts):
    with pytest.raises(ConfigError) as caught:
        simulator.simulate({"workload": {"num_requests": 2}}, **overrides)
    assert str(caught.value).startswith(starts), str(caught.value)


def test_coefficient_overrides_choose_the_model_that_reads_them_as_the_flags_do(tmp_path):
    """--alpha-coeffs/--beta-coeffs imply blackbox and --latency-coeffs physics; the same
    keyword overrides from Python were refused ("physics takes a coefficients file, not
    alpha/beta") because an override marked every field of the scenario as set."""
    base = tmp_path / "base.yaml"
    base.write_text("seed: 7\nworkload: {rate: 20, num_requests: 20}\n")
    blackbox = simulator.simulate(
        base, latency__alpha_coeffs=[1000, 1, 2], latency__beta_coeffs=[3000, 5, 20]
    )
    assert blackbox.latency_provenance["latency_model"] == "blackbox"
    fit = Path(__file__).resolve().parents[1] / "docs" / "physics-h100-fit.yaml"
    roofline = tmp_path / "roofline.yaml"
    roofline.write_text(
        "seed: 7\nlatency: {model: roofline}\nworkload: {rate: 20, num_requests: 20}\n"
    )
    physics = simulator.simulate(roofline, latency__coeffs_file=str(fit))
    assert physics.latency_provenance["latency_model"] == "physics"


def test_an_override_leaves_the_scenario_s_defaults_unset():
    """apply_overrides carries over what the author set (and the overrides), not a full dump:
    a rule that reads "left unset" reads the copy as it read the original (a node pool's
    gpu_memory_gib, unset, drew a warning after any override, `--seed 4` included)."""
    from simulator.scenario import apply_overrides, explicitly_set, scenario_from_dict

    sc = scenario_from_dict({"engine": {"max_num_running_reqs": 64}})
    copy = apply_overrides(sc, {"seed": 4})
    assert explicitly_set(copy, "engine.max_num_running_reqs")
    assert explicitly_set(copy, "seed")
    assert not explicitly_set(copy, "engine.total_kv_blocks")
    assert not explicitly_set(copy, "latency.model")


def test_a_decision_file_implies_recording_decisions(tmp_path):
    """`cluster.trace.path` alone wrote an empty file (the level stayed 'none'); it records
    the decisions, as --decisions-path does, and a path with level 'none' given is refused."""
    path = tmp_path / "decisions.jsonl"
    cluster = {"num_instances": 2, "trace": {"path": str(path)}}
    simulator.simulate({"cluster": cluster, "workload": {"num_requests": 10}}, warn_unsteady=False)
    assert len(path.read_text().splitlines()) == 20  # admission and routing, per request
    cluster["trace"] |= {"level": "none", "path": str(tmp_path / "other.jsonl")}
    with pytest.raises(ConfigError, match="cluster.trace: level: invalid value 'none' with a path"):
        simulator.simulate({"cluster": cluster, "workload": {"num_requests": 10}})
    assert not (tmp_path / "other.jsonl").exists()


@pytest.mark.parametrize("trace", [{"summarize": True}, {"counterfactual_k": 2}])
def test_a_trace_summary_or_counterfactuals_record_the_decisions(trace):
    """QA: summarize (or counterfactual_k) without level printed `Total Decisions: 0` beside
    a run that routed all 10 requests; each implies the decisions it is about, as a path does
    (and is refused beside level 'none' given)."""
    run = simulator.simulate(
        {"cluster": {"num_instances": 2, "trace": trace}, "workload": {"num_requests": 10}},
        warn_unsteady=False,
    )
    assert run.decisions.summary()["total_decisions"] == 10
    with pytest.raises(ConfigError, match=r"cluster.trace: level: invalid value 'none' with"):
        simulator.simulate({"cluster": {"num_instances": 2, "trace": {**trace, "level": "none"}}})


def test_closed_loop_settings_given_to_an_open_loop_are_told(caplog):
    """--think-time-ms without --concurrency is refused, --concurrency with --rate too; a
    scenario file or Python ran both silently. Think time without users is refused; a rate
    beside users is said not to apply (a file's rate with --concurrency stays usable)."""
    with pytest.raises(ConfigError, match="workload: think_time_us: invalid value 5000; it app"):
        simulator.simulate({"workload": {"rate": 20, "num_requests": 30, "think_time_us": 5000}})
    with caplog.at_level("WARNING", logger="servesim"):
        simulator.simulate(
            {"workload": {"rate": 20, "num_requests": 30, "concurrency": 4}}, warn_unsteady=False
        )
    assert [r for r in caplog.records if "do not apply to closed-loop users" in r.getMessage()]


def test_a_bad_coefficient_from_a_scenario_is_named_in_the_latency_section():
    with pytest.raises(ConfigError, match=r"^latency\.alpha_coeffs\[2\]: invalid value -2"):
        simulator.simulate(
            {
                "latency": {
                    "model": "blackbox",
                    "alpha_coeffs": [1, 1, -2],
                    "beta_coeffs": [1, 1, 1],
                },
                "workload": {"num_requests": 3},
            }
        )


def test_a_result_s_scenario_runs_again_as_the_same_scenario():
    """`Result.scenario` is the run's scenario plus what it resolved; fed back to simulate it
    was refused (unknown key 'resolved'). It gives the same run."""
    first = simulator.simulate({"seed": 5, "workload": {"rate": 10, "num_requests": 20}})
    again = simulator.simulate(first.scenario)
    assert again.summary == first.summary
