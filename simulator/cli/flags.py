"""The flags `run` and `replay` share (and `observe` takes the traffic flags of), and how they
become scenario overrides.

Every flag overrides the matching scenario field (the tables below say which). The flags are
declared once, as the parameters of template functions (`common_flags`, `workload_flags`,
`trace_output_flag`; BLIS's closed-loop and goodput flags in `blis`), and grafted onto each
command's signature by `with_flags`.

The annotations here are evaluated when the module is imported (no `from __future__ import
annotations`, on purpose): typer reads every option's `Annotated[...]` with
`typing.get_type_hints` each time it builds a command, and a string annotation costs an `eval`
there, about 10 ms of every `run`'s start-up for ~130 options (tests/test_startup.py).
"""

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ConfigError, shorten
from .common import LOG_HELP

_SIM = "Deployment and engine"
_CL = "Cluster"
_WL = "Workload"
_PD = "Prefill/decode disaggregation"
_OUT = "Output"
_FL = "Fleet (node pools, lifecycle, autoscaling)"


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
    "pd_transfer_slots": "cluster.pd.transfer_slots",
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


def common_flags(
    model: Annotated[
        str | None,
        _opt(
            "--model",
            _SIM,
            "bundled HF id (`servesim models`), or a config folder or .json file (default "
            "meta-llama/llama-3.1-8b-instruct)",
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
        str | None,
        _opt(
            "--hardware",
            _SIM,
            "GPU type, e.g. H100 (`servesim hardware`; default: the model's GPU in the defaults "
            "table, else H100)",
        ),
    ] = None,
    hardware_config: Annotated[
        Path | None, _opt("--hardware-config", _SIM, "extra GPU table file (YAML/JSON)")
    ] = None,
    tp: Annotated[
        int | None,
        _opt(
            "--tp",
            _SIM,
            "tensor parallelism: GPUs per instance (default: the model's in the defaults "
            "table, else 1)",
        ),
    ] = None,
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
            "vLLM version whose fitted coefficients to use, e.g. 0.15.1: physics' fit for the "
            "GPU (default: its newest) and blackbox's defaults.yaml row (default: the model's)",
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
        _opt(
            "--max-num-seqs",
            _SIM,
            "requests per batch, at most (default: vLLM's on the GPU with physics, 1,024 on "
            "an H100; 256 with BLIS's latency models)",
        ),
    ] = None,
    max_num_running_reqs: Annotated[
        int | None,
        _opt("--max-num-running-reqs", _SIM, "old name of --max-num-seqs", hidden=True),
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        _opt(
            "--max-num-batched-tokens",
            _SIM,
            "tokens per step, at most (default: vLLM's on the GPU with physics, 8,192 on an "
            "H100; 2,048 with BLIS's latency models)",
        ),
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
        _opt(
            "--priority-policy", _SIM, "constant (default) | slo-based | inverted-slo | slo-class"
        ),
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
    pd_transfer_slots: Annotated[
        int | None,
        _opt(
            "--pd-transfer-slots",
            _PD,
            "KV transfers in flight at most; more wait their turn (default: no limit)",
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
            "re-route the requests of failed nodes and failed instances (default: off)",
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
        _opt("--loading-delay-s", _FL, "mean time to load an instance's weights, s (default 0)"),
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
    log: Annotated[str, _opt("--log", _OUT, LOG_HELP)] = "warning",
    quiet: Annotated[bool, _opt(("--quiet", "-q"), _OUT, "no progress bar on stderr")] = False,
    report: Annotated[
        Path | None,
        _opt("--report", _OUT, "write the run's HTML report (one self-contained page)"),
    ] = None,
) -> None:
    """Template: the flags of both `run` and `replay`."""


def workload_flags(
    rate: Annotated[
        float | None,
        _opt(
            "--rate",
            _WL,
            "arrival rate, requests/s (default 1; with --workload-spec, the spec's aggregate_rate)",
        ),
    ] = None,
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
            "--prompt-tokens-stdev",
            _WL,
            "prompt length standard deviation, tokens (default 256, or the preset's)",
        ),
    ] = None,
    prompt_tokens_min: Annotated[
        int | None,
        _opt("--prompt-tokens-min", _WL, "shortest prompt, tokens (default 2, or the preset's)"),
    ] = None,
    prompt_tokens_max: Annotated[
        int | None,
        _opt("--prompt-tokens-max", _WL, "longest prompt, tokens (default 7000, or the preset's)"),
    ] = None,
    output_tokens: Annotated[
        float | None,
        _opt("--output-tokens", _WL, "mean output length, tokens (default 512, or the preset's)"),
    ] = None,
    output_tokens_stdev: Annotated[
        float | None,
        _opt(
            "--output-tokens-stdev",
            _WL,
            "output length standard deviation, tokens (default 256, or the preset's)",
        ),
    ] = None,
    output_tokens_min: Annotated[
        int | None,
        _opt("--output-tokens-min", _WL, "shortest output, tokens (default 2, or the preset's)"),
    ] = None,
    output_tokens_max: Annotated[
        int | None,
        _opt("--output-tokens-max", _WL, "longest output, tokens (default 7000, or the preset's)"),
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


def trace_output_flag(
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


def with_flags(*templates: Callable) -> Callable:
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
    """A flag's JSON object (vLLM's --speculative-config style), or a ConfigError; strict as
    the files are (a key twice is an error)."""
    from ..input_files import load_json

    value = load_json(text, f"{flag} {shorten(repr(text))}")
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: invalid value {text!r}; expected a JSON object {{...}}")
    return value


def common_overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """Scenario overrides from the common flags: a policy bundle first, explicit flags last."""
    from ..cluster.policy_bundle import load_policy_bundle

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
        from ..lora_setup import parse_lora_flag

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


# Fields the flags set outside SCENARIO_FIELDS and WORKLOAD_FIELDS (`common_overrides`, and
# blis's closed-loop flags): field -> the flag, so that a refused value names the flag the user
# typed. Only for naming errors, not in `flag_for_field`: these flags' values are not the
# field's (--lora's NAME:RANK text is a list of adapters, --think-time-ms's ms are µs).
HAND_SET_FIELDS = {
    "speculative": "--speculative-config",
    "speculative.acceptance_rate": "--spec-acceptance-rate",
    "lora.adapters": "--lora",
    "latency.alpha_coeffs": "--alpha-coeffs",
    "latency.beta_coeffs": "--beta-coeffs",
    "cluster.pd.transfer_contention": "--pd-transfer-contention",
    "autoscaler": "--no-autoscaler",
    "workload_spec": "--workload-spec",
    "workload.concurrency": "--concurrency",
    "workload.think_time_us": "--think-time-ms",
}
# `slo.classes.<class>.<metric>`, set by blis's per-class goodput flags.
_SLO_CLASS_FIELD = re.compile(r"slo\.classes\.[\w-]+\.(ttft|itl|e2e)_ms")
# Other names a check gives a field a flag sets: on a v2 workload spec --rate sets its
# aggregate_rate (api.with_overrides, workload.synthetic.V2_EQUIVALENTS) and the deadline is
# each client's and cohort's own; a PD pool's deployment check names its latency model as the
# pool's `latency.model`.
_ALSO_TOLD_AS = {
    "workload.rate": (r"workload\.aggregate_rate",),
    "workload.timeout_us": (r"workload\.(?:clients|cohorts)\[\d+\]\.timeout",),
    "cluster.pd.prefill.latency_model": (r"cluster\.pd\.prefill: latency\.model",),
    "cluster.pd.decode.latency_model": (r"cluster\.pd\.decode: latency\.model",),
}
# Checks of a whole section that are about one field but do not start with it (LoRASpec's
# own): field -> the message's start. Tried in this order after the fields' own forms, so
# that `--lora a:16 --max-lora-rank 8` names --lora, the adapter refused.
_SECTION_CHECKS = (
    ("lora.adapters", r"lora: (?=adapter ')"),
    ("lora.max_lora_rank", r"lora: (?=adapter '.*exceeds max_lora_rank)"),
    ("lora.max_cpu_loras", r"lora: (?=max_cpu_loras \()"),
    ("lora.max_loras", r"lora: (?=max_cpu_loras \(.*>= max_loras)"),
)
# Where a field's name starts in a check's message: at its start, or after the message's
# source (`command-line flags: `), another error (`; `) or an opening parenthesis.
_BEFORE = r"(?P<before>^|: |; |\()"


@contextlib.contextmanager
def naming_flags(
    overrides: dict[str, Any], workload_overrides: dict[str, Any] | None = None
) -> Iterator[None]:
    """Errors about the fields these flag `overrides` (and synthetic-workload
    `workload_overrides`) set name the flag the user typed beside the field:
    `--max-num-seqs (engine.max_num_running_reqs): must be ...` where the scenario check says
    `engine.max_num_running_reqs: ...` (a scenario file's fields keep their names)."""
    try:
        yield
    except ConfigError as exc:
        text = str(exc)
        named = _named(text, [*overrides, *(workload_overrides or {})])
        if named == text:
            raise
        raise ConfigError(named) from exc


def _named(text: str, paths: list[str]) -> str:
    """`text` with the first mention of each field in `paths` told as `--flag (field):`."""
    flags = {path: naming_flag(path) for path in paths}
    flags = {path: flag for path, flag in flags.items() if flag is not None}
    # Longest paths first: `speculative.method` (--speculative-method) before `speculative`
    # (--speculative-config), whose fields a message names too.
    for path in sorted(flags, key=len, reverse=True):
        flag = flags[path]
        if _mentions(text, flag):
            continue
        # A field inside the value a flag sets is that flag's too (`lora.adapters[0].rank`).
        fields = "|".join([re.escape(path), *_ALSO_TOLD_AS.get(path, ())])
        whole = rf"{_BEFORE}(?P<field>(?:{fields})(?:\.\w+|\[\d+\])*):"
        text, n = re.subn(whole, lambda m, f=flag, p=path: _told(m, f, p), text, count=1)
        if n:
            continue
        # As a section's own check names it: `cluster.trace: level:`.
        section, _, leaf = path.rpartition(".")
        if section:
            own = rf"{_BEFORE}{re.escape(section)}: {re.escape(leaf)}:"
            text = re.sub(own, lambda m, f=flag, p=path: f"{m['before']}{f} ({p}):", text, count=1)
    for path, start in _SECTION_CHECKS:
        flag = flags.get(path)
        if flag is None or _mentions(text, flag):
            continue
        check = rf"{_BEFORE}{start}"
        text = re.sub(check, lambda m, f=flag, p=path: f"{m['before']}{f} ({p}): ", text, count=1)
    return text


def _told(match: re.Match, flag: str, path: str) -> str:
    """`--flag (field):` for a field's mention: the field as the check names it when that is a
    field (`lora.adapters[0].rank`), else the flag's field (for `cluster.pd.decode:
    latency.model`, a section's check)."""
    field = match["field"] if ": " not in match["field"] else path
    return f"{match['before']}{flag} ({field}):"


def _mentions(text: str, flag: str) -> bool:
    """Whether `text` names `flag` itself (`--timeout` is not in `--timeout-us`)."""
    return re.search(rf"{re.escape(flag)}(?![\w-])", text) is not None


def naming_flag(path: str) -> str | None:
    """The flag whose value sets scenario field `path` (dotted), for naming it in an error:
    `flag_for_field`'s, or that of a flag set by hand (`HAND_SET_FIELDS`, the per-class SLO
    flags)."""
    flag = flag_for_field(path) or HAND_SET_FIELDS.get(path)
    if flag is None and (slo := _SLO_CLASS_FIELD.fullmatch(path)) is not None:
        flag = f"--slo-{slo[1]}"
    return flag


def flag_for_field(path: str) -> str | None:
    """The flag that sets scenario field `path` (dotted) to its own value, under its current
    name; None when no flag does."""
    fields = {**SCENARIO_FIELDS, **WORKLOAD_FIELDS}
    params = [param for param, field in fields.items() if field == path]
    if not params:
        return None
    renamed = {new: new_flag for _old_flag, new, new_flag in RENAMED_FLAGS.values()}
    return renamed.get(params[0], "--" + params[0].replace("_", "-"))


ON_VALUES = ("on", "true")
OFF_VALUES = ("off", "false")


def on_off(flag: str, text: str) -> bool:
    """A switch given a value (`--flag on`, BLIS's `--flag=true`): on/true or off/false."""
    value = text.strip().lower()
    if value in ON_VALUES or value in OFF_VALUES:
        return value in ON_VALUES
    if value.startswith("--"):
        # BLIS's bare switch (`--flag` alone) took the next flag as its value here.
        raise ConfigError(
            f"{flag}: takes a value, and {text!r} was read as it; BLIS's bare switch is "
            f"written `{flag} on` (or `{flag}=true`) here"
        )
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
