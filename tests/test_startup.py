"""What a run imports (issue 30): the CLI's run and help paths load neither the data-science
stack nor the modules of other commands. A test on module names, never on time; the time is
measured by benchmarks/."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from simulator.collector import RUN_GEN0_THRESHOLD

# Imported only where they are used: tables and plots, other commands, optional extras.
NEVER_ON_THE_RUN_PATH = (
    "pandas",
    "pyarrow",
    "matplotlib",
    "scipy",
    "httpx",
    "ray",
    "plotly",
    # numpy imports it the first time np.percentile or np.median runs (np.unique asks
    # np.ma.is_masked); the summaries compute both without them (metrics/quantiles.py).
    "numpy.ma",
    "simulator.report",
    "simulator.metrics.plots",
    "simulator.metrics.persistence",
    "simulator.observe",
    "simulator.calibrate",
    "simulator.plan",
    "simulator.sweeps",
    "simulator.validate",
)


# A PD run: its report (the PD metrics) reads the link's records, not a DataFrame.
PD_RUN = (
    ["run", "--num-requests", "3", "--latency-model", "roofline", "--num-instances", "2",
     "--prefill-instances", "1", "--decode-instances", "1", "--pd-decider", "always"]
)  # fmt: skip


def _modules_after(argv: list[str]) -> set[str]:
    probe = (
        "import sys\n"
        "from simulator.cli import main\n"
        f"sys.argv = ['servesim', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('MODULES', ' '.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return set(line.split()[1:])


def _top(modules: set[str]) -> set[str]:
    return {m for m in modules for name in NEVER_ON_THE_RUN_PATH if m == name or
            m.startswith(name + ".")}  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--num-requests", "3", "--latency-model", "roofline"],
        ["run", "scenarios/quickstart.yaml", "--num-requests", "3"],
        PD_RUN,
    ],
)
def test_the_run_and_help_paths_import_nothing_heavy(argv):
    assert _top(_modules_after(argv)) == set()


def test_help_imports_no_schema():
    """`--help` builds no scenario: pydantic (about 40 ms of a 0.2 s start) stays out. A
    module-level `from ..limits import ...` in cli/blis.py brought it in (0.19 -> 0.23 s)."""
    modules = _modules_after(["--help"])
    assert {m for m in modules if m.split(".")[0] == "pydantic"} == set()
    assert "simulator.limits" not in modules and "simulator.scenario" not in modules


# The modules of features a run may not use: imported by the runs that use them, so a plain
# run does not build their classes at start-up.
FEATURE_MODULES = (
    "simulator.engine.lora",
    "simulator.engine.speculative",
    "simulator.cluster.infrastructure",
    "simulator.cluster.lifecycle",
    "simulator.cluster.autoscaler",
    "simulator.metrics.fleet_record",
    "simulator.workload.closed_loop",
    "simulator.workload.trace",
    # Prefill/decode disaggregation (its decider registry stays: a run checks the decider's
    # name whether PD is on or not).
    "simulator.cluster.pd",
    "simulator.cluster.pools",
    "simulator.cluster.kv_transfer",
    "simulator.metrics.pd_record",
    "simulator.metrics.views.pd",
)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--num-requests", "3", "--latency-model", "roofline"],
        ["run", "scenarios/quickstart.yaml", "--num-requests", "3"],
    ],
)
def test_a_plain_run_imports_no_feature_it_does_not_use(argv):
    assert _modules_after(argv) & set(FEATURE_MODULES) == set()


def test_a_run_generates_each_schema_once():
    # pydantic generates a model's schema on first use (defer_build) and, inside another
    # model's, again unless the inner one was complete first. The scenario's sections default
    # to an empty mapping validated by the scenario's schema, not to an instance built by
    # their own; the workload spec, which every run validates on its own, is complete before
    # the scenario's schema is generated and is reused there.
    probe = (
        "import simulator\n"
        "from simulator import scenario\n"
        "from simulator.workload.spec import WorkloadSpec\n"
        "simulator.simulate({'workload': {'num_requests': 3}})\n"
        "from simulator.cluster.infra_spec import LifecycleSpec\n"
        "sections = [scenario.LatencySpec, scenario.EngineSpec, scenario.ClusterSpec, "
        "scenario.RoutingSpec, scenario.PDSpec, scenario.SloSpec, LifecycleSpec]\n"
        "print('BUILT', [s.__name__ for s in sections if s.__pydantic_complete__])\n"
        "print('SPEC', WorkloadSpec.__pydantic_complete__)\n"
    )
    out = _probe_output(probe)
    assert "BUILT []" in out and "SPEC True" in out, out


def test_a_run_parses_only_its_own_models_rows_of_the_shipped_defaults():
    # The shipped BLIS defaults file is mostly blackbox coefficients of 31 models: a run with
    # the default step-time model reads its model's defaults and rows (for the KV capacity
    # BLIS measured), never the whole file.
    probe = (
        "import simulator\n"
        "from simulator.catalog import defaults\n"
        "result = simulator.simulate({'workload': {'num_requests': 3}})\n"
        "assert result.summary['completed_requests'] == 3\n"
        "print('WHOLE', defaults.bundled_defaults.cache_info().currsize)\n"
        "print('ROWS', defaults._bundled_entries_of.cache_info().currsize)\n"
    )
    out = _probe_output(probe)
    assert "WHOLE 0" in out and "ROWS 1" in out, out


def test_a_run_with_the_features_imports_them():
    # The other side of the laziness: the same modules do load when a run uses them (and the
    # feature tests check that they work).
    modules = _modules_after(
        ["run", "--num-requests", "3", "--concurrency", "2", "--think-time-ms", "1",
         "--lora", "a:8", "--speculative-method", "ngram", "--num-speculative-tokens", "2",
         "--spec-acceptance-rate", "0.7"]
    )  # fmt: skip
    assert {
        "simulator.engine.lora",
        "simulator.engine.speculative",
        "simulator.workload.closed_loop",
    } <= modules
    assert {"simulator.cluster.pd", "simulator.cluster.kv_transfer"} <= _modules_after(PD_RUN)


def test_a_run_needs_no_package_outside_the_runtime_dependencies():
    """`click` is not a dependency (typer bundles its own copy); the dev environment has it
    through ray, so a stray `import click` passed every test while `make run` failed on a
    fresh install. The run path must work with it absent."""
    probe = (
        "import sys\n"
        "sys.modules['click'] = None\n"
        "from simulator.cli import main\n"
        "sys.argv = ['servesim', 'run', '--num-requests', '3', '--latency-model', 'roofline']\n"
        "main()\n"
    )
    assert "=== Simulation Metrics ===" in _probe_output(probe)


def _probe_output(probe: str) -> str:
    """What `probe` printed, run in a fresh Python that must exit cleanly."""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _process_settings_after(argv: list[str], environment: dict[str, str]) -> dict:
    probe = (
        "import gc, json, os, sys\n"
        "from simulator.cli import main\n"
        f"sys.argv = ['servesim', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('SETTINGS', json.dumps({'blas_threads': os.environ.get('OPENBLAS_NUM_THREADS'),"
        " 'pydantic_plugins': os.environ.get('PYDANTIC_DISABLE_PLUGINS'),"
        " 'gen0': gc.get_threshold()[0], 'frozen': gc.get_freeze_count()}), file=sys.stderr)\n"
    )
    chosen = ("OPENBLAS_NUM_THREADS", "PYDANTIC_DISABLE_PLUGINS")
    env = {k: v for k, v in os.environ.items() if k not in chosen} | environment
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    line = next(x for x in done.stderr.splitlines() if x.startswith("SETTINGS "))
    return json.loads(line.split(" ", 1)[1])


def test_the_command_line_process_starts_lean_and_leaves_its_objects_to_the_os():
    """What start-up costs are avoided (docs/performance.md, "What makes it fast"): numpy's
    BLAS starts one thread and pydantic scans no entry points for plugins (unless the user
    chose), the young-generation threshold is the
    run's from the first line, and every object is frozen before exit so the interpreter's
    last collection walks none of them."""
    settings = _process_settings_after(["--help"], {})
    assert settings["blas_threads"] == "1"
    assert settings["pydantic_plugins"] == "__all__"  # no entry-point scan on first validation
    assert settings["gen0"] >= RUN_GEN0_THRESHOLD
    assert settings["frozen"] > 0
    assert _process_settings_after(["--help"], {"OPENBLAS_NUM_THREADS": "4"})["blas_threads"] == "4"
    mine = _process_settings_after(["--help"], {"PYDANTIC_DISABLE_PLUGINS": "logfire"})
    assert mine["pydantic_plugins"] == "logfire"


def test_the_flag_templates_annotations_are_objects_not_strings():
    """typer evaluates a string annotation with `eval` every time it builds a command; the
    templates that declare `run`'s ~130 options keep theirs evaluated at import (their modules
    do not use `from __future__ import annotations`)."""
    import inspect

    from simulator.cli import blis, flags

    templates = [
        flags.common_flags,
        flags.workload_flags,
        flags.trace_output_flag,
        blis.closed_loop_flags,
        blis.goodput_flags,
    ]
    for template in templates:
        annotations = inspect.get_annotations(template)
        assert annotations, template.__name__
        strings = [name for name, value in annotations.items() if isinstance(value, str)]
        assert strings == [], f"{template.__name__}: {strings[:5]}"
