"""BLIS TraceV2 files (SPEC §9.5): a YAML header plus a CSV with one row per request."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..engine.request import Request
from ..errors import ConfigError
from ..scenario import yaml_problem

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
SERVER_KEYS = {
    "type",
    "model",
    "tensor_parallel",
    "max_num_seqs",
    "block_size",
    "gpu_memory_utilization",
    "max_model_len",
}
# BLIS replay gives every request of a prefix group the same fixed-length prefix.
REPLAY_PREFIX_TOKENS = 50


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


def read_header(path: str | Path) -> dict:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"trace header: cannot read {str(p)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"trace header: {str(p)!r} is not valid YAML: {yaml_problem(exc)}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"trace header: {str(p)!r} must be a YAML mapping")
    extra = set(data) - HEADER_KEYS
    if extra:
        raise ConfigError(
            f"trace header: unknown key(s) {sorted(extra)} in {str(p)!r}; "
            f"valid: {', '.join(sorted(HEADER_KEYS))}"
        )
    version = data.get("trace_version")
    if version != 2:
        raise ConfigError(f"trace header: trace_version: invalid value {version!r}; must be 2")
    unit = data.get("time_unit", "microseconds")
    if unit != "microseconds":
        raise ConfigError(f"trace header: time_unit: invalid value {unit!r}; must be microseconds")
    server = data.get("server") or {}
    if not isinstance(server, dict) or set(server) - SERVER_KEYS:
        raise ConfigError(
            f"trace header: server: unknown keys {sorted(set(server) - SERVER_KEYS)}; "
            f"valid: {', '.join(sorted(SERVER_KEYS))}"
        )
    return data


def _int(value: str, column: str, line: int, path: Path) -> int:
    try:
        return int(float(value)) if value else 0
    except ValueError:
        raise ConfigError(
            f"trace data: {str(path)!r} line {line}: column {column}: invalid value {value!r}; "
            "must be an integer"
        ) from None


def read_rows(path: str | Path) -> list[TraceRow]:
    p = Path(path)
    try:
        handle = p.open(newline="")
    except OSError as exc:
        raise ConfigError(f"trace data: cannot read {str(p)!r}: {exc.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ConfigError(f"trace data: {str(p)!r} is empty")
        if header not in (TRACE_COLUMNS, TRACE_COLUMNS[:-1]):
            raise ConfigError(
                f"trace data: {str(p)!r} header does not match TraceV2; expected columns "
                f"{','.join(TRACE_COLUMNS)}"
            )
        col = {name: i for i, name in enumerate(header)}
        rows = []
        for line, rec in enumerate(reader, start=2):
            if not rec:
                continue
            if len(rec) != len(header):
                raise ConfigError(
                    f"trace data: {str(p)!r} line {line}: {len(rec)} columns, expected "
                    f"{len(header)}"
                )
            row = TraceRow(
                request_id=rec[col["request_id"]],
                arrival_time_us=_int(rec[col["arrival_time_us"]], "arrival_time_us", line, p),
                input_tokens=_int(rec[col["input_tokens"]], "input_tokens", line, p),
                output_tokens=_int(rec[col["output_tokens"]], "output_tokens", line, p),
                client_id=rec[col["client_id"]],
                tenant_id=rec[col["tenant_id"]],
                slo_class=rec[col["slo_class"]],
                prefix_group=rec[col["prefix_group"]],
                model=rec[col["model"]],
                deadline_us=_int(rec[col["deadline_us"]], "deadline_us", line, p),
                first_chunk_time_us=_int(rec[col["first_chunk_time_us"]], "first_chunk", line, p),
                last_chunk_time_us=_int(rec[col["last_chunk_time_us"]], "last_chunk", line, p),
                status=rec[col["status"]],
            )
            if row.arrival_time_us < 0 or row.input_tokens < 0 or row.output_tokens < 0:
                raise ConfigError(
                    f"trace data: {str(p)!r} line {line}: arrival and token counts must be >= 0"
                )
            rows.append(row)
    return rows


def requests_from_rows(rows: list[TraceRow]) -> list[Request]:
    """Rebuild requests from trace rows: lengths, arrival, deadline and tags are kept."""
    requests = []
    for i, row in enumerate(rows):
        rid = f"request_{row.request_id}"
        segments = None
        if row.prefix_group:
            shared = min(REPLAY_PREFIX_TOKENS, row.input_tokens)
            segments = [(("prefix", row.prefix_group), shared)]
            if row.input_tokens > shared:
                segments.append((("req", rid), row.input_tokens - shared))
        requests.append(
            Request(
                rid,
                row.arrival_time_us,
                row.input_tokens,
                row.output_tokens,
                index=i,
                deadline_us=row.deadline_us,
                segments=segments,
                slo_class=row.slo_class,
                tenant_id=row.tenant_id,
                model=row.model,
                client_id=row.client_id,
            )
        )
    return requests


def load_trace(header_path: str | Path, data_path: str | Path) -> tuple[dict, list[Request]]:
    header = read_header(header_path)
    return header, requests_from_rows(read_rows(data_path))
