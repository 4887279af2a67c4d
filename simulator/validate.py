"""Score servesim against real vLLM runs (shared/groundtruth/vllm-0.15.1-h100).

Each run is replayed exactly as its README prescribes (one H100 instance with the run's
server settings and measured KV capacity, every request at its recorded arrival time, prefix
caching off) and the measured and predicted latency figures of the successful requests are
compared metric by metric. Nothing here is fitted on the runs, so every figure is
out-of-sample for the analytical backends.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .engine.request import RequestState
from .errors import ConfigError, excerpt
from .input_files import read_json, read_yaml

REQUESTS_SUFFIX = ".requests.csv"
META_SUFFIX = ".meta.json"
HARDWARE = "H100"
# The README's load marks these workloads as overloaded (many client timeouts): scored for
# the record, but kept out of the accuracy summary.
OVERLOADED_WORKLOADS = frozenset({"reasoning"})
WORKLOADS = ("general", "codegen", "roleplay", "reasoning")
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

    @property
    def overloaded(self) -> bool:
        return self.workload in OVERLOADED_WORKLOADS


# ---------------------------------------------------------------------------------- discovery


def _dataset_folders(folder: Path) -> list[Path]:
    """The dataset folder itself, or the dataset folders directly under it."""
    if (folder / "requests").is_dir():
        return [folder]
    return sorted(p for p in folder.iterdir() if (p / "requests").is_dir())


def discover_runs(folder: Path, forced_output: bool = True) -> list[RunSpec]:
    """Every `requests/<run>.requests.csv` with its meta.json, sorted by dataset and run.

    With `forced_output` (the default), a run whose profile forced its output length
    (ignore_eos) replays every successful request at that length (`forced_output_tokens`);
    without it (the README's replay) at the count the client reported, which undercounts."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"ground truth: {str(folder)!r} is not a folder")
    datasets = _dataset_folders(folder)
    if not datasets:
        raise ConfigError(
            f"ground truth: {str(folder)!r} has no requests/ folder, nor any dataset folder "
            "holding one (expected e.g. vllm-0.15.1-h100/requests/<run>.requests.csv)"
        )
    runs = []
    for dataset in datasets:
        for csv_path in sorted((dataset / "requests").glob(f"*{REQUESTS_SUFFIX}")):
            name = csv_path.name.removesuffix(REQUESTS_SUFFIX)
            spec = _run_spec(dataset, name, csv_path)
            if not forced_output:
                spec = dataclasses.replace(spec, forced_output_tokens=None)
            runs.append(spec)
    if not runs:
        raise ConfigError(f"ground truth: no *{REQUESTS_SUFFIX} files under {str(folder)!r}")
    return runs


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


def select_runs(runs: list[RunSpec], names: Sequence[str] | None) -> list[RunSpec]:
    """Runs whose name equals or contains one of `names`; a name matching none is an error."""
    if not names:
        return runs
    for wanted in names:
        if not any(wanted in r.name for r in runs):
            raise ConfigError(
                f"--runs: no run matches {excerpt(wanted)}; "
                f"available: {', '.join(r.name for r in runs)}"
            )
    return [r for r in runs if any(wanted in r.name for wanted in names)]


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


def _measured(path: Path) -> tuple[dict[str, float], list[int], list[int]]:
    """Measured figures of the successful rows, their row positions, and every row's output
    tokens as the client reported them (the count ITL and throughput use).

    Throughput's window runs from the first arrival to the last response of any request
    (failed ones included), the way targets_summary.csv computes it."""
    from .workload.trace import read_groundtruth_rows

    rows = read_groundtruth_rows(path)
    ok = [i for i, r in enumerate(rows) if not r.has_error and r.ttft_s is not None and r.e2e_s]
    if not ok:
        raise ConfigError(f"ground truth: {str(path)!r} has no successful request to score")
    start_us = min(r.arrival_time_us for r in rows)
    end_s = max(r.arrival_time_us / 1e6 + r.e2e_s for r in rows if r.e2e_s is not None)
    metrics = run_metrics(
        (rows[i].ttft_s * 1e3 for i in ok),
        (rows[i].e2e_s * 1e3 for i in ok),
        (rows[i].output_tokens for i in ok),
        end_s - start_us / 1e6,
    )
    return metrics, ok, [r.output_tokens for r in rows]


def _predicted(
    records: list, positions: list[int], reported: Sequence[int] | None = None
) -> tuple[dict[str, float], int]:
    """Predicted figures of the same requests (by row position), over those the run finished.

    ITL and throughput count each request's output as `reported[position]` when given (the
    client's count, as the measured figures do: the simulated client would have counted the
    same text), else as the tokens the replay generated."""
    by_index = {r.index: r for r in records}
    done = [
        (i, by_index[i])
        for i in positions
        if i in by_index and by_index[i].state is RequestState.COMPLETED
    ]
    finished = [r for r in records if r.state is RequestState.COMPLETED]
    start_us = min((r.arrival_us for r in records), default=0)
    end_us = max((r.completion_us for r in finished), default=start_us)
    metrics = run_metrics(
        ((r.first_token_us - r.arrival_us) / 1e3 for _, r in done),
        ((r.completion_us - r.arrival_us) / 1e3 for _, r in done),
        (reported[i] if reported is not None else r.generated_tokens for i, r in done),
        (end_us - start_us) / 1e6,
    )
    return metrics, len(done)


def replay_overrides(run: RunSpec, latency_model: str) -> dict[str, Any]:
    """README step 1: one H100 instance with the run's server settings and KV capacity."""
    return {
        "model": run.model,
        "hardware": HARDWARE,
        "tp": run.tp,
        "latency__model": latency_model,
        "engine__max_num_running_reqs": run.max_num_seqs,
        "engine__max_num_scheduled_tokens": run.max_num_batched_tokens,
        "engine__max_model_len": run.max_model_len,
        "engine__block_size_tokens": run.block_size_tokens,
        "engine__total_kv_blocks": run.gpu_kv_blocks,
        # Group membership of the shared system prompts was not recorded: baseline is off.
        "engine__enable_prefix_caching": False,
        "cluster__num_instances": 1,
    }


def validate_run(
    run: RunSpec,
    latency_model: str = "roofline",
    extra_overrides: dict[str, Any] | None = None,
    trace: tuple[Path, Path] | None = None,
) -> dict[str, Any]:
    """Replay one run and score it. Returns the run's identity, counts, wall time and
    `scores` (one dict per metric, see `score`). `trace` (header, data) replays those requests
    instead of the run's CSV, in the same order (e.g. `shared_prefix_trace`)."""
    import tempfile

    from .api import replay

    started_s = time.perf_counter()
    measured, positions, reported = _measured(run.requests_csv)
    overrides = replay_overrides(run, latency_model) | (extra_overrides or {})
    with tempfile.TemporaryDirectory(prefix="servesim-") as tmp:
        header, data = trace if trace is not None else baseline_trace(run, Path(tmp))
        result = replay(header, data, **overrides)
    # With a forced length, the simulated client counts what the real one reported.
    forced = run.forced_output_tokens is not None
    predicted, n_predicted = _predicted(
        result.request_records, positions, reported if forced else None
    )
    return {
        "run": run.name,
        "model": run.model,
        "workload": run.workload,
        "overloaded": run.overloaded,
        "latency_model": latency_model,
        "n_requests": len(reported),
        "n_success": len(positions),
        "n_predicted": n_predicted,
        "wall_s": time.perf_counter() - started_s,
        "scores": score(measured, predicted),
    }


# README: the system prompt every request starts with, by workload.
SYSTEM_PROMPT_TOKENS = {"general": 100, "codegen": 100, "roleplay": 150, "reasoning": 100}
PREFIX_GROUPS = 10


def distinct_prompts(run: RunSpec) -> int | None:
    """System prompts x users per system prompt from the run's load-generator profile."""
    profile = run.requests_csv.parent.parent / "runs" / run.name / "profile.yaml"
    document = _optional_yaml(profile)
    try:
        shared = document["data"]["shared_prefix"]
        return int(shared["num_unique_system_prompts"]) * int(shared["num_users_per_system_prompt"])
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def shared_prefix_trace(
    run: RunSpec, prefix: Path, groups: int = PREFIX_GROUPS, whole_prompt: bool = False
) -> tuple[Path, Path]:
    """The run's requests as a TraceV3 whose system prompt is shared by `groups` groups,
    assigned round-robin (README step 2's sensitivity check: membership was not recorded).
    `whole_prompt` shares the whole prompt instead: the load generator's profile.yaml shows
    it cycled through a few dozen fixed prompts (system prompt x user), so vLLM's prefix cache
    served almost all of every prompt after its first occurrence."""
    from .engine.request import Request
    from .workload.trace import prefix_key, write_trace

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
    `forced_output_tokens`); failed requests keep max(1, the reported count)."""
    from .engine.request import Request
    from .workload.trace import read_groundtruth_csv, read_groundtruth_rows

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
    """The README's baseline replay (no sharing, prefix caching off): the run's CSV itself,
    or, when the run has `forced_output_tokens`, a trace of `replay_requests` written under
    `workdir` (a new temporary folder if None)."""
    import tempfile

    from .workload.trace import write_trace

    if run.forced_output_tokens is None:
        return None, run.requests_csv
    folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="servesim-"))
    return write_trace(folder / f"{run.name}-baseline", replay_requests(run))


def reuse_trace(run: RunSpec, workdir: Path | None = None) -> tuple[Path, Path]:
    """The `--prompt-reuse` replay of a run: its profile's distinct prompts shared whole,
    assigned round-robin (written under `workdir`, a new temporary folder if None)."""
    import tempfile

    prompts = distinct_prompts(run)
    if prompts is None:
        raise ConfigError(
            f"--prompt-reuse: {run.name}: no runs/{run.name}/profile.yaml with "
            "data.shared_prefix.num_unique_system_prompts and num_users_per_system_prompt"
        )
    folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="servesim-"))
    return shared_prefix_trace(run, folder / f"{run.name}-reuse", prompts, whole_prompt=True)


def validate_folder(
    folder: Path,
    latency_model: str = "roofline",
    runs: Sequence[str] | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    extra_overrides: dict[str, Any] | None = None,
    prompt_reuse: bool = False,
    forced_output: bool = True,
) -> pd.DataFrame:
    """One row per run × metric (FRAME_COLUMNS); `on_run` sees each run's result as it ends.
    `extra_overrides` (dotted with `__`) apply to every replay, e.g. latency__coeffs_file;
    `prompt_reuse` replays the load generator's repeated prompts with prefix caching on;
    `forced_output` replays forced output lengths (see `discover_runs`)."""
    import tempfile

    rows = []
    for spec in select_runs(discover_runs(Path(folder), forced_output), runs):
        if prompt_reuse:
            with tempfile.TemporaryDirectory() as tmp:
                outcome = validate_run(
                    spec,
                    latency_model,
                    (extra_overrides or {}) | {"engine__enable_prefix_caching": True},
                    reuse_trace(spec, Path(tmp)),
                )
        else:
            outcome = validate_run(spec, latency_model, extra_overrides)
        if on_run is not None:
            on_run(outcome)
        for s in outcome["scores"]:
            rows.append(
                {
                    "run": spec.name,
                    "model": spec.model,
                    "workload": spec.workload,
                    **s,
                    "overloaded": spec.overloaded,
                }
            )
    return pd.DataFrame(rows, columns=FRAME_COLUMNS)


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Per metric and group (accuracy runs / overloaded runs): runs, mean and median error,
    mean signed error."""
    rows = []
    for overloaded, group in (("accuracy", False), ("overloaded", True)):
        part = frame[frame["overloaded"] == group]
        for metric in METRICS:
            values = part[part["metric"] == metric]
            if values.empty:
                continue
            rows.append(
                {
                    "group": overloaded,
                    "metric": metric,
                    "runs": len(values),
                    "mean_error": float(values["error"].mean()),
                    "median_error": float(values["error"].median()),
                    "mean_signed_error": float(values["signed_error"].mean()),
                }
            )
    return pd.DataFrame(
        rows,
        columns=["group", "metric", "runs", "mean_error", "median_error", "mean_signed_error"],
    )


def format_table(frame: pd.DataFrame) -> str:
    """Per-run table: one line per run × metric, errors in percent."""
    lines = [
        f"{'run':<46} {'metric':<20} {'measured':>11} {'predicted':>11} {'error':>8} {'signed':>8}"
    ]
    for row in frame.itertuples(index=False):
        flag = " (overloaded)" if row.overloaded and row.metric == METRICS[0] else ""
        lines.append(
            f"{row.run:<46} {row.metric:<20} {row.measured:>11.2f} {row.predicted:>11.2f} "
            f"{row.error:>8.1%} {row.signed_error:>+8.1%}{flag}"
        )
    return "\n".join(lines)


def format_summary(summary: pd.DataFrame) -> str:
    lines = [
        f"{'group':<11} {'metric':<20} {'runs':>4} {'mean err':>9} {'median err':>10} "
        f"{'mean signed':>11}"
    ]
    for row in summary.itertuples(index=False):
        lines.append(
            f"{row.group:<11} {row.metric:<20} {row.runs:>4} {row.mean_error:>9.1%} "
            f"{row.median_error:>10.1%} {row.mean_signed_error:>+11.1%}"
        )
    return "\n".join(lines)
