"""`servesim` command line: BLIS's flag names over servesim's scenario files.

Every flag overrides the matching scenario field. Bad input prints one line on stderr and
exits with status 2, before anything is written.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from .errors import ConfigError, ServesimError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="servesim: discrete-event simulator of LLM inference serving (BLIS-compatible flags).",
)

_SIM = "Deployment and engine"
_WL = "Workload"

Model = Annotated[
    str | None, typer.Option("--model", help="HF id, bundled name or path", rich_help_panel=_SIM)
]
Hardware = Annotated[
    str | None, typer.Option("--hardware", help="GPU type, e.g. H100", rich_help_panel=_SIM)
]
HardwareConfig = Annotated[
    Path | None,
    typer.Option("--hardware-config", help="extra GPU table (YAML/JSON)", rich_help_panel=_SIM),
]
TP = Annotated[int | None, typer.Option("--tp", help="tensor parallelism", rich_help_panel=_SIM)]
LatencyModel = Annotated[
    str | None, typer.Option("--latency-model", help="roofline | blackbox", rich_help_panel=_SIM)
]
Alpha = Annotated[str | None, typer.Option("--alpha-coeffs", help="a0,a1,a2", rich_help_panel=_SIM)]
Beta = Annotated[str | None, typer.Option("--beta-coeffs", help="b0,b1,b2", rich_help_panel=_SIM)]
VllmVersion = Annotated[str | None, typer.Option("--vllm-version", rich_help_panel=_SIM)]
KVBlocks = Annotated[int | None, typer.Option("--total-kv-blocks", rich_help_panel=_SIM)]
BlockSize = Annotated[int | None, typer.Option("--block-size-in-tokens", rich_help_panel=_SIM)]
GpuMemUtil = Annotated[float | None, typer.Option("--gpu-memory-utilization", rich_help_panel=_SIM)]
MaxRunning = Annotated[int | None, typer.Option("--max-num-running-reqs", rich_help_panel=_SIM)]
MaxTokens = Annotated[int | None, typer.Option("--max-num-scheduled-tokens", rich_help_panel=_SIM)]
LongPrefill = Annotated[
    int | None, typer.Option("--long-prefill-token-threshold", rich_help_panel=_SIM)
]
MaxModelLen = Annotated[int | None, typer.Option("--max-model-len", rich_help_panel=_SIM)]
SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler", help="fcfs | priority-fcfs | sjf | reverse-priority", rich_help_panel=_SIM
    ),
]
PriorityOpt = Annotated[
    str | None,
    typer.Option(
        "--priority-policy", help="constant | slo-based | inverted-slo", rich_help_panel=_SIM
    ),
]
Seed = Annotated[int | None, typer.Option("--seed", rich_help_panel=_SIM)]
Horizon = Annotated[
    int | None, typer.Option("--horizon", help="end time in µs", rich_help_panel=_SIM)
]
ResultsPath = Annotated[
    Path | None,
    typer.Option("--results-path", help="write summary + per-request records (JSON)"),
]
LogLevel = Annotated[str, typer.Option("--log", help="log level on stderr")]


def _coeffs(flag: str, text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"{flag}: invalid value {text!r}; expected comma-separated numbers"
        ) from None


def _common_overrides(
    model, hardware, hardware_config, tp, latency_model, alpha, beta, vllm_version, kv_blocks,
    block_size, gpu_mem, max_running, max_tokens, long_prefill, max_model_len, scheduler,
    priority, seed, horizon,
) -> dict[str, Any]:  # fmt: skip
    alpha_list = _coeffs("--alpha-coeffs", alpha)
    beta_list = _coeffs("--beta-coeffs", beta)
    if (alpha_list is None) != (beta_list is None):
        raise ConfigError("--alpha-coeffs/--beta-coeffs: must be given together")
    if alpha_list is not None and latency_model is None:
        latency_model = "blackbox"  # as in BLIS: coefficients without a model mean blackbox
    pairs = {
        "model": model,
        "hardware": hardware,
        "hardware_file": hardware_config,
        "tp": tp,
        "latency.model": latency_model,
        "latency.alpha_coeffs": alpha_list,
        "latency.beta_coeffs": beta_list,
        "latency.vllm_version": vllm_version,
        "engine.total_kv_blocks": kv_blocks,
        "engine.block_size_tokens": block_size,
        "engine.gpu_memory_utilization": gpu_mem,
        "engine.max_num_running_reqs": max_running,
        "engine.max_num_scheduled_tokens": max_tokens,
        "engine.long_prefill_token_threshold": long_prefill,
        "engine.max_model_len": max_model_len,
        "engine.scheduler": scheduler,
        "engine.priority_policy": priority,
        "seed": seed,
        "horizon_us": horizon,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def _setup_logging(level: str) -> None:
    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        raise ConfigError(
            f"--log: invalid value {level!r}; valid: debug, info, warning, error, critical"
        )
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(levelname)s %(message)s")


def _write_json_atomically(path: Path, document: dict) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_writable(path: Path | None) -> None:
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ConfigError(f"--results-path: invalid value {str(path)!r}; it is a directory")
    if parent.exists() and not os.access(parent, os.W_OK):
        raise ConfigError(f"--results-path: invalid value {str(path)!r}; folder not writable")


def _execute(
    scenario,
    overrides: dict[str, Any],
    results_path: Path | None,
    workload_overrides: dict[str, Any] | None = None,
    trace_output: str | None = None,
) -> None:
    from .api import as_scenario, simulate, with_overrides
    from .scenario import Scenario

    _check_writable(results_path)
    if trace_output is not None:
        _check_writable(Path(f"{trace_output}.csv"))
    sc = as_scenario(scenario) if scenario is not None else Scenario()
    sc = with_overrides(sc, overrides, workload_overrides)
    result = simulate(sc)
    typer.echo(result.report_text())
    if results_path is not None:
        _write_json_atomically(results_path, result.results_document())
        logging.getLogger("servesim").info("wrote %s", results_path)
    if trace_output is not None:
        yaml_path, csv_path = result.write_trace(trace_output)
        logging.getLogger("servesim").info("wrote %s and %s", yaml_path, csv_path)


def _guarded(fn, *args) -> None:
    try:
        fn(*args)
    except ServesimError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def run(
    scenario: Annotated[
        Path | None, typer.Argument(help="scenario YAML (flags override its fields)")
    ] = None,
    model: Model = None,
    hardware: Hardware = None,
    hardware_config: HardwareConfig = None,
    tp: TP = None,
    latency_model: LatencyModel = None,
    alpha_coeffs: Alpha = None,
    beta_coeffs: Beta = None,
    vllm_version: VllmVersion = None,
    total_kv_blocks: KVBlocks = None,
    block_size_in_tokens: BlockSize = None,
    gpu_memory_utilization: GpuMemUtil = None,
    max_num_running_reqs: MaxRunning = None,
    max_num_scheduled_tokens: MaxTokens = None,
    long_prefill_token_threshold: LongPrefill = None,
    max_model_len: MaxModelLen = None,
    scheduler: SchedulerOpt = None,
    priority_policy: PriorityOpt = None,
    seed: Seed = None,
    horizon: Horizon = None,
    rate: Annotated[float | None, typer.Option("--rate", help="req/s", rich_help_panel=_WL)] = None,
    arrival: Annotated[
        str | None, typer.Option("--arrival", help="poisson | constant", rich_help_panel=_WL)
    ] = None,
    num_requests: Annotated[int | None, typer.Option("--num-requests", rich_help_panel=_WL)] = None,
    prompt_tokens: Annotated[
        float | None, typer.Option("--prompt-tokens", rich_help_panel=_WL)
    ] = None,
    prompt_tokens_stdev: Annotated[
        float | None, typer.Option("--prompt-tokens-stdev", rich_help_panel=_WL)
    ] = None,
    prompt_tokens_min: Annotated[
        int | None, typer.Option("--prompt-tokens-min", rich_help_panel=_WL)
    ] = None,
    prompt_tokens_max: Annotated[
        int | None, typer.Option("--prompt-tokens-max", rich_help_panel=_WL)
    ] = None,
    output_tokens: Annotated[
        float | None, typer.Option("--output-tokens", rich_help_panel=_WL)
    ] = None,
    output_tokens_stdev: Annotated[
        float | None, typer.Option("--output-tokens-stdev", rich_help_panel=_WL)
    ] = None,
    output_tokens_min: Annotated[
        int | None, typer.Option("--output-tokens-min", rich_help_panel=_WL)
    ] = None,
    output_tokens_max: Annotated[
        int | None, typer.Option("--output-tokens-max", rich_help_panel=_WL)
    ] = None,
    workload_name: Annotated[
        str | None,
        typer.Option(
            "--workload",
            help="preset (chatbot, contentgen, summarization, multidoc) or distribution",
            rich_help_panel=_WL,
        ),
    ] = None,
    workload_spec: Annotated[
        Path | None,
        typer.Option("--workload-spec", help="BLIS v2 workload YAML", rich_help_panel=_WL),
    ] = None,
    prefix_tokens: Annotated[
        int | None, typer.Option("--prefix-tokens", help="shared prefix", rich_help_panel=_WL)
    ] = None,
    trace_output: Annotated[
        str | None,
        typer.Option("--trace-output", help="write TraceV2 PREFIX.yaml + PREFIX.csv"),
    ] = None,
    timeout_us: Annotated[
        int | None,
        typer.Option("--timeout-us", help="client deadline after arrival", rich_help_panel=_WL),
    ] = None,
    results_path: ResultsPath = None,
    log: LogLevel = "warning",
) -> None:
    """Simulate a scenario file, or synthetic traffic described by flags."""

    def go() -> None:
        _setup_logging(log)
        overrides = _common_overrides(
            model, hardware, hardware_config, tp, latency_model, alpha_coeffs, beta_coeffs,
            vllm_version, total_kv_blocks, block_size_in_tokens, gpu_memory_utilization,
            max_num_running_reqs, max_num_scheduled_tokens, long_prefill_token_threshold,
            max_model_len, scheduler, priority_policy, seed, horizon,
        )  # fmt: skip
        workload = {
            "workload.rate": rate,
            "workload.arrival": arrival,
            "workload.num_requests": num_requests,
            "workload.prompt_tokens.mean": prompt_tokens,
            "workload.prompt_tokens.stdev": prompt_tokens_stdev,
            "workload.prompt_tokens.min": prompt_tokens_min,
            "workload.prompt_tokens.max": prompt_tokens_max,
            "workload.output_tokens.mean": output_tokens,
            "workload.output_tokens.stdev": output_tokens_stdev,
            "workload.output_tokens.min": output_tokens_min,
            "workload.output_tokens.max": output_tokens_max,
            "workload.timeout_us": timeout_us,
            "workload.preset": workload_name,
            "workload.prefix_tokens": prefix_tokens,
        }
        if workload_spec is not None:
            overrides["workload_spec"] = workload_spec
        workload_flags = {k: v for k, v in workload.items() if v is not None}
        _execute(scenario, overrides, results_path, workload_flags, trace_output)

    _guarded(go)


@app.command()
def replay(
    trace_data: Annotated[
        Path, typer.Option("--trace-data", help="TraceV2 CSV, or a plain request CSV")
    ],
    trace_header: Annotated[
        Path | None,
        typer.Option("--trace-header", help="TraceV2 header YAML (omit for a plain CSV)"),
    ] = None,
    scenario: Annotated[
        Path | None, typer.Option("--scenario", help="scenario YAML for the deployment")
    ] = None,
    model: Model = None,
    hardware: Hardware = None,
    hardware_config: HardwareConfig = None,
    tp: TP = None,
    latency_model: LatencyModel = None,
    alpha_coeffs: Alpha = None,
    beta_coeffs: Beta = None,
    vllm_version: VllmVersion = None,
    total_kv_blocks: KVBlocks = None,
    block_size_in_tokens: BlockSize = None,
    gpu_memory_utilization: GpuMemUtil = None,
    max_num_running_reqs: MaxRunning = None,
    max_num_scheduled_tokens: MaxTokens = None,
    long_prefill_token_threshold: LongPrefill = None,
    max_model_len: MaxModelLen = None,
    scheduler: SchedulerOpt = None,
    priority_policy: PriorityOpt = None,
    seed: Seed = None,
    horizon: Horizon = None,
    results_path: ResultsPath = None,
    log: LogLevel = "warning",
) -> None:
    """Simulate exactly the requests of a BLIS TraceV2 file (arrival times, token counts)."""

    def go() -> None:
        _setup_logging(log)
        overrides = _common_overrides(
            model, hardware, hardware_config, tp, latency_model, alpha_coeffs, beta_coeffs,
            vllm_version, total_kv_blocks, block_size_in_tokens, gpu_memory_utilization,
            max_num_running_reqs, max_num_scheduled_tokens, long_prefill_token_threshold,
            max_model_len, scheduler, priority_policy, seed, horizon,
        )  # fmt: skip
        overrides["workload"] = None
        overrides["workload_spec"] = None
        overrides["trace"] = {"header": trace_header, "data": trace_data}
        _execute(scenario, overrides, results_path)

    _guarded(go)


convert_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Turn other workload forms into a v2 spec."
)
app.add_typer(convert_app, name="convert")


@convert_app.command("preset")
def convert_preset(
    name: Annotated[str, typer.Option("--name", help="chatbot, contentgen, summarization, ...")],
    rate: Annotated[float, typer.Option("--rate", help="req/s")] = 1.0,
    num_requests: Annotated[int, typer.Option("--num-requests")] = 100,
    arrival: Annotated[str, typer.Option("--arrival", help="poisson | constant")] = "poisson",
) -> None:
    """Print a BLIS preset as a v2 workload spec (YAML) on stdout."""

    def go() -> None:
        from .workload.presets import preset_spec, spec_to_yaml

        typer.echo(spec_to_yaml(preset_spec(name, rate, num_requests, arrival)), nl=False)

    _guarded(go)


@app.command("compose")
def compose(
    sources: Annotated[
        list[Path], typer.Option("--from", help="v2 workload spec; repeat to merge several")
    ],
) -> None:
    """Merge v2 workload specs into one (aggregate rate = sum) and print it on stdout."""

    def go() -> None:
        from .workload.presets import compose_specs, spec_to_yaml
        from .workload.spec import load_workload_spec

        typer.echo(spec_to_yaml(compose_specs([load_workload_spec(p) for p in sources])), nl=False)

    _guarded(go)


@app.command("models")
def list_models_cmd() -> None:
    """List the bundled models (HuggingFace ids)."""
    from .catalog.models import list_models

    for name in list_models():
        typer.echo(name)


@app.command("hardware")
def list_hardware_cmd() -> None:
    """List the GPU catalog with its peak rates."""
    from .catalog.hardware import get_gpu, list_gpus

    typer.echo(
        f"{'gpu':<10} {'bf16_tflops':>11} {'fp8_tflops':>10} {'hbm_tbs':>8} {'memory_gib':>10}"
    )
    for name in list_gpus():
        g = get_gpu(name)
        typer.echo(
            f"{g.name:<10} {g.tflops_peak:>11.1f} {g.tflops_fp8:>10.1f} {g.bw_peak_tbs:>8.3f} "
            f"{g.memory_gib:>10.1f}"
        )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
