"""The example notebooks (`notebooks/*.ipynb`): each runs top to bottom in a fresh kernel, and
each is committed clean (no outputs, no execution counts)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

try:
    import nbclient
    import nbformat
except ImportError as exc:  # fail loudly: the dev extra is part of the test setup
    raise ImportError(
        f"{exc}: the notebook tests need the dev extra (`pip install -e '.[dev]'`: "
        "nbclient, nbformat, ipykernel)"
    ) from exc

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "python3"


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def test_notebooks_exist() -> None:
    assert len(NOTEBOOKS) >= 5, f"expected the example notebooks in {REPO_ROOT / 'notebooks'}"


def test_python3_kernel_available() -> None:
    """ipykernel provides the native `python3` kernel, run by this interpreter."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        pytest.fail(
            f"no '{KERNEL}' Jupyter kernel found for {sys.executable}; install the dev extra "
            "(`pip install -e '.[dev]'`, which brings ipykernel) into this environment"
        )
    # jupyter_client substitutes sys.executable for a bare "python" in the kernel command.
    launcher = Path(spec.argv[0]).name
    assert launcher.startswith("python") or spec.argv[0] == sys.executable, (
        f"the '{KERNEL}' kernel does not run a Python interpreter: {spec.argv}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_committed_clean(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count"))
    ]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        pytest.fail(f"no '{KERNEL}' Jupyter kernel: install ipykernel (the dev extra)")
    # A notebook may shrink its study under this switch (the kernel inherits the environment).
    monkeypatch.setenv("SERVESIM_NOTEBOOK_QUICK", "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=120,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(REPO_ROOT)}},
    )
    started = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}")
    elapsed = time.perf_counter() - started
    print(f"{path.name}: {elapsed:.1f} s")
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors, f"{path.name}: error outputs {errors}"
