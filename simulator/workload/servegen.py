"""ServeGen data folders as workload clients (BLIS servegen.go / `convert servegen`, BLIS-Mar).

A ServeGen folder holds, per traffic chunk `<id>`:

* `chunk-<id>-trace.csv`: rows `start_time_s, rate_req_per_s, cv, pattern[, shape, scale]`
  (no header; pattern "Gamma", "Weibull" or empty); short or non-numeric rows are skipped;
* `chunk-<id>-dataset.json`: {"<window start s>": {"input_tokens": "{tokens: prob, ...}",
  "output_tokens": "{...}"}, ...}, the length PDFs written as Python dict strings.

Each chunk with some traffic in the span becomes one client `servegen-chunk-<id>` (tenant
`chunk-<id>`): its arrival process and CV are those of its busiest trace row inside
[span_start, span_end) (seconds; 0 = unbounded), its rate_fraction is that row's rate, and its
lengths are empirical tables from the first dataset window inside the span whose input and
output PDFs are both non-empty. The fitted shape/scale columns are not used (the CV fixes the
law, as in BLIS-Mar's schema).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..errors import ConfigError, excerpt
from ..input_files import csv_records, read_json
from .arrivals import WEIBULL_CV_RANGE
from .spec import ClientSpec, WorkloadSpec, format_spec_error

WHERE = "servegen_data"


@dataclass(frozen=True)
class TraceRow:
    start_s: float
    rate_per_s: float
    cv: float
    pattern: str


def parse_pdf_string(text: str, where: str) -> dict[int, float]:
    """A Python dict string "{100: 0.5, 200: 0.3}" as {tokens: probability}."""
    if not isinstance(text, str):
        raise ConfigError(
            f"{where}: invalid PDF {excerpt(text, 40)}; expected a string '{{tokens: prob, ...}}'"
        )
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ConfigError(
            f"{where}: invalid PDF {excerpt(text, 40)}; expected '{{tokens: prob, ...}}'"
        )
    pdf: dict[int, float] = {}
    for pair in body[1:-1].split(","):
        if not pair.strip():
            continue  # trailing comma
        key, sep, value = pair.partition(":")
        try:
            if not sep:
                raise ValueError
            tokens = int(float(key.strip().strip("\"'")))
            prob = float(value.strip())
        except (ValueError, OverflowError):
            raise ConfigError(
                f"{where}: invalid PDF entry {excerpt(pair.strip())}; expected tokens: probability"
            ) from None
        pdf[tokens] = prob
    if not pdf:
        raise ConfigError(f"{where}: empty PDF {excerpt(text)}; expected '{{tokens: prob, ...}}'")
    return pdf


def read_trace(path: Path) -> list[TraceRow]:
    rows = []
    with contextlib.closing(csv_records(path, WHERE)) as records:
        for _, record in records:
            if len(record) < 4:
                continue
            try:
                start, rate, cv = (float(record[i].strip()) for i in range(3))
            except ValueError:
                continue  # header or damaged row, skipped like BLIS
            rows.append(TraceRow(start, rate, cv, record[3].strip()))
    return rows


def _in_span(start_s: float, span_start: int, span_end: int) -> bool:
    if span_start > 0 and start_s < span_start:
        return False
    return not (span_end > 0 and start_s >= span_end)


def _dataset_pdfs(
    path: Path, span_start: int, span_end: int
) -> tuple[dict[int, float], dict[int, float]]:
    data = read_json(path, WHERE)
    if not isinstance(data, dict):
        raise ConfigError(f"{WHERE}: {str(path)!r} must map window start times to PDFs")
    windows = []
    for key, window in data.items():
        try:
            windows.append((float(key), key, window))
        except ValueError:
            continue
    # Numeric order (BLIS sorts the keys as strings, so "1200" came before "600").
    for start_s, key, window in sorted(windows, key=lambda w: w[0]):
        if not _in_span(start_s, span_start, span_end) or not isinstance(window, dict):
            continue
        inp, out = window.get("input_tokens", ""), window.get("output_tokens", "")
        if inp and inp != "{}" and out and out != "{}":
            where = f"{WHERE}: {path.name}[{key}]"
            return (
                parse_pdf_string(inp, f"{where}.input_tokens"),
                parse_pdf_string(out, f"{where}.output_tokens"),
            )
    raise ConfigError(f"{WHERE}: {str(path)!r} has no window with input and output PDFs in span")


def _arrival(row: TraceRow) -> dict:
    process = row.pattern.lower()
    if process not in ("gamma", "weibull"):
        return {"process": "poisson"}
    if not (math.isfinite(row.cv) and row.cv > 0):
        return {"process": process}  # cv defaults to 1
    cv = row.cv
    if process == "weibull":
        lo, hi = WEIBULL_CV_RANGE
        cv = min(max(cv, lo), hi)
    return {"process": process, "cv": cv}


def _pdf_params(pdf: dict[int, float]) -> dict[str, float]:
    return {str(tokens): prob for tokens, prob in sorted(pdf.items())}


def load_servegen_clients(folder: Path, span_start: int = 0, span_end: int = 0) -> list[ClientSpec]:
    """One client per active chunk of a ServeGen folder, in chunk-file name order."""
    if not folder.is_dir():
        raise ConfigError(f"{WHERE}.path: invalid value {str(folder)!r}; not a folder")
    traces = sorted(folder.glob("chunk-*-trace.csv"))
    if not traces:
        raise ConfigError(f"{WHERE}.path: no chunk-*-trace.csv files in {str(folder)!r}")
    clients = []
    for trace in traces:
        chunk_id = trace.name.removeprefix("chunk-").removesuffix("-trace.csv")
        best: TraceRow | None = None
        for row in read_trace(trace):
            if _in_span(row.start_s, span_start, span_end) and (
                row.rate_per_s > (best.rate_per_s if best else 0.0)
            ):
                best = row
        if best is None:
            continue  # silent in the span
        inputs, outputs = _dataset_pdfs(
            folder / f"chunk-{chunk_id}-dataset.json", span_start, span_end
        )
        client = {
            "id": f"servegen-chunk-{chunk_id}",
            "tenant_id": f"chunk-{chunk_id}",
            "rate_fraction": best.rate_per_s,
            "arrival": _arrival(best),
            "input_distribution": {"type": "empirical", "params": _pdf_params(inputs)},
            "output_distribution": {"type": "empirical", "params": _pdf_params(outputs)},
        }
        try:
            clients.append(ClientSpec.model_validate(client))
        except ValidationError as exc:
            # The values come from the chunk's files: name them, not the client built here.
            raise ConfigError(
                format_spec_error(
                    exc, f"{WHERE}: chunk {chunk_id} ({str(trace)!r} and its dataset)"
                )
            ) from None
    if not clients:
        raise ConfigError(f"{WHERE}: no chunk in {str(folder)!r} has traffic in the span")
    return clients


def expand_servegen(spec: WorkloadSpec, base_dir: Path | None = None) -> WorkloadSpec:
    """A `servegen_data` spec as plain clients (cohorts pass through).

    `path` is resolved against `base_dir` (the workload file's folder) when relative.
    aggregate_rate is the spec's when given, otherwise the sum of the chunks' peak rates, so
    each chunk then runs at its own peak rate.
    """
    sg = spec.servegen_data
    if sg is None:
        raise ConfigError(f"{WHERE}: missing; expand_servegen needs that section")
    if sg.span_end and sg.span_end <= sg.span_start:
        raise ConfigError(
            f"{WHERE}.span_end: invalid value {sg.span_end}; must be > span_start ({sg.span_start})"
        )
    folder = Path(sg.path)
    if not folder.is_absolute() and base_dir is not None:
        folder = Path(base_dir) / folder
    clients = load_servegen_clients(folder, sg.span_start, sg.span_end)
    rate = spec.aggregate_rate or sum(c.rate_fraction for c in clients)
    return spec.model_copy(
        update={"servegen_data": None, "clients": clients, "aggregate_rate": rate}
    )
