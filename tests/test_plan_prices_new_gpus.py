"""`plan` prices GB200, MI300X and MI325X without `--price` (docs/planning.md, "Cost and
price assumptions"): the bundled table covers every catalog GPU, each new figure has its
sources and their dates in the data file, and plan's cost is GPUs x that price."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.catalog.hardware import list_gpus
from simulator.cli import app
from simulator.plan import DEFAULT_PRICES_USD_PER_GPU_HOUR, plan
from tests.specs import CAPACITY_25_RPS

NEW = {"GB200": 6.00, "MI300X": 2.00, "MI325X": 2.25}
# Every step 10 ms and one request at a time (tests/specs.py): 25 req/s per instance, on any
# GPU, since the explicit blackbox coefficients do not depend on it.
BASE = {
    **CAPACITY_25_RPS,
    "workload": {**CAPACITY_25_RPS["workload"], "rate": 60, "num_requests": 120},
}
SLO = {"ttft_p99_ms": 50.0}


def _data_text() -> str:
    return resources.files("simulator.catalog").joinpath("data/prices.yaml").read_text()


def test_every_catalog_gpu_has_a_default_price() -> None:
    assert {g.lower() for g in list_gpus()} <= {g.lower() for g in DEFAULT_PRICES_USD_PER_GPU_HOUR}
    for gpu, price in NEW.items():
        assert DEFAULT_PRICES_USD_PER_GPU_HOUR[gpu] == price


def test_the_existing_prices_are_unchanged() -> None:
    """Moving the table into the data file changed none of the earlier figures."""
    before = {"H100": 3.00, "H200": 3.50, "B200": 5.00, "A100-SXM": 1.80, "A100-80": 1.80}
    before["L40S"] = 1.00
    assert {k: DEFAULT_PRICES_USD_PER_GPU_HOUR[k] for k in before} == before


@pytest.mark.parametrize("gpu", sorted(NEW))
def test_each_new_price_names_its_sources_and_their_dates(gpu: str) -> None:
    """The data file's comments give, for each new GPU, a source (a web address) and the
    date of its figures; the table itself parses to the numbers plan uses."""
    text = _data_text()
    assert yaml.safe_load(text)["usd_per_gpu_hour"][gpu] == NEW[gpu]
    notes = re.search(rf"^#   {gpu}: (.*?)(?=^#   \S|^usd_per_gpu_hour)", text, re.M | re.S)
    assert notes is not None, gpu
    assert re.search(r"\w+\.(com|ai|network)/", notes.group(1)), gpu
    assert re.search(r"(January|February|March|April|May) 2026|\(2026\)", notes.group(1)), gpu


def test_plan_ranks_the_new_gpus_by_their_default_prices() -> None:
    """Step time is GPU-independent here, so each GPU needs the same 3 instances (60 req/s
    at 25 req/s per instance: n >= 2.4, tests/test_plan.py's known answer) and the cost is
    3 GPUs x the price: GB200 3 x 6.00 = 18.00, MI300X 3 x 2.00 = 6.00, MI325X
    3 x 2.25 = 6.75 USD/h; MI300X is cheapest."""
    res = plan(BASE, SLO, gpus=list(NEW), seeds=(1,), max_instances=8, workers=1)
    per_gpu = res.per_gpu.set_index("gpu")
    assert per_gpu["instances"].tolist() == [3, 3, 3]
    assert per_gpu["usd_per_gpu_hour"].to_dict() == NEW
    assert per_gpu["cost_per_hour_usd"].to_dict() == pytest.approx(
        {"GB200": 18.00, "MI300X": 6.00, "MI325X": 6.75}
    )
    assert res.best is not None
    assert (res.best.gpu, res.best.cost_per_hour) == ("MI300X", pytest.approx(6.00))


def test_cli_plan_needs_no_price_for_them(tmp_path: Path) -> None:
    """Before these defaults, comparing them without --price was refused (`no price for
    GPU`, exit 2)."""
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(BASE))
    args = ["plan", str(path), "--slo", "ttft_p99_ms=50", "--seeds", "1", "--quiet"]
    args += ["--max-instances", "8", "--gpu", "GB200", "--gpu", "MI300X", "--gpu", "MI325X"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "best: MI300X x 3 instance(s)" in out.output
    assert "no price" not in out.output
