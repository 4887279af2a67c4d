"""ServeGen data folders as workload clients (BLIS servegen.go / `convert servegen`).

Two conversions, as BLIS has had them:

* **One span** (BLIS-Mar; a `servegen_data` without period keys, `convert servegen
  --single-span`): one client per chunk, described below.
* **Multi-period** (current BLIS; `servegen_data` with `window_duration_secs`,
  `drain_timeout_secs` or `time_window`, and `convert servegen`): `servegen_periods`.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from ..errors import ConfigError, excerpt
from ..input_files import csv_records, read_json
from ..limits import MAX_TOKENS
from .arrivals import WEIBULL_CV_RANGE
from .spec import ClientSpec, CohortSpec, WorkloadSpec, format_spec_error

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
        if not 0 <= tokens <= MAX_TOKENS:
            raise ConfigError(
                f"{where}: invalid PDF entry {excerpt(pair.strip())}; the token count must be "
                f"from 0 to {MAX_TOKENS:,}"
            )
        if not (math.isfinite(prob) and prob >= 0):
            raise ConfigError(
                f"{where}: invalid PDF entry {excerpt(pair.strip())}; the probability must be a "
                "finite number >= 0"
            )
        pdf[tokens] = prob
    if not pdf:
        raise ConfigError(f"{where}: empty PDF {excerpt(text)}; expected '{{tokens: prob, ...}}'")
    if not any(pdf.values()):
        raise ConfigError(f"{where}: PDF {excerpt(text, 40)} has no probability above 0")
    return pdf


def _trace_records(path: Path) -> Iterator[tuple[float, float, float, list[str]]]:
    """(start, rate, cv, the whole record) of every row of a chunk's trace CSV whose first
    three fields are numbers; a header or damaged row is skipped, as BLIS skips it."""
    with contextlib.closing(csv_records(path, WHERE)) as records:
        for _, record in records:
            if len(record) < 4:
                continue
            try:
                start, rate, cv = (float(record[i].strip()) for i in range(3))
            except ValueError:
                continue
            yield start, rate, cv, record


def read_trace(path: Path) -> list[TraceRow]:
    return [
        TraceRow(start, rate, cv, record[3].strip())
        for start, rate, cv, record in _trace_records(path)
    ]


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


# --- multi-period conversion (current BLIS) ----------------------------------------------------

# Each period: its name and where it starts in the trace's day (s).
PERIODS = (("midnight", 0), ("morning", 8 * 3600), ("afternoon", 14 * 3600))
# A period offers three consecutive candidate windows of this length; one is picked at random.
CANDIDATE_WINDOW_S = 600
CANDIDATES = 3
# Chunks are dealt round-robin over these SLO classes, after a shuffle.
DEALT_CLASSES = ("critical", "standard", "batch", "sheddable", "background")
DEFAULT_WINDOW_S = 600
DEFAULT_DRAIN_S = 180
# Lengths of a cohort whose chunks have no length table in the window (BLIS's fallback).
_FALLBACK_LENGTHS = {"input": (512.0, 128.0), "output": (128.0, 32.0)}
_FALLBACK_BOUNDS = (1, 32768)


@dataclass(frozen=True)
class _FullRow:
    start_s: float
    rate_per_s: float
    cv: float
    pattern: str
    shape: float
    scale_s: float


def _read_full_trace(path: Path) -> list[_FullRow]:
    rows = []
    for start, rate, cv, record in _trace_records(path):
        extra = []
        for i in (4, 5):
            try:
                extra.append(float(record[i].strip()) if len(record) > i else 0.0)
            except ValueError:
                extra.append(0.0)
        rows.append(_FullRow(start, rate, cv, record[3].strip().lower(), *extra))
    return rows


def lognormal_fit(pdf: dict[int, float]) -> tuple[float, float]:
    """(mu, sigma) of ln(tokens) under a length table: its weighted mean and (population)
    standard deviation, as BLIS fits a chunk's lengths."""
    total = sum(p for t, p in pdf.items() if t > 0 and p > 0)
    if total <= 0:
        raise ConfigError(f"{WHERE}: a length table has no positive token count")
    logs = [(math.log(t), p / total) for t, p in pdf.items() if t > 0 and p > 0]
    mu = sum(x * w for x, w in logs)
    sigma = math.sqrt(max(0.0, sum(w * (x - mu) ** 2 for x, w in logs)))
    return mu, sigma


def _window_pdfs(
    path: Path, window_start_s: float
) -> tuple[dict[int, float], dict[int, float]] | None:
    """The length tables of the dataset window a trace window uses: the latest one starting
    at or before it with both tables, else the first with both; None when there is none."""
    if not path.exists():
        return None
    data = read_json(path, WHERE)
    if not isinstance(data, dict):
        raise ConfigError(f"{WHERE}: {str(path)!r} must map window start times to PDFs")
    usable = []
    for key, window in data.items():
        try:
            start = float(key)
        except ValueError:
            continue
        if not isinstance(window, dict):
            continue
        inp, out = window.get("input_tokens", ""), window.get("output_tokens", "")
        if inp and inp != "{}" and out and out != "{}":
            usable.append((start, key, inp, out))
    if not usable:
        return None
    usable.sort(key=lambda u: u[0])
    before = [u for u in usable if u[0] <= window_start_s]
    _, key, inp, out = before[-1] if before else usable[0]
    where = f"{WHERE}: {path.name}[{key}]"
    return parse_pdf_string(inp, f"{where}.input_tokens"), parse_pdf_string(
        out, f"{where}.output_tokens"
    )


def _length_dist(fits: list[tuple[float, float]], which: str) -> dict:
    if not fits:
        mean, sd = _FALLBACK_LENGTHS[which]
        lo, hi = _FALLBACK_BOUNDS
        return {
            "type": "gaussian",
            "params": {"mean": mean, "std_dev": sd, "min": lo, "max": hi},
        }
    mu = sum(f[0] for f in fits) / len(fits)
    sigma = sum(f[1] for f in fits) / len(fits)
    return {"type": "lognormal", "params": {"mu": mu, "sigma": sigma}}


def _cohort_arrival(rows: list[_FullRow]) -> dict:
    """The arrival law of a cohort: the majority pattern of its chunks (gamma on a tie), with
    their averaged cv, shape and scale (the trace's scale is in s; here µs)."""
    shaped = [r for r in rows if r.pattern in ("gamma", "weibull")]
    if not shaped:
        return {"process": "poisson"}
    gammas = sum(r.pattern == "gamma" for r in shaped)
    process = "gamma" if gammas * 2 >= len(shaped) else "weibull"
    members = [r for r in shaped if r.pattern == process]
    arrival: dict = {"process": process}
    cvs = [r.cv for r in members if math.isfinite(r.cv) and r.cv > 0]
    if cvs:
        cv = sum(cvs) / len(cvs)
        if process == "weibull":
            lo, hi = WEIBULL_CV_RANGE
            cv = min(max(cv, lo), hi)
        arrival["cv"] = cv
    shapes = [r.shape for r in members if r.shape > 0 and r.scale_s > 0]
    if shapes:
        arrival["shape"] = sum(shapes) / len(shapes)
        scales = [r.scale_s for r in members if r.shape > 0 and r.scale_s > 0]
        arrival["scale"] = sum(scales) / len(scales) * 1e6
    return arrival


def servegen_periods(
    folder: Path,
    seed: int,
    window_s: int = DEFAULT_WINDOW_S,
    drain_s: int = DEFAULT_DRAIN_S,
    time_window: str = "",
) -> list[dict]:
    """Current BLIS's multi-period conversion: cohorts (as dicts) for the midnight (00:00),
    morning (08:00) and afternoon (14:00) periods of a ServeGen day.

    In each period one of three consecutive 600-s windows is picked at random (`seed`); the
    chunks with traffic in it are shuffled and dealt round-robin over the SLO classes critical,
    standard, batch, sheddable, background; each (period, class) becomes cohort
    `<period>-<class>` with one member per chunk, streaming, active as a spike of `window_s`
    seconds starting at period_index × (window_s + drain_s) s, at the chunks' summed mean rate
    in the window (`trace_rate`, absolute), with lognormal lengths fitted to the chunks'
    length tables (averaged) and the chunks' majority arrival law. `time_window` keeps one
    period (at its place in time). The random picks use servesim's generator, not Go's: for
    the same seed BLIS may pick other windows and deal chunks differently.
    """
    if not folder.is_dir():
        raise ConfigError(f"{WHERE}.path: invalid value {str(folder)!r}; not a folder")
    traces = sorted(folder.glob("chunk-*-trace.csv"))
    if not traces:
        raise ConfigError(f"{WHERE}.path: no chunk-*-trace.csv files in {str(folder)!r}")
    chunks = []
    for trace in traces:
        chunk_id = trace.name.removeprefix("chunk-").removesuffix("-trace.csv")
        chunks.append((chunk_id, _read_full_trace(trace)))
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(7,))))
    cohorts = []
    for index, (period, start_s) in enumerate(PERIODS):
        pick = int(rng.integers(CANDIDATES))
        w0 = start_s + pick * CANDIDATE_WINDOW_S
        w1 = w0 + CANDIDATE_WINDOW_S
        active = []
        for chunk_id, rows in chunks:
            inside = [r for r in rows if w0 <= r.start_s < w1]
            if inside and any(r.rate_per_s > 0 for r in inside):
                active.append((chunk_id, inside))
        order = rng.permutation(len(active))
        dealt: dict[str, list] = {c: [] for c in DEALT_CLASSES}
        for k, i in enumerate(order):
            dealt[DEALT_CLASSES[k % len(DEALT_CLASSES)]].append(active[i])
        if time_window and period != time_window:
            continue
        for slo_class in DEALT_CLASSES:
            members = dealt[slo_class]
            rate = sum(sum(r.rate_per_s for r in rows) / len(rows) for _, rows in members)
            if not members or rate <= 0:
                continue
            fits: dict[str, list] = {"input": [], "output": []}
            for chunk_id, _ in members:
                pdfs = _window_pdfs(folder / f"chunk-{chunk_id}-dataset.json", w0)
                if pdfs is not None:
                    fits["input"].append(lognormal_fit(pdfs[0]))
                    fits["output"].append(lognormal_fit(pdfs[1]))
            representative = [max(rows, key=lambda r: r.rate_per_s) for _, rows in members]
            cohorts.append(
                {
                    "id": f"{period}-{slo_class}",
                    "population": len(members),
                    "slo_class": slo_class,
                    "rate_fraction": 1.0,
                    "arrival": _cohort_arrival(representative),
                    "input_distribution": _length_dist(fits["input"], "input"),
                    "output_distribution": _length_dist(fits["output"], "output"),
                    "streaming": True,
                    "spike": {
                        "start_time_us": index * (window_s + drain_s) * 1_000_000,
                        "duration_us": window_s * 1_000_000,
                        "trace_rate": rate,
                    },
                }
            )
    if not cohorts:
        raise ConfigError(f"{WHERE}: no chunk in {str(folder)!r} has traffic in any period")
    return cohorts


def expand_servegen_periods(spec: WorkloadSpec, base_dir: Path | None = None) -> WorkloadSpec:
    """A multi-period `servegen_data` spec as cohorts (absolute rates; cohorts of the spec
    itself pass through after them)."""
    sg = spec.servegen_data
    if sg is None:
        raise ConfigError(f"{WHERE}: missing; expand_servegen_periods needs that section")
    folder = Path(sg.path)
    if not folder.is_absolute() and base_dir is not None:
        folder = Path(base_dir) / folder
    window_s = sg.window_duration_secs or DEFAULT_WINDOW_S
    drain = sg.drain_timeout_secs or 0
    drain_s = DEFAULT_DRAIN_S if drain < 0 else drain
    seed = spec.seed if spec.seed is not None else 42
    cohorts = servegen_periods(folder, seed, window_s, drain_s, sg.time_window)
    try:
        converted = [CohortSpec.model_validate(c) for c in cohorts]
    except ValidationError as exc:
        raise ConfigError(format_spec_error(exc, f"{WHERE}: {str(folder)!r} (converted)")) from None
    return spec.model_copy(
        update={
            "servegen_data": None,
            "cohorts": [*converted, *spec.cohorts],
            # Absolute rates, as BLIS's conversion sets: each period brings its own.
            "aggregate_rate": 0.0,
        }
    )
