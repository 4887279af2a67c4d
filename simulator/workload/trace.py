"""Request files: BLIS TraceV2/v3 (docs/behaviour.md §9.5) and the ground-truth vLLM request CSVs.

A TraceV2 is a YAML header plus a CSV with one row per request. servesim reads traces written
by BLIS (`blis run --trace-output`, `blis observe`) and by itself (`write_trace`), and replays
them (docs/behaviour.md §12.2). Version 3 — BLIS after March 2026, as its `run`, `replay` and
`observe` write it (docs/traces.md) — adds a `prefix_length` column after `prefix_group`, in
which case `input_tokens` counts only the tokens after the shared prefix, and the header keys
and optional columns of `blis observe`.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..atomic_io import replacing
from ..engine.request import Request, RequestState, group_prefix_tokens, prefix_key
from ..errors import ConfigError, counted, excerpt
from ..input_files import csv_header, csv_records, read_yaml_mapping
from ..limits import MAX_REQUESTS, MAX_TIME_US, MAX_TOKENS

TRACE_COLUMNS = [
    "request_id",
    "client_id",
    "tenant_id",
    "slo_class",
    "session_id",
    "round_index",
    "prefix_group",
    "streaming",
    "input_tokens",
    "output_tokens",
    "text_tokens",
    "image_tokens",
    "audio_tokens",
    "video_tokens",
    "reason_ratio",
    "model",
    "deadline_us",
    "server_input_tokens",
    "arrival_time_us",
    "send_time_us",
    "first_chunk_time_us",
    "last_chunk_time_us",
    "num_chunks",
    "status",
    "error_message",
    "finish_reason",
]
# A replayed row's request is named after the row's request_id (`requests_from_rows`), which an
# export of the replay writes back (`write_trace(keep_request_ids=True)`).
REPLAYED_ID_PREFIX = "request_"
# v3 inserts prefix_length right after prefix_group (BLIS tracev2.go, traceV2Columns).
TRACE_V3_COLUMNS = [
    *TRACE_COLUMNS[: TRACE_COLUMNS.index("prefix_group") + 1],
    "prefix_length",
    *TRACE_COLUMNS[TRACE_COLUMNS.index("prefix_group") + 1 :],
]
# Newer BLIS writes these only when they carry information (vllm_priority after slo_class,
# slo_target_us after deadline_us, the rest trailing); servesim finds every column by name.
OPTIONAL_COLUMNS = frozenset(
    {"vllm_priority", "slo_target_us", "x_request_id", "adapter", "think_time_us"}
)
# finish_reason arrived late in v2: 25-column files are still valid.
_REQUIRED_COLUMNS = frozenset(TRACE_COLUMNS[:-1])
_KNOWN_COLUMNS = frozenset(TRACE_V3_COLUMNS) | OPTIONAL_COLUMNS

TRACE_VERSIONS = (2, 3)
# run/replay write "microseconds", observe writes "us"; BLIS reads both as µs.
TIME_UNITS = ("microseconds", "us")
HEADER_KEYS = {
    "trace_version",
    "time_unit",
    "created_at",
    "mode",
    "warm_up_requests",
    "workload_spec",
    "server",
    "network",
}
# BLIS decodes every version into one struct with unknown keys rejected, so the keys that
# came with v3 are valid in any version.
HEADER_KEYS_V3 = {
    "goodput_slo_targets",
    "workload_seed",
    "session_context_growth",
    "kv_offload",
    "observed_kv_metrics",
}
SERVER_KEYS = {
    "type",
    "model",
    "tensor_parallel",
    "max_num_seqs",
    "block_size",
    "gpu_memory_utilization",
    "max_model_len",
}
NETWORK_KEYS = {"measured_rtt_ms"}
# The sections servesim accepts and does not model; their keys are BLIS's (f90a1e3a), so a
# typo is still an error.
SLO_TARGET_KEYS = {"ttft_ms", "itl_ms", "e2e_ms"}
KV_OFFLOAD_KEYS = {
    "cpu_bytes_to_use",
    "per_block_bytes",
    "block_size",
    "blocks_per_chunk",
    "tokens_per_hash",
    "eviction_policy",
    "offload_prompt_only",
    "self_describing_kv_events",
    "secondary_tiers",
}
OBSERVED_KV_KEYS = {
    "source",
    "hit_rate",
    "block_hits",
    "block_queries",
    "read_time_total",
    "write_time_total",
    "vllm_commit",
}
SESSION_CONTEXT_GROWTH = ("accumulate",)
MODES = ("real", "generated", "replayed")
STATUSES = ("ok", "error", "timeout", "incomplete")
# BLIS replay of a v2 trace gives every request of a prefix group the same fixed-length prefix.
REPLAY_PREFIX_TOKENS = 50

GROUNDTRUTH_COLUMNS = [
    "index",
    "arrival_time_us",
    "input_tokens",
    "output_tokens",
    "prefix_group",
    "has_error",
    "ttft_s",
    "e2e_s",
]
_GROUNDTRUTH_REQUIRED = ("index", "arrival_time_us", "input_tokens", "output_tokens")
_GROUNDTRUTH_MEASURED = ("has_error", "ttft_s", "e2e_s")
# A ground-truth index only names its request; it must fit the int64 columns of results.
_MAX_INDEX = 2**63 - 1
# vllm_priority is a Go int in BLIS: any int64.
_MAX_PRIORITY = 2**63 - 1


@dataclass
class TraceRow:
    request_id: str
    arrival_time_us: int
    input_tokens: int
    output_tokens: int
    client_id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    prefix_group: str = ""
    model: str = ""
    deadline_us: int = 0
    first_chunk_time_us: int = 0
    last_chunk_time_us: int = 0
    status: str = "ok"
    session_id: str = ""
    round_index: int = 0
    # None when the file has no prefix_length column (v2): replay then uses 50 tokens.
    prefix_length: int | None = None
    streaming: bool = False
    text_tokens: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0
    video_tokens: int = 0
    reason_ratio: float = 0.0
    server_input_tokens: int = 0
    send_time_us: int = 0
    num_chunks: int = 0
    error_message: str = ""
    finish_reason: str = ""
    # Optional columns of newer BLIS (0 / "" / None when the file has none). Replay has no
    # place for them on a request yet; they are read so that the values are checked.
    vllm_priority: int = 0
    slo_target_us: int = 0
    x_request_id: str = ""
    adapter: str = ""
    think_time_us: int | None = None

    @property
    def replay_input_tokens(self) -> int:
        """The prompt tokens replay gives this row (after any group prefix), BLIS's
        `effectiveInputTokenCount`: the server's own count when it recorded one and the row
        has no prefix group (observe traces: it includes the chat template), else
        input_tokens (a group row's server count includes the prefix that replay prepends)."""
        if self.server_input_tokens > 0 and not self.prefix_group:
            return self.server_input_tokens
        return self.input_tokens

    @property
    def injection_basis_us(self) -> int:
        """BLIS's `injectionTime`: send_time_us when positive, else arrival_time_us."""
        return self.send_time_us if self.send_time_us > 0 else self.arrival_time_us


@dataclass(frozen=True)
class GroundTruthRow:
    """One measured request of a ground-truth run (times as the client saw them)."""

    index: int
    arrival_time_us: int
    input_tokens: int
    output_tokens: int
    has_error: bool = False
    ttft_s: float | None = None
    e2e_s: float | None = None


# ---------------------------------------------------------------------------------- reading


def read_header(path: str | Path) -> dict:
    p = Path(path)
    data = read_yaml_mapping(p, "trace header")
    where = f"trace header {str(p)!r}"
    extra = set(data) - HEADER_KEYS - HEADER_KEYS_V3
    if extra:
        raise ConfigError(
            f"{where}: unknown key(s) {_keys(extra)}; "
            f"valid: {', '.join(sorted(HEADER_KEYS | HEADER_KEYS_V3))}"
        )
    version = data.get("trace_version")
    if version not in TRACE_VERSIONS or isinstance(version, bool):
        raise ConfigError(
            f"{where}: trace_version: invalid value {excerpt(version)}; must be 2 or 3"
        )
    unit = data.get("time_unit", "microseconds")
    if unit not in TIME_UNITS:
        raise ConfigError(
            f"{where}: time_unit: invalid value {excerpt(unit)}; must be microseconds or us"
        )
    mode = data.get("mode", "generated")
    if mode not in MODES:
        raise ConfigError(f"{where}: mode: invalid value {excerpt(mode)}; must be one of {MODES}")
    warm = data.get("warm_up_requests", 0)
    if not isinstance(warm, int) or isinstance(warm, bool) or warm < 0:
        raise ConfigError(
            f"{where}: warm_up_requests: invalid value {excerpt(warm)}; must be an integer >= 0"
        )
    seed = data.get("workload_seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ConfigError(
            f"{where}: workload_seed: invalid value {excerpt(seed)}; must be an integer"
        )
    growth = data.get("session_context_growth")
    if growth not in (None, "", *SESSION_CONTEXT_GROWTH):
        raise ConfigError(
            f"{where}: session_context_growth: invalid value {excerpt(growth)}; "
            "must be accumulate or absent"
        )
    for key, valid in (
        ("server", SERVER_KEYS),
        ("network", NETWORK_KEYS),
        ("kv_offload", KV_OFFLOAD_KEYS),
        ("observed_kv_metrics", OBSERVED_KV_KEYS),
    ):
        _check_section(where, key, data.get(key), valid)
    rtt = (data.get("network") or {}).get("measured_rtt_ms")
    if rtt is not None and (
        isinstance(rtt, bool) or not isinstance(rtt, int | float) or not 0 <= rtt < math.inf
    ):
        # A round trip is added to every simulated latency compared with this trace.
        raise ConfigError(
            f"{where}: network.measured_rtt_ms: invalid value {excerpt(rtt)}; must be a "
            "number >= 0 (ms), as --rtt-ms"
        )
    targets = data.get("goodput_slo_targets") or {}
    if not isinstance(targets, dict):
        raise ConfigError(
            f"{where}: goodput_slo_targets: must be a mapping of SLO class to "
            f"{{{', '.join(sorted(SLO_TARGET_KEYS))}}}"
        )
    for slo_class, dims in targets.items():
        name = f"goodput_slo_targets.{excerpt(slo_class, 40)}"
        _check_section(where, name, dims, SLO_TARGET_KEYS)
        for dim, value in (dims or {}).items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(
                    f"{where}: {name}.{dim}: invalid value {excerpt(value)}; "
                    "must be a number >= 0 (ms)"
                )
    return data


def _check_section(where: str, key: str, section: object, valid: set[str]) -> None:
    if not section:
        return
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: {key}: must be a mapping with keys {sorted(valid)}")
    if set(section) - valid:
        raise ConfigError(
            f"{where}: {key}: unknown key(s) {_keys(set(section) - valid)}; "
            f"valid: {', '.join(sorted(valid))}"
        )


def _keys(keys: Iterable[object], most: int = 5) -> str:
    """Keys of any type (a YAML key may be null or a number) for a message, excerpted."""
    shown = sorted(keys, key=repr)
    text = ", ".join(excerpt(k, 40) for k in shown[:most])
    return f"[{text}{f', … ({len(shown) - most} more)' if len(shown) > most else ''}]"


def _csv_header(path: Path, kind: str) -> list[str]:
    return [name.strip() for name in csv_header(path, kind)]


def _records(path: Path, kind: str, width: int) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each non-empty data line after the header; every line must
    have `width` fields."""
    with contextlib.closing(csv_records(path, kind)) as records:
        next(records, None)
        for line, rec in records:
            if not rec:
                continue
            if len(rec) != width:
                raise ConfigError(
                    f"{kind}: {str(path)!r} line {line}: {len(rec)} columns, expected {width} "
                    "(as many as the header)"
                )
            yield line, rec


# TraceRow's integer fields and their bounds, what the simulator represents (simulator/
# limits.py): (maximum, minimum, required). prefix_length and think_time_us, optional and
# read apart (an absent column is None), have `_OPTIONAL_INT_MAXIMA`.
_INT_FIELDS = {
    "arrival_time_us": (MAX_TIME_US, 0, True),
    "input_tokens": (MAX_TOKENS, 0, True),
    "output_tokens": (MAX_TOKENS, 0, True),
    "deadline_us": (MAX_TIME_US, 0, False),
    # A chunk time is a time on the run's clock or the wall clock, 0 when no token came: a
    # negative one is a damaged row, and on a completed row it was dropped without a word
    # (calibrate fitted on 199 of 200) while a first chunk before the send was refused.
    "first_chunk_time_us": (MAX_TIME_US, 0, False),
    "last_chunk_time_us": (MAX_TIME_US, 0, False),
    "round_index": (MAX_REQUESTS, 0, False),
    "text_tokens": (MAX_TOKENS, 0, False),
    "image_tokens": (MAX_TOKENS, 0, False),
    "audio_tokens": (MAX_TOKENS, 0, False),
    "video_tokens": (MAX_TOKENS, 0, False),
    "server_input_tokens": (MAX_TOKENS, 0, False),
    # A send is a time on the run's clock or the wall clock, never before either starts; 0 is
    # a request that never went out (`injection_basis_us`), so a negative one would read as a
    # send that happened before 1970 and move every other request by decades.
    "send_time_us": (MAX_TIME_US, 0, False),
    "num_chunks": (MAX_TOKENS, 0, False),
    "vllm_priority": (_MAX_PRIORITY, 0, False),
    "slo_target_us": (MAX_TIME_US, 0, False),
}
_OPTIONAL_INT_MAXIMA = {"prefix_length": MAX_TOKENS, "think_time_us": MAX_TIME_US}
# Go's strconv.ParseBool spellings (BLIS writes true/false).
_BOOL_SPELLINGS = {
    **dict.fromkeys(("", "0", "f", "F", "false", "False", "FALSE"), False),
    **dict.fromkeys(("1", "t", "T", "true", "True", "TRUE"), True),
}


class _Fields:
    """Typed access to one CSV record, with errors that name file, line and column."""

    def __init__(self, kind: str, path: Path, line: int, col: dict[str, int], rec: list[str]):
        self.kind, self.path, self.line, self.col, self.rec = kind, path, line, col, rec

    def fail(self, column: str, value: object, allowed: str) -> ConfigError:
        return ConfigError(
            f"{self.kind}: {str(self.path)!r} line {self.line}: column {column}: "
            f"invalid value {excerpt(value)}; {allowed}"
        )

    def text(self, column: str) -> str:
        i = self.col.get(column)
        return self.rec[i].strip() if i is not None else ""

    def as_int(self, column: str, maximum: int, *, required: bool = False, minimum: int = 0) -> int:
        """An integer in [minimum, maximum]: the bounds are what the simulator represents
        (simulator/limits.py), so a larger value is refused here, not overflowed later."""
        raw = self.text(column)
        allowed = f"must be an integer >= {minimum} and <= {maximum}"
        if not raw:
            if required:
                raise self.fail(column, raw, allowed)
            return 0
        # Python refuses to convert integers of more than 4,300 digits; none is in range.
        if len(raw) > 40:
            raise self.fail(column, raw, allowed)
        # Decimal digits only, as BLIS's Go parser reads them (Python's int() would also take
        # "1_000", " 5" and other scripts' digits, and float() "1e3"); "512.0" is accepted,
        # as pandas writes integers that way, and "1.5" refused.
        match = _PLAIN_INTEGER.fullmatch(raw)
        if match is None:
            raise self.fail(column, raw, allowed)
        value = int(match.group(1))
        if not minimum <= value <= maximum:
            raise self.fail(column, raw, allowed)
        return value

    def as_float(self, column: str, lo: float, hi: float) -> float:
        raw = self.text(column)
        if not raw:
            return 0.0
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(column, raw, "must be a number") from None
        if not lo <= value <= hi:
            raise self.fail(column, raw, f"must be in [{lo}, {hi}]")
        return value

    def optional_duration_s(self, column: str) -> float | None:
        """A measured duration in seconds: empty (not measured), or a finite number >= 0."""
        raw = self.text(column)
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(column, raw, "must be a number of seconds >= 0") from None
        if not (math.isfinite(value) and value >= 0):
            raise self.fail(column, raw, "must be a finite number of seconds >= 0")
        return value

    def as_bool(self, column: str) -> bool:
        raw = self.text(column)
        value = _BOOL_SPELLINGS.get(raw)
        if value is None:
            raise self.fail(column, raw, "must be true or false")
        return value

    def bounded_int(self, column: str) -> int:
        """`as_int` with the column's bounds (`_INT_FIELDS`)."""
        maximum, minimum, required = _INT_FIELDS[column]
        return self.as_int(column, maximum, required=required, minimum=minimum)


def _names(names: list[str], most: int = 5) -> str:
    """Column names from a file for a message: each excerpted, at most `most` of them (an
    unclosed quote can make one name of the whole file)."""
    shown = ", ".join(
        n if n.isprintable() and len(n) <= 40 else excerpt(n, 40) for n in names[:most]
    )
    return shown + (f", … ({len(names) - most} more)" if len(names) > most else "")


def _trace_columns(path: Path, header: list[str]) -> dict[str, int]:
    missing = sorted(_REQUIRED_COLUMNS - set(header), key=TRACE_V3_COLUMNS.index)
    unknown = [name for name in header if name not in _KNOWN_COLUMNS]
    duplicated = sorted({name for name in header if header.count(name) > 1})
    if missing or unknown or duplicated:
        problems = []
        if missing:
            problems.append(f"missing column(s) {', '.join(missing)}")
        if unknown:
            problems.append(f"unknown column(s) {_names(unknown)}")
        if duplicated:
            problems.append(f"repeated column(s) {_names(duplicated)}")
        raise ConfigError(
            f"trace data: {str(path)!r}: CSV header does not match TraceV2: "
            f"{'; '.join(problems)}; expected columns "
            f"{','.join(TRACE_COLUMNS)} (v3 adds prefix_length after prefix_group)"
        )
    return {name: i for i, name in enumerate(header)}


def read_rows(path: str | Path) -> list[TraceRow]:
    """Rows of a TraceV2 or v3 CSV (columns found by name), validated as BLIS validates them.

    The file is read in chunks of `_CHUNK_ROWS` records. A chunk whose every value is plainly
    valid is converted a column at a time (`_rows_by_column`); any other chunk goes through
    the row-by-row reference (`_rows_one_by_one`), which reports the first problem in file
    order, so the rows and the errors are the reference's either way (tests/workload/
    test_trace_read.py checks both on random files)."""
    p = Path(path)
    kind = "trace data"
    header = _csv_header(p, kind)
    col = _trace_columns(p, header)
    has_prefix_length = "prefix_length" in col
    # BLIS tells a recorded 0 from an absent think time (#1608): empty stays None.
    has_think_time = "think_time_us" in col
    rows: list[TraceRow] = []
    first_line: dict[str, int] = {}  # request_id -> the line that used it first
    for chunk, unreadable in _chunks(_records(p, kind, len(header))):
        if unreadable is not None:
            # The records before a line that cannot be read are checked first, as they are
            # when the file is read record by record.
            _rows_one_by_one(p, chunk, col, has_prefix_length, has_think_time, first_line)
            raise unreadable
        fast = _rows_by_column(chunk, col, first_line)
        if fast is None:
            fast = _rows_one_by_one(p, chunk, col, has_prefix_length, has_think_time, first_line)
        rows += fast
    return rows


# Records converted at a time: the raw strings of a chunk are held at once (a million-row
# trace's would take gigabytes).
_CHUNK_ROWS = 1 << 13


def _chunks(
    records: Iterator[tuple[int, list[str]]],
) -> Iterator[tuple[list[tuple[int, list[str]]], ConfigError | None]]:
    """`records` in lists of up to `_CHUNK_ROWS`; a record that cannot be read ends the last
    list, which comes with the error."""
    chunk: list[tuple[int, list[str]]] = []
    try:
        for record in records:
            chunk.append(record)
            if len(chunk) == _CHUNK_ROWS:
                yield chunk, None
                chunk = []
    except ConfigError as exc:
        yield chunk, exc
        return
    if chunk:
        yield chunk, None


def _rows_one_by_one(
    p: Path,
    records: list[tuple[int, list[str]]],
    col: dict[str, int],
    has_prefix_length: bool,
    has_think_time: bool,
    first_line: dict[str, int],
) -> list[TraceRow]:
    """The reference: each record checked and converted field by field, in the order of
    TraceRow's fields, the first problem raised with its line and column."""
    kind = "trace data"
    rows = []
    for line, rec in records:
        f = _Fields(kind, p, line, col, rec)
        row = TraceRow(
            request_id=f.text("request_id"),
            arrival_time_us=f.bounded_int("arrival_time_us"),
            input_tokens=f.bounded_int("input_tokens"),
            output_tokens=f.bounded_int("output_tokens"),
            client_id=f.text("client_id"),
            tenant_id=f.text("tenant_id"),
            slo_class=f.text("slo_class"),
            prefix_group=f.text("prefix_group"),
            model=f.text("model"),
            deadline_us=f.bounded_int("deadline_us"),
            first_chunk_time_us=f.bounded_int("first_chunk_time_us"),
            last_chunk_time_us=f.bounded_int("last_chunk_time_us"),
            status=f.text("status"),
            session_id=f.text("session_id"),
            round_index=f.bounded_int("round_index"),
            prefix_length=(
                f.as_int("prefix_length", _OPTIONAL_INT_MAXIMA["prefix_length"])
                if has_prefix_length
                else None
            ),
            streaming=f.as_bool("streaming"),
            text_tokens=f.bounded_int("text_tokens"),
            image_tokens=f.bounded_int("image_tokens"),
            audio_tokens=f.bounded_int("audio_tokens"),
            video_tokens=f.bounded_int("video_tokens"),
            reason_ratio=f.as_float("reason_ratio", 0.0, 1.0),
            server_input_tokens=f.bounded_int("server_input_tokens"),
            send_time_us=f.bounded_int("send_time_us"),
            num_chunks=f.bounded_int("num_chunks"),
            error_message=f.text("error_message"),
            finish_reason=f.text("finish_reason"),
            vllm_priority=f.bounded_int("vllm_priority"),
            slo_target_us=f.bounded_int("slo_target_us"),
            x_request_id=f.text("x_request_id"),
            adapter=f.text("adapter"),
            think_time_us=(
                f.as_int("think_time_us", _OPTIONAL_INT_MAXIMA["think_time_us"])
                if has_think_time and f.text("think_time_us")
                else None
            ),
        )
        if not row.request_id:
            raise f.fail("request_id", "", "must not be empty")
        # Two rows with one ID would become two requests with one name (results, decision
        # logs and the prefix cache key requests by it): a corrupt or concatenated trace.
        seen = first_line.setdefault(row.request_id, line)
        if seen != line:
            raise f.fail(
                "request_id", row.request_id, f"already used on line {seen}; IDs must be unique"
            )
        # A deadline before arrival would time the request out on arrival: a corrupt trace.
        if 0 < row.deadline_us < row.arrival_time_us:
            raise f.fail(
                "deadline_us", row.deadline_us, f"precedes arrival_time_us {row.arrival_time_us}"
            )
        rows.append(row)
    return rows


_TRACE_ROW_FIELDS = [field.name for field in dataclasses.fields(TraceRow)]


def _plain_digits(strings: Sequence[str]) -> bool:
    """No value `int` would read but the reference refuses: digit separators ("1_000") or
    another script's digits (the reference takes ASCII decimal digits only)."""
    joined = "".join(strings)
    return joined.isascii() and "_" not in joined


def _rows_by_column(
    records: list[tuple[int, list[str]]], col: dict[str, int], first_line: dict[str, int]
) -> list[TraceRow] | None:
    """`_rows_one_by_one`'s rows, built a column at a time, or None (nothing changed) when a
    value is anything but plainly valid: an empty or non-integer integer field ("512.0"
    included), a value out of range or longer than 40 characters, an unknown boolean
    spelling, a ratio outside [0, 1], an empty or repeated request_id or a deadline before
    its arrival. What it accepts, it converts as the reference does: `int` and `float` ignore
    the surrounding whitespace the reference strips, so the values are the same."""
    n = len(records)
    columns = list(zip(*(rec for _line, rec in records), strict=True))

    def raw(name: str) -> tuple[str, ...] | None:
        i = col.get(name)
        return columns[i] if i is not None else None

    values: dict[str, list] = {}
    for name, (maximum, minimum, _required) in _INT_FIELDS.items():
        strings = raw(name)
        if strings is None:  # an optional column the file does not have (required ones it has)
            values[name] = [0] * n
            continue
        if max(map(len, strings)) > 40 or not _plain_digits(strings):
            return None
        try:
            numbers = list(map(int, strings))
        except ValueError:
            return None
        if min(numbers) < minimum or max(numbers) > maximum:
            return None
        values[name] = numbers
    for name in _OPTIONAL_INT_MAXIMA:
        strings = raw(name)
        if strings is None:  # a v2 file (prefix_length), or no think times recorded
            values[name] = [None] * n
            continue
        stripped = [x.strip() for x in strings]
        if max(map(len, stripped)) > 40 or not _plain_digits(stripped):
            return None
        try:
            numbers = [int(x) if x else None for x in stripped]
        except ValueError:
            return None
        if name == "prefix_length" and None in numbers:
            return None  # an empty prefix_length reads as 0, not None: the reference's
        present = [v for v in numbers if v is not None]
        if present and (min(present) < 0 or max(present) > _OPTIONAL_INT_MAXIMA[name]):
            return None
        values[name] = numbers
    streaming = raw("streaming")
    if streaming is None:
        values["streaming"] = [False] * n
    else:
        try:
            values["streaming"] = [_BOOL_SPELLINGS[x.strip()] for x in streaming]
        except KeyError:
            return None
    ratios = raw("reason_ratio")
    if ratios is None:
        values["reason_ratio"] = [0.0] * n
    else:
        try:
            numbers = [float(x) if x.strip() else 0.0 for x in ratios]
        except ValueError:
            return None
        if not all(0.0 <= v <= 1.0 for v in numbers):
            return None
        values["reason_ratio"] = numbers
    for name in _TRACE_ROW_FIELDS:
        if name not in values:
            strings = raw(name)
            values[name] = [x.strip() for x in strings] if strings is not None else [""] * n
    ids = values["request_id"]
    if not all(ids) or len(set(ids)) < n or not first_line.keys().isdisjoint(ids):
        return None
    arrivals = values["arrival_time_us"]
    if any(0 < d < a for d, a in zip(values["deadline_us"], arrivals, strict=True)):
        return None
    first_line.update(zip(ids, (line for line, _rec in records), strict=True))
    return list(map(TraceRow, *(values[name] for name in _TRACE_ROW_FIELDS)))


def injection_origin_shift(rows: list[TraceRow]) -> int:
    """What replay subtracts from every row's injection basis (send_time_us when positive,
    else arrival_time_us): min(basis) − min(arrival_time_us), BLIS's `injectionOriginShift`
    (inference-sim #1606); both minima over the rows that were sent when some were not.

    `blis observe` writes send_time_us as Unix-epoch µs but arrival_time_us and deadline_us
    on a clock that starts with the run; the shift puts injection back on that clock (the
    first send lands at the first arrival) while keeping the spacing of the sends, which
    carries how far the client fell behind. A simulated trace has send == arrival, so the
    shift is 0 and its requests arrive exactly when they did."""
    if not rows:
        return 0
    if _mixes_clocks([r.send_time_us for r in rows]):
        # Over the rows that record a send: a row with send_time_us 0 among wall-clock sends
        # (a request that never went out) is on the arrival clock, and mixing it in would put
        # every other row decades late (BLIS's formula does), or, if it was scheduled first,
        # every sent row before its own scheduled arrival.
        sent = [r for r in rows if r.send_time_us > 0]
        return min(r.send_time_us for r in sent) - min(r.arrival_time_us for r in sent)
    return min(r.injection_basis_us for r in rows) - min(r.arrival_time_us for r in rows)


def refuse_decreasing_times(row: TraceRow, sent_us: int, where: str) -> None:
    """A completed request's recorded times run forward (sent, first chunk, last chunk);
    anything else is a damaged row, refused before it becomes a negative latency."""
    if not sent_us <= row.first_chunk_time_us <= row.last_chunk_time_us:
        raise ConfigError(
            f"{where}, request {row.request_id}: sent at {sent_us} µs, first chunk at "
            f"{row.first_chunk_time_us} µs, last at {row.last_chunk_time_us} µs; a completed "
            "request's times must not decrease"
        )


def _mixes_clocks(sends: Sequence[int]) -> bool:
    """Wall-clock sends (`observe`) beside rows without a send. (On a run's own clock a send
    of 0 is simply the run's first instant, as in BLIS's own traces.)"""
    return 0 in sends and max(sends) >= _EPOCH_LIKE_US


def never_sent(rows: Sequence[TraceRow]) -> list[bool]:
    """Which rows record a request that never went out: send_time_us 0 among wall-clock sends.
    Such a row's only time (arrival_time_us) is on the run's clock, not the wall clock its
    neighbours' sends and chunks are on, so no span may mix it with them."""
    if not _mixes_clocks([r.send_time_us for r in rows]):
        return [False] * len(rows)
    return [r.send_time_us == 0 for r in rows]


def injection_times_us(rows: list[TraceRow], shift: int) -> list[int]:
    """When a replay injects each row: its injection basis (send_time_us when positive, else
    arrival_time_us) less the origin shift (`injection_origin_shift`); in a trace that mixes
    wall-clock sends with rows that were never sent, those rows at their arrival time, which
    is on the run's clock."""
    if not _mixes_clocks([r.send_time_us for r in rows]):
        return [r.injection_basis_us - shift for r in rows]
    return [r.send_time_us - shift if r.send_time_us > 0 else r.arrival_time_us for r in rows]


def requests_from_rows(rows: list[TraceRow]) -> list[Request]:
    """Rebuild requests from trace rows as BLIS replay does (fixed session mode): injection
    time, lengths, deadline, tags.

    A request arrives at its row's send_time_us (arrival_time_us when that is 0) minus
    `injection_origin_shift`. Its prompt is `replay_input_tokens` (the server's own count
    when recorded), after its group's shared prefix when the row has a prefix_group (BLIS
    replay.go prepends it). The group's length is the first positive prefix_length of the
    group (v3) or 50 tokens when the file has no prefix_length column (v2); a v3 group whose
    rows all say 0 shares nothing, as in BLIS. The deadline stays on the arrival clock, as
    in BLIS. Sessions are replayed open-loop: every row is injected at its own time.
    """
    group_tokens: dict[str, int] = {}
    for row in rows:
        if row.prefix_group and row.prefix_group not in group_tokens:
            length = REPLAY_PREFIX_TOKENS if row.prefix_length is None else row.prefix_length
            if length > 0:
                group_tokens[row.prefix_group] = length
    shift = injection_origin_shift(rows)
    injection_us = injection_times_us(rows, shift)
    id_counts = Counter(row.request_id for row in rows)
    requests = []
    for i, row in enumerate(rows):
        rid = f"{REPLAYED_ID_PREFIX}{row.request_id}"
        shared = group_tokens.get(row.prefix_group, 0) if row.prefix_group else 0
        own = row.replay_input_tokens
        if shared + own > MAX_TOKENS:
            raise ConfigError(
                f"trace data: request_id {excerpt(row.request_id)}: prefix_length {shared} of "
                f"group {excerpt(row.prefix_group)} + input_tokens {own} is "
                f"beyond the simulator's prompt size; a prompt may be at most {MAX_TOKENS} tokens"
            )
        arrival_us = injection_us[i]
        if arrival_us > MAX_TIME_US:
            # Only when sends precede arrivals by more than the clock holds: a corrupt trace.
            raise ConfigError(
                f"trace data: request_id {excerpt(row.request_id)}: injection time "
                f"{arrival_us} µs (send_time_us {row.send_time_us} re-based by {-shift}) is "
                f"beyond the simulator's clock; times may be at most {MAX_TIME_US} µs"
            )
        segments = None
        if shared:
            segments = [(prefix_key(row.prefix_group), shared)]
            if own:
                segments.append((("req", rid), own))
        requests.append(
            Request(
                rid,
                arrival_us,
                shared + own,
                row.output_tokens,
                index=i,
                deadline_us=row.deadline_us,
                segments=segments,
                slo_class=row.slo_class,
                tenant_id=row.tenant_id,
                model=row.model,
                client_id=row.client_id,
                session_id=row.session_id,
                round_index=row.round_index,
                prefix_group=row.prefix_group,
                streaming=row.streaming,
                text_tokens=row.text_tokens,
                image_tokens=row.image_tokens,
                audio_tokens=row.audio_tokens,
                video_tokens=row.video_tokens,
                reason_ratio=row.reason_ratio,
                adapter=row.adapter,
            )
        )
        if id_counts[row.request_id] == 1:
            # Its own tokens are named by its ID alone (the KV cache defers hashing them).
            requests[-1].private_from_token = shared
    return requests


@dataclass(frozen=True)
class TraceSpans:
    """How long a trace's client took to send what it scheduled (µs, on the file's clocks)."""

    rows: int
    first_arrival_us: int
    last_arrival_us: int
    first_send_us: int  # injection basis: send_time_us when positive, else arrival_time_us
    last_send_us: int
    # The most requests outstanding at once (sent, last chunk not yet received) when the
    # trace records completions (last_chunk_time_us), else 0.
    max_in_flight: int = 0
    # Rows `servesim observe` marks as never having gone out (`never_went_out`).
    not_sent: int = 0

    @property
    def scheduled_span_us(self) -> int:
        return self.last_arrival_us - self.first_arrival_us

    @property
    def send_span_us(self) -> int:
        return self.last_send_us - self.first_send_us

    @property
    def client_fell_behind(self) -> bool:
        """Did the client take noticeably longer to send than it scheduled (more than
        CLIENT_BEHIND_TOLERANCE)? A closed-loop load generator does when the server saturates:
        it can only send as fast as responses come back."""
        scheduled = self.scheduled_span_us
        return bool(scheduled) and self.send_span_us > scheduled * (1 + CLIENT_BEHIND_TOLERANCE)


# How much longer than scheduled a client may take to send before it counts as behind: the
# unsaturated cells of the vLLM 0.23 sweep are within 0.01 %, the saturated ones 4.7 % and more.
CLIENT_BEHIND_TOLERANCE = 0.02


def trace_spans(path: str | Path) -> TraceSpans:
    """The arrival and send spans of a TraceV2/v3 CSV, reading only those two columns (a
    quick look at a large trace; `read_rows` checks every column)."""
    p = Path(path)
    kind = "trace data"
    header = _csv_header(p, kind)
    col = _trace_columns(p, header)
    arrivals, recorded_sends, ends = [], [], []
    not_sent = 0
    for line, rec in _records(p, kind, len(header)):
        f = _Fields(kind, p, line, col, rec)
        arrivals.append(f.bounded_int("arrival_time_us"))
        recorded_sends.append(f.bounded_int("send_time_us"))
        ends.append(f.bounded_int("last_chunk_time_us"))
        not_sent += never_went_out(f.text("status"), f.text("error_message"))
    if not arrivals:
        return TraceSpans(0, 0, 0, 0, 0)
    if _mixes_clocks(recorded_sends):
        # The client's spans over the rows it sent (a row with send 0 never went out, and its
        # arrival time is on another clock than an observe trace's wall-clock sends).
        sent = [(s, e) for s, e in zip(recorded_sends, ends, strict=True) if s > 0]
        sends, ends = [s for s, _e in sent], [e for _s, e in sent]
    else:
        sends = [s if s > 0 else a for s, a in zip(recorded_sends, arrivals, strict=True)]
    return TraceSpans(
        len(arrivals),
        min(arrivals),
        max(arrivals),
        min(sends),
        max(sends),
        _most_outstanding(sends, ends),
        not_sent,
    )


# How `servesim observe` begins the error message of a request that never went out (its
# connection failed, or its deadline passed first); its send_time_us is 0.
NOT_SENT_PREFIX = "not sent:"


def never_went_out(status: str, error_message: str) -> bool:
    """Whether a row is one `servesim observe` recorded as never having gone out."""
    return status != "ok" and error_message.startswith(NOT_SENT_PREFIX)


def not_streamed(header: dict[str, Any], row: Any) -> bool:
    """Whether a row of a recorded trace (`mode: real`) has no measured TTFT because the
    client did not stream the answer (`streaming` false): its first chunk is then the first
    byte of the whole body, so first chunk − send is E2E, not TTFT, and an ITL taken from it
    is about 0. A simulated or generated trace's times are the simulator's, streamed or not."""
    return header.get("mode", "generated") == "real" and not row.streaming


def _most_outstanding(sends: list[int], ends: list[int]) -> int:
    """The most requests between send and last chunk at any instant (0 when no row records
    its last chunk): a completion at the very instant of a send frees its slot first."""
    events = [(end, -1) for end in ends if end > 0]
    if not events:
        return 0
    events += [(send, 1) for send, end in zip(sends, ends, strict=True) if end > 0]
    events.sort()
    outstanding = most = 0
    for _time, change in events:
        outstanding += change
        most = max(most, outstanding)
    return most


@dataclass(frozen=True)
class ClientReplay:
    """How a replay sends a recorded trace's requests: at the recorded send times (BLIS's
    replay), or at the scheduled times through a client that allows at most `max_in_flight`
    outstanding requests, and why."""

    at_schedule: bool
    max_in_flight: int | None
    source: str
    # The trace's spans when deciding read them (`recorded_client`), for other readers of the
    # same file (`trace_notes`): a million-row trace takes seconds to scan.
    spans: TraceSpans | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def replay_choice(self) -> int | str:
        """`api.replay`'s max_in_flight that replays this way: the cap (at the scheduled
        times), or "off" (at the send times)."""
        return self.max_in_flight if self.max_in_flight is not None else "off"

    def line(self) -> str:
        """`client: ...`, as the commands print it."""
        if self.max_in_flight is None:
            how = "at the scheduled times" if self.at_schedule else "at the recorded send times"
            return f"client: {how} ({self.source})"
        return (
            f"client: at the scheduled times, at most {self.max_in_flight:,} requests "
            f"outstanding ({self.source})"
        )


def recorded_client(data_path: str | Path) -> ClientReplay:
    """What a recorded client did, for its replay.

    A load generator that caps its outstanding requests falls behind its schedule once the
    server saturates: it sends only as fast as responses return. Replaying the send times
    then imposes the real server's throughput on the simulated one (circular, and a simulated
    server a few percent faster drains the queue the real one had). So when the trace's
    client fell behind (TraceSpans.client_fell_behind) and the trace records completions,
    replay sends at the scheduled times through the same cap, the most requests the client
    ever had outstanding; otherwise at the send times, as BLIS does."""
    p = Path(data_path)
    if "request_id" not in set(_csv_header(p, "trace data")):
        return ClientReplay(False, None, "a request file without send times")
    return client_of(trace_spans(p))


def client_of(spans: TraceSpans) -> ClientReplay:
    """`recorded_client` of a trace whose spans are already read."""
    if spans.client_fell_behind and spans.max_in_flight > 0:
        late = spans.send_span_us / spans.scheduled_span_us - 1
        return ClientReplay(
            True,
            spans.max_in_flight,
            f"the recorded client sent {late:.0%} later than scheduled with at most "
            f"{counted(spans.max_in_flight, 'request')} outstanding",
            spans,
        )
    return ClientReplay(False, None, "the recorded client kept to its schedule", spans)


_PLAIN_INTEGER = re.compile(r"([+-]?[0-9]+)(?:\.0*)?", re.ASCII)
# A send time past 2001-09-09 in µs since 1970 is a wall-clock reading, not a run's clock.
_EPOCH_LIKE_US = 10**15
# What replay does with the recorded information it has no model for (header key or column).
IGNORED_HEADER_KEYS = {
    "kv_offload": "the recorded KV offload configuration is not modelled (servesim's CPU "
    "tier is --kv-cpu-blocks)",
    "observed_kv_metrics": "the observed KV hit rate is a record of the real run; not used",
}
IGNORED_COLUMNS = {
    "think_time_us": "recorded think times are not used: replay is open-loop, every row is "
    "injected at its own time (--session-mode closed-loop uses them)",
    "adapter": "LoRA adapters are served only when the scenario declares them (`lora`, "
    "docs/lora.md); otherwise every request runs on the base model",
    "slo_target_us": "per-request TTFT targets are not used",
    "vllm_priority": "the priority sent to vLLM is not used (servesim's priority comes from "
    "the scheduler and priority policy)",
    "x_request_id": "the HTTP request ids observe recorded are not used (requests are named "
    "by request_id)",
}


def trace_notes(
    header_path: str | Path | None,
    data_path: str | Path,
    closed_loop: bool = False,
    spans: TraceSpans | None = None,
) -> list[str]:
    """One line per thing a replay of this trace leaves out or re-bases, for the user: the
    header keys and columns servesim reads but does not model, sessions replayed open-loop
    (unless `closed_loop`), and the injection clock when send times are on another clock
    than arrivals. `spans`: the data's `trace_spans`, when already read."""
    notes = []
    header = read_header(header_path) if header_path is not None else {}
    if header.get("session_context_growth") == "accumulate" and not closed_loop:
        notes.append(
            "session_context_growth: accumulate: replay is open-loop, so each round's "
            "input_tokens (a delta in such a trace) is replayed as its whole prompt"
        )
    for key, text in IGNORED_HEADER_KEYS.items():
        if header.get(key):
            notes.append(f"{key}: {text}")
    p = Path(data_path)
    columns = set(_csv_header(p, "trace data"))
    if "request_id" not in columns:
        return notes
    for column, text in IGNORED_COLUMNS.items():
        if column in columns and not (closed_loop and column == "think_time_us"):
            notes.append(f"{column}: {text}")
    if spans is None:
        spans = trace_spans(p)
    if spans.not_sent:
        notes.append(
            f"{NOT_SENT_PREFIX} {spans.not_sent:,} request(s) never went out to the recorded "
            "server; replayed at their arrival_time_us like every row, as BLIS replays every "
            "row (the load offered, not only what the server saw; docs/observe.md)"
        )
    shift = spans.first_send_us - spans.first_arrival_us
    if shift:
        clocks = ""
        if spans.first_send_us >= _EPOCH_LIKE_US:
            clocks = (
                " (send_time_us is Unix-epoch time, arrival_time_us counts from the run's start)"
            )
        notes.append(
            f"send_time_us: requests are injected at their send times moved by {-shift:+,} µs, "
            f"so that the first send is at the first arrival{clocks}"
        )
    return notes


def load_trace(header_path: str | Path, data_path: str | Path) -> tuple[dict, list[Request]]:
    header = read_header(header_path)
    return header, requests_from_rows(read_rows(data_path))


def read_groundtruth_rows(path: str | Path, measured: bool = False) -> list[GroundTruthRow]:
    """Rows of a ground-truth request CSV (groundtruth/*/requests/*.requests.csv). With
    `measured` (scoring against it) the measurement columns are required too: without
    `has_error` every row would count as a success, without `ttft_s`/`e2e_s` none."""
    p = Path(path)
    kind = "ground-truth data"
    header = _csv_header(p, kind)
    required = (*_GROUNDTRUTH_REQUIRED, *(_GROUNDTRUTH_MEASURED if measured else ()))
    missing = [name for name in required if name not in header]
    if missing:
        raise ConfigError(
            f"{kind}: {str(p)!r}: missing column(s) {', '.join(missing)}; expected columns "
            f"{','.join(GROUNDTRUTH_COLUMNS)}"
        )
    col = {name: i for i, name in enumerate(header)}
    rows = []
    first_line: dict[int, int] = {}
    for line, rec in _records(p, kind, len(header)):
        f = _Fields(kind, p, line, col, rec)
        row = GroundTruthRow(
            index=f.as_int("index", _MAX_INDEX, required=True),
            arrival_time_us=f.bounded_int("arrival_time_us"),
            input_tokens=f.bounded_int("input_tokens"),
            output_tokens=f.bounded_int("output_tokens"),
            has_error=f.as_bool("has_error"),
            ttft_s=f.optional_duration_s("ttft_s"),
            e2e_s=f.optional_duration_s("e2e_s"),
        )
        if row.ttft_s is not None and row.e2e_s is not None and row.e2e_s < row.ttft_s:
            raise f.fail(
                "e2e_s",
                row.e2e_s,
                f"is below ttft_s {row.ttft_s:g}: a request ends after its first token",
            )
        # The index names the replayed request (request_<index>), as request_id does.
        seen = first_line.setdefault(row.index, line)
        if seen != line:
            raise f.fail("index", row.index, f"already used on line {seen}; indices must be unique")
        rows.append(row)
    return rows


def read_groundtruth_csv(path: str | Path, *, fill_missing_input: bool = True) -> list[Request]:
    """Requests to replay a ground-truth run (its README, step 2).

    Output length is max(1, output_tokens): vLLM was forced to the requested length, so a
    recorded 0 means the client received nothing, not that nothing was asked. Failed requests
    the server never counted have input_tokens 0; with `fill_missing_input` they get the mean
    prompt length of the rows that have one (they still loaded the queue), else 1 token.
    prefix_group is ignored: group membership was not recorded.
    """
    rows = read_groundtruth_rows(path)
    known = [r.input_tokens for r in rows if r.input_tokens > 0]
    fill = round(sum(known) / len(known)) if fill_missing_input and known else 1
    return [
        Request(
            f"request_{row.index}",
            row.arrival_time_us,
            row.input_tokens if row.input_tokens > 0 else fill,
            max(1, row.output_tokens),
            index=i,
        )
        for i, row in enumerate(rows)
    ]


def load_requests_file(
    data_path: str | Path, header_path: str | Path | None = None, at_schedule: bool = False
) -> list[Request]:
    """Requests from a TraceV2/v3 pair, a header-less TraceV2 CSV or a ground-truth CSV;
    `at_schedule` injects a trace's rows at arrival_time_us instead of their send times."""
    if header_path is not None:
        read_header(header_path)
    p = Path(data_path)
    columns = set(_csv_header(p, "requests file"))
    if (
        header_path is None
        and "request_id" not in columns
        and set(_GROUNDTRUTH_REQUIRED) <= (columns)
    ):
        return read_groundtruth_csv(p)
    if header_path is not None or "request_id" in columns:
        # A TraceV2 CSV without its header file: assume v2 defaults (nothing in the header
        # changes how requests are rebuilt).
        rows = read_rows(p)
        if at_schedule:
            rows = [dataclasses.replace(r, send_time_us=0) for r in rows]
        return requests_from_rows(rows)
    raise ConfigError(
        f"requests file: {str(p)!r} is neither a ground-truth CSV (columns "
        f"{','.join(GROUNDTRUTH_COLUMNS)}) nor a TraceV2 CSV (columns {','.join(TRACE_COLUMNS)})"
    )


# ---------------------------------------------------------------------------------- writing


# Requests the system gave up on: each is an `error` row naming its state.
_LOST = (
    RequestState.DROPPED,
    RequestState.REJECTED,
    RequestState.DROPPED_ON_DRAIN,
    RequestState.FAILED,
)


def trace_status(req: Request) -> tuple[str, str, str]:
    """(status, error_message, finish_reason) of a simulated request at the end of a run."""
    state = req.state
    if state is RequestState.COMPLETED:
        return "ok", "", "length" if req.length_capped else "stop"
    if state is RequestState.TIMED_OUT:
        return "timeout", "", ""
    if state in _LOST:
        return "error", state.value, ""
    # Still queued, running or in flight when the run stopped.
    return "incomplete", "", ""


def format_float(value: float) -> str:
    # Like Go's FormatFloat(v, 'f', -1): shortest round-trip digits, never an exponent.
    return np.format_float_positional(float(value), trim="-")


def _trace_row(
    row_index: int,
    req: Request,
    keep_prefix_groups: bool,
    keep_request_ids: bool = False,
    session_row_ids: dict[tuple[str, int], str] | None = None,
) -> list[str]:
    status, error_message, finish_reason = trace_status(req)
    first_chunk_us = last_chunk_us = 0
    if req.first_token_us >= 0:
        first_chunk_us = req.first_token_us
        # Completed: the last token reached the client at completion. Otherwise the last
        # token received so far (timed out or still running at the horizon).
        last_chunk_us = (
            req.completion_us if status == "ok" and req.completion_us >= 0 else req.last_token_us
        )
    # A streamed response arrives token by token; a non-streamed one in one piece when done.
    num_chunks = req.generated_tokens if req.streaming else int(status == "ok")
    input_tokens = req.input_tokens
    group = req.prefix_group if keep_prefix_groups else ""
    # A capped client (a replay with max_in_flight) sent the request `wait_us` after its
    # scheduled time: the row keeps both, as a load generator records them, and the
    # deadline as scheduled (a replay through the same cap moves it with the send again).
    wait_us = req.client_wait_us
    deadline_us = req.deadline_us - wait_us if req.deadline_us else 0
    row = [
        _replayed_row_id(req, session_row_ids) if keep_request_ids else str(row_index),
        req.client_id,
        req.tenant_id,
        req.slo_class,
        req.session_id,
        str(req.round_index),
        group,
    ]
    if keep_prefix_groups:
        # v3: input_tokens counts what follows the prefix, so replay rebuilds the same prompt.
        prefix_tokens = group_prefix_tokens(req) if group else 0
        input_tokens -= prefix_tokens
        row.append(str(prefix_tokens))
    row += [
        "true" if req.streaming else "false",
        str(input_tokens),
        str(req.output_tokens),
        str(req.text_tokens),
        str(req.image_tokens),
        str(req.audio_tokens),
        str(req.video_tokens),
        format_float(req.reason_ratio),
        req.model,
        str(deadline_us),
        str(req.input_tokens),
        str(req.arrival_us - wait_us),
        str(req.arrival_us),
        str(first_chunk_us),
        str(last_chunk_us),
        str(num_chunks),
        status,
        error_message,
        finish_reason,
    ]
    return row


def _replayed_row_id(req: Request, session_row_ids: dict[tuple[str, int], str] | None) -> str:
    """The request_id of the trace row `req` replayed. A closed-loop replay names a session's
    later rounds as BLIS does (`session_<id>_round_<r>_<k>`); their row is found by session
    and round."""
    if req.request_id.startswith(REPLAYED_ID_PREFIX):
        return req.request_id.removeprefix(REPLAYED_ID_PREFIX)
    if session_row_ids:
        return session_row_ids.get((req.session_id, req.round_index), req.request_id)
    return req.request_id


def session_row_ids(rows: Iterable[TraceRow]) -> dict[tuple[str, int], str]:
    """(session_id, round_index) -> request_id of a trace's session rows."""
    return {(r.session_id, r.round_index): r.request_id for r in rows if r.session_id}


def check_trace_prefix(prefix: str | os.PathLike[str], field: str = "prefix") -> None:
    """A trace export's prefix names its two files (PREFIX.yaml, PREFIX.csv): it needs a file
    name of its own, or the files would be hidden dot-files such as `.yaml` (`out/`, `.`,
    '')."""
    text = os.fspath(prefix)
    if not text.strip() or text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        raise ConfigError(
            f"{field}: invalid value {text!r}; expected a path prefix with a file name, e.g. "
            "out/run (writes out/run.yaml and out/run.csv)"
        )


def write_trace_files(
    header_path: Path, data_path: Path, header_text: str, columns: list[str], rows: Iterable
) -> None:
    """Write a trace's header text and CSV rows; both files are complete before either is
    renamed into place, so a failure never leaves half a trace."""
    with replacing(data_path) as data_tmp, replacing(header_path) as header_tmp:
        with open(data_tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(columns)
            writer.writerows(rows)
        header_tmp.write_text(header_text, encoding="utf-8")


def write_trace(
    prefix: str | Path,
    requests: Iterable[Request],
    *,
    server: dict | None = None,
    workload_spec: str = "",
    warm_up_requests: int = 0,
    created_at: str | None = None,
    keep_prefix_groups: bool = False,
    keep_request_ids: bool = False,
    session_row_ids: dict[tuple[str, int], str] | None = None,
) -> tuple[Path, Path]:
    """Write `<prefix>.yaml` and `<prefix>.csv`, a TraceV2 of simulated requests (docs/behaviour.md
    §9.5).

    Rows are in arrival order (ties by request index) with request_id = row number, or, with
    `keep_request_ids` (a replay's export), the request_id of the trace row each request
    replayed (a closed-loop replay's later rounds found in `session_row_ids`), so that a
    comparison with that trace joins the same requests. By default the file is what BLIS
    writes: prefix_group empty and input_tokens the whole prompt. `keep_prefix_groups=True`
    writes a v3 trace instead (prefix_group, prefix_length and the suffix-only input_tokens)
    so that replaying it shares the same prefixes again.
    Both files are written to temporary files first and renamed into place, so a failure
    leaves any previous trace untouched and never half a new one.
    """
    header_path = Path(f"{prefix}.yaml")
    data_path = Path(f"{prefix}.csv")
    if server:
        unknown_keys = set(server) - SERVER_KEYS
        if unknown_keys:
            raise ConfigError(
                f"trace header: server: unknown key(s) {sorted(unknown_keys)}; "
                f"valid: {', '.join(sorted(SERVER_KEYS))}"
            )
    if created_at is None:
        created_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    header: dict[str, Any] = {
        "trace_version": 3 if keep_prefix_groups else 2,
        "time_unit": "microseconds",
        "created_at": created_at,
        "mode": "generated",
        "warm_up_requests": int(warm_up_requests),
        "workload_spec": workload_spec,
    }
    if server:
        header["server"] = dict(server)
    header["network"] = {"measured_rtt_ms": 0}
    header_text = yaml.safe_dump(header, sort_keys=False, allow_unicode=True)

    ordered = sorted(requests, key=lambda r: (r.arrival_us, r.index))
    columns = TRACE_V3_COLUMNS if keep_prefix_groups else TRACE_COLUMNS
    rows = (
        _trace_row(i, req, keep_prefix_groups, keep_request_ids, session_row_ids)
        for i, req in enumerate(ordered)
    )
    if any(req.adapter for req in ordered):
        # BLIS's optional trailing column, written (as BLIS does) only when it says something:
        # a replay must ask for the same LoRA adapters.
        columns = [*columns, "adapter"]
        rows = ([*row, req.adapter] for row, req in zip(rows, ordered, strict=True))
    write_trace_files(header_path, data_path, header_text, columns, rows)
    return header_path, data_path


# ---------------------------------------------------------------------------------- closed loop


@dataclass
class ClosedLoopReplay:
    """The sessions of a trace replayed closed-loop (`replay --session-mode closed-loop`)."""

    sessions: Any  # generator.SessionManager
    horizon_us: int | None = None
    spec: Any = None  # no v2 spec behind a trace
    has_sessions: bool = True


def closed_loop_replay(
    trace: Any, seed: int, horizon_us: int | None = None
) -> tuple[list[Request], ClosedLoopReplay]:
    """A trace's requests for closed-loop replay: rows without a session and each session's
    round 0 at their recorded times; every later round is sent when the one before it has
    finished plus a think time (`closed_loop.replay_sessions`), as BLIS's closed-loop session
    mode does. `trace` is the scenario's TraceSpec."""
    from .closed_loop import parse_think_time, replay_sessions
    from .generator import SessionManager

    header = read_header(trace.header) if trace.header is not None else {}
    rows = read_rows(trace.data)
    if trace.timing == "schedule":
        rows = [dataclasses.replace(r, send_time_us=0) for r in rows]
    think = parse_think_time(trace.think_time, "trace.think_time") if trace.think_time else None
    accumulate = header.get("session_context_growth") == "accumulate"
    injected, sessions = replay_sessions(rows, requests_from_rows(rows), think, accumulate, seed)
    manager = SessionManager(horizon_us)
    for session in sessions:
        manager.register(session.templates[0], session)
    return injected, ClosedLoopReplay(manager, horizon_us)
