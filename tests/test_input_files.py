"""Every file servesim reads goes through one reader (simulator/input_files.py): bad bytes,
odd paths and special files become one-line errors that name the file, the place and what is
allowed, with exit status 2 on the command line, never a traceback.

Each test writes its damaged file with write_bytes, as a user's disk would hold it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, field_validator

from simulator.api import as_scenario, build_traffic, instance_setups, resolve_deployment
from simulator.catalog.defaults import load_defaults_file
from simulator.catalog.hardware import load_gpu_file
from simulator.catalog.models import load_model
from simulator.cluster.policy_bundle import load_policy_bundle
from simulator.errors import ConfigError, ServesimError, excerpt
from simulator.input_files import (
    MAX_CSV_LINE_BYTES,
    MAX_DOCUMENT_BYTES,
    csv_records,
    load_json,
    load_yaml,
    read_text,
    read_yaml,
)
from simulator.latency.physics import load_coefficients_file
from simulator.limits import MAX_TIME_US, MAX_TOKENS
from simulator.metrics.persistence import load_result
from simulator.scenario import load_scenario
from simulator.sweeps import load_sweep_file
from simulator.workload.lengths import load_empirical_table
from simulator.workload.spec import format_spec_error, load_workload_spec
from simulator.workload.trace import (
    TRACE_COLUMNS,
    load_requests_file,
    read_groundtruth_rows,
    read_header,
    read_rows,
)
from tests.fuzzing import assert_one_line_error, finishes_within

ROOT = Path(__file__).resolve().parent.parent
BLIS = ROOT / "tests" / "data" / "blis"
TRACE_HEADER = BLIS / "r1_fixed512.trace.yaml"
TRACE_DATA = BLIS / "r1_fixed512.trace.csv"
MODEL = "meta-llama/llama-3.1-8b-instruct"
TRACE_HEAD = TRACE_DATA.read_bytes().splitlines(keepends=True)[:4]
HEADER_LINE = TRACE_HEAD[0]
ROW = TRACE_HEAD[1]  # request 0, 512 in, 128 out, arrival 12049


def row(**fields: object) -> bytes:
    """A data row of the reference trace with some fields replaced."""
    cells = ROW.decode().rstrip("\n").split(",")
    for name, value in fields.items():
        cells[TRACE_COLUMNS.index(name)] = str(value)
    return (",".join(cells) + "\n").encode()


def write(folder: Path, name: str, content: bytes) -> Path:
    path = folder / name
    path.write_bytes(content)
    return path


def refused(load: Callable, *args: object) -> str:
    """The one-line message `load` refuses its input with (the fuzzers' law)."""
    with finishes_within(30), pytest.raises(ServesimError) as caught:
        load(*args)
    assert_one_line_error(caught.value, getattr(load, "__name__", ""))
    return str(caught.value)


def prepare_run(path: Path) -> None:
    """What `servesim run` does with a scenario before the event loop (reads every file)."""
    scenario = as_scenario(path)
    instance_setups(scenario, resolve_deployment(scenario))
    requests, _ = build_traffic(scenario)
    next(iter(requests), None)


def cli(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simulator.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def assert_cli_refuses(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, one line `error: ...` on stderr, no traceback; the line holds every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    return proc.stderr


# --- the files: a loader and a valid file of each kind ---------------------------------------

GOOD_GPU = {
    "X1": {
        "TFlopsPeak": 100.0,
        "TFlopsFP8": 0.0,
        "BwPeakTBs": 1.0,
        "mfuPrefill": 0.5,
        "mfuDecode": 0.3,
        "MemoryGiB": 40.0,
    }
}
BUNDLE = b"routing:\n  policy: least-loaded\nscheduler: fcfs\n"
SWEEP = b"base:\n  workload: {num_requests: 5, rate: 5}\ngrid:\n  cluster.num_instances: [1]\n"
COEFFS = b"latency_model: physics\ncoefficients:\n  per_step_overhead_us: 500.0\n"
SPEC = (
    b'version: "2"\naggregate_rate: 5\nnum_requests: 5\nclients:\n'
    b"  - id: a\n    rate_fraction: 1\n    arrival: {process: poisson}\n"
    b"    input_distribution: {type: constant, params: {value: 10}}\n"
    b"    output_distribution: {type: constant, params: {value: 5}}\n"
)
SCENARIO = f"model: {MODEL}\nname: plain\n".encode()
DEFAULTS = (ROOT / "simulator" / "catalog" / "data" / "defaults.yaml").read_bytes()
HF_CONFIG = (
    (ROOT / "simulator" / "catalog" / "data" / "model_configs" / "llama-3.1-8b-instruct")
    .joinpath("config.json")
    .read_bytes()
)

# (name, suffix, valid content, loader); the loader takes the file's path.
YAML_FILES = [
    ("scenario", ".yaml", SCENARIO, load_scenario),
    ("workload spec", ".yaml", SPEC, load_workload_spec),
    ("trace header", ".yaml", TRACE_HEADER.read_bytes(), read_header),
    ("policy bundle", ".yaml", BUNDLE, load_policy_bundle),
    ("sweep", ".yaml", SWEEP, load_sweep_file),
    ("latency coefficients file", ".yaml", COEFFS, load_coefficients_file),
    ("GPU file", ".yaml", yaml.safe_dump(GOOD_GPU).encode(), load_gpu_file),
    ("defaults file", ".yaml", DEFAULTS, load_defaults_file),
    ("empirical.file", ".yaml", b"100: 0.5\n200: 0.5\n", lambda p: load_empirical_table(p)),
]
OTHER_FILES = [
    ("trace data", ".csv", HEADER_LINE + ROW, lambda p: load_requests_file(p, TRACE_HEADER)),
    # Without a header file the CSV's own header decides its kind; its rows are trace data.
    ("trace data", ".csv", HEADER_LINE + ROW, load_requests_file),
    (
        "ground-truth data",
        ".csv",
        b"index,arrival_time_us,input_tokens,output_tokens\n0,10,5,5\n",
        read_groundtruth_rows,
    ),
    ("empirical.file", ".csv", b"tokens,probability\n100,1\n", lambda p: load_empirical_table(p)),
    ("empirical.file", ".json", b'{\n"100": 1\n}', lambda p: load_empirical_table(p)),
    ("GPU file", ".json", json.dumps(GOOD_GPU, indent=1).encode(), load_gpu_file),
    ("model config", ".json", HF_CONFIG, lambda p: load_model(str(p))),
]
ALL_FILES = YAML_FILES + OTHER_FILES
IDS = [f"{i}-{what}{suffix}" for i, (what, suffix, _, _) in enumerate(ALL_FILES)]


@pytest.mark.parametrize(("what", "suffix", "content", "load"), ALL_FILES, ids=IDS)
def test_every_kind_of_file_loads_when_valid(tmp_path, what, suffix, content, load):
    load(write(tmp_path, f"good{suffix}", content))


@pytest.mark.parametrize(("what", "suffix", "content", "load"), ALL_FILES, ids=IDS)
def test_invalid_utf8_names_the_file_line_and_column(tmp_path, what, suffix, content, load):
    lines = content.splitlines(keepends=True)
    # In the middle of the second line (a value, or a CSV row).
    lines[1] = lines[1][:3] + b"\xff\xfe" + lines[1][3:]
    message = refused(load, write(tmp_path, f"bad{suffix}", b"".join(lines)))
    assert f"bad{suffix}" in message and what in message
    assert "line 2, column 4: invalid UTF-8 byte(s) 0xff" in message
    assert "must be UTF-8 text" in message


@pytest.mark.parametrize(("what", "suffix", "content", "load"), ALL_FILES, ids=IDS)
def test_a_nul_byte_in_a_file_is_refused(tmp_path, what, suffix, content, load):
    lines = content.splitlines(keepends=True)
    lines[1] = lines[1][:2] + b"\x00" + lines[1][2:]
    message = refused(load, write(tmp_path, f"nul{suffix}", b"".join(lines)))
    assert f"nul{suffix}" in message and "line 2, column 3: NUL byte" in message


@pytest.mark.parametrize(
    "bad",
    [
        b"\xed\xa0\x80",  # a lone surrogate's UTF-8 encoding
        b"\xc3",  # a cut two-byte character
        b"\xc0\xaf",  # an overlong encoding
        b"\x80",  # a stray continuation byte
    ],
)
def test_every_invalid_utf8_sequence_is_refused(tmp_path, bad):
    message = refused(read_text, write(tmp_path, "x.yaml", b"a: 1\nb: x" + bad + b"\n"), "x")
    assert "line 2, column 5: invalid UTF-8" in message


def test_byte_order_mark_and_cr_line_ends_are_read(tmp_path):
    """A UTF-8 BOM (Excel's CSVs) is skipped; CR or CRLF end lines as LF does."""
    bom = b"\xef\xbb\xbf"
    csv_bytes = bom + (HEADER_LINE + row(request_id=1) + row(request_id=2)).replace(b"\n", b"\r")
    rows = read_rows(write(tmp_path, "cr.csv", csv_bytes))
    assert [r.request_id for r in rows] == ["1", "2"]
    crlf = bom + SCENARIO.replace(b"\n", b"\r\n")
    assert load_scenario(write(tmp_path, "s.yaml", crlf)).name == "plain"
    assert load_empirical_table(write(tmp_path, "t.json", bom + b'{"7": 1}')) == {7: 1.0}
    # A UTF-16 file is not UTF-8: refused, not misread.
    utf16 = SCENARIO.decode().encode("utf-16")
    assert "invalid UTF-8" in refused(load_scenario, write(tmp_path, "u16.yaml", utf16))


def test_cli_refuses_a_scenario_with_invalid_utf8(tmp_path):
    path = write(tmp_path, "x.yaml", f'model: {MODEL}\nname: "\xff\xfe"\n'.encode("latin-1"))
    proc = cli("run", path, "--num-requests", "5", "--quiet")
    assert_cli_refuses(proc, "x.yaml", "line 2, column 8: invalid UTF-8 byte(s) 0xff")


def test_cli_refuses_a_trace_csv_with_invalid_utf8(tmp_path):
    data = write(tmp_path, "t.csv", HEADER_LINE + row().replace(b",c0,", b",c\xff0,"))
    proc = cli("replay", "--trace-data", data, "--trace-header", TRACE_HEADER, "--quiet")
    assert_cli_refuses(proc, "t.csv", "line 2, column 4: invalid UTF-8")


# --- NUL bytes in paths, special files, size caps ---------------------------------------------


@pytest.mark.parametrize(("what", "suffix", "content", "load"), ALL_FILES, ids=IDS)
def test_a_nul_byte_in_a_path_is_refused(tmp_path, what, suffix, content, load):
    message = refused(load, str(tmp_path / f"a\x00b{suffix}"))
    assert "must not contain a NUL byte" in message and "\\x00" in message


@pytest.mark.parametrize(
    "field",
    [
        'workload_spec: "w\\0.yaml"',
        'trace: {data: "t\\0.csv"}',
        'trace: {header: "h\\0.yaml", data: "t.csv"}',
        'hardware_file: "g\\0.yaml"',
        'latency: {model: physics, coeffs_file: "c\\0.yaml"}',
    ],
)
def test_a_nul_byte_in_a_path_field_of_a_scenario_is_refused(tmp_path, field):
    path = write(tmp_path, "s.yaml", f"model: {MODEL}\n{field}\n".encode())
    message = refused(prepare_run, path)
    assert "invalid path" in message and "must not contain a NUL byte" in message


def test_cli_refuses_a_nul_byte_in_a_path_field_of_a_scenario(tmp_path):
    path = write(tmp_path, "s.yaml", f'model: {MODEL}\nworkload_spec: "w\\0.yaml"\n'.encode())
    proc = cli("run", path, "--quiet")
    # However long tmp_path is, the shortened path keeps its file name, the NUL escaped.
    assert_cli_refuses(proc, "workload spec: invalid path", "w\\x00.yaml'", "NUL byte")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    for load in (load_scenario, read_rows, load_policy_bundle, load_empirical_table):
        assert "it is a FIFO (named pipe); give a regular file" in refused(load, fifo)
    proc = cli("run", fifo, "--num-requests", "5")
    assert_cli_refuses(proc, "pipe.yaml", "FIFO")


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/dev/zero", "a character device"),
        ("/dev/urandom", "a character device"),
        ("/dev/null", "a character device"),
        ("/proc/self/status", "under /proc or /sys"),
        ("/proc/self/environ", "under /proc or /sys"),
        ("/tmp", "a directory"),
    ],
)
def test_special_files_are_refused(path, kind):
    if not Path(path).exists():
        pytest.skip(f"{path} does not exist here")
    loaders = [load_scenario, read_rows, load_gpu_file, load_policy_bundle, load_empirical_table]
    if kind != "a directory":  # a model's folder holds its config.json
        loaders.append(lambda p: load_model(str(p)))
    for load in loaders:
        message = refused(load, Path(path))
        assert f"{kind}; give a regular file" in message and repr(path) in message


def test_cli_refuses_a_device_as_trace(tmp_path):
    proc = cli("replay", "--trace-data", "/dev/zero", "--quiet")
    assert_cli_refuses(proc, "'/dev/zero'", "character device")


def test_a_csv_line_longer_than_the_cap_is_refused(tmp_path):
    long_row = b"0," + b"x" * MAX_CSV_LINE_BYTES + b"\n"
    message = refused(read_rows, write(tmp_path, "long.csv", HEADER_LINE + ROW + long_row))
    assert "long.csv' line 3: longer than 1 MiB" in message
    # A file without line ends at all is refused at its first line.
    message = refused(read_rows, write(tmp_path, "blob.csv", b"\x01" * (3 * MAX_CSV_LINE_BYTES)))
    assert "blob.csv' line 1: longer than 1 MiB" in message


def test_a_yaml_file_larger_than_the_cap_is_refused_without_reading_it(tmp_path):
    big = tmp_path / "big.yaml"
    with big.open("wb") as handle:
        handle.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: nothing to read, only its size
    message = refused(load_scenario, big)
    assert "big.yaml' is larger than 64 MiB" in message


# --- the trace header and CSV -----------------------------------------------------------------


def test_trace_header_with_unknown_keys_one_of_them_null(tmp_path):
    header = write(tmp_path, "h.yaml", TRACE_HEADER.read_bytes() + b"foo: 1\n~: 2\n")
    message = refused(read_header, header)
    assert "unknown key(s) ['foo', None]" in message and "valid: created_at" in message
    proc = cli("replay", "--trace-data", TRACE_DATA, "--trace-header", header, "--quiet")
    assert_cli_refuses(proc, "h.yaml", "unknown key(s)")


def test_an_unclosed_quote_is_quoted_as_a_short_excerpt(tmp_path):
    """A leading quote makes the header one field holding the whole file (84 KB): the
    message quotes at most an excerpt of it."""
    data = write(tmp_path, "q.csv", b'"' + TRACE_DATA.read_bytes())
    message = refused(load_requests_file, data, TRACE_HEADER)
    assert "unknown column(s) 'request_id,client_id," in message and "…" in message
    assert len(message) < 1500
    # The same in a data row: the field runs to the end of the file.
    rest = b"".join(TRACE_DATA.read_bytes().splitlines(keepends=True)[2:])
    data = write(tmp_path, "q2.csv", HEADER_LINE + ROW + b'1,c0,,,,0,,false,"512' + rest)
    message = refused(load_requests_file, data, TRACE_HEADER)
    assert "q2.csv" in message and len(message) < 400


def test_duplicate_request_ids_name_the_id_and_both_lines(tmp_path):
    data = write(tmp_path, "d.csv", HEADER_LINE + row(request_id=7) + ROW + row(request_id=7))
    message = refused(read_rows, data)
    assert "d.csv' line 4: column request_id: invalid value '7'" in message
    assert "already used on line 2; IDs must be unique" in message
    proc = cli("replay", "--trace-data", data, "--quiet")
    assert_cli_refuses(proc, "d.csv", "line 4", "line 2")
    gt = b"index,arrival_time_us,input_tokens,output_tokens\n3,10,5,5\n4,11,5,5\n3,12,5,5\n"
    message = refused(read_groundtruth_rows, write(tmp_path, "gt.csv", gt))
    assert "line 4: column index: invalid value 3; already used on line 2" in message


@pytest.mark.parametrize(
    ("column", "value", "maximum"),
    [
        ("input_tokens", 99999999999999999999999, MAX_TOKENS),
        ("input_tokens", MAX_TOKENS + 1, MAX_TOKENS),
        ("output_tokens", 2**63, MAX_TOKENS),
        ("arrival_time_us", 99999999999999999999999, MAX_TIME_US),
        ("arrival_time_us", MAX_TIME_US + 1, MAX_TIME_US),
        ("deadline_us", 2**64, MAX_TIME_US),
        ("send_time_us", -(2**63), MAX_TIME_US),
        ("prefix_group", None, None),  # control: a valid row
    ],
)
def test_trace_values_beyond_the_simulator_are_refused(tmp_path, column, value, maximum):
    if value is None:
        assert read_rows(write(tmp_path, "ok.csv", HEADER_LINE + ROW))
        return
    data = write(tmp_path, "big.csv", HEADER_LINE + row(**{column: value}))
    message = refused(read_rows, data)
    assert f"big.csv' line 2: column {column}: invalid value '{value}'" in message
    assert f"<= {maximum}" in message


def test_cli_refuses_trace_values_beyond_int64(tmp_path):
    data = write(tmp_path, "big.csv", HEADER_LINE + row(input_tokens=10**22))
    proc = cli("replay", "--trace-data", data, "--quiet")
    assert_cli_refuses(proc, "big.csv", "line 2", "column input_tokens", f"<= {MAX_TOKENS}")


def test_a_prompt_beyond_the_token_bound_through_its_prefix_is_refused(tmp_path):
    header = HEADER_LINE.replace(b"prefix_group,", b"prefix_group,prefix_length,")
    cells = ROW.split(b",")
    cells[6:7] = [b"sys", str(MAX_TOKENS).encode()]
    message = refused(load_requests_file, write(tmp_path, "p.csv", header + b",".join(cells)))
    assert "prefix_length" in message and f"at most {MAX_TOKENS} tokens" in message


def test_a_zero_token_prompt_is_accepted_and_counted_unservable(tmp_path):
    data = write(tmp_path, "z.csv", HEADER_LINE + row(input_tokens=0) + row(request_id=1))
    assert [r.input_tokens for r in read_rows(data)] == [0, 512]
    proc = cli("replay", "--trace-data", data)
    assert proc.returncode == 0, proc.stderr
    assert '"dropped_unservable": 1' in proc.stdout


# --- YAML: duplicate keys, values PyYAML cannot build, aliases, syntax -------------------------


@pytest.mark.parametrize(
    ("what", "suffix", "content", "load"), YAML_FILES, ids=[w for w, *_ in YAML_FILES]
)
def test_duplicate_yaml_keys_name_the_key_and_both_lines(tmp_path, what, suffix, content, load):
    lines = content.splitlines(keepends=True)
    key = lines[0].split(b":")[0].strip()
    doubled = b"".join([lines[0], *lines[1:], lines[0]])
    message = refused(load, write(tmp_path, f"dup{suffix}", doubled))
    line = len(lines) + 1
    assert f"dup{suffix}' is not valid YAML" in message and what in message
    assert f"duplicate key {excerpt(yaml.safe_load(key))} at line {line}, column 1" in message
    assert "(first at line 1); a key may appear once in a mapping" in message


def test_duplicate_keys_nested_and_json(tmp_path):
    text = "cluster:\n  num_instances: 2\n  routing: {policy: least-loaded}\n  num_instances: 3\n"
    message = refused(load_yaml, text, "scenario", "s.yaml")
    assert "duplicate key 'num_instances' at line 4, column 3 (first at line 2)" in message
    # A merge key (`<<: *base`) may be overridden: that is not a duplicate.
    assert load_yaml("a: &b {x: 1}\nc: {<<: *b, x: 2}\n", "x") == {"a": {"x": 1}, "c": {"x": 2}}
    message = refused(load_json, '{"a": 1,\n "b": 2,\n "a": 3}', "model config", "c.json")
    assert "duplicate key 'a' in one object (a key on lines 1, 3)" in message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("d: 2024-13-45\n", "invalid timestamp value '2024-13-45' at line 1, column 4; a date"),
        ("n: !!int abc\n", "invalid int value 'abc'"),
        ("n: !!float x\n", "invalid float value 'x'"),
        ("n: " + "1" * 5000 + "\n", "invalid int value '1111"),
        ("b: !!binary 'a'\n", "failed to decode base64"),
        ("a: &a [*a]\n", "an alias refers to a node that contains it"),
        ("[" * 5000, "nested too deeply"),
        ("a: b\n c: d\n", "mapping values are not allowed here at line 2, column 3"),
        ("a: [1, 2\n", "at line 2, column 1"),
        ("a: \x01\n", "unacceptable character U+0001 at line 1, column 4"),
        ("a: !!python/object:os.system x\n", "could not determine a constructor"),
    ],
)
def test_yaml_problems_are_one_line_with_their_place(text, needle):
    message = refused(load_yaml, text, "scenario", "s.yaml")
    assert message.startswith("scenario: 's.yaml' is not valid YAML: ") and needle in message


def test_a_yaml_alias_bomb_is_refused_quickly():
    lines = ["a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]"]
    for prev, name in zip("abcdefg", "bcdefgh", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    message = refused(load_yaml, "\n".join(lines), "scenario", "bomb.yaml")
    assert "aliases expand the document by more than 1,000,000 nodes" in message
    # A few aliases are fine.
    assert load_yaml("a: &a [1, 2]\nb: [*a, *a]\n", "x") == {"a": [1, 2], "b": [[1, 2], [1, 2]]}


def test_json_problems_are_one_line_with_their_place():
    for text, needle in [
        ('{"a": 1,,}', "is not valid JSON: Expecting property name"),
        ('{"a": ' + "1" * 5000 + "}", "a number has more than 4,300 digits"),
        ("[" * 100_000, "nested too deeply"),
    ]:
        assert needle in refused(load_json, text, "model config", "c.json")


def test_read_yaml_of_an_empty_or_scalar_file(tmp_path):
    assert read_yaml(write(tmp_path, "e.yaml", b""), "x") is None
    message = refused(load_policy_bundle, write(tmp_path, "s.yaml", b"- a\n"))
    assert "policy bundle" in message and "must be a mapping" in message


# --- one line, always -------------------------------------------------------------------------


def test_a_servesim_error_is_always_one_line():
    """The safety net: a line break that reaches an error's text is folded, in the CLI and in
    Python alike (parsers are still expected to write one line; the fuzzers check that)."""
    exc = ConfigError("first line\n  second line\r\nthird\u2028fourth\n")
    assert str(exc) == "first line second line third fourth"
    assert str(ServesimError("plain")) == "plain"


class _Validated(BaseModel):
    name: str
    count: int = 0

    @field_validator("name")
    @classmethod
    def _check(cls, value: str) -> str:
        raise ValueError(f"bad name\n  {value}\n  expected: a short one")


def test_format_spec_error_is_one_short_line():
    try:
        _Validated.model_validate({"name": "x" * 10_000, "count": "y" * 10_000})
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError
        message = format_spec_error(exc, "spec\nfile.yaml")
    assert "\n" not in message and len(message) < 1000, message
    assert message.startswith("spec file.yaml: name: bad name") and "…" in message


def test_format_spec_error_lists_the_first_problems_and_counts_the_rest():
    class Many(BaseModel):
        items: list[int]

    try:
        Many.model_validate({"items": ["a"] * 1000})
    except Exception as exc:  # noqa: BLE001
        message = format_spec_error(exc, "w.yaml")
    assert "items[0]" in message and "… and 992 more problem(s)" in message
    assert len(message) < 1500


def test_csv_records_stream_and_report_malformed_csv(tmp_path):
    path = write(tmp_path, "r.csv", b"a,b\n1,2\n")
    assert list(csv_records(path, "t")) == [(1, ["a", "b"]), (2, ["1", "2"])]


def test_load_result_of_damaged_files(tmp_path):
    folder = tmp_path / "result"
    folder.mkdir()
    (folder / "summary.json").write_bytes(b'{"format": \xff}')
    assert "summary.json' line 1, column 12: invalid UTF-8" in refused(load_result, folder)
    (folder / "summary.json").write_bytes(b'{"format": "servesim-result"}')
    (folder / "requests.parquet").write_bytes(b"PAR1 not really")
    message = refused(load_result, folder)
    assert "requests.parquet" in message


def test_bundled_yaml_reads_every_shipped_file_as_the_pure_python_loader_does():
    """Start-up reads the shipped YAML with libyaml's loader (`bundled_yaml`); the pure-Python
    safe loader is the reference: every file under simulator/ must give the same document."""
    from simulator.input_files import bundled_yaml

    package = Path(__file__).resolve().parent.parent / "simulator"
    files = sorted(package.rglob("*.yaml"))
    assert len(files) >= 5  # defaults, gpus, model index, physics, parallel tables, prices
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert bundled_yaml(text) == yaml.safe_load(text), path


@given(text=st.text(min_size=0, max_size=300), limit=st.integers(min_value=2, max_value=120))
def test_a_shortened_path_keeps_its_start_and_its_file_name(text, limit):
    """`shorten(..., keep_end=True)` cuts the middle: the text when it fits; else no longer
    than the limit and the "…", starting as the text starts and ending as it ends."""
    from simulator.errors import shorten

    short = shorten(text, limit, keep_end=True)
    if len(text) <= limit:
        assert short == text
    else:
        half = limit // 2
        assert len(short) <= limit + 1 and "…" in short
        assert short.startswith(text[:half]) and short.endswith(text[len(text) - half :])
