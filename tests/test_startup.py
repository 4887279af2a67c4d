"""What a run imports (issue 30): the CLI's run and help paths load neither the data-science
stack nor the modules of other commands. A test on module names, never on time; the time is
measured by benchmarks/."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Imported only where they are used: tables and plots, other commands, optional extras.
NEVER_ON_THE_RUN_PATH = (
    "pandas",
    "pyarrow",
    "matplotlib",
    "scipy",
    "httpx",
    "ray",
    "plotly",
    "simulator.report",
    "simulator.metrics.plots",
    "simulator.metrics.persistence",
    "simulator.observe",
    "simulator.calibrate",
    "simulator.plan",
    "simulator.sweeps",
    "simulator.validate",
)


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
    ],
)
def test_the_run_and_help_paths_import_nothing_heavy(argv):
    assert _top(_modules_after(argv)) == set()


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
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "=== Simulation Metrics ===" in done.stdout
