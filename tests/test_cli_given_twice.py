"""A setting given twice, empty, or in a form YAML misreads is refused with one line naming it
(exit 2), not resolved silently by the last value, the default, or a type error."""

from __future__ import annotations

import pytest

import simulator
from simulator.errors import ConfigError
from tests.test_cli_workloads import invoke

RUN = ["run", "--num-requests", "2", "--rate", "1"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            [*RUN, "--speculative-config", '{"method": "ngram", "method": "eagle"}'],
            "duplicate key 'method'",
        ),
        ([*RUN, "--slo-ttft", "critical=5ms,critical=10ms"], "class 'critical' is given twice"),
        (
            [
                "plan",
                "scenarios/quickstart.yaml",
                "--slo",
                "ttft_p99_ms=5000",
                "--slo",
                "ttft_p99_ms=1",
            ],
            "'ttft_p99_ms' is given twice",
        ),  # fmt: skip
        ([*RUN, "--hardware", ""], "--hardware (hardware): must name a GPU"),
        ([*RUN, "--slo-ttft-ms", "0"], "--slo-ttft-ms (slo.ttft_ms): must be > 0"),
        (["calibrate", "--workers", "0"], "--workers: invalid value 0"),
    ],
)
def test_refused_with_one_line(args, needle):
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert needle in res.stderr and "Traceback" not in res.output, res.stderr


def test_an_exponent_yaml_reads_as_text_is_named(tmp_path):
    """PyYAML (YAML 1.1) reads `rate: 1e3` and `1.0e3` as strings; only 1.0e+3 is a float."""
    path = tmp_path / "s.yaml"
    for text in ("1e3", "1.0e3"):
        path.write_text(f"workload: {{num_requests: 3, rate: {text}}}\n")
        with pytest.raises(ConfigError, match=rf"YAML reads {text} as text: .* 1\.0e\+3"):
            simulator.load_scenario(path)
    path.write_text("workload: {num_requests: 3, rate: 1.0e+3}\n")
    assert simulator.load_scenario(path).workload.rate == 1000.0
