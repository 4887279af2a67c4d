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
    with pytest.raises(ConfigError, match="^directory: expected a path"):
        plots.write_plots(run, 6)
    with pytest.raises(ConfigError, match="^result: expected a Result .*; got str 'x'"):
        plots.latency_cdfs("x")
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
