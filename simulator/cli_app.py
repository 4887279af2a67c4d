"""`servesim` command line: BLIS's flag names over servesim's scenario files.

Every flag overrides the matching scenario field (the tables below say which). Bad input
prints one line on stderr and exits with status 2, before anything is written; so does an
output flag naming something servesim must not replace (a device, a FIFO, a path on /proc),
checked before simulating (atomic_io.check_output).

The program starts in `simulator.cli.main`, which installs the signal handlers and the
stdout guard before importing this module (typer, then the simulator on first use).

`run` and `replay` share their deployment, engine and cluster flags: the flags are declared
once, as the parameters of template functions, and grafted onto each command's signature.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from .atomic_io import (
    atomic_open,
    check_output,
    check_output_folder,
    write_json_atomically,
    write_with,
)
from .errors import ConfigError, ServesimError
from .interruption import interruptible, to_report

# `-h` as well as `--help`, on the app and (inherited by their contexts) on every command.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    context_settings=CONTEXT_SETTINGS,
    help="servesim: discrete-event simulator of LLM inference serving (BLIS-compatible flags).",
)

_SIM = "Deployment and engine"
_CL = "Cluster"
_WL = "Workload"
_PD = "Prefill/decode disaggregation"
_OUT = "Output"
_FL = "Fleet (node pools, lifecycle, autoscaling)"


def package_version() -> str:
    """servesim's version from the installed package's metadata ("unknown" if not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servesim")
    except PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"servesim {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="print servesim's version and exit",
            metavar="",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    """servesim: discrete-event simulator of LLM inference serving (BLIS-compatible flags)."""


def _opt(
    flag: str | tuple[str, ...],
    panel: str,
    help: str,  # noqa: A002
    hidden: bool = False,
) -> typer.models.OptionInfo:
    """A flag's declaration; an on/off switch (a boolean) shows no value placeholder."""
    names = (flag,) if isinstance(flag, str) else flag
    switch = "/" in names[0] or names[0] in SWITCHES
    return typer.Option(
        *names, help=help, rich_help_panel=panel, hidden=hidden, metavar="" if switch else None
    )


# Plain on switches (no --no- form): they only add something to a run.
SWITCHES = ("--quiet", "--version")


# Flag parameter → scenario field (dotted path). Flags left out here are handled by hand.
SCENARIO_FIELDS = {
    "model": "model",
    "model_config_folder": "model_config_folder",
    "hardware": "hardware",
    "hardware_config": "hardware_file",
    "tp": "tp",
    "pp": "pp",
    "ep": "ep",
    "enable_expert_parallel": "enable_expert_parallel",
    "dp": "dp",
    "weight_dtype": "weight_dtype",
    "kv_cache_dtype": "engine.kv_cache_dtype",
    "kv_capacity_rule": "engine.kv_capacity_rule",
    "latency_model": "latency.model",
    "vllm_version": "latency.vllm_version",
    "latency_coeffs": "latency.coeffs_file",
    "total_kv_blocks": "engine.total_kv_blocks",
    "block_size_in_tokens": "engine.block_size_tokens",
    "gpu_memory_utilization": "engine.gpu_memory_utilization",
    "max_num_seqs": "engine.max_num_running_reqs",
    "max_num_batched_tokens": "engine.max_num_scheduled_tokens",
    "long_prefill_token_threshold": "engine.long_prefill_token_threshold",
    "max_model_len": "engine.max_model_len",
    "scheduler": "engine.scheduler",
    "priority_policy": "engine.priority_policy",
    "preemption_policy": "engine.preemption_policy",
    "batch_formation": "engine.batch_formation",
    "kv_cpu_blocks": "engine.kv_cpu_blocks",
    "kv_offload_policy": "engine.kv_offload_policy",
    "kv_transfer_bandwidth": "engine.kv_transfer_bandwidth_gb_per_s",
    "kv_transfer_base_latency": "engine.kv_transfer_base_latency_us",
    "kv_reload_blocking": "engine.kv_reload_blocking",
    "speculative_method": "speculative.method",
    "num_speculative_tokens": "speculative.num_speculative_tokens",
    "speculative_model": "speculative.draft_model",
    "max_loras": "lora.max_loras",
    "max_cpu_loras": "lora.max_cpu_loras",
    "max_lora_rank": "lora.max_lora_rank",
    "seed": "seed",
    "horizon": "horizon_us",
    "slo_ttft_ms": "slo.ttft_ms",
    "slo_itl_ms": "slo.itl_ms",
    "slo_e2e_ms": "slo.e2e_ms",
    "check_invariants": "check_invariants",
    "num_instances": "cluster.num_instances",
    "admission_policy": "cluster.admission.policy",
    "admission_latency": "cluster.admission.latency_us",
    "token_bucket_capacity": "cluster.admission.token_bucket_capacity",
    "token_bucket_refill_rate": "cluster.admission.token_bucket_refill_rate",
    "routing_policy": "cluster.routing.policy",
    "routing_scorers": "cluster.routing.scorers",
    "routing_profile": "cluster.routing.profile",
    "cache_signal_delay": "cluster.routing.cache_signal_delay_us",
    "routing_latency": "cluster.routing.latency_us",
    "snapshot_refresh_interval": "cluster.routing.snapshot_refresh_interval_us",
    "trace_level": "cluster.trace.level",
    "counterfactual_k": "cluster.trace.counterfactual_k",
    "summarize_trace": "cluster.trace.summarize",
    "decisions_path": "cluster.trace.path",
    "fitness_weights": "cluster.fitness_weights",
    "prefill_instances": "cluster.pd.prefill_instances",
    "decode_instances": "cluster.pd.decode_instances",
    "pd_decider": "cluster.pd.decider",
    "pd_prefix_threshold": "cluster.pd.prefix_threshold",
    "pd_prefix_mode": "cluster.pd.prefix_mode",
    "pd_prompt_length_threshold": "cluster.pd.prompt_length_threshold",
    "pd_transfer_bandwidth": "cluster.pd.transfer_bandwidth_gb_per_s",
    "pd_transfer_base_latency": "cluster.pd.transfer_base_latency_ms",
    "pd_kv_bytes_per_token": "cluster.pd.kv_bytes_per_token",
    "prefill_hardware": "cluster.pd.prefill.hardware",
    "decode_hardware": "cluster.pd.decode.hardware",
    "prefill_tp": "cluster.pd.prefill.tp",
    "decode_tp": "cluster.pd.decode.tp",
    "prefill_pp": "cluster.pd.prefill.pp",
    "decode_pp": "cluster.pd.decode.pp",
    "prefill_ep": "cluster.pd.prefill.ep",
    "decode_ep": "cluster.pd.decode.ep",
    "prefill_dp": "cluster.pd.prefill.dp",
    "decode_dp": "cluster.pd.decode.dp",
    "prefill_latency_model": "cluster.pd.prefill.latency_model",
    "decode_latency_model": "cluster.pd.decode.latency_model",
    "prefill_max_model_len": "cluster.pd.prefill.max_model_len",
    "decode_max_model_len": "cluster.pd.decode.max_model_len",
    "prefill_routing_scorers": "cluster.pd.prefill.routing_scorers",
    "decode_routing_scorers": "cluster.pd.decode.routing_scorers",
    "drain_policy": "instance_lifecycle.drain_policy",
    "retry_on_failure": "instance_lifecycle.retry_on_failure",
    "warm_up_requests": "instance_lifecycle.warm_up_request_count",
    "warm_up_ttft_factor": "instance_lifecycle.warm_up_ttft_factor",
    "loading_delay": "instance_lifecycle.loading_delay.mean_s",
}
WORKLOAD_FIELDS = {
    "rate": "workload.rate",
    "arrival": "workload.arrival",
    "num_requests": "workload.num_requests",
    "prompt_tokens": "workload.prompt_tokens.mean",
    "prompt_tokens_stdev": "workload.prompt_tokens.stdev",
    "prompt_tokens_min": "workload.prompt_tokens.min",
    "prompt_tokens_max": "workload.prompt_tokens.max",
    "output_tokens": "workload.output_tokens.mean",
    "output_tokens_stdev": "workload.output_tokens.stdev",
    "output_tokens_min": "workload.output_tokens.min",
    "output_tokens_max": "workload.output_tokens.max",
    "timeout_us": "workload.timeout_us",
    "workload": "workload.preset",
    "prefix_tokens": "workload.prefix_tokens",
}


def _common_flags(
    model: Annotated[
        str | None,
        _opt(
            "--model", _SIM, "bundled HF id (`servesim models`), or a config folder or .json file"
        ),
    ] = None,
    model_config_folder: Annotated[
        Path | None,
        _opt(
            "--model-config-folder",
            _SIM,
            "folder holding the model's config.json; --model then only names the model",
        ),
    ] = None,
    defaults_filepath: Annotated[
        Path | None,
        _opt(
            "--defaults-filepath",
            _SIM,
            "BLIS defaults.yaml to take default GPU/TP, presets and fitted coefficients from "
            "(default: the bundled one)",
        ),
    ] = None,
    lazy_generation: Annotated[
        bool | None,
        _opt(
            "--lazy-generation/--no-lazy-generation",
            _SIM,
            "accepted for BLIS: servesim always generates requests as they are needed",
        ),
    ] = None,
    hardware: Annotated[
        str | None, _opt("--hardware", _SIM, "GPU type, e.g. H100 (`servesim hardware`)")
    ] = None,
    hardware_config: Annotated[
        Path | None, _opt("--hardware-config", _SIM, "extra GPU table file (YAML/JSON)")
    ] = None,
    tp: Annotated[int | None, _opt("--tp", _SIM, "tensor parallelism: GPUs per instance")] = None,
    pp: Annotated[
        int | None,
        _opt(
            "--pp",
            _SIM,
            "pipeline parallelism: stages of tp GPUs per instance (default 1; latency model "
            "physics)",
        ),
    ] = None,
    ep: Annotated[
        int | None,
        _opt(
            "--ep",
            _SIM,
            "expert parallelism: GPUs the routed experts are sharded over whole (default 1 = "
            "sliced by TP; MoE models)",
        ),
    ] = None,
    enable_expert_parallel: Annotated[
        bool | None,
        _opt(
            "--enable-expert-parallel/--no-enable-expert-parallel",
            _SIM,
            "vLLM's flag: shard the routed experts over all tp x dp GPUs (default: off)",
        ),
    ] = None,
    dp: Annotated[
        int | None,
        _opt(
            "--dp",
            _SIM,
            "data-parallel attention ranks per instance, each its own scheduler and KV cache, "
            "stepping together (default 1; needs --latency-model physics)",
        ),
    ] = None,
    weight_dtype: Annotated[
        str | None,
        _opt(
            "--weight-dtype",
            _SIM,
            "weight format: auto (the config's, default) | bf16 | fp16 | fp8 | int4 | fp4; "
            "refused where the GPU lacks the tensor cores",
        ),
    ] = None,
    kv_cache_dtype: Annotated[
        str | None,
        _opt(
            "--kv-cache-dtype",
            _SIM,
            "KV-cache element: auto (the model's dtype, default) | fp8 | fp8_e4m3 | fp8_e5m2",
        ),
    ] = None,
    kv_capacity_rule: Annotated[
        str | None,
        _opt(
            "--kv-capacity-rule",
            _SIM,
            "KV blocks from free memory: auto (default: vllm with physics, blis with BLIS's "
            "backends) | blis (BLIS's formula) | vllm (per GPU, as vLLM allocates)",
        ),
    ] = None,
    latency_model: Annotated[
        str | None,
        _opt(
            "--latency-model",
            _SIM,
            "step-time model: physics (default) | roofline | blackbox | crossmodel | "
            "trained-roofline | trained-physics",
        ),
    ] = None,
    latency_coeffs: Annotated[
        Path | None,
        _opt(
            "--latency-coeffs",
            _SIM,
            "physics coefficients YAML from `servesim calibrate` (selects physics)",
        ),
    ] = None,
    alpha_coeffs: Annotated[
        str | None,
        _opt(
            "--alpha-coeffs",
            _SIM,
            "blackbox a0,a1,a2: queueing µs = a0 + a1·input tokens; a2 µs per output token "
            "(with --beta-coeffs)",
        ),
    ] = None,
    beta_coeffs: Annotated[
        str | None,
        _opt(
            "--beta-coeffs",
            _SIM,
            "blackbox b0,b1,b2: step µs = b0 + b1·prefill tokens + b2·decode requests",
        ),
    ] = None,
    vllm_version: Annotated[
        str | None,
        _opt(
            "--vllm-version",
            _SIM,
            "vLLM version whose fitted coefficients to use, e.g. 0.15.1 (default: the model's)",
        ),
    ] = None,
    total_kv_blocks: Annotated[
        int | None,
        _opt(
            "--total-kv-blocks",
            _SIM,
            "GPU KV-cache blocks per instance (default: fitted value, else from GPU memory)",
        ),
    ] = None,
    block_size_in_tokens: Annotated[
        int | None, _opt("--block-size-in-tokens", _SIM, "tokens per KV block (default 16)")
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        _opt(
            "--gpu-memory-utilization",
            _SIM,
            "fraction (0, 1] of GPU memory for weights and KV cache (default 0.9)",
        ),
    ] = None,
    max_num_seqs: Annotated[
        int | None,
        _opt("--max-num-seqs", _SIM, "requests per batch, at most (default 256)"),
    ] = None,
    max_num_running_reqs: Annotated[
        int | None,
        _opt("--max-num-running-reqs", _SIM, "old name of --max-num-seqs", hidden=True),
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        _opt("--max-num-batched-tokens", _SIM, "tokens per step, at most (default 2048)"),
    ] = None,
    max_num_scheduled_tokens: Annotated[
        int | None,
        _opt(
            "--max-num-scheduled-tokens", _SIM, "old name of --max-num-batched-tokens", hidden=True
        ),
    ] = None,
    long_prefill_token_threshold: Annotated[
        int | None,
        _opt(
            "--long-prefill-token-threshold",
            _SIM,
            "prefill tokens per request per step, at most (0 = no cap, default)",
        ),
    ] = None,
    max_model_len: Annotated[
        int | None,
        _opt(
            "--max-model-len",
            _SIM,
            "context limit, tokens (0 = none; default: the model's config, analytical models)",
        ),
    ] = None,
    scheduler: Annotated[
        str | None,
        _opt("--scheduler", _SIM, "fcfs (default) | priority-fcfs | sjf | reverse-priority"),
    ] = None,
    priority_policy: Annotated[
        str | None,
        _opt("--priority-policy", _SIM, "constant (default) | slo-based | inverted-slo"),
    ] = None,
    preemption_policy: Annotated[
        str | None,
        _opt(
            "--preemption-policy",
            _SIM,
            "victim when KV runs out: fcfs (newest admitted, default) | priority (least "
            "urgent SLO class, then latest arrival)",
        ),
    ] = None,
    batch_formation: Annotated[
        str | None,
        _opt(
            "--batch-formation",
            _SIM,
            "how a step is formed: chunked (vLLM V1, default) | whole-prompt (Orca, no "
            "chunking) | prefill-first (vLLM V0: prompt-only or decode-only steps)",
        ),
    ] = None,
    kv_cpu_blocks: Annotated[
        int | None, _opt("--kv-cpu-blocks", _SIM, "CPU KV tier size in blocks (0 = off, default)")
    ] = None,
    kv_offload_policy: Annotated[
        str | None, _opt("--kv-offload-policy", _SIM, "evict (default) | mirror")
    ] = None,
    kv_transfer_bandwidth: Annotated[
        float | None,
        _opt("--kv-transfer-bandwidth", _SIM, "CPU<->GPU KV link, GB/s per GPU (default 50)"),
    ] = None,
    kv_transfer_base_latency: Annotated[
        int | None,
        _opt(
            "--kv-transfer-base-latency",
            _SIM,
            "fixed cost of one CPU->GPU KV reload, µs (default 0)",
        ),
    ] = None,
    kv_reload_blocking: Annotated[
        bool | None,
        _opt(
            "--kv-reload-blocking/--no-kv-reload-blocking",
            _SIM,
            "KV reloads stall the engine step, as BLIS (default: off)",
        ),
    ] = None,
    speculative_config: Annotated[
        str | None,
        _opt(
            "--speculative-config",
            _SIM,
            "speculative decoding as JSON, the scenario's `speculative` fields, e.g. "
            '\'{"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7}\'',
        ),
    ] = None,
    speculative_method: Annotated[
        str | None,
        _opt(
            "--speculative-method", _SIM, "speculative decoding: draft_model | eagle | ngram | mtp"
        ),
    ] = None,
    num_speculative_tokens: Annotated[
        int | None,
        _opt(
            "--num-speculative-tokens", _SIM, "drafts per request per step (speculative decoding)"
        ),
    ] = None,
    spec_acceptance_rate: Annotated[
        str | None,
        _opt(
            "--spec-acceptance-rate",
            _SIM,
            "per-position draft acceptance α: one number in [0, 1], or one per position "
            "(comma-separated)",
        ),
    ] = None,
    speculative_model: Annotated[
        str | None,
        _opt("--speculative-model", _SIM, "the draft model of --speculative-method draft_model"),
    ] = None,
    lora: Annotated[
        str | None,
        _opt(
            "--lora",
            _SIM,
            "LoRA adapters NAME:RANK, or NAME:RANK:COUNT for NAME-0 .. NAME-(COUNT-1), "
            "comma-separated (turns multi-LoRA serving on)",
        ),
    ] = None,
    max_loras: Annotated[
        int | None, _opt("--max-loras", _SIM, "LoRA adapters per batch (GPU slots; default 1)")
    ] = None,
    max_cpu_loras: Annotated[
        int | None,
        _opt("--max-cpu-loras", _SIM, "LoRA adapters cached in host memory (default: --max-loras)"),
    ] = None,
    max_lora_rank: Annotated[
        int | None,
        _opt("--max-lora-rank", _SIM, "largest LoRA rank (default: the largest adapter's)"),
    ] = None,
    seed: Annotated[int | None, _opt("--seed", _SIM, "master random seed (default 42)")] = None,
    horizon: Annotated[
        int | None,
        _opt(
            "--horizon",
            _SIM,
            "end of the run, µs of simulated time (default: when the traffic is done)",
        ),
    ] = None,
    slo_ttft_ms: Annotated[
        float | None,
        _opt(
            "--slo-ttft-ms",
            _OUT,
            "SLO target: time to first token per request, ms (for SLO attainment and goodput)",
        ),
    ] = None,
    slo_itl_ms: Annotated[
        float | None,
        _opt("--slo-itl-ms", _OUT, "SLO target: a request's mean inter-token time, ms"),
    ] = None,
    slo_e2e_ms: Annotated[
        float | None,
        _opt("--slo-e2e-ms", _OUT, "SLO target: end-to-end latency per request, ms"),
    ] = None,
    check_invariants: Annotated[
        bool | None,
        _opt(
            "--check-invariants/--no-check-invariants",
            _OUT,
            "check conservation and causality laws during the run; the first broken one "
            "exits 3 (default: the scenario's, off)",
        ),
    ] = None,
    num_instances: Annotated[
        int | None, _opt("--num-instances", _CL, "replicas behind the router (default 1)")
    ] = None,
    admission_policy: Annotated[
        str | None,
        _opt("--admission-policy", _CL, "always-admit (default) | token-bucket | reject-all"),
    ] = None,
    admission_latency: Annotated[
        int | None, _opt("--admission-latency", _CL, "admission decision delay, µs (default 0)")
    ] = None,
    token_bucket_capacity: Annotated[
        float | None, _opt("--token-bucket-capacity", _CL, "token-bucket size, tokens")
    ] = None,
    token_bucket_refill_rate: Annotated[
        float | None,
        _opt("--token-bucket-refill-rate", _CL, "token-bucket refill rate, tokens/s"),
    ] = None,
    routing_policy: Annotated[
        str | None,
        _opt(
            "--routing-policy",
            _CL,
            "round-robin (default) | least-loaded | weighted | always-busiest",
        ),
    ] = None,
    routing_scorers: Annotated[
        str | None,
        _opt("--routing-scorers", _CL, 'scorer weights "name:weight,..." (weighted routing)'),
    ] = None,
    routing_profile: Annotated[
        str | None,
        _opt(
            "--routing-profile",
            _CL,
            "blis-mar (default) | blis-current: that BLIS release's scorer meanings, default "
            "scorers and signal ages",
        ),
    ] = None,
    routing_latency: Annotated[
        int | None, _opt("--routing-latency", _CL, "routing decision delay, µs (default 0)")
    ] = None,
    snapshot_refresh_interval: Annotated[
        int | None,
        _opt(
            "--snapshot-refresh-interval",
            _CL,
            "age of the router's load signals, µs (0 = always fresh, default; "
            "blis-current profile 50000)",
        ),
    ] = None,
    cache_signal_delay: Annotated[
        int | None,
        _opt(
            "--cache-signal-delay",
            _CL,
            "age of the router's view of the prefix caches, µs (0 = live, default; "
            "blis-current profile 50000)",
        ),
    ] = None,
    policy_config: Annotated[
        Path | None,
        _opt("--policy-config", _CL, "BLIS policy bundle YAML (explicit flags win)"),
    ] = None,
    trace_level: Annotated[
        str | None,
        _opt("--trace-level", _CL, "routing decision trace: none (default) | decisions"),
    ] = None,
    counterfactual_k: Annotated[
        int | None,
        _opt(
            "--counterfactual-k",
            _CL,
            "alternative instances recorded per routing decision (default 0)",
        ),
    ] = None,
    summarize_trace: Annotated[
        bool | None,
        _opt(
            "--summarize-trace/--no-summarize-trace",
            _CL,
            "print the decision trace's summary after the metrics (default: off)",
        ),
    ] = None,
    decisions_path: Annotated[
        Path | None,
        _opt(
            "--decisions-path",
            _CL,
            "write routing decisions as JSON Lines (implies --trace-level decisions)",
        ),
    ] = None,
    prefill_instances: Annotated[
        int | None,
        _opt(
            "--prefill-instances",
            _PD,
            "instances in the prefill pool (0 = no disaggregation; pools must fit in "
            "--num-instances)",
        ),
    ] = None,
    decode_instances: Annotated[
        int | None, _opt("--decode-instances", _PD, "instances in the decode pool")
    ] = None,
    pd_decider: Annotated[
        str | None,
        _opt(
            "--pd-decider",
            _PD,
            "which requests go disaggregated: never (default) | always | prefix-threshold | "
            "prompt-length",
        ),
    ] = None,
    pd_prefix_threshold: Annotated[
        int | None,
        _opt(
            "--pd-prefix-threshold",
            _PD,
            "prefix-threshold decider: non-cached prompt tokens (default 16)",
        ),
    ] = None,
    pd_prefix_mode: Annotated[
        str | None,
        _opt(
            "--pd-prefix-mode",
            _PD,
            "prefix-threshold decider's cache view: global (default) | decode-cache",
        ),
    ] = None,
    pd_prompt_length_threshold: Annotated[
        int | None,
        _opt(
            "--pd-prompt-length-threshold",
            _PD,
            "prompt-length decider: prompt tokens (default 256)",
        ),
    ] = None,
    pd_transfer_bandwidth: Annotated[
        float | None,
        _opt("--pd-transfer-bandwidth", _PD, "prefill->decode KV link, GB/s (default 25)"),
    ] = None,
    pd_transfer_base_latency: Annotated[
        float | None,
        _opt(
            "--pd-transfer-base-latency",
            _PD,
            "fixed cost of one KV transfer, ms (as BLIS; default 0.05)",
        ),
    ] = None,
    pd_kv_bytes_per_token: Annotated[
        int | None,
        _opt(
            "--pd-kv-bytes-per-token",
            _PD,
            "KV bytes per token transferred (default: the model's KV geometry)",
        ),
    ] = None,
    pd_transfer_contention: Annotated[
        str | None,
        _opt(
            "--pd-transfer-contention",
            _PD,
            "on | off (also true | false): concurrent transfers share the link's bandwidth "
            "(default on)",
        ),
    ] = None,
    prefill_hardware: Annotated[
        str | None,
        _opt("--prefill-hardware", _PD, "prefill pool's GPU type (default: --hardware)"),
    ] = None,
    decode_hardware: Annotated[
        str | None,
        _opt("--decode-hardware", _PD, "decode pool's GPU type (default: --hardware)"),
    ] = None,
    prefill_tp: Annotated[
        int | None,
        _opt("--prefill-tp", _PD, "prefill pool's tensor parallelism (default: --tp)"),
    ] = None,
    decode_tp: Annotated[
        int | None, _opt("--decode-tp", _PD, "decode pool's tensor parallelism (default: --tp)")
    ] = None,
    prefill_pp: Annotated[
        int | None, _opt("--prefill-pp", _PD, "prefill pool's pipeline stages (default: --pp)")
    ] = None,
    decode_pp: Annotated[
        int | None, _opt("--decode-pp", _PD, "decode pool's pipeline stages (default: --pp)")
    ] = None,
    prefill_ep: Annotated[
        int | None, _opt("--prefill-ep", _PD, "prefill pool's expert parallelism (default: --ep)")
    ] = None,
    decode_ep: Annotated[
        int | None, _opt("--decode-ep", _PD, "decode pool's expert parallelism (default: --ep)")
    ] = None,
    prefill_dp: Annotated[
        int | None,
        _opt("--prefill-dp", _PD, "prefill pool's data-parallel attention ranks (default: --dp)"),
    ] = None,
    decode_dp: Annotated[
        int | None,
        _opt("--decode-dp", _PD, "decode pool's data-parallel attention ranks (default: --dp)"),
    ] = None,
    prefill_latency_model: Annotated[
        str | None,
        _opt(
            "--prefill-latency-model",
            _PD,
            "prefill pool's step-time model (default: --latency-model)",
        ),
    ] = None,
    decode_latency_model: Annotated[
        str | None,
        _opt(
            "--decode-latency-model",
            _PD,
            "decode pool's step-time model (default: --latency-model)",
        ),
    ] = None,
    prefill_max_model_len: Annotated[
        int | None,
        _opt(
            "--prefill-max-model-len",
            _PD,
            "prefill pool's context limit, tokens (default: --max-model-len)",
        ),
    ] = None,
    decode_max_model_len: Annotated[
        int | None,
        _opt(
            "--decode-max-model-len",
            _PD,
            "decode pool's context limit, tokens (default: --max-model-len)",
        ),
    ] = None,
    prefill_routing_scorers: Annotated[
        str | None,
        _opt(
            "--prefill-routing-scorers",
            _PD,
            'weighted routing within the prefill pool, "name:weight,..."',
        ),
    ] = None,
    decode_routing_scorers: Annotated[
        str | None,
        _opt(
            "--decode-routing-scorers",
            _PD,
            'weighted routing within the decode pool, "name:weight,..."',
        ),
    ] = None,
    drain_policy: Annotated[
        str | None,
        _opt("--drain-policy", _FL, "immediate | wait (default) | redirect"),
    ] = None,
    retry_on_failure: Annotated[
        bool | None,
        _opt(
            "--retry-on-failure/--no-retry-on-failure",
            _FL,
            "re-route the requests of failed nodes (default: off)",
        ),
    ] = None,
    warm_up_requests: Annotated[
        int | None,
        _opt("--warm-up-requests", _FL, "slow first requests per new instance (default 0)"),
    ] = None,
    warm_up_ttft_factor: Annotated[
        float | None,
        _opt(
            "--warm-up-ttft-factor",
            _FL,
            "prefill cost factor of warm-up requests, >= 1 (default 1)",
        ),
    ] = None,
    loading_delay: Annotated[
        float | None,
        _opt("--loading-delay-s", _FL, "mean time to load an instance's weights, s"),
    ] = None,
    loading_delay_legacy: Annotated[
        float | None,
        _opt("--loading-delay", _FL, "old name of --loading-delay-s (seconds)", hidden=True),
    ] = None,
    autoscaler: Annotated[
        bool,
        _opt(
            "--autoscaler/--no-autoscaler",
            _FL,
            "use the scenario's autoscaler, or run on its initial fleet",
        ),
    ] = True,
    timeline_path: Annotated[
        Path | None,
        _opt("--timeline-path", _OUT, "write lifecycle transitions (CSV)"),
    ] = None,
    fitness_weights: Annotated[
        str | None,
        _opt("--fitness-weights", _OUT, 'print a fitness score: metric weights "key:weight,..."'),
    ] = None,
    results_path: Annotated[
        Path | None,
        _opt("--results-path", _OUT, "write the summary and per-request records (JSON)"),
    ] = None,
    metrics_path: Annotated[
        Path | None,
        _opt("--metrics-path", _OUT, "current BLIS's name of --results-path (the same file)"),
    ] = None,
    log: Annotated[
        str, _opt("--log", _OUT, "log level on stderr: debug | info | warning | error")
    ] = "warning",
    quiet: Annotated[bool, _opt(("--quiet", "-q"), _OUT, "no progress bar on stderr")] = False,
    report: Annotated[
        Path | None,
        _opt("--report", _OUT, "write the run's HTML report (one self-contained page)"),
    ] = None,
) -> None:
    """Template: the flags of both `run` and `replay`."""


def _workload_flags(
    rate: Annotated[float | None, _opt("--rate", _WL, "arrival rate, requests/s")] = None,
    arrival: Annotated[
        str | None, _opt("--arrival", _WL, "arrival process: poisson (default) | constant")
    ] = None,
    num_requests: Annotated[
        int | None, _opt("--num-requests", _WL, "requests to send (default 100)")
    ] = None,
    prompt_tokens: Annotated[
        float | None,
        _opt("--prompt-tokens", _WL, "mean prompt length, tokens (default 512, or the preset's)"),
    ] = None,
    prompt_tokens_stdev: Annotated[
        float | None,
        _opt(
            "--prompt-tokens-stdev", _WL, "prompt length standard deviation, tokens (default 256)"
        ),
    ] = None,
    prompt_tokens_min: Annotated[
        int | None, _opt("--prompt-tokens-min", _WL, "shortest prompt, tokens (default 2)")
    ] = None,
    prompt_tokens_max: Annotated[
        int | None, _opt("--prompt-tokens-max", _WL, "longest prompt, tokens (default 7000)")
    ] = None,
    output_tokens: Annotated[
        float | None,
        _opt("--output-tokens", _WL, "mean output length, tokens (default 512, or the preset's)"),
    ] = None,
    output_tokens_stdev: Annotated[
        float | None,
        _opt(
            "--output-tokens-stdev", _WL, "output length standard deviation, tokens (default 256)"
        ),
    ] = None,
    output_tokens_min: Annotated[
        int | None, _opt("--output-tokens-min", _WL, "shortest output, tokens (default 2)")
    ] = None,
    output_tokens_max: Annotated[
        int | None, _opt("--output-tokens-max", _WL, "longest output, tokens (default 7000)")
    ] = None,
    timeout_us: Annotated[
        int | None,
        _opt("--timeout-us", _WL, "client deadline after arrival, µs (0 = none, default)"),
    ] = None,
    workload: Annotated[
        str | None,
        _opt(
            "--workload",
            _WL,
            "preset: chatbot | contentgen | summarization | multidoc | distribution",
        ),
    ] = None,
    workload_spec: Annotated[
        Path | None,
        _opt(
            "--workload-spec",
            _WL,
            "BLIS v2 workload YAML (then only --rate and --num-requests apply)",
        ),
    ] = None,
    prefix_tokens: Annotated[
        int | None,
        _opt("--prefix-tokens", _WL, "shared prefix length, tokens (one group; default 0)"),
    ] = None,
) -> None:
    """Template: the traffic flags of `run` (and `observe`)."""


def _closed_loop_flags() -> Callable:
    """Template: `run`'s closed-loop and deadline flags (declared in cli_blis)."""
    from .cli_blis import closed_loop_flags

    return closed_loop_flags


def _goodput_flags() -> Callable:
    """Template: current BLIS's per-class goodput targets (declared in cli_blis)."""
    from .cli_blis import goodput_flags

    return goodput_flags


def _trace_output_flag(
    trace_output: Annotated[
        str | None, _opt("--trace-output", _OUT, "write TraceV2 PREFIX.yaml + PREFIX.csv")
    ] = None,
) -> None:
    """Template: `run`'s trace export."""


def workload_overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """Synthetic-workload overrides (`workload.rate`, ...) from the traffic flags given."""
    return {
        path: flags[name] for name, path in WORKLOAD_FIELDS.items() if flags.get(name) is not None
    }


def _with_flags(*templates: Callable) -> Callable:
    """Give a `**flags` command the parameters of `templates`, so Typer exposes them."""

    def graft(command: Callable) -> Callable:
        own = [
            p
            for p in inspect.signature(command, eval_str=True).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        extra = [
            p for t in templates for p in inspect.signature(t, eval_str=True).parameters.values()
        ]
        command.__signature__ = inspect.Signature(own + extra)
        return command

    return graft


def _coeffs(flag: str, text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"{flag}: invalid value {text!r}; expected comma-separated numbers"
        ) from None


def _json_object(flag: str, text: str) -> dict[str, Any]:
    """A flag's JSON object (vLLM's --speculative-config style), or a ConfigError."""
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: invalid value {text!r}; not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: invalid value {text!r}; expected a JSON object {{...}}")
    return value


def _overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """Scenario overrides from the common flags: a policy bundle first, explicit flags last."""
    from .cluster.policy_bundle import load_policy_bundle

    overrides: dict[str, Any] = {}
    if flags.get("policy_config") is not None:
        overrides.update(load_policy_bundle(flags["policy_config"]))
    alpha = _coeffs("--alpha-coeffs", flags.get("alpha_coeffs"))
    beta = _coeffs("--beta-coeffs", flags.get("beta_coeffs"))
    if (alpha is None) != (beta is None):
        raise ConfigError("--alpha-coeffs/--beta-coeffs: must be given together")
    if alpha is not None:
        overrides["latency.alpha_coeffs"] = alpha
        overrides["latency.beta_coeffs"] = beta
        if flags.get("latency_model") is None:
            overrides["latency.model"] = "blackbox"  # BLIS: coefficients imply blackbox
    if flags.get("latency_coeffs") is not None and flags.get("latency_model") is None:
        overrides["latency.model"] = "physics"  # only physics reads a coefficients file
    flags = _renamed_flags(flags)
    if flags.get("speculative_config") is not None:
        overrides["speculative"] = _json_object("--speculative-config", flags["speculative_config"])
    if flags.get("lora") is not None:
        from .lora_setup import parse_lora_flag

        overrides["lora.adapters"] = parse_lora_flag(flags["lora"])
    for name, path in SCENARIO_FIELDS.items():
        if flags.get(name) is not None:
            overrides[path] = flags[name]
    rates = _coeffs("--spec-acceptance-rate", flags.get("spec_acceptance_rate"))
    if rates is not None:
        overrides["speculative.acceptance_rate"] = rates[0] if len(rates) == 1 else rates
    contention = flags.get("pd_transfer_contention")
    if contention is not None:
        overrides["cluster.pd.transfer_contention"] = on_off("--pd-transfer-contention", contention)
    if flags.get("autoscaler") is False:
        overrides["autoscaler"] = []
    if "cluster.trace.path" in overrides and "cluster.trace.level" not in overrides:
        overrides["cluster.trace.level"] = "decisions"
    return overrides


# Old flag names kept as hidden aliases: parameter of the old name -> of the new one.
RENAMED_FLAGS = {
    "loading_delay_legacy": ("--loading-delay", "loading_delay", "--loading-delay-s"),
    # BLIS-Mar's names of vLLM's --max-num-seqs and --max-num-batched-tokens.
    "max_num_running_reqs": ("--max-num-running-reqs", "max_num_seqs", "--max-num-seqs"),
    "max_num_scheduled_tokens": (
        "--max-num-scheduled-tokens",
        "max_num_batched_tokens",
        "--max-num-batched-tokens",
    ),
}

ON_VALUES = ("on", "true")
OFF_VALUES = ("off", "false")


def on_off(flag: str, text: str) -> bool:
    """A switch given a value (`--flag on`, BLIS's `--flag=true`): on/true or off/false."""
    value = text.strip().lower()
    if value in ON_VALUES or value in OFF_VALUES:
        return value in ON_VALUES
    raise ConfigError(f"{flag}: invalid value {text!r}; valid: on, off, true, false")


def _renamed_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """`flags` with each old name's value moved to its new name (both at once: an error)."""
    flags = dict(flags)
    for old, (old_flag, new, new_flag) in RENAMED_FLAGS.items():
        value = flags.pop(old, None)
        if value is None:
            continue
        if flags.get(new) is not None:
            raise ConfigError(f"{old_flag}: the old name of {new_flag}; give only one of them")
        flags[new] = value
    return flags


def _setup_logging(level: str) -> None:
    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        raise ConfigError(
            f"--log: invalid value {level!r}; valid: debug, info, warning, error, critical"
        )
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(levelname)s %(message)s")


def _check_writable(flag: str, path: str | os.PathLike[str] | None) -> None:
    """Refuse, before any work, an output servesim could not or must not replace."""
    if path is not None:
        check_output(path, flag)


def _check_folder_writable(flag: str, path: str | os.PathLike[str] | None) -> None:
    """The same for an output folder (files are written inside it)."""
    if path is not None:
        check_output_folder(path, flag)


def _execute(
    scenario: Path | None,
    overrides: dict[str, Any],
    results_path: Path | None,
    workload_overrides: dict[str, Any] | None = None,
    trace_output: str | None = None,
    quiet: bool = False,
    timeline_path: Path | None = None,
    report_path: Path | None = None,
) -> None:
    from .api import as_scenario, simulate, with_overrides
    from .scenario import Scenario

    _check_writable("--results-path", results_path)
    _check_writable("--timeline-path", timeline_path)
    _check_writable("--report", report_path)
    _check_writable("--decisions-path", overrides.get("cluster.trace.path"))
    if trace_output is not None:
        _check_writable("--trace-output", f"{trace_output}.yaml")
        _check_writable("--trace-output", f"{trace_output}.csv")
    sc = as_scenario(scenario) if scenario is not None else Scenario()
    sc = with_overrides(sc, overrides, workload_overrides)
    if "cluster.trace.path" not in overrides:
        _check_writable("cluster.trace.path", sc.cluster.trace.path)  # from the scenario file
    outputs = _planned_outputs(results_path, sc.cluster.trace.path, trace_output)
    if timeline_path is not None:
        outputs.append(str(timeline_path))
    if report_path is not None:
        outputs.append(str(report_path))
    written: list[str] = []

    def lost() -> str:
        missing = [o for o in outputs if o not in written]
        if not outputs:
            return "the run was abandoned; no output files were requested"
        kept = f"; complete: {', '.join(written)}" if written else ""
        return f"the run was abandoned; not written: {', '.join(missing)}{kept}"

    with interruptible(lost):
        logging.getLogger("servesim").info("simulating %s", scenario or "flags-only scenario")
        # A progress display only on a terminal: pipes and CI logs get clean stderr.
        show_progress = not quiet and sys.stderr.isatty()
        result = _simulate_with_progress(sc) if show_progress else simulate(sc)
        if sc.cluster.trace.path is not None:
            written.append(str(sc.cluster.trace.path))
        typer.echo(result.report_text())
        if results_path is not None:
            write_json_atomically(results_path, result.results_document())
            written.append(str(results_path))
            logging.getLogger("servesim").info("wrote %s", results_path)
        if trace_output is not None:
            yaml_path, csv_path = result.write_trace(trace_output)
            written.append(f"{trace_output}.yaml/.csv")
            logging.getLogger("servesim").info("wrote %s and %s", yaml_path, csv_path)
        if timeline_path is not None:
            with atomic_open(timeline_path, newline="") as handle:
                result.timeline.to_csv(handle, index=False)
            written.append(str(timeline_path))
        if report_path is not None:
            from .report import write_report  # plotly loads only for a report

            write_report(result, report_path)
            written.append(str(report_path))
            logging.getLogger("servesim").info("wrote %s", report_path)


def _planned_outputs(
    results_path: Path | None, decisions_path: Path | None, trace_output: str | None
) -> list[str]:
    """The files a run was asked to write, named as its interruption message names them."""
    outputs = [str(p) for p in (decisions_path, results_path) if p is not None]
    if trace_output is not None:
        outputs.append(f"{trace_output}.yaml/.csv")
    return outputs


def _simulate_with_progress(sc, console=None):
    """`simulate(sc)` with a progress display on stderr: a bar with the requests finished out
    of the run's known request count and the time remaining, or, when the count is not known
    in advance (a workload bounded only by its horizon), a spinner. rich loads only here."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from .api import simulate

    total = expected_requests(sc)
    if total is None:
        columns: tuple = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    else:
        columns = (
            TextColumn("simulating"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests, {task.description}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
        )
    console = console if console is not None else _stderr_console()
    with Progress(*columns, transient=True, console=console) as bar:
        task = bar.add_task("simulating", total=total)

        def report(now_us: int, completed: int) -> None:
            if total is None:
                description = f"simulated {now_us / 1e6:,.0f} s, {completed:,} requests done"
                bar.update(task, description=description)
            else:
                # Closed-loop follow-ups can outnumber the requests known in advance.
                grown = max(total, completed)
                description = f"{now_us / 1e6:,.0f} s simulated"
                bar.update(task, completed=completed, total=grown, description=description)

        return simulate(sc, progress=report)


def expected_requests(sc: Any) -> int | None:
    """How many requests the run will serve, when known before it starts: a trace's rows, or
    the workload's num_requests (synthetic or v2); None for a workload bounded only by its
    horizon, or when the count cannot be had cheaply."""
    if sc.trace is not None:
        return _count_rows(sc.trace.data)
    from .api import workload_spec_of

    try:
        spec = workload_spec_of(sc)
    except ServesimError:
        return None  # the run itself reports the problem
    return spec.num_requests or None


def _count_rows(path: str | os.PathLike[str]) -> int | None:
    """Data rows of a CSV with a header line (blank lines not counted)."""
    try:
        with open(path, "rb") as handle:
            lines = sum(1 for line in handle if line.strip())
    except OSError:
        return None
    return max(lines - 1, 0) or None


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _guarded(fn: Callable[[], None]) -> None:
    """Run a command body; bad input or an unusable output, a broken invariant or an
    interrupt end it with one line on stderr and exit status 2, 3, or 128 + the signal
    number."""
    from .invariants import InvariantViolation

    try:
        fn()
    except ServesimError as exc:
        # Parsers write one-line messages; a line break that slips through is still shown
        # on one line (the fuzz tests catch the parser that let it through).
        error_line(" ".join(str(exc).splitlines()))
        raise typer.Exit(2) from None
    except InvariantViolation as exc:
        error_line(str(exc))
        raise typer.Exit(INVARIANT_EXIT_CODE) from None
    except KeyboardInterrupt as exc:
        # Commands without their own `interruptible` block (validate, plan, ...) too.
        stopped, untold = to_report(exc)
        if untold:
            error_line(stopped.message())
        raise typer.Exit(stopped.exit_code) from None
    except OSError as exc:
        # Every writer raises OutputError and every reader ConfigError; an OSError that
        # still gets here (a folder a library creates itself) is the environment's, not a
        # bug's: one line, like any other unusable file.
        error_line(os_error_text(exc))
        raise typer.Exit(2) from None


def error_line(text: str) -> None:
    """`error: TEXT` on stderr; a stderr that cannot be written to is not worth a traceback."""
    with contextlib.suppress(OSError):
        typer.echo(f"error: {text}", err=True)


def os_error_text(exc: OSError) -> str:
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return reason
    return f"{str(exc.filename)!r}: {reason}"


INVARIANT_EXIT_CODE = 3


@app.command()
@_with_flags(
    _common_flags, _workload_flags, _closed_loop_flags(), _goodput_flags(), _trace_output_flag
)
def run(
    scenario: Annotated[
        Path | None, typer.Argument(help="scenario YAML (flags override its fields)")
    ] = None,
    **flags: Any,
) -> None:
    """Simulate a scenario file, or synthetic traffic described by flags."""

    def go() -> None:
        from .cli_blis import (
            closed_loop_overrides,
            defaults_file_overrides,
            goodput_overrides,
            results_path,
        )

        _setup_logging(flags["log"])
        overrides = {**_overrides(flags), **goodput_overrides(flags)}
        if flags.get("workload_spec") is not None:
            overrides["workload_spec"] = flags["workload_spec"]
        workload = closed_loop_overrides(flags, workload_overrides(flags))
        if flags.get("defaults_filepath") is not None:
            extra, extra_workload = defaults_file_overrides(
                flags["defaults_filepath"], scenario, overrides, workload
            )
            overrides, workload = {**extra, **overrides}, {**extra_workload, **workload}
        _execute(
            scenario,
            overrides,
            results_path(flags),
            workload,
            flags["trace_output"],
            flags["quiet"],
            flags["timeline_path"],
            flags["report"],
        )

    _guarded(go)


@app.command()
@_with_flags(_common_flags, _goodput_flags(), _trace_output_flag)
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
    prefix_caching: Annotated[
        bool | None,
        typer.Option(
            "--prefix-caching/--no-prefix-caching",
            metavar="",
            help="override what the recorded server did (default: its configuration next to "
            "the trace, else vLLM's default, on)",
            show_default=False,
        ),
    ] = None,
    max_in_flight: Annotated[
        str,
        typer.Option(
            "--max-in-flight",
            help="the load generator's cap on outstanding requests: auto (what the recorded "
            "client did: its send times, or, if it fell behind a saturated server, the "
            "scheduled times with its cap), off (the send times, as BLIS), or N (the scheduled "
            "times, at most N outstanding)",
        ),
    ] = "auto",
    session_mode: Annotated[
        str,
        typer.Option(
            "--session-mode",
            help="fixed (every row at its recorded time, default) | closed-loop (each "
            "session's later rounds wait for the earlier: round r+1 is sent when round r "
            "finished plus a think time)",
        ),
    ] = "fixed",
    think_time_ms: Annotated[
        int | None,
        typer.Option(
            "--think-time-ms",
            help="closed-loop: think time between rounds, ms (0 or unset: the trace's "
            "recorded think times, else its arrival gaps)",
        ),
    ] = None,
    think_time_dist: Annotated[
        str | None,
        typer.Option(
            "--think-time-dist",
            help='closed-loop: think-time law, "constant:value=500ms" or '
            '"lognormal:mu=2.0,sigma=0.6,min=3s,max=30s" (mu, sigma in ln s)',
        ),
    ] = None,
    **flags: Any,
) -> None:
    """Simulate exactly the requests of a BLIS TraceV2 file (send/arrival times, token counts)."""

    def go() -> None:
        from .api import client_replay
        from .cli_blis import (
            defaults_file_overrides,
            goodput_overrides,
            results_path,
            session_mode_trace,
        )
        from .workload.trace import trace_notes

        _setup_logging(flags["log"])
        overrides = {**_overrides(flags), **goodput_overrides(flags)}
        overrides["workload"] = None
        overrides["workload_spec"] = None
        sessions = session_mode_trace(session_mode, think_time_ms, think_time_dist)
        if sessions and max_in_flight != "auto":
            raise ConfigError(
                "--max-in-flight: closed-loop sessions pace themselves; it does not apply "
                "with --session-mode closed-loop"
            )
        client = client_replay("off" if sessions else max_in_flight, trace_data)
        overrides["trace"] = {
            "header": trace_header,
            "data": trace_data,
            "timing": "schedule" if client.at_schedule else "sends",
            "max_in_flight": client.max_in_flight,
            **sessions,
        }
        if flags.get("defaults_filepath") is not None:
            extra, _ = defaults_file_overrides(flags["defaults_filepath"], scenario, overrides, {})
            overrides = {**extra, **overrides}
        choice, apply = _replay_prefix_caching(
            prefix_caching, scenario, overrides, trace_header, trace_data
        )
        if apply:
            overrides["engine.enable_prefix_caching"] = choice.enabled
        notes = trace_notes(trace_header, trace_data, closed_loop=bool(sessions))
        if client.at_schedule:  # the send times are not used
            notes = [n for n in notes if not n.startswith("send_time_us:")]
        _execute(
            scenario,
            overrides,
            results_path(flags),
            trace_output=flags["trace_output"],
            quiet=flags["quiet"],
            timeline_path=flags["timeline_path"],
            report_path=flags["report"],
        )
        # After the run: a refused input must leave its error as the only line on stderr.
        typer.echo(choice.line(), err=True)
        typer.echo(client.line(), err=True)
        for note in notes:
            typer.echo(f"note: {note}", err=True)

    _guarded(go)


def _replay_prefix_caching(
    flag: bool | None,
    scenario: Path | None,
    overrides: dict[str, Any],
    trace_header: Path | None,
    trace_data: Path,
) -> tuple[Any, bool]:
    """The prefix-caching setting of a replay and whether the replay must be told it: the
    flag, else a policy bundle's or the scenario file's own setting (already in force),
    else what the recorded server did (`recorded_prefix_caching`)."""
    from .api import as_scenario
    from .workload.server_settings import PrefixCaching, recorded_prefix_caching

    if flag is not None:
        return PrefixCaching(flag, "--prefix-caching" if flag else "--no-prefix-caching"), True
    if "engine.enable_prefix_caching" in overrides:
        return PrefixCaching(
            bool(overrides["engine.enable_prefix_caching"]), "--policy-config"
        ), False
    if scenario is not None:
        engine = as_scenario(scenario).engine
        if "enable_prefix_caching" in engine.model_fields_set:
            return PrefixCaching(engine.enable_prefix_caching, f"scenario {scenario}"), False
    return recorded_prefix_caching(trace_header, trace_data), True


convert_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    context_settings=CONTEXT_SETTINGS,
    help="Turn other workload forms into a v2 spec.",
)
app.add_typer(convert_app, name="convert")


@convert_app.command("preset")
def convert_preset(
    name: Annotated[str, typer.Option("--name", help="chatbot, contentgen, summarization, ...")],
    rate: Annotated[float, typer.Option("--rate", help="arrival rate, requests/s")] = 1.0,
    num_requests: Annotated[
        int, typer.Option("--num-requests", help="requests in the spec (0 = unlimited)")
    ] = 100,
    arrival: Annotated[
        str, typer.Option("--arrival", help="arrival process: poisson | constant")
    ] = "poisson",
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
    """List the GPU catalog with its peak rates (dense) and whose MFU each uses."""
    from .catalog.hardware import get_gpu, list_gpus

    typer.echo(
        f"{'gpu':<10} {'bf16_tflops':>11} {'fp8_tflops':>10} {'fp4_tflops':>10} {'hbm_tbs':>8} "
        f"{'memory_gib':>10}  mfu"
    )
    for name in list_gpus():
        g = get_gpu(name)
        typer.echo(
            f"{g.name:<10} {g.tflops_peak:>11.1f} {g.tflops_fp8:>10.1f} {g.tflops_fp4:>10.1f} "
            f"{g.bw_peak_tbs:>8.3f} {g.memory_gib:>10.1f}  "
            + (f"carried over from {g.mfu_from}" if g.mfu_from else "calibrated")
        )


@app.command("validate")
def validate_cmd(
    folder: Annotated[
        Path | None,
        typer.Argument(
            help="ground-truth folder: a dataset folder (vllm-0.15.1 request CSVs or "
            "vllm-0.23.0 observe cells), one cell, or their parent; default: the "
            "repository's groundtruth/ folder"
        ),
    ] = None,
    latency_models: Annotated[
        list[str] | None,
        typer.Option(
            "--latency-model",
            help="step-time backend (repeat to compare several: physics, roofline, blackbox, "
            "crossmodel, trained-roofline, trained-physics)",
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", help="write the per-run table as CSV")
    ] = None,
    runs: Annotated[
        list[str] | None,
        typer.Option("--runs", help="only runs/cells whose name contains NAME (repeatable)"),
    ] = None,
    latency_coeffs: Annotated[
        Path | None,
        typer.Option("--latency-coeffs", help="coefficients YAML for physics (from calibrate)"),
    ] = None,
    prompt_reuse: Annotated[
        bool,
        typer.Option(
            "--prompt-reuse/--no-prompt-reuse",
            metavar="",
            help="share the load generator's few distinct prompts whole, prefix caching on "
            "(request-CSV runs)",
        ),
    ] = False,
    forced_output_length: Annotated[
        bool,
        typer.Option(
            "--forced-output-length/--reported-output-length",
            metavar="",
            help="replay the output length an ignore_eos profile forced (default), or the "
            "count the client reported, which undercounts (docs/accuracy.md)",
        ),
    ] = True,
    prefix_caching: Annotated[
        bool | None,
        typer.Option(
            "--prefix-caching/--no-prefix-caching",
            metavar="",
            help="override what each recorded server did (default: its configuration, "
            "else vLLM's default, on)",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", metavar="", help="no per-run progress lines on stderr")
    ] = False,
) -> None:
    """Replay the measured vLLM runs and score TTFT, E2E, ITL and throughput against them."""
    import time

    def go() -> None:
        from .validate import ALL_DATASETS, default_groundtruth, summarize, validate_datasets

        started_s = time.perf_counter()
        where = folder if folder is not None else default_groundtruth("validate")
        _check_writable("--output", output)

        def progress(outcome: dict[str, Any]) -> None:
            if quiet:
                return
            typer.echo(
                f"{outcome['dataset']} {outcome['run']}: {outcome['n_success']}/"
                f"{outcome['n_requests']} scored, {outcome['wall_s']:.1f} s",
                err=True,
            )

        import pandas as pd

        from .scenario import DEFAULT_LATENCY_MODEL

        models = latency_models or [DEFAULT_LATENCY_MODEL]
        frames = []
        medians = {}
        for model in models:
            extra = {"latency__coeffs_file": latency_coeffs} if latency_coeffs else None
            done = validate_datasets(
                where,
                model,
                runs,
                on_run=progress,
                extra_overrides=extra,
                prompt_reuse=prompt_reuse,
                forced_output=forced_output_length,
                prefix_caching=prefix_caching,
            )
            if model == models[0]:
                _echo_prefix_caching(done.runs, prefix_caching, prompt_reuse)
            _echo_validation(done, model)
            summary = summarize(done.frame)
            accuracy = summary[summary["group"] == "accuracy"]
            # Over every dataset's accuracy runs: the `all` rows when there are several.
            if (accuracy["dataset"] == ALL_DATASETS).any():
                overall = accuracy[accuracy["dataset"] == ALL_DATASETS]
            else:
                overall = accuracy
            medians[model] = dict(zip(overall["metric"], overall["median_error"], strict=True))
            frames.append(done.frame.assign(latency_model=model))
        if len(models) > 1:
            typer.echo("median error on the accuracy runs, by backend")
            typer.echo(f"{'metric':<20}" + "".join(f"{m:>18}" for m in models))
            for metric in medians[models[0]]:
                cells = "".join(
                    f"{100 * medians[m].get(metric, float('nan')):>17.1f}%" for m in models
                )
                typer.echo(f"{metric:<20}{cells}")
        frame = pd.concat(frames, ignore_index=True)
        if output is not None:
            write_with(output, lambda tmp: frame.to_csv(tmp, index=False))
            typer.echo(f"wrote {output}", err=True)
        typer.echo(f"wall time {time.perf_counter() - started_s:.1f} s", err=True)

    _guarded(go)


def _echo_prefix_caching(runs: list, flag: bool | None, prompt_reuse: bool) -> None:
    """One stderr line per dataset: the prefix-caching choice and where it came from."""
    from .workload.server_settings import PrefixCaching

    seen: dict[str, PrefixCaching] = {}
    for run in runs:
        if flag is not None:
            choice = PrefixCaching(flag, "--prefix-caching" if flag else "--no-prefix-caching")
        elif prompt_reuse and run.kind == "requests":
            choice = PrefixCaching(True, "--prompt-reuse")
        else:
            choice = PrefixCaching(run.prefix_caching, run.prefix_caching_source)
        seen.setdefault(run.dataset, choice)
    for dataset, choice in seen.items():
        typer.echo(f"{dataset}: {choice.line()}", err=True)


def _echo_validation(done: Any, model: str) -> None:
    """The per-dataset tables, the overloaded runs, the load sweep and the summary."""
    from .validate import (
        format_load,
        format_saturation,
        format_summary,
        format_table,
        saturation,
        summarize,
    )

    frame = done.frame
    for dataset in dict.fromkeys(frame["dataset"]):
        part = frame[(frame["dataset"] == dataset) & ~frame["overloaded"]]
        if part.empty:
            continue
        typer.echo(f"{dataset}: {part['run'].nunique()} runs ({model})")
        typer.echo(format_table(part))
        typer.echo("")
    overloaded = frame[frame["overloaded"]]
    if not overloaded.empty:
        typer.echo(f"overloaded runs, kept out of the accuracy summary ({model})")
        for run in done.runs:
            if run.overloaded and run.name in set(overloaded["run"]):
                typer.echo(f"  {run.dataset} {run.name}: {run.overload_reason}")
        typer.echo(format_table(overloaded))
        typer.echo("")
    for dataset in dict.fromkeys(done.load["dataset"]):
        cells = done.load[done.load["dataset"] == dataset]
        typer.echo(f"{dataset}: load sweep, achieved throughput in req/s ({model})")
        typer.echo(format_load(cells))
        typer.echo(format_saturation(saturation(cells)))
        typer.echo("")
    typer.echo(f"summary ({model}; error = |predicted - measured| / measured)")
    typer.echo(format_summary(summarize(frame)))
    typer.echo("")


@app.command("report")
def report_cmd(
    source: Annotated[
        Path,
        typer.Argument(
            help="a saved result folder (Result.save), a sweep's --out folder, or a "
            "--results-path JSON file"
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="HTML file to write (default: report.html in the folder, or the JSON file's "
            "name with .html)",
        ),
    ] = None,
) -> None:
    """Write one self-contained HTML page (charts and data inside, no network) for a run or
    a sweep (docs/report.md)."""

    def go() -> None:
        from .report import default_output, load_input, write_report

        target = output if output is not None else default_output(source)
        _check_writable("--output", target)
        write_report(load_input(source), target)
        typer.echo(str(target))

    _guarded(go)


def _register_extras() -> None:
    from .cli_calibrate import register as register_calibrate
    from .cli_convert import register as register_convert
    from .cli_extras import register as register_plot
    from .cli_observe import register as register_observe
    from .cli_plan import register as register_plan
    from .cli_sweep import register as register_sweep

    register_convert(convert_app)
    register_plot(app)
    register_sweep(app)
    register_plan(app)
    register_observe(app)
    register_calibrate(app)


_register_extras()
