"""ServeGen folders -> empirical-distribution clients, on a tiny synthetic fixture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.workload.lengths import from_dist_spec
from simulator.workload.servegen import expand_servegen, parse_pdf_string
from simulator.workload.spec import workload_spec_from_dict


def _write_fixture(folder: Path) -> None:
    (folder / "chunk-0-trace.csv").write_text(
        "0,2.0,1.5,Gamma,0.4,1.2\n600,5.0,2.5,Gamma,0.16,0.5\n1200,1.0,1.0,Weibull\nbad,row\n"
    )
    (folder / "chunk-0-dataset.json").write_text(
        json.dumps(
            {
                "0": {"input_tokens": "{}", "output_tokens": "{}"},
                "600": {"input_tokens": "{100: 0.25, 200: 0.75,}", "output_tokens": "{50: 1.0}"},
                "1200": {"input_tokens": "{300: 1}", "output_tokens": "{60: 1}"},
            }
        )
    )
    (folder / "chunk-1-trace.csv").write_text("0,3.0,0.8,Weibull\n600,0,0,\n")
    (folder / "chunk-1-dataset.json").write_text(
        json.dumps({"0": {"input_tokens": "{10: 1e-1, 20: 9e-1}", "output_tokens": "{5: 1}"}})
    )
    (folder / "chunk-2-trace.csv").write_text("0,0,0,\n")  # never active: skipped
    (folder / "chunk-2-dataset.json").write_text("{}")


def _spec(path: str, **extra) -> dict:
    return {"version": "2", "servegen_data": {"path": path, **extra}}


def test_expand_servegen(tmp_path: Path) -> None:
    _write_fixture(tmp_path)
    out = expand_servegen(workload_spec_from_dict(_spec(".")), tmp_path)
    assert out.servegen_data is None
    assert [c.id for c in out.clients] == ["servegen-chunk-0", "servegen-chunk-1"]
    c0, c1 = out.clients
    assert c0.tenant_id == "chunk-0"
    assert (c0.arrival.process, c0.arrival.cv, c0.rate_fraction) == ("gamma", 2.5, 5.0)
    assert (c1.arrival.process, c1.arrival.cv, c1.rate_fraction) == ("weibull", 0.8, 3.0)
    assert out.aggregate_rate == 8.0
    # First in-span window with both PDFs non-empty ("0" is empty).
    assert c0.input_distribution.params == {"100": 0.25, "200": 0.75}
    values = from_dist_spec(c0.input_distribution).sample(np.random.default_rng(0), 20_000)
    assert (values == 200).mean() == pytest.approx(0.75, abs=0.015)


def test_span_filters_rows_and_windows(tmp_path: Path) -> None:
    _write_fixture(tmp_path)
    spec = workload_spec_from_dict(
        _spec(str(tmp_path), span_start=1000, span_end=2000) | {"aggregate_rate": 4.0}
    )
    out = expand_servegen(spec)
    [c0] = out.clients  # chunk 1 has no traffic after t=1000
    assert c0.arrival.process == "weibull" and c0.rate_fraction == 1.0
    assert c0.input_distribution.params == {"300": 1.0}
    assert out.aggregate_rate == 4.0


def test_parse_pdf_string() -> None:
    assert parse_pdf_string("{1.0: 0.5, 2: 5e-1}", "x") == {1: 0.5, 2: 0.5}
    with pytest.raises(ConfigError, match="x: invalid PDF"):
        parse_pdf_string("[1, 2]", "x")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{100: -1}", "probability must be a finite number >= 0"),
        ("{100: nan}", "probability must be a finite number >= 0"),
        ("{1000000000: 1}", "token count must be from 0 to 100,000,000"),
        ("{-5: 1}", "token count must be from 0"),
        ("{100: 0, 200: 0}", "no probability above 0"),
    ],
)
def test_a_pdf_the_workload_could_not_use_is_refused_where_it_is_written(text, problem) -> None:
    """`convert servegen` printed such PDFs into a spec that `run` then refused, naming the
    spec's client instead of the dataset file."""
    with pytest.raises(ConfigError, match=f"dataset.json\\[0\\].input_tokens: .*{problem}"):
        parse_pdf_string(text, "dataset.json[0].input_tokens")


def test_bad_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="servegen_data.path"):
        expand_servegen(workload_spec_from_dict(_spec(str(tmp_path / "missing"))))
    with pytest.raises(ConfigError, match="no chunk-"):
        expand_servegen(workload_spec_from_dict(_spec(str(tmp_path))))
