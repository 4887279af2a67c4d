"""Score servesim against real vLLM runs (the repository's groundtruth/ folder).

Two layouts are understood, and a folder holding both datasets scores both:

- `vllm-0.15.1-h100`: `requests/<run>.requests.csv` + `<run>.meta.json`, server arguments in
  `runs/<run>/exp-config.yaml` (three models, moderate load plus overloaded runs);
- `vllm-0.23.0-h100-qwen3-14b`: one folder per load cell holding the BLIS `observe` trace
  (`trace.yaml` + `trace.csv`, TraceV2 version 3) and the server's settings in
  `server_config.json` at the top (a load sweep from 2 req/s into saturation).

Each run is replayed as its README prescribes (one H100 instance with the run's server settings
and measured KV capacity, every request at its recorded time) and the measured and predicted
latency figures of the successful requests are compared metric by metric. Prefix caching
follows what the server did (`recorded_prefix_caching`). Nothing here is fitted on the runs,
so every figure is out-of-sample for the analytical backends.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .engine.request import RequestState
from .errors import ConfigError, excerpt, invalid
from .input_files import read_json, read_yaml
from .scenario import DEFAULT_LATENCY_MODEL
from .workload.server_settings import (
    HEADER_SERVER_FIELDS,
    SERVER_CONFIG,
    SERVER_CONFIG_FIELDS,
    header_server,
    recorded_prefix_caching,
    server_config_near,
    vllm_batch_defaults_for,
)

REQUESTS_SUFFIX = ".requests.csv"
META_SUFFIX = ".meta.json"
TRACE_HEADER = "trace.yaml"
TRACE_DATA = "trace.csv"
HARDWARE = "H100"
# The README's load marks these workloads as overloaded (many client timeouts): scored for
# the record, but kept out of the accuracy summary.
OVERLOADED_WORKLOADS = frozenset({"reasoning"})
WORKLOADS = ("general", "codegen", "roleplay", "reasoning")
# A load cell whose client took more than trace.CLIENT_BEHIND_TOLERANCE longer to send its
# requests than they were scheduled over fell behind the server: the offered load was not
# delivered, so the cell measures the server's capacity, not latency at that load
# (vllm-0.23.0 agg18/24/30: +5 %, +38 %, +71 %; every other cell within 0.01 %).
METRICS = (
    "ttft_mean_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "e2e_mean_ms",
    "e2e_p90_ms",
    "e2e_p99_ms",
    "itl_ms",
    "output_tokens_per_s",
)
FRAME_COLUMNS = [
    "run",
    "model",
    "workload",
    "metric",
    "measured",
    "predicted",
    "error",
    "signed_error",
    "overloaded",
    "dataset",
]
LOAD_COLUMNS = [
    "dataset",
    "run",
    "requests",
    "offered_rps",
    "sent_rps",
    "measured_rps",
    "predicted_rps",
    "predicted_at",
    "overloaded",
]


@dataclass(frozen=True)
class RunSpec:
    """One measured run: where its files are and the server it ran on."""

    name: str
    requests_csv: Path
    meta_json: Path
    model: str  # bundled model name
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size_tokens: int
    gpu_kv_blocks: int
    workload: str
    # Output tokens the server generated for every successful request: the profile's
    # `data.shared_prefix.output_len` when it ran with `server.ignore_eos` (None otherwise).
    # The request files' `output_tokens` counts what the client re-counted from the streamed
    # text, which for Llama-2-7B is far lower (p10 31-64 of 247-251) although E2E shows the
    # full length was generated; see `forced_output_tokens`.
    forced_output_tokens: int | None = None
    # The dataset the run belongs to, tagged by vLLM version ("vllm-0.15.1").
    dataset: str = ""
    # A BLIS observe cell: its trace header (requests_csv is then its trace.csv and
    # meta_json the dataset's server_config.json). None for a ground-truth request CSV.
    trace_header: Path | None = None
    # Batch limits the server's configuration does not record, as (setting, value) pairs: the
    # values vLLM takes on the GPU when not given (server_settings.vllm_batch_defaults).
    vllm_default_settings: tuple[tuple[str, int], ...] = ()
    # What the server did (see simulator.workload.server_settings) and where that was read.
    prefix_caching: bool = True
    prefix_caching_source: str = ""
    # An observe cell's trace spans (workload.trace.TraceSpans), read once when the cell is
    # found; None for a request CSV.
    spans: Any = None
    # Where the dataset's vLLM version (in `dataset`) was read: the server's configuration or
    # the dataset folder's name; "" when neither says (the tag is then the folder's name).
    version_source: str = ""

    @property
    def client_fell_behind(self) -> bool:
        """The cell's client sent its requests more than CLIENT_BEHIND_TOLERANCE later than
        they were scheduled (see trace.CLIENT_BEHIND_TOLERANCE)."""
        return self.spans is not None and self.spans.client_fell_behind

    @property
    def overloaded(self) -> bool:
        return self.workload in OVERLOADED_WORKLOADS or self.client_fell_behind

    @property
    def vllm_version(self) -> str | None:
        """The measured server's vLLM version, from the dataset tag ("vllm-0.15.1"); None when
        neither the server's configuration nor the folder's name records one."""
        return self.dataset.removeprefix("vllm-") if self.version_source else None

    @property
    def kind(self) -> str:
        """The layout: `trace` for a BLIS observe cell, `requests` for a request CSV."""
        return "trace" if self.trace_header is not None else "requests"

    @property
    def overload_reason(self) -> str:
        if self.client_fell_behind:
            return "client fell behind its schedule"
        if self.workload in OVERLOADED_WORKLOADS:
            return "README: client timeouts"
        return ""


# ---------------------------------------------------------------------------------- discovery


def _dataset_folders(folder: Path) -> list[Path]:
    """The request-CSV dataset folder itself, or those directly under it."""
    if (folder / "requests").is_dir():
        return [folder]
    return sorted(p for p in folder.iterdir() if (p / "requests").is_dir())


def trace_datasets(folder: Path) -> list[tuple[Path, list[Path]]]:
    """(dataset folder, its observe cell folders) under `folder` (see `_trace_datasets`)."""
    return _trace_datasets(Path(folder))


def _is_cell(folder: Path) -> bool:
    """A folder holding a cell's header or data: one that holds only one of the two is still
    a cell (named, and refused when read: `_refuse_incomplete_cell`), not silently left out."""
    return (folder / TRACE_HEADER).is_file() or (folder / TRACE_DATA).is_file()


def incomplete_cell(folder: Path) -> str | None:
    """What is wrong with `folder` as a cell (its trace.yaml + trace.csv) when it holds one of
    the two files without the other ("holds trace.yaml but no trace.csv; ..."), else None.
    validate and calibrate both name such a cell rather than leave it out."""
    have = [name for name in (TRACE_HEADER, TRACE_DATA) if (folder / name).is_file()]
    if len(have) != 1:
        return None
    lacking = TRACE_DATA if have[0] == TRACE_HEADER else TRACE_HEADER
    return (
        f"holds {have[0]} but no {lacking}; a cell is a folder with both {TRACE_HEADER} and "
        f"{TRACE_DATA}"
    )


def _refuse_incomplete_cell(cell: Path) -> None:
    """A cell is its trace.yaml + trace.csv: one without the other is an error naming it."""
    problem = incomplete_cell(cell)
    if problem is not None:
        raise ConfigError(f"ground truth: observe cell {str(cell)!r} {problem}")


def _trace_datasets(folder: Path) -> list[tuple[Path, list[Path]]]:
    """(dataset folder, its cell folders) of the BLIS observe layout: `folder` as one cell,
    as a dataset of cells, or as the parent of such datasets."""
    if _is_cell(folder):
        return [(folder.parent, [folder])]

    def cells(dataset: Path) -> list[Path]:
        return sorted((p for p in dataset.iterdir() if p.is_dir() and _is_cell(p)), key=_natural)

    if cells(folder):
        return [(folder, cells(folder))]
    found = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if cells(sub):
            found.append((sub, cells(sub)))
    return found


def _natural(path: Path) -> list[Any]:
    """Sort key that orders the cells of a sweep by load: agg6 before agg12."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", path.name)]


def dataset_tag(dataset: Path, version: object = None) -> str:
    """`vllm-<version>`: from the server's own record when it has one, else the folder name
    (vllm-0.15.1-h100 -> vllm-0.15.1); the folder name itself when neither says."""
    if isinstance(version, str):
        return f"vllm-{version}"
    return _folder_version(dataset)[0]


VERSION_FROM_FOLDER = "the dataset folder's name"


def _folder_version(dataset: Path) -> tuple[str, str]:
    """(`dataset_tag` from the folder's name, VERSION_FROM_FOLDER or "" when the name carries
    no version)."""
    found = re.match(r"vllm-(\d+(?:\.\d+)+)", dataset.name)
    if found:
        return f"vllm-{found.group(1)}", VERSION_FROM_FOLDER
    return dataset.name, ""


GROUNDTRUTH_FOLDER = "groundtruth"


def default_groundtruth(command: str = "ground truth") -> Path:
    """The ground-truth folder used when none is given: the repository's `groundtruth/` (the
    folder next to the `simulator` package), else `./groundtruth` in the current directory.
    Neither present (an installed package run elsewhere) is a one-line ConfigError naming both
    places, prefixed with `command`."""
    beside_package = Path(__file__).resolve().parents[1] / GROUNDTRUTH_FOLDER
    if beside_package.is_dir():
        return beside_package
    in_cwd = Path.cwd() / GROUNDTRUTH_FOLDER
    if in_cwd.is_dir():
        return in_cwd
    raise ConfigError(
        f"{command}: no ground truth at {str(beside_package)!r} (next to the simulator "
        f"package) nor at {str(in_cwd)!r} (current directory); pass FOLDER"
    )


def discover_runs(
    folder: Path,
    forced_output: bool = True,
    traces: bool = False,
    names: Sequence[str] | None = None,
    trace_pairs_too: bool = False,
) -> list[RunSpec]:
    """Every `requests/<run>.requests.csv` with its meta.json, sorted by dataset and run; with
    `traces`, also every BLIS observe cell (`<cell>/trace.yaml` + `trace.csv` with a
    `server_config.json` in the cell's folder or the folder above), after them.

    With `forced_output` (the default), a run whose profile forced its output length
    (ignore_eos) replays every successful request at that length (`forced_output_tokens`);
    without it (the README's replay) at the count the client reported, which undercounts.
    `traces` is off by default so that callers that read the request CSVs themselves
    (calibrate's ground-truth cases) see only that layout. With `names`, only the runs
    `select_runs` would keep are read, so that another run's broken files do not stop them.
    `trace_pairs_too` only words the error of a folder holding none of these for a caller
    that also reads folders of trace cells and pairs itself (calibrate's FOLDER)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"ground truth: {str(folder)!r} is not a folder")
    datasets = [] if _is_cell(folder) else _dataset_folders(folder)
    cells = _trace_datasets(folder) if traces else []
    if not datasets and not cells:
        expected = "requests/ folder, nor any dataset folder holding one"
        if trace_pairs_too:
            expected = (
                "requests/ folder, nor any dataset folder holding one, and is no folder of "
                "trace cells (<cell>/trace.yaml + trace.csv) or NAME.yaml + NAME.csv pairs"
            )
        if traces:
            expected = (
                "requests/ folder or <cell>/trace.yaml + trace.csv, nor any dataset folder "
                "holding them"
            )
        raise ConfigError(
            f"ground truth: {str(folder)!r} has no {expected} (expected e.g. "
            "vllm-0.15.1-h100/requests/<run>.requests.csv"
            + (
                " or vllm-0.23.0-h100-qwen3-14b/<cell>/trace.yaml"
                if traces or trace_pairs_too
                else ""
            )
            + ")"
        )
    # (name, how to read it): a run's files are read only once it is selected.
    found: list[tuple[str, Callable[[], RunSpec]]] = []
    for dataset in datasets:
        for csv_path in sorted((dataset / "requests").glob(f"*{REQUESTS_SUFFIX}")):
            name = csv_path.name.removesuffix(REQUESTS_SUFFIX)
            found.append((name, functools.partial(_run_spec, dataset, name, csv_path)))
    for dataset, cell_folders in cells:
        found.extend((c.name, functools.partial(_cell_spec, dataset, c)) for c in cell_folders)
    if not found:
        raise ConfigError(f"ground truth: no *{REQUESTS_SUFFIX} files under {str(folder)!r}")
    selected = set(_selected_names([name for name, _ in found], names))
    runs = [read() for name, read in found if name in selected]
    if forced_output:
        return runs
    return [dataclasses.replace(spec, forced_output_tokens=None) for spec in runs]


def _require(data: dict, key: str, where: Path) -> Any:
    if not isinstance(data, dict) or key not in data or data[key] is None:
        raise ConfigError(f"ground truth: {str(where)!r}: missing key {key!r}")
    return data[key]


def _positive_int(value: Any, key: str, where: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"ground truth: {str(where)!r}: {key}: invalid value {excerpt(value)}; "
            "must be a positive integer"
        )
    return value


def bundled_model(model_id: str, where: Path) -> str:
    """The bundled model a HuggingFace id refers to (case and organisation insensitive)."""
    from .catalog.models import list_models

    wanted = str(model_id).strip().lower()
    names = list_models()
    for name in names:
        if name == wanted or name.split("/")[-1] == wanted.split("/")[-1]:
            return name
    raise ConfigError(
        f"ground truth: {str(where)!r}: model_id {excerpt(model_id)} is not a bundled model; "
        f"valid: {', '.join(names)}"
    )


def _max_model_len(config: dict, dataset: Path, name: str, meta_path: Path) -> int:
    """meta.json does not record the context limit; the run's server arguments do."""
    if config.get("max_model_len") is not None:
        return _positive_int(config["max_model_len"], "config.max_model_len", meta_path)
    exp = dataset / "runs" / name / "exp-config.yaml"
    if exp.exists():
        args = read_yaml(exp, "ground truth") or {}
        if isinstance(args, dict) and args.get("max_model_len") is not None:
            return _positive_int(args["max_model_len"], "max_model_len", exp)
    raise ConfigError(
        f"ground truth: {str(meta_path)!r}: missing key 'config.max_model_len' "
        f"(and no max_model_len in {str(exp)!r})"
    )


def _run_spec(dataset: Path, name: str, csv_path: Path) -> RunSpec:
    meta_path = csv_path.with_name(name + META_SUFFIX)
    if not meta_path.exists():
        raise ConfigError(f"ground truth: {str(meta_path)!r} is missing (needed for {name})")
    meta = read_json(meta_path, "ground truth")
    if not isinstance(meta, dict):
        raise ConfigError(
            f"ground truth: {str(meta_path)!r} must be a JSON object, not {type(meta).__name__}"
        )
    config = _require(meta, "config", meta_path)
    model_id = _require(meta, "model_id", meta_path)
    workload = str(_require(meta, "profile", meta_path))

    def cfg(key: str) -> int:
        if not isinstance(config, dict) or config.get(key) is None:
            raise ConfigError(f"ground truth: {str(meta_path)!r}: missing key 'config.{key}'")
        return _positive_int(config[key], f"config.{key}", meta_path)

    caching = recorded_prefix_caching(dataset / "runs" / name / "exp-config.yaml", csv_path)
    return RunSpec(
        name=name,
        requests_csv=csv_path,
        meta_json=meta_path,
        model=bundled_model(model_id, meta_path),
        tp=cfg("tensor_parallelism"),
        max_num_seqs=cfg("max_num_seqs"),
        max_num_batched_tokens=cfg("max_num_batched_tokens"),
        max_model_len=_max_model_len(config, dataset, name, meta_path),
        block_size_tokens=cfg("block_size"),
        gpu_kv_blocks=cfg("kv_blocks_total_gpu"),
        workload=workload,
        forced_output_tokens=forced_output_tokens(dataset / "runs" / name / "profile.yaml"),
        dataset=dataset_tag(dataset),
        prefix_caching=caching.enabled,
        prefix_caching_source=caching.source,
        version_source=_folder_version(dataset)[1],
    )


def _server_config(cell: Path) -> tuple[Path, dict[str, Any]]:
    """The `server_config.json` of an observe cell and its contents, found where `replay` and
    `calibrate` find it (`server_config_near`: in the cell's folder, else the folder above), so
    that a cell copied out with its configuration is scored as it is replayed."""
    path = server_config_near(cell / TRACE_DATA)
    if path is None:
        tried = " and ".join(
            repr(str((where / SERVER_CONFIG).resolve())) for where in (cell, cell.parent)
        )
        raise ConfigError(
            f"ground truth: {SERVER_CONFIG!r} is missing (needed for {cell.name}: the server's "
            f"settings; looked for {tried})"
        )
    config = read_json(path, "ground truth")
    if not isinstance(config, dict):
        raise ConfigError(
            f"ground truth: {str(path)!r} must be a JSON object, not {type(config).__name__}"
        )
    return path, config


# A trace header's `server` key for each server_config.json key `_cell_spec` reads (the two
# keys that set the same scenario field): the header outranks the configuration, as in
# `server_settings.recorded_server`.
_HEADER_KEYS = {
    config_key: header_key
    for config_key, path in SERVER_CONFIG_FIELDS.items()
    for header_key, header_path in HEADER_SERVER_FIELDS.items()
    if header_path == path
}


def _cell_spec(dataset: Path, cell: Path) -> RunSpec:
    """A BLIS observe cell, replayed with the server that recorded it as `replay` reads it:
    the trace header's `server` section first, then `server_config.json` (its README)."""
    from .latency.physics import version_key
    from .workload.trace import read_header, trace_spans

    _refuse_incomplete_cell(cell)
    config_path, server = _server_config(cell)
    header_path = cell / TRACE_HEADER
    header = header_server(read_header(header_path))

    unrecorded: dict[str, int] = {}

    def cfg(*keys: str, default: int | None = None) -> int:
        for key in keys:
            if _HEADER_KEYS.get(key) in header:
                return _positive_int(
                    header[_HEADER_KEYS[key]], f"server.{_HEADER_KEYS[key]}", header_path
                )
        for key in keys:
            if server.get(key) is not None:
                return _positive_int(server[key], key, config_path)
        if default is not None:
            unrecorded[keys[0]] = default
            return default
        raise ConfigError(f"ground truth: {str(config_path)!r}: missing key {keys[0]!r}")

    if "model" in header:
        model = bundled_model(header["model"], header_path)
    else:
        model = bundled_model(_require(server, "model", config_path), config_path)

    # What the server took for a batch limit the configuration does not record: vLLM's own
    # default on the GPU (server_settings.vllm_batch_defaults), not BLIS's.
    default_tokens, default_seqs = vllm_batch_defaults_for(HARDWARE)

    max_num_seqs = cfg("max_num_seqs", default=default_seqs)
    max_num_batched_tokens = cfg("max_num_batched_tokens", default=default_tokens)
    spans = trace_spans(cell / TRACE_DATA)
    caching = recorded_prefix_caching(header_path)
    server_version = server.get("vllm_version")
    if server_version is None:
        tag, version_source = _folder_version(dataset)
    else:
        # A recorded version that is no vLLM version is refused: a fit chosen for it would be
        # a guess.
        where = f"ground truth: {str(config_path)!r}: vllm_version"
        if not isinstance(server_version, str):
            raise invalid(where, server_version, "must be a string")
        version_key(server_version, where)
        tag, version_source = dataset_tag(dataset, server_version), SERVER_CONFIG
    return RunSpec(
        name=cell.name,
        requests_csv=cell / TRACE_DATA,
        meta_json=config_path,
        model=model,
        tp=cfg("tensor_parallel_size", "tensor_parallelism"),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        vllm_default_settings=tuple(unrecorded.items()),
        max_model_len=cfg("max_model_len", "max_seq_len"),
        block_size_tokens=cfg("block_size"),
        gpu_kv_blocks=cfg("num_gpu_blocks", "kv_blocks_total_gpu"),
        workload=cell.name.split("-")[0],
        dataset=tag,
        version_source=version_source,
        trace_header=header_path,
        prefix_caching=caching.enabled,
        prefix_caching_source=caching.source,
        spans=spans,
    )


def _optional_yaml(path: Path) -> Any:
    """The document of a load-generator file that only refines a replay: missing or unreadable
    (bad bytes, not YAML, not a regular file) counts as absent, as the callers' missing keys do.
    """
    if not path.exists():
        return {}
    try:
        return read_yaml(path, "ground truth") or {}
    except ConfigError:
        return {}


def forced_output_tokens(profile: Path) -> int | None:
    """The output length the load generator forced, from a run's profile.yaml: its
    `data.shared_prefix.output_len` when `server.ignore_eos` is set (vLLM then generates
    exactly max_tokens), else None (also when the file or the keys are missing).

    The request files' `output_tokens` is not that length: the client counted the tokens it
    received, and for the Llama-2-7B runs about a fifth of the successful requests report
    far fewer (p10 31-64 of 247-251; 76 report 0) while their E2E is the same as the
    full-length ones' to within 1.5% in every load stage. So the server generated the full
    length and the count is an artefact of the client; replaying the count would give those
    requests a fraction of the real work."""
    document = _optional_yaml(profile)
    try:
        if not (document.get("server") or {}).get("ignore_eos"):
            return None
        value = document["data"]["shared_prefix"]["output_len"]
    except (KeyError, TypeError, AttributeError):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def check_warm_up_s(value: Any, field_name: str = "warm_up_s") -> float:
    """A warm-up to leave out of the scores: a finite number of seconds >= 0."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value >= 0):
        raise invalid(field_name, value, "must be a number of seconds >= 0")
    return float(value)


def select_runs(runs: list[RunSpec], names: Sequence[str] | None) -> list[RunSpec]:
    """Runs whose name equals or contains one of `names`; a name matching none is an error."""
    keep = set(_selected_names([r.name for r in runs], names))
    return [r for r in runs if r.name in keep]


def _selected_names(available: list[str], names: Sequence[str] | None) -> list[str]:
    """The names of `available` that equal or contain one of `names` (all when none)."""
    if not names:
        return available
    for wanted in names:
        if not any(wanted in name for name in available):
            raise ConfigError(
                f"--runs: no run matches {excerpt(wanted)}; available: {', '.join(available)}"
            )
    return [name for name in available if any(wanted in name for wanted in names)]


# ------------------------------------------------------------------------------------ scoring


def run_metrics(
    ttft_ms: Iterable[float],
    e2e_ms: Iterable[float],
    output_tokens: Iterable[float],
    window_s: float,
) -> dict[str, float]:
    """The README's per-run figures from per-request values (numpy linear percentiles).

    ITL is derived from the means, not from stream chunks: the server sent about two chunks
    per token, so chunk gaps would halve it."""
    ttft = np.asarray(list(ttft_ms), dtype=float)
    e2e = np.asarray(list(e2e_ms), dtype=float)
    out = np.asarray(list(output_tokens), dtype=float)
    if ttft.size == 0 or e2e.size == 0:
        return dict.fromkeys(METRICS, math.nan)
    mean_out = out.mean()
    itl = (e2e.mean() - ttft.mean()) / (mean_out - 1) if mean_out > 1 else math.nan
    return {
        "ttft_mean_ms": float(ttft.mean()),
        "ttft_p90_ms": float(np.percentile(ttft, 90)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "e2e_mean_ms": float(e2e.mean()),
        "e2e_p90_ms": float(np.percentile(e2e, 90)),
        "e2e_p99_ms": float(np.percentile(e2e, 99)),
        "itl_ms": float(itl),
        "output_tokens_per_s": float(out.sum() / window_s) if window_s > 0 else math.nan,
    }


def score(measured: dict[str, float], predicted: dict[str, float]) -> list[dict[str, Any]]:
    """Per metric: measured, predicted, |pred − meas| / meas and the signed (pred − meas) / meas."""
    rows = []
    for metric in METRICS:
        meas, pred = measured.get(metric, math.nan), predicted.get(metric, math.nan)
        signed = (pred - meas) / meas if meas and math.isfinite(meas) else math.nan
        rows.append(
            {
                "metric": metric,
                "measured": meas,
                "predicted": pred,
                "error": abs(signed),
                "signed_error": signed,
            }
        )
    return rows


@dataclass(frozen=True)
class MeasuredRun:
    """What a run measured, per successful request, as validate scores it.

    `positions` are the successful rows (their position in the request file, which is the
    replayed request's `index`); `ttft_ms`, `e2e_ms` and `output_tokens` follow them.
    `reported` is every row's output-token count as the client reported it, `window_s` the
    throughput window and `requests` the number of rows, failed ones included."""

    positions: list[int]
    ttft_ms: np.ndarray
    e2e_ms: np.ndarray
    output_tokens: np.ndarray
    reported: list[int]
    window_s: float
    requests: int
    # Seconds from the run's first arrival (send) to each scored request's, following
    # `positions`; the throughput window starts at `window_start_s` on that clock.
    arrival_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    window_start_s: float = 0.0
    # Per scored request (following `positions`), whether the client streamed its answer: a
    # recorded row with `streaming` false measured no TTFT (`trace.not_streamed`). None: all.
    streamed: np.ndarray | None = None

    @property
    def streamed_mask(self) -> np.ndarray:
        """`streamed`, with None as every request."""
        if self.streamed is None:
            return np.ones(len(self.positions), dtype=bool)
        return self.streamed

    def only(self, keep: np.ndarray) -> MeasuredRun:
        """The scored requests where `keep` (following `positions`) is true."""
        return replace(
            self,
            positions=[p for p, k in zip(self.positions, keep, strict=True) if k],
            ttft_ms=self.ttft_ms[keep],
            e2e_ms=self.e2e_ms[keep],
            output_tokens=self.output_tokens[keep],
            arrival_s=self.arrival_s[keep] if self.arrival_s.size else self.arrival_s,
            streamed=None if self.streamed is None else self.streamed[keep],
        )

    def after_warm_up(self, warm_up_s: float, run: str = "") -> MeasuredRun:
        """The requests that arrived `warm_up_s` or more after the run's first: a freshly
        started vLLM server runs its first seconds slow (docs/accuracy.md, "The servers'
        warm-up"), which no step-time model prices. The throughput window starts there too."""
        if warm_up_s <= 0:
            return self
        keep = self.arrival_s >= warm_up_s
        if not keep.any():
            last = float(self.arrival_s.max()) if self.arrival_s.size else 0.0
            raise invalid(
                "warm_up_s",
                warm_up_s,
                f"run {run!r} has no successful request that arrived that late: must be below "
                f"its last one's {last:.1f} s",
                NothingToScore,
            )
        return replace(
            self.only(keep), window_s=self.window_s - warm_up_s, window_start_s=warm_up_s
        )


def measured_requests(run: RunSpec) -> MeasuredRun:
    """The measured side of a run (either layout), over its successful requests.

    Request CSV (vllm-0.15.1): `has_error == 0` rows, TTFT and E2E as the client measured
    them; the window runs from the first arrival to the last response of any request (failed
    ones included), the way targets_summary.csv computes it.
    Observe trace (vllm-0.23.0): see `measured_trace`, after the header's
    `warm_up_requests`."""
    if run.kind == "trace":
        from .workload.trace import read_header

        header = read_header(run.trace_header)
        warm_up = int(header.get("warm_up_requests") or 0)
        return measured_trace(run.requests_csv, warm_up, header)
    from .workload.trace import read_groundtruth_rows

    path = run.requests_csv
    rows = read_groundtruth_rows(path, measured=True)
    ok = [i for i, r in enumerate(rows) if not r.has_error and r.ttft_s is not None and r.e2e_s]
    if not ok:
        raise ConfigError(f"ground truth: {str(path)!r} has no successful request to score")
    start_us = min(r.arrival_time_us for r in rows)
    end_s = max(r.arrival_time_us / 1e6 + r.e2e_s for r in rows if r.e2e_s is not None)
    return MeasuredRun(
        positions=ok,
        ttft_ms=np.asarray([rows[i].ttft_s * 1e3 for i in ok]),
        e2e_ms=np.asarray([rows[i].e2e_s * 1e3 for i in ok]),
        output_tokens=np.asarray([rows[i].output_tokens for i in ok], dtype=float),
        reported=[r.output_tokens for r in rows],
        window_s=end_s - start_us / 1e6,
        requests=len(rows),
        arrival_s=np.asarray([(rows[i].arrival_time_us - start_us) / 1e6 for i in ok]),
    )


class NothingToScore(ConfigError):
    """A measured run without a successful request (after its warm-up) to score or fit."""


def measured_trace(
    path: Path, warm_up_requests: int = 0, header: dict[str, Any] | None = None
) -> MeasuredRun:
    """The measured side of a recorded trace (observe's data file): the `status == ok` rows
    with both chunk times, after the first `warm_up_requests` rows (the load generator's
    warm-up, which the header counts), TTFT = first chunk − send and E2E = last chunk − send
    (send_time_us; arrival_time_us when it is 0); the window runs from the first send to the
    last chunk of any request, over the rows that were sent (`trace.never_sent`). With the
    trace's `header`, a recorded row not streamed is marked (`MeasuredRun.streamed`). `validate`
    scores and `calibrate` fits these requests."""
    from .workload.trace import never_sent, not_streamed, read_rows, refuse_decreasing_times

    rows = read_rows(path)
    ok = [
        i
        for i, r in enumerate(rows)
        if i >= warm_up_requests
        and r.status == "ok"
        and r.first_chunk_time_us > 0
        and r.last_chunk_time_us > 0
    ]
    if not ok:
        after = f" after its {warm_up_requests} warm-up requests" if warm_up_requests else ""
        raise NothingToScore(
            f"trace data: {str(path)!r} has no successful (ok) request{after} to score"
        )
    sent = [r.injection_basis_us for r in rows]
    unsent = never_sent(rows)
    for i in ok:  # before anything is fitted or scored on a negative latency
        if unsent[i]:
            raise ConfigError(
                f"trace data: {str(path)!r}, request {rows[i].request_id}: status ok with "
                "send_time_us 0 (never sent) among wall-clock sends; a completed request was "
                "sent"
            )
        # Labelled by what the input is: a recorded trace (validate's observe cell or a trace
        # calibrate fits), as trace reading labels its errors.
        refuse_decreasing_times(rows[i], sent[i], f"trace data: {str(path)!r}")
    ends = [r.last_chunk_time_us for r in rows if r.last_chunk_time_us > 0]
    # The window starts at the first send: an unsent row's arrival is on the run's clock, and
    # taking it for the start stretched a wall-clock window over 56 years.
    first_us = min(s for s, never in zip(sent, unsent, strict=True) if not never)
    return MeasuredRun(
        positions=ok,
        ttft_ms=np.asarray([(rows[i].first_chunk_time_us - sent[i]) / 1e3 for i in ok]),
        e2e_ms=np.asarray([(rows[i].last_chunk_time_us - sent[i]) / 1e3 for i in ok]),
        output_tokens=np.asarray([rows[i].output_tokens for i in ok], dtype=float),
        reported=[r.output_tokens for r in rows],
        window_s=(max(ends) - first_us) / 1e6,
        requests=len(rows),
        arrival_s=np.asarray([(sent[i] - first_us) / 1e6 for i in ok]),
        streamed=np.asarray([not not_streamed(header or {}, rows[i]) for i in ok], dtype=bool),
    )


# The figures only a streamed answer measures (its first chunk is the first token).
STREAMED_METRICS = ("ttft_mean_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_ms")


def _figures(m: MeasuredRun) -> dict[str, float]:
    return run_metrics(m.ttft_ms, m.e2e_ms, m.output_tokens, m.window_s)


def _predicted(
    records: list,
    positions: list[int],
    reported: Sequence[int] | None = None,
    window_start_s: float = 0.0,
) -> tuple[dict[str, float], int]:
    """Predicted figures of the same requests (by row position), over those the run finished.

    ITL and throughput count each request's output as `reported[position]` when given (the
    client's count, as the measured figures do: the simulated client would have counted the
    same text), else as the tokens the replay generated. The throughput window starts
    `window_start_s` after the first arrival (the measured side's warm-up, if any)."""
    by_index = {r.index: r for r in records}
    done = [
        (i, by_index[i])
        for i in positions
        if i in by_index and by_index[i].state is RequestState.COMPLETED
    ]
    finished = [r for r in records if r.state is RequestState.COMPLETED]
    start_us = min((r.arrival_us for r in records), default=0) + round(window_start_s * 1e6)
    end_us = max((r.completion_us for r in finished), default=start_us)
    metrics = run_metrics(
        ((r.first_token_us - r.arrival_us) / 1e3 for _, r in done),
        ((r.completion_us - r.arrival_us) / 1e3 for _, r in done),
        (reported[i] if reported is not None else r.generated_tokens for i, r in done),
        (end_us - start_us) / 1e6,
    )
    return metrics, len(done)


def achieved_rps(records: Iterable) -> float:
    """Requests completed per second of a replay, from its first arrival to its last
    completion: under overload, the server's capacity."""
    records = list(records)
    finished = [r for r in records if r.state is RequestState.COMPLETED]
    if not finished:
        return math.nan
    start_us = min(r.arrival_us for r in records)
    span_us = max(r.completion_us for r in finished) - start_us
    return len(finished) / (span_us / 1e6) if span_us > 0 else math.nan


def replay_overrides(run: RunSpec, latency_model: str) -> dict[str, Any]:
    """README step 1: one H100 instance with the run's server settings and KV capacity;
    prefix caching as the server had it (`RunSpec.prefix_caching`); physics uses its fit for
    the measured server's vLLM version."""
    version = {}
    if latency_model == "physics" and run.vllm_version is not None:
        version = {"latency__vllm_version": run.vllm_version}
    return version | {
        "model": run.model,
        "hardware": HARDWARE,
        "tp": run.tp,
        "latency__model": latency_model,
        "engine__max_num_running_reqs": run.max_num_seqs,
        "engine__max_num_scheduled_tokens": run.max_num_batched_tokens,
        "engine__max_model_len": run.max_model_len,
        "engine__block_size_tokens": run.block_size_tokens,
        "engine__total_kv_blocks": run.gpu_kv_blocks,
        "engine__enable_prefix_caching": run.prefix_caching,
        "cluster__num_instances": 1,
    }


def validate_run(
    run: RunSpec,
    latency_model: str = DEFAULT_LATENCY_MODEL,
    extra_overrides: dict[str, Any] | None = None,
    trace: tuple[Path, Path] | None = None,
    offered_load: bool | None = None,
    warm_up_s: float = 0.0,
) -> dict[str, Any]:
    """Replay one run and score it. Returns the run's identity, counts, wall time, `scores`
    (one dict per metric, see `score`) and, for an observe cell, `load` (see `load_row`).
    `trace` (header, data) replays those requests instead of the run's own, in the same order
    (e.g. `shared_prefix_trace`). `warm_up_s` > 0 scores only the requests that arrived that
    long after the run's first, on both sides (`MeasuredRun.after_warm_up`); the whole run is
    still replayed, and the load row still counts every request.

    `offered_load` (default: for a cell whose client fell behind) uses the cell's requests at
    their *scheduled* times, through the recorded client's limit on outstanding requests (the
    load that was offered; `offered_load_replay`), for the predicted achieved throughput:
    replayed at their send times, an overloaded cell would offer the simulated server only
    what the real one let the client send."""
    import tempfile

    from .api import replay
    from .workload.trace import client_of

    started_s = time.perf_counter()
    whole_run = measured_requests(run)
    measured = whole_run.after_warm_up(warm_up_s, run.name)
    overrides = replay_overrides(run, latency_model) | (extra_overrides or {})
    with tempfile.TemporaryDirectory(prefix="servesim-") as tmp:
        header, data = trace if trace is not None else baseline_trace(run, Path(tmp))
        # The run's own trace: its client decided from the spans read when it was found.
        client = {}
        recorded_client = client_of(run.spans) if run.spans is not None else None
        if trace is None and recorded_client is not None:
            client = {"max_in_flight": recorded_client.replay_choice}
        result = replay(header, data, **client, **overrides)
        load = None
        if run.kind == "trace":
            if offered_load is None:
                offered_load = run.client_fell_behind
            at_schedule = None
            if offered_load:
                # A late client's own replay (`--max-in-flight auto`) already is the offered
                # load through its limit; otherwise replay the schedule.
                replayed_at_schedule = (
                    trace is None and recorded_client is not None and recorded_client.at_schedule
                )
                at_schedule = (
                    result
                    if replayed_at_schedule
                    else offered_load_replay(run, Path(tmp), overrides, recorded_client)
                )
            load = load_row(run, whole_run, result.request_records, at_schedule)
    # With a forced length (or an observe cell's exact count), the simulated client counts
    # what the real one reported.
    counted = run.forced_output_tokens is not None or run.kind == "trace"
    reported = measured.reported if counted else None
    predicted, n_predicted = _predicted(
        result.request_records, measured.positions, reported, measured.window_start_s
    )
    figures = _figures(measured)
    streamed = measured.streamed_mask
    if not streamed.all():
        # A request the client did not stream measured no TTFT (its first chunk is the whole
        # body's): TTFT and ITL are of the streamed requests alone, on both sides.
        only = measured.only(streamed)
        sub_measured = _figures(only)
        sub_predicted, _ = _predicted(
            result.request_records, only.positions, reported, measured.window_start_s
        )
        for name in STREAMED_METRICS:
            figures[name], predicted[name] = sub_measured[name], sub_predicted[name]
    outcome = {
        "run": run.name,
        "dataset": run.dataset,
        "model": run.model,
        "workload": run.workload,
        "overloaded": run.overloaded,
        "latency_model": latency_model,
        "prefix_caching": overrides.get("engine__enable_prefix_caching"),
        "n_requests": measured.requests,
        "n_success": len(measured.positions),
        "n_predicted": n_predicted,
        "warm_up_s": warm_up_s,
        "wall_s": time.perf_counter() - started_s,
        "scores": score(figures, predicted),
    }
    if not streamed.all():
        outcome["not_streamed"] = int(np.count_nonzero(~streamed))
    if load is not None:
        outcome["load"] = load
    return outcome


def load_row(
    run: RunSpec, measured: MeasuredRun, at_sends: list, at_schedule: Any = None
) -> dict[str, Any]:
    """One cell of a load sweep: offered, sent and achieved request rates (req/s).

    offered = requests / scheduled span (arrival_time_us); sent = requests / send span;
    measured = successful requests / the measured window (first send to last chunk);
    predicted = completed requests / (last completion − first arrival) of the replay at the
    scheduled times when `at_schedule` (a replay Result) is given, else of the replay at the
    send times (which, for a cell whose client kept up, is the offered load within 2 %)."""
    from .workload.trace import trace_spans

    spans = run.spans if run.spans is not None else trace_spans(run.requests_csv)
    n = spans.rows
    records = at_schedule.request_records if at_schedule is not None else at_sends
    return {
        "dataset": run.dataset,
        "run": run.name,
        "requests": n,
        "offered_rps": n / (spans.scheduled_span_us / 1e6) if spans.scheduled_span_us else math.nan,
        "sent_rps": n / (spans.send_span_us / 1e6) if spans.send_span_us else math.nan,
        "measured_rps": len(measured.positions) / measured.window_s
        if measured.window_s > 0
        else math.nan,
        "predicted_rps": achieved_rps(records),
        "predicted_at": "schedule" if at_schedule is not None else "sends",
        "overloaded": run.overloaded,
    }


def offered_load_replay(
    run: RunSpec, workdir: Path, overrides: dict[str, Any], recorded_client: Any = None
) -> Any:
    """The replay of an observe cell's requests at their scheduled times, through its
    recorded client's limit on outstanding requests when that client fell behind (256 in the
    saturated 0.23 cells; `recorded_client` is `trace.client_of` of the cell's spans): the
    load the real server was offered. Without the limit the simulated server would face a
    queue the real one never saw (with vLLM's 1,024 sequences on an H100 it then admits past
    its KV capacity and preempts)."""
    from .api import replay

    client = {}
    if recorded_client is not None and recorded_client.at_schedule:
        client = {"max_in_flight": recorded_client.max_in_flight}
    return replay(*scheduled_trace(run, workdir), **client, **overrides)


def scheduled_trace(run: RunSpec, workdir: Path) -> tuple[Path, Path]:
    """An observe cell's requests at their scheduled times (arrival_time_us, the offered
    load) instead of their send times, otherwise as `replay_requests` builds them."""
    from .workload.trace import read_rows, requests_from_rows, write_trace

    rows = [dataclasses.replace(r, send_time_us=0) for r in read_rows(run.requests_csv)]
    return write_trace(workdir / f"{run.name}-scheduled", requests_from_rows(rows))


# README: the system prompt every request starts with, by workload.
SYSTEM_PROMPT_TOKENS = {"general": 100, "codegen": 100, "roleplay": 150, "reasoning": 100}
PREFIX_GROUPS = 10


# A prompt cycle is read off the request file when at least this share of the requests one
# cycle apart have the same prompt length...
PROMPT_CYCLE_AGREEMENT = 0.95
# ...and the lengths vary enough to say anything (equal lengths fit every cycle).
PROMPT_CYCLE_MIN_LENGTHS = 3


def prompt_cycle(lengths: Sequence[int]) -> int | None:
    """The period of a sequence of prompt lengths in request order: the smallest P such that
    requests P apart have the same length (PROMPT_CYCLE_AGREEMENT of the pairs whose lengths
    were recorded, > 0), over at least two whole cycles; None when there is none or the
    lengths vary too little to tell (fewer than PROMPT_CYCLE_MIN_LENGTHS distinct)."""
    tokens = np.asarray(lengths, dtype=np.int64)
    if len(set(tokens[tokens > 0].tolist())) < PROMPT_CYCLE_MIN_LENGTHS:
        return None
    for period in range(1, tokens.size // 2 + 1):
        before, after = tokens[:-period], tokens[period:]
        recorded = (before > 0) & (after > 0)
        pairs = int(recorded.sum())
        if pairs >= period and (before[recorded] == after[recorded]).mean() >= (
            PROMPT_CYCLE_AGREEMENT
        ):
            return period
    return None


def _prompt_cycle_of(requests_csv: Path) -> int | None:
    """`prompt_cycle` of a request file, read once per version of the file (validate replays
    it, then prints it)."""
    stat = requests_csv.stat()
    return _prompt_cycle_cached(requests_csv.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.cache
def _prompt_cycle_cached(requests_csv: Path, _mtime_ns: int, _size: int) -> int | None:
    from .workload.trace import read_groundtruth_rows

    return prompt_cycle([r.input_tokens for r in read_groundtruth_rows(requests_csv)])


def distinct_prompts(run: RunSpec) -> int | None:
    """The number of distinct prompts the load generator cycled through, in order: the period
    of the request file's prompt lengths (`prompt_cycle`; every vLLM 0.15.1 run cycles
    through 100). None when the lengths show no cycle, and for an observe cell, which records
    its own prompts.

    The profile's system prompts x users is not a fallback: it says how many prompts the
    generator could draw, not that it sent them in a fixed cycle, and a replay that cycled
    them anyway would credit the server with prefix hits nothing shows it had."""
    if run.kind == "trace":
        return None
    return _prompt_cycle_of(Path(run.requests_csv))


def shared_prefix_trace(
    run: RunSpec, prefix: Path, groups: int = PREFIX_GROUPS, whole_prompt: bool = False
) -> tuple[Path, Path]:
    """The run's requests as a TraceV3 whose system prompt is shared by `groups` groups,
    assigned round-robin (README step 2's sensitivity check: membership was not recorded).
    `whole_prompt` shares the whole prompt instead, `groups` being the run's distinct prompts
    (`distinct_prompts`): the load generator cycled through them in a fixed order, so vLLM's
    prefix cache served almost all of every prompt after its first occurrence."""
    from .engine.request import Request, prefix_key
    from .workload.trace import write_trace

    system = SYSTEM_PROMPT_TOKENS.get(run.workload, 0)
    requests = []
    for req in replay_requests(run):
        group = f"system-{req.index % groups}"
        shared = req.input_tokens if whole_prompt else min(system, req.input_tokens)
        segments = [(prefix_key(group), shared)]
        if req.input_tokens > shared:
            segments.append((("req", req.request_id), req.input_tokens - shared))
        requests.append(
            Request(
                req.request_id,
                req.arrival_us,
                req.input_tokens,
                req.output_tokens,
                index=req.index,
                segments=segments,
                prefix_group=group,
            )
        )
    return write_trace(prefix, requests, keep_prefix_groups=True)


def replay_requests(run: RunSpec) -> list:
    """The run's requests as README step 2 replays them (`read_groundtruth_csv`), except that
    every successful request generates the run's `forced_output_tokens` when it has one (see
    `forced_output_tokens`); failed requests keep max(1, the reported count). An observe
    cell's requests are its trace's, as replay rebuilds them (`load_trace`)."""
    from .engine.request import Request
    from .workload.trace import (
        read_groundtruth_csv,
        read_groundtruth_rows,
        read_rows,
        requests_from_rows,
    )

    if run.kind == "trace":
        return requests_from_rows(read_rows(run.requests_csv))
    requests = read_groundtruth_csv(run.requests_csv)
    forced = run.forced_output_tokens
    if forced is None:
        return requests
    rows = read_groundtruth_rows(run.requests_csv)
    return [
        req
        if row.has_error
        else Request(req.request_id, req.arrival_us, req.input_tokens, forced, index=req.index)
        for req, row in zip(requests, rows, strict=True)
    ]


def baseline_trace(run: RunSpec, workdir: Path | None = None) -> tuple[Path | None, Path]:
    """The README's baseline replay (every prompt its own): the run's CSV itself (an observe
    cell: its trace pair), or, when the run has `forced_output_tokens`, a trace of
    `replay_requests` written under `workdir` (a new temporary folder if None)."""
    import tempfile

    from .workload.trace import write_trace

    if run.kind == "trace":
        return run.trace_header, run.requests_csv
    if run.forced_output_tokens is None:
        return None, run.requests_csv
    folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="servesim-"))
    return write_trace(folder / f"{run.name}-baseline", replay_requests(run))


def reused_prompts(run: RunSpec, prompt_reuse: bool | None = None) -> int | None:
    """How many distinct prompts `run`'s replay cycles through, or None when it replays every
    prompt as new. The choice `validate` and `calibrate` share: `prompt_reuse=None` (their
    default) reuses prompts whenever the run shows the load generator's cycle
    (`distinct_prompts`), which is what the server was sent; False never; True requires the
    cycle (a ConfigError naming the run when there is none). An observe cell records its own
    prompts and is replayed as recorded either way."""
    if run.kind == "trace" or prompt_reuse is False:
        return None
    prompts = distinct_prompts(run)
    if prompts is None and prompt_reuse:
        raise ConfigError(
            f"--prompt-reuse: {run.name}: its prompt lengths repeat in no cycle, so there are "
            "no repeated prompts to replay (--no-prompt-reuse, or leave both out, replays "
            "every prompt as new)"
        )
    return prompts


def reuse_trace(run: RunSpec, workdir: Path | None = None) -> tuple[Path, Path]:
    """The prompt-reuse replay of a run: its distinct prompts (`distinct_prompts`) shared
    whole, request i reusing prompt i mod their number (written under `workdir`, a new
    temporary folder if None)."""
    import tempfile

    if run.kind == "trace":
        raise ConfigError(
            f"--prompt-reuse: {run.name}: an observe cell records its own prompts; "
            "it has no load-generator profile to reuse"
        )
    prompts = reused_prompts(run, True)
    folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="servesim-"))
    return shared_prefix_trace(run, folder / f"{run.name}-reuse", prompts, whole_prompt=True)


@dataclass
class Validation:
    """Everything `validate_datasets` scored: one row per run × metric (`frame`,
    FRAME_COLUMNS), one row per load cell (`load`, LOAD_COLUMNS), the runs and their
    outcomes (as `validate_run` returns them)."""

    frame: pd.DataFrame
    load: pd.DataFrame
    runs: list[RunSpec]
    outcomes: list[dict[str, Any]]

    def reused_prompts(self) -> dict[str, set[int | None]]:
        """Per dataset of request-CSV runs, the prompt counts its replays cycled through
        (None: a run replayed with every prompt new)."""
        found: dict[str, set[int | None]] = {}
        for run, outcome in zip(self.runs, self.outcomes, strict=True):
            if run.kind == "requests":
                found.setdefault(run.dataset, set()).add(outcome.get("reused_prompts"))
        return found


def prompt_reuse_text(counts: Iterable[int]) -> str:
    """How a prompt-reuse replay shares prompts, as the commands say it."""
    listed = ", ".join(str(n) for n in sorted(counts))
    return f"{listed} distinct prompts per run, request i reusing prompt i mod that"


def validate_datasets(
    folder: Path,
    latency_model: str = DEFAULT_LATENCY_MODEL,
    runs: Sequence[str] | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    extra_overrides: dict[str, Any] | None = None,
    prompt_reuse: bool | None = None,
    forced_output: bool = True,
    traces: bool = True,
    prefix_caching: bool | None = None,
    warm_up_s: float = 0.0,
    vllm_version: str | None = None,
) -> Validation:
    """Replay and score every run under `folder` (both layouts; `traces=False` only the
    request CSVs). `on_run` sees each run's result as it ends. `extra_overrides` (dotted with
    `__`) apply to every replay, e.g. latency__coeffs_file; `prefix_caching` overrides what
    each server did; `prompt_reuse` decides whether a request-CSV run's replay reuses the load
    generator's repeated prompts (`reused_prompts`: by default whenever the run shows them;
    an observe cell replays its own prompts); `forced_output` replays forced output lengths
    (see `discover_runs`); `warm_up_s` > 0 scores only the requests that arrived that long
    after each run's first (see `validate_run`); `vllm_version` chooses physics's shipped fit
    for every run instead of each dataset's recorded version. Each outcome records
    `reused_prompts`."""
    import tempfile

    from .latency.physics import version_key

    warm_up_s = check_warm_up_s(warm_up_s)
    if vllm_version is not None:
        version_key(vllm_version, "vllm_version")

    specs = discover_runs(Path(folder), forced_output, traces=traces, names=runs)
    rows, load, outcomes = [], [], []
    for spec in specs:
        overrides = dict(extra_overrides or {})
        if vllm_version is not None and latency_model == "physics":
            overrides["latency__vllm_version"] = vllm_version
        if prefix_caching is not None:
            overrides.setdefault("engine__enable_prefix_caching", prefix_caching)
        prompts = reused_prompts(spec, prompt_reuse)
        if prompts is not None:
            with tempfile.TemporaryDirectory() as tmp:
                trace = reuse_trace(spec, Path(tmp))
                outcome = validate_run(spec, latency_model, overrides, trace, warm_up_s=warm_up_s)
        else:
            outcome = validate_run(spec, latency_model, overrides, warm_up_s=warm_up_s)
        outcome["reused_prompts"] = prompts
        if on_run is not None:
            on_run(outcome)
        outcomes.append(outcome)
        if "load" in outcome:
            load.append(outcome["load"])
        for s in outcome["scores"]:
            rows.append(
                {
                    "run": spec.name,
                    "model": spec.model,
                    "workload": spec.workload,
                    **s,
                    "overloaded": spec.overloaded,
                    "dataset": spec.dataset,
                }
            )
    return Validation(
        frame=pd.DataFrame(rows, columns=FRAME_COLUMNS),
        load=pd.DataFrame(load, columns=LOAD_COLUMNS),
        runs=specs,
        outcomes=outcomes,
    )


def physics_fit_lines(runs: Sequence[RunSpec], vllm_version: str | None = None) -> list[str]:
    """Per dataset, the shipped physics fit its replays use and why (`--vllm-version`, the
    version its server's configuration or its folder's name records, else the newest fit,
    with a warning): a folder's name alone can choose the fit, and a copy under another name
    would silently take another."""
    from .catalog.hardware import get_gpu
    from .latency.physics import default_coefficients

    gpu = get_gpu(HARDWARE)
    lines, seen = [], set()
    for run in runs:
        if run.dataset in seen:
            continue
        seen.add(run.dataset)
        version = vllm_version or run.vllm_version
        _, source = default_coefficients(gpu, version)
        if vllm_version is not None:
            why = f"vLLM {vllm_version} from --vllm-version"
        elif run.vllm_version is not None:
            why = f"vLLM {run.vllm_version} from {run.version_source}"
        else:
            why = "no vLLM version recorded: the newest fit"
        line = (
            f"{run.dataset}: physics fit: {source.fit_gpu}, vLLM {source.fit_vllm} "
            f"({why}{source.note})"
        )
        if version is None:
            line = (
                f"{run.dataset}: warning: vLLM version unknown (the server's configuration "
                "records none, nor the folder's name); physics uses the newest fit, "
                f"{source.fit_gpu} vLLM {source.fit_vllm} (--vllm-version chooses)"
            )
        lines.append(line)
    return lines


def validate_folder(
    folder: Path,
    latency_model: str = DEFAULT_LATENCY_MODEL,
    runs: Sequence[str] | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    extra_overrides: dict[str, Any] | None = None,
    prompt_reuse: bool | None = None,
    forced_output: bool = True,
    traces: bool = True,
    prefix_caching: bool | None = None,
    warm_up_s: float = 0.0,
) -> pd.DataFrame:
    """One row per run × metric (FRAME_COLUMNS) of `validate_datasets`."""
    return validate_datasets(
        folder,
        latency_model,
        runs,
        on_run,
        extra_overrides,
        prompt_reuse,
        forced_output,
        traces,
        prefix_caching,
        warm_up_s,
    ).frame


SUMMARY_COLUMNS = [
    "group",
    "dataset",
    "metric",
    "runs",
    "mean_error",
    "median_error",
    "mean_signed_error",
]
ALL_DATASETS = "all"


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Per group (accuracy runs / overloaded runs), dataset and metric: runs, mean and median
    error, mean signed error. With several datasets, each group also gets an `all` row per
    metric over every dataset's runs."""
    if "dataset" not in frame.columns:
        frame = frame.assign(dataset="")
    datasets = list(dict.fromkeys(frame["dataset"]))
    scopes = datasets + ([ALL_DATASETS] if len(datasets) > 1 else [])
    rows = []
    for group, overloaded in (("accuracy", False), ("overloaded", True)):
        part = frame[frame["overloaded"] == overloaded]
        for scope in scopes:
            here = part if scope == ALL_DATASETS else part[part["dataset"] == scope]
            for metric in METRICS:
                values = here[here["metric"] == metric]
                if values.empty:
                    continue
                rows.append(
                    {
                        "group": group,
                        "dataset": scope,
                        "metric": metric,
                        "runs": len(values),
                        "mean_error": float(values["error"].mean()),
                        "median_error": float(values["error"].median()),
                        "mean_signed_error": float(values["signed_error"].mean()),
                    }
                )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def saturation(load: pd.DataFrame) -> pd.DataFrame:
    """Per dataset: the saturation throughput, the largest achieved request rate over its
    cells, measured and predicted, and the cells that reached it."""
    rows = []
    for dataset, cells in load.groupby("dataset", sort=False):
        measured = cells.loc[cells["measured_rps"].idxmax()]
        predicted = (
            cells.loc[cells["predicted_rps"].idxmax()]
            if cells["predicted_rps"].notna().any()
            else None
        )
        rows.append(
            {
                "dataset": dataset,
                "measured_rps": float(measured["measured_rps"]),
                "measured_run": measured["run"],
                "predicted_rps": float(predicted["predicted_rps"])
                if predicted is not None
                else math.nan,
                "predicted_run": predicted["run"] if predicted is not None else "",
            }
        )
    return pd.DataFrame(
        rows, columns=["dataset", "measured_rps", "measured_run", "predicted_rps", "predicted_run"]
    )


def format_table(frame: pd.DataFrame) -> str:
    """Per-run table: one line per run × metric, errors in percent."""
    width = max([46, *(len(str(r)) for r in frame["run"])])
    lines = [
        f"{'run':<{width}} {'metric':<20} {'measured':>11} {'predicted':>11} {'error':>8} "
        f"{'signed':>8}"
    ]
    for row in frame.itertuples(index=False):
        flag = " (overloaded)" if row.overloaded and row.metric == METRICS[0] else ""
        lines.append(
            f"{row.run:<{width}} {row.metric:<20} {row.measured:>11.2f} {row.predicted:>11.2f} "
            f"{row.error:>8.1%} {row.signed_error:>+8.1%}{flag}"
        )
    return "\n".join(lines)


def format_summary(summary: pd.DataFrame) -> str:
    lines = [
        f"{'group':<11} {'dataset':<14} {'metric':<20} {'runs':>4} {'mean err':>9} "
        f"{'median err':>10} {'mean signed':>11}"
    ]
    for row in summary.itertuples(index=False):
        lines.append(
            f"{row.group:<11} {row.dataset or '-':<14} {row.metric:<20} {row.runs:>4} "
            f"{row.mean_error:>9.1%} {row.median_error:>10.1%} {row.mean_signed_error:>+11.1%}"
        )
    return "\n".join(lines)


def format_load(load: pd.DataFrame) -> str:
    """Per load cell: offered, sent, measured and predicted achieved rates (req/s)."""
    width = max([26, *(len(str(r)) for r in load["run"])])
    lines = [
        f"{'cell':<{width}} {'requests':>8} {'offered':>8} {'sent':>8} {'measured':>9} "
        f"{'predicted':>9} {'error':>7}  predicted at"
    ]
    for row in load.itertuples(index=False):
        error = (row.predicted_rps - row.measured_rps) / row.measured_rps
        flag = " (overloaded)" if row.overloaded else ""
        lines.append(
            f"{row.run:<{width}} {row.requests:>8} {row.offered_rps:>8.2f} {row.sent_rps:>8.2f} "
            f"{row.measured_rps:>9.2f} {row.predicted_rps:>9.2f} {error:>+7.1%}  "
            f"{row.predicted_at}{flag}"
        )
    return "\n".join(lines)


def format_saturation(table: pd.DataFrame) -> str:
    lines = []
    for row in table.itertuples(index=False):
        error = (row.predicted_rps - row.measured_rps) / row.measured_rps
        lines.append(
            f"saturation throughput {row.dataset}: measured {row.measured_rps:.2f} req/s "
            f"({row.measured_run}), predicted {row.predicted_rps:.2f} req/s "
            f"({row.predicted_run}), {error:+.1%}"
        )
    return "\n".join(lines)
