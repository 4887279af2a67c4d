"""A fresh clone stands alone (issue 28): with nothing next to it, `servesim validate` finds the
ground truth that ships in the repository and scores a run. Only committed files are cloned,
so this also catches data left out of a commit (a .gitignore rule, a forgotten `git add`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_validate_works_in_a_fresh_clone_with_nothing_beside_it(tmp_path):
    clone = tmp_path / "alone" / "servesim"
    cloned = subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
        capture_output=True,
        text=True,
    )
    if cloned.returncode != 0:  # e.g. an old git refusing to clone a shallow CI checkout
        pytest.skip(f"git clone failed: {cloned.stderr.strip()[:200]}")
    assert not (clone.parent / "shared").exists()
    env = {**os.environ, "PYTHONPATH": str(clone)}
    where = subprocess.run(
        [sys.executable, "-c", "import simulator; print(simulator.__file__)"],
        cwd=clone, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(clone), where  # the clone's code, not this checkout's
    done = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "validate", "--runs", "llama-2-7b-tp1-general"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "llama-2-7b-tp1-general" in done.stdout
    assert "e2e_mean_ms" in done.stdout
