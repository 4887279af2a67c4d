"""Fuzzing every parser of user input: each input is accepted, or rejected with one clear
line (a ServesimError; exit status 2 on the command line). No other exception, no hang.

Inputs are real files (scenarios/, tests/data, groundtruth/, the bundled catalog data) damaged
two ways: structurally (a node replaced by an odd value, deleted, or an unknown key added;
`perturbed`) and as bytes (lines dropped or cut, characters inserted, numbers replaced, invalid
UTF-8, NUL bytes, BOMs, CR line ends, very long lines; `mutated_bytes`, written with
write_bytes), plus strategies over the flag-string grammars. Budgets: tests/fuzzing.py
(`make fuzz` for long).
"""

from __future__ import annotations

import functools
import itertools
import json
import uuid
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from simulator.api import as_scenario, build_traffic, instance_setups, resolve_deployment
from simulator.catalog.defaults import load_defaults_file
from simulator.catalog.hardware import load_gpu_file
from simulator.catalog.models import load_model
from simulator.cli import _coeffs, app
from simulator.cluster.policy_bundle import load_policy_bundle
from simulator.cluster.routing import parse_scorers
from simulator.latency.physics import load_coefficients_file
from simulator.metrics.fitness import parse_fitness_weights
from simulator.sweeps import load_sweep_file
from simulator.workload.lengths import load_empirical_table
from simulator.workload.servegen import load_servegen_clients
from simulator.workload.spec import load_workload_spec
from simulator.workload.trace import load_requests_file, read_groundtruth_rows, read_header
from tests.fuzzing import (
    accepted_or_one_line_error,
    finishes_within,
    fuzz_settings,
    mutated_bytes,
    perturbed,
)

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
BLIS = ROOT / "tests" / "data" / "blis"
TRACE_HEADER = BLIS / "r1_fixed512.trace.yaml"
TRACE_DATA = BLIS / "r1_fixed512.trace.csv"
WORKLOAD = ROOT / "tests" / "data" / "workloads" / "everything.yaml"
GROUNDTRUTH = sorted((ROOT / "groundtruth").glob("*/requests/*.requests.csv"))
# BLIS's own defaults.yaml and hardware_config.json, bundled unchanged.
BUNDLED_DEFAULTS = ROOT / "simulator" / "catalog" / "data" / "defaults.yaml"
BUNDLED_HARDWARE = ROOT / "simulator" / "catalog" / "data" / "hardware_config.json"

SCENARIO_DOCS = {p.name: yaml.safe_load(p.read_text()) for p in SCENARIOS}


def _head(path: Path, lines: int = 25) -> str:
    with path.open() as handle:
        return "".join(itertools.islice(handle, lines))


TRACE_TEXT = _head(TRACE_DATA)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _file(folder: Path, content: str | bytes, suffix: str) -> Path:
    path = folder / f"{uuid.uuid4().hex}{suffix}"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def damaged_yaml(doc, text: str | None = None):
    """YAML of `doc` damaged structurally (`perturbed`), or `text` (default: the dump of
    `doc`) damaged as bytes (`mutated_bytes`)."""
    return st.one_of(perturbed(doc).map(_dump), mutated_bytes(text if text else _dump(doc)))


# --- scenario YAML --------------------------------------------------------------------------


def _prepare_scenario(path: Path) -> None:
    """Everything `servesim run` does before the event loop: parse, resolve the deployment
    (model, GPU, latency backend, KV size), build the instances and the first requests."""
    sc = as_scenario(path)
    deployment = resolve_deployment(sc)
    instance_setups(sc, deployment)
    requests, _stream = build_traffic(sc)
    list(itertools.islice(requests, 30))


@fuzz_settings(ci_examples=100)
@given(
    st.sampled_from(SCENARIOS).flatmap(lambda p: damaged_yaml(SCENARIO_DOCS[p.name], p.read_text()))
)
def test_scenario_file(scratch, text):
    accepted_or_one_line_error(_prepare_scenario, _file(scratch, text, ".yaml"))


# --- workload spec v2 -----------------------------------------------------------------------

WORKLOAD_DOC = yaml.safe_load(WORKLOAD.read_text())


def _prepare_workload(path: Path) -> None:
    spec = load_workload_spec(path)
    scenario = as_scenario({"workload": spec.model_dump(exclude_none=True)})
    requests, _ = build_traffic(scenario)
    list(itertools.islice(requests, 30))


@fuzz_settings(ci_examples=90)
@given(damaged_yaml(WORKLOAD_DOC, WORKLOAD.read_text()))
def test_workload_spec_file(scratch, text):
    accepted_or_one_line_error(_prepare_workload, _file(scratch, text, ".yaml"))


# --- TraceV2 header and CSV -----------------------------------------------------------------


@fuzz_settings(ci_examples=80)
@given(damaged_yaml(yaml.safe_load(TRACE_HEADER.read_text()), TRACE_HEADER.read_text()))
def test_trace_header_file(scratch, text):
    accepted_or_one_line_error(read_header, _file(scratch, text, ".yaml"))


@fuzz_settings(ci_examples=80)
@given(mutated_bytes(TRACE_TEXT))
def test_trace_csv_with_damaged_text(scratch, text):
    data = _file(scratch, text, ".csv")
    accepted_or_one_line_error(load_requests_file, data, TRACE_HEADER)


@fuzz_settings(ci_examples=20)
@given(mutated_bytes(TRACE_TEXT))
def test_headerless_trace_csv_with_damaged_text(scratch, text):
    """`servesim replay --trace-data X.csv` alone: the CSV's own header decides its kind."""
    accepted_or_one_line_error(load_requests_file, _file(scratch, text, ".csv"))


@fuzz_settings(ci_examples=30)
@given(st.lists(st.text(max_size=12), min_size=26, max_size=26))
def test_trace_csv_row_of_arbitrary_cells(scratch, cells):
    row = ",".join(c.replace(",", ";").replace("\n", " ").replace("\r", " ") for c in cells)
    data = _file(scratch, TRACE_TEXT.splitlines(keepends=True)[0] + row + "\n", ".csv")
    accepted_or_one_line_error(load_requests_file, data, TRACE_HEADER)


# --- ground-truth CSV -----------------------------------------------------------------------


@fuzz_settings(ci_examples=40)
@given(st.data())
def test_groundtruth_csv_with_damaged_text(scratch, data):
    source = data.draw(st.sampled_from(GROUNDTRUTH))
    text = data.draw(mutated_bytes(_head(source)))
    accepted_or_one_line_error(read_groundtruth_rows, _file(scratch, text, ".csv"))


# --- coefficient and hardware files ---------------------------------------------------------


@fuzz_settings(ci_examples=60)
@given(st.data())
def test_coefficient_yaml_file(scratch, data):
    text = data.draw(damaged_yaml(_defaults_doc()))
    accepted_or_one_line_error(load_defaults_file, _file(scratch, text, ".yaml"))


@functools.cache
def _defaults_doc() -> dict:
    """A small but complete defaults.yaml: a few of each section of the bundled file."""
    full = yaml.safe_load(BUNDLED_DEFAULTS.read_text())
    small = dict(full)
    small["models"] = full["models"][:3]
    for key in ("defaults", "workloads"):
        if isinstance(full.get(key), dict):
            small[key] = dict(itertools.islice(full[key].items(), 2))
    return small


@fuzz_settings(ci_examples=30)
@given(st.data())
def test_hardware_file_with_damaged_fields(scratch, data):
    doc = data.draw(perturbed(json.loads(BUNDLED_HARDWARE.read_text())))
    suffix = data.draw(st.sampled_from([".json", ".yaml"]))
    text = json.dumps(doc) if suffix == ".json" else _dump(doc)
    accepted_or_one_line_error(load_gpu_file, _file(scratch, text, suffix))


@fuzz_settings(ci_examples=20)
@given(st.data())
def test_hardware_file_with_damaged_bytes(scratch, data):
    suffix = data.draw(st.sampled_from([".json", ".yaml"]))
    text = BUNDLED_HARDWARE.read_text()
    if suffix == ".yaml":
        text = _dump(json.loads(text))
    accepted_or_one_line_error(
        load_gpu_file, _file(scratch, data.draw(mutated_bytes(text)), suffix)
    )


COEFFICIENTS = {
    "version": 2,
    "latency_model": "physics",
    "coefficients": {
        "bandwidth_efficiency": 0.8,
        "prefill_compute_efficiency": 0.6,
        "per_step_overhead_us": 500.0,
        "gemm_fixed_rows": 64,
    },
    "fitted_on": ["run-a", "run-b"],
}


@fuzz_settings(ci_examples=30)
@given(damaged_yaml(COEFFICIENTS))
def test_latency_coefficients_file(scratch, text):
    """`--latency-coeffs`: a file written by `servesim calibrate`, damaged."""
    accepted_or_one_line_error(load_coefficients_file, _file(scratch, text, ".yaml"))


MODEL_CONFIGS = sorted((ROOT / "simulator" / "catalog" / "data" / "model_configs").glob("*/"))


@fuzz_settings(ci_examples=60)
@given(st.data())
def test_hf_config_json(scratch, data):
    """`--model path/to/config.json`: a damaged HuggingFace config of a bundled model."""
    source = data.draw(st.sampled_from(MODEL_CONFIGS)) / "config.json"
    if data.draw(st.booleans()):
        content = json.dumps(data.draw(perturbed(json.loads(source.read_text()))))
    else:
        content = data.draw(mutated_bytes(source.read_text()))
    accepted_or_one_line_error(load_model, str(_file(scratch, content, ".json")))


# --- length tables and ServeGen folders -------------------------------------------------------

LENGTH_TABLE = {100: 0.25, 200: 0.5, 400: 0.25}


@fuzz_settings(ci_examples=30)
@given(st.data())
def test_empirical_length_file(scratch, data):
    """`empirical` distributions' `file:` as YAML, JSON or a two-column CSV."""
    suffix = data.draw(st.sampled_from([".yaml", ".json", ".csv"]))
    if suffix == ".csv":
        text = "tokens,probability\n" + "".join(f"{k},{v}\n" for k, v in LENGTH_TABLE.items())
        content = data.draw(mutated_bytes(text))
    elif suffix == ".json":
        doc = {str(k): v for k, v in LENGTH_TABLE.items()}
        content = data.draw(
            st.one_of(perturbed(doc).map(json.dumps), mutated_bytes(json.dumps(doc, indent=1)))
        )
    else:
        content = data.draw(damaged_yaml(LENGTH_TABLE))
    accepted_or_one_line_error(load_empirical_table, _file(scratch, content, suffix))


SERVEGEN_TRACE = "0,2.0,1.5,Gamma,0.4,1.2\n600,5.0,2.5,Gamma,0.16,0.5\n1200,1.0,1.0,Weibull\n"
SERVEGEN_DATASET = {
    "0": {"input_tokens": "{}", "output_tokens": "{}"},
    "600": {"input_tokens": "{100: 0.25, 200: 0.75,}", "output_tokens": "{50: 1.0}"},
    "1200": {"input_tokens": "{300: 1}", "output_tokens": "{60: 1}"},
}


@fuzz_settings(ci_examples=30)
@given(st.data())
def test_servegen_folder(scratch, data):
    """A ServeGen chunk: its trace CSV and its dataset JSON, either damaged."""
    folder = scratch / uuid.uuid4().hex
    folder.mkdir()
    trace, dataset = SERVEGEN_TRACE.encode(), json.dumps(SERVEGEN_DATASET, indent=1).encode()
    which = data.draw(st.sampled_from(["trace", "dataset", "dataset-fields"]))
    if which == "trace":
        trace = data.draw(mutated_bytes(trace))
    elif which == "dataset":
        dataset = data.draw(mutated_bytes(dataset))
    else:
        dataset = json.dumps(data.draw(perturbed(SERVEGEN_DATASET))).encode()
    (folder / "chunk-0-trace.csv").write_bytes(trace)
    (folder / "chunk-0-dataset.json").write_bytes(dataset)
    accepted_or_one_line_error(load_servegen_clients, folder)


# --- policy bundle and sweep files ----------------------------------------------------------

POLICY_BUNDLE = {
    "admission": {
        "policy": "token-bucket",
        "token_bucket_capacity": 5000,
        "token_bucket_refill_rate": 500,
    },
    "routing": {
        "policy": "weighted",
        "scorers": [{"name": "prefix-affinity", "weight": 3}, {"name": "queue-depth", "weight": 2}],
    },
    "priority": {"policy": "slo-based"},
    "scheduler": "priority-fcfs",
}


@fuzz_settings(ci_examples=40)
@given(damaged_yaml(POLICY_BUNDLE))
def test_policy_bundle_file(scratch, text):
    accepted_or_one_line_error(load_policy_bundle, _file(scratch, text, ".yaml"))


SWEEP = {
    "base": {"workload": {"num_requests": 10, "rate": 5}},
    "grid": {"cluster.num_instances": [1, 2], "engine.max_num_running_reqs": [8]},
    "seeds": [1, 2],
    "workers": 1,
}


@fuzz_settings(ci_examples=40)
@given(damaged_yaml(SWEEP))
def test_sweep_file(scratch, text):
    accepted_or_one_line_error(load_sweep_file, _file(scratch, text, ".yaml"))


# --- flag strings ---------------------------------------------------------------------------

SCORER_NAMES = ["queue-depth", "kv-utilization", "load-balance", "prefix-affinity", "x", ""]
FLAG_ALPHABET = st.sampled_from(list("abcdeq-:,. 019e+nafi\t"))


def _pairs(names: list[str]):
    weight = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(-5, 5).map(str),
        st.text(FLAG_ALPHABET, max_size=4),
    )
    pair = st.tuples(st.sampled_from(names), weight).map(lambda t: f"{t[0]}:{t[1]}")
    return st.one_of(st.lists(pair, max_size=4).map(",".join), st.text(FLAG_ALPHABET, max_size=30))


@fuzz_settings(ci_examples=150)
@given(_pairs(SCORER_NAMES))
def test_routing_scorers_flag(text):
    accepted_or_one_line_error(parse_scorers, text)


FITNESS_KEYS = ["throughput", "p99_ttft", "mean_e2e", "tokens_per_sec", "nope"]


@fuzz_settings(ci_examples=150)
@given(_pairs(FITNESS_KEYS))
def test_fitness_weights_flag(text):
    accepted_or_one_line_error(parse_fitness_weights, text)


@fuzz_settings(ci_examples=100)
@given(st.text(FLAG_ALPHABET, max_size=30))
def test_coefficient_flags(text):
    accepted_or_one_line_error(_coeffs, "--alpha-coeffs", text)


# --- end to end: the command line -----------------------------------------------------------

RUN_FLAGS = [
    "--routing-scorers",
    "--fitness-weights",
    "--alpha-coeffs",
    "--beta-coeffs",
    "--hardware",
    "--latency-model",
    "--scheduler",
    "--admission-policy",
    "--pd-transfer-contention",
    "--log",
    "--num-instances",
    "--tp",
    "--rate",
]


@fuzz_settings(ci_examples=25, long_cap=500)
@given(
    st.lists(
        st.tuples(st.sampled_from(RUN_FLAGS), st.text(FLAG_ALPHABET, min_size=1, max_size=16)),
        min_size=1,
        max_size=3,
    )
)
def test_cli_run_with_odd_flag_values_exits_0_or_2_with_one_line(flags):
    args = ["run", "--num-requests", "5", "--quiet"]
    for flag, value in flags:
        args += [flag, value]
    with finishes_within(60):
        res = CliRunner().invoke(app, args)
    assert res.exit_code in (0, 2), (args, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exception)
    if res.exit_code == 2:
        errors = [line for line in res.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 or errors[0].startswith("Usage:"), (args, res.stderr)
        assert "Traceback" not in res.output


@fuzz_settings(ci_examples=8, long_cap=200)
@given(st.sampled_from(sorted(SCENARIO_DOCS)).flatmap(lambda n: perturbed(SCENARIO_DOCS[n], 2)))
def test_cli_run_of_damaged_scenarios_exits_0_or_2(scratch, doc):
    path = _file(scratch, _dump(doc), ".yaml")
    args = ["run", str(path), "--quiet", "--horizon", "5000000"]
    with finishes_within(120):
        res = CliRunner().invoke(app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), (doc, res.exception)
    assert res.exit_code in (0, 2), (doc, res.output)
    if res.exit_code == 2:
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
