"""A scenario resolved into its deployment: model, GPU, parallel layout, step-time model,
engine settings and KV capacity (`resolve_deployment`), with BLIS's precedence rules; the PD
pools' own deployments (`pool_deployments`) and one setup per instance (`instance_setups`).
Fleets described by `deployments`, node pools and the rest are planned in `fleet_plan`; runs
are in `api`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .catalog.defaults import lookup_coefficients, model_defaults
from .catalog.hardware import get_gpu, load_gpu_file
from .catalog.models import load_model, validate_tp
from .catalog.precision import apply_precision, served_dtype
from .catalog.types import GPUSpec, ModelConfig
from .cluster.cluster import InstanceSetup
from .engine.batching import EngineConfig
from .engine.formation import make_batch_formation
from .engine.policies import make_priority_policy, make_scheduler
from .engine.preemption import make_preemption_policy
from .errors import ConfigError, in_field, invalid
from .latency import build_step_time_model, latency_model_class
from .latency.base import StepTimeModel
from .latency.kv_capacity import (
    GIB_BYTES,
    blis_kv_bytes_per_token,
    compute_kv_blocks,
    derive_max_model_len,
    kv_bytes_per_token,
    model_context_limit,
    model_weight_bytes,
)
from .latency.parallel import Parallelism
from .scenario import Scenario, apply_overrides

log = logging.getLogger("servesim")

# What this run has been told already: a scenario is resolved more than once per run (the
# top-level deployment, each PD pool or named deployment, a sweep's validation pass), and a
# setting's warning is said once (`api.simulate` and `api.replay` start a new run's list).
_SAID: set[str] = set()
# Whose settings are being resolved ("cluster.pd.decode", "deployments[llama]"; "" for the
# scenario's own): a PD pool's or a deployment's warning names it.
_WHOSE: list[str] = []


def warn_once(message: str, *args: object) -> None:
    text = message % args if args else message
    if text not in _SAID:  # the same words for another pool or deployment: said once
        _SAID.add(text)
        log.warning("%s", f"{_WHOSE[-1]}: {text}" if _WHOSE and _WHOSE[-1] else text)


@contextmanager
def warnings_of(whose: str) -> Iterator[None]:
    """Warnings said while resolving `whose` settings name it."""
    _WHOSE.append(whose)
    try:
        yield
    finally:
        _WHOSE.pop()


def new_run_warnings() -> None:
    """A new run: its settings' warnings are said again."""
    _SAID.clear()


FALLBACK_KV_BLOCKS = 1_000_000
# Why BLIS's trained-physics cannot price a data-parallel rank (docs/parallelism.md).
DP_NEEDS_RANK_PRICING = (
    "latency model 'trained-physics' prices one scheduler standing for all dp ranks (BLIS's "
    "approximation); servesim runs a scheduler per rank, which latency model physics prices"
)


@dataclass
class Deployment:
    """A scenario's deployment, fully resolved: what one instance is and how it is priced."""

    model: ModelConfig
    gpu: GPUSpec
    tp: int
    step_model: StepTimeModel
    engine: EngineConfig
    kv_blocks_source: str
    parallelism: Parallelism | None = None
    # Where the batch limits came from (`batch_limits`).
    batch_limits_source: str = "set"

    @property
    def gpus(self) -> int:
        """GPUs one instance occupies: tp x pp x dp."""
        return self.parallelism.gpus if self.parallelism is not None else self.tp

    @property
    def dp(self) -> int:
        """Data-parallel attention ranks per instance."""
        return self.parallelism.dp if self.parallelism is not None else 1

    def describe(self) -> dict[str, Any]:
        layout = self.parallelism or Parallelism(self.tp)
        described = {
            "model": self.model.name,
            "hardware": self.gpu.name,
            "tp": self.tp,
            "pp": layout.pp,
            "ep": layout.ep,
            "gpus": layout.gpus,
            "latency_model": self.step_model.name,
            "latency": self.step_model.provenance(),
            "total_kv_blocks": self.engine.total_kv_blocks,
            "kv_blocks_source": self.kv_blocks_source,
            "max_model_len": self.engine.max_model_len,
            "max_num_running_reqs": self.engine.max_num_running_reqs,
            "max_num_scheduled_tokens": self.engine.max_num_scheduled_tokens,
            "batch_limits_source": self.batch_limits_source,
        }
        if self.engine.speculative is not None:
            described["speculative"] = self.engine.speculative.describe()
        if self.engine.lora is not None:
            described["lora"] = self.engine.lora.describe()
        return described


def resolve_deployment(
    scenario: Scenario, instances_field: str = "cluster.num_instances (--num-instances)"
) -> Deployment:
    """Model, GPU, TP, step-time model and engine settings, with BLIS's precedence rules.
    `instances_field` names where more replicas are asked for (a PD pool's own count)."""
    if scenario.model_config_folder is not None:
        if not Path(scenario.model_config_folder).exists():
            raise invalid(
                "model_config_folder",
                str(scenario.model_config_folder),
                "no such folder or file (a HuggingFace config.json, or the folder holding it)",
            )
        model = load_model(str(scenario.model_config_folder), name=scenario.model)
    else:
        with in_field("model"):
            model = load_model(scenario.model)
    defaults = model_defaults(model.name) or {}
    hardware = scenario.hardware or defaults.get("GPU") or "H100"
    extra = load_gpu_file(scenario.hardware_file) if scenario.hardware_file else None
    with in_field("hardware"):
        gpu = get_gpu(hardware, extra)
    tp = scenario.tp or int(defaults.get("tensor_parallelism") or 1)
    validate_tp(model, tp)
    model = apply_precision(model, gpu, scenario.weight_dtype, scenario.engine.kv_cache_dtype)
    if scenario.latency.model == "physics":
        model = served_dtype(model)
    if scenario.dp not in (None, 1) and scenario.latency.model == "trained-physics":
        raise invalid("dp", scenario.dp, DP_NEEDS_RANK_PRICING)
    layout = Parallelism.of(
        tp, scenario.pp, scenario.dp, scenario.ep, scenario.enable_expert_parallel
    ).check(model)
    if scenario.enable_expert_parallel and not model.is_moe:
        raise ConfigError(
            f"enable_expert_parallel: invalid value True; expert parallelism needs an MoE "
            f"model and {model.name!r} is dense"
        )
    if layout.dp > 1 and not model.is_moe:
        # vLLM keeps DP ranks in lockstep (aligned steps, dummy batches) for the expert
        # all-to-alls of an MoE model; a dense model's ranks are independent servers, which
        # servesim models as instances (docs/parallelism.md).
        raise invalid(
            "dp",
            layout.dp,
            f"{model.name!r} is dense: its data-parallel ranks are independent replicas, not "
            f"ranks stepping together; give {instances_field} instead",
        )
    lat = scenario.latency
    with in_field("latency.model"):
        latency_model_class(lat.model)
    try:
        step_model = build_step_time_model(
            lat.model,
            model,
            gpu,
            tp,
            lat.alpha_coeffs,
            lat.beta_coeffs,
            lat.vllm_version,
            coeffs_file=lat.coeffs_file,
            parallelism=layout,
        )
    except ConfigError as exc:
        # The backends name their coefficients bare (they are built from Python too); from a
        # scenario they are the latency section's.
        if str(exc).startswith(("alpha_coeffs", "beta_coeffs")):
            raise type(exc)(f"latency.{exc}") from None
        raise
    eng = scenario.engine
    if eng.kv_cache_dtype != "auto" and lat.model in _BLIS_BACKENDS:
        warn_once(
            "latency model %s prices a step as BLIS does, without the KV cache's width: "
            "engine.kv_cache_dtype %s changes only the KV capacity with it (physics prices the "
            "8-bit cache's reads too)",
            lat.model,
            eng.kv_cache_dtype,
        )
    with in_field("engine.scheduler"):
        make_scheduler(eng.scheduler)
    if eng.scheduler in ("priority-fcfs", "reverse-priority") and eng.priority_policy == "constant":
        # BLIS-current's priority schedulers always order by SLO class; servesim's order by the
        # priority policy, whose default gives every request the same priority.
        warn_once(
            "engine.scheduler %s orders by engine.priority_policy, which is 'constant': every "
            "request has the same priority, so the queue keeps arrival order; BLIS-current's "
            "%s orders by SLO class, which is priority_policy 'slo-class' "
            "(--priority-policy slo-class)",
            eng.scheduler,
            eng.scheduler,
        )
    with in_field("engine.priority_policy"):
        make_priority_policy(eng.priority_policy)
    with in_field("engine.preemption_policy"):
        make_preemption_policy(eng.preemption_policy)
    if eng.slo_priorities and not (
        eng.preemption_policy == "priority" or eng.priority_policy == "slo-class"
    ):
        warn_once(
            "engine.slo_priorities is read by preemption_policy 'priority' and priority_policy "
            "'slo-class' only; with neither set it changes nothing"
        )
    with in_field("engine.batch_formation"):
        make_batch_formation(eng.batch_formation)
    _validate_cluster(scenario)
    total_blocks, source = _total_kv_blocks(scenario, model, gpu, tp, layout)
    speculative = None
    if scenario.speculative is not None:
        from .speculative_setup import build_speculation

        capacity = capacity_settings(scenario, layout)
        speculative, total_blocks, source = build_speculation(
            scenario, model, gpu, tp, capacity, step_model, total_blocks, source
        )
    lora = None
    if scenario.lora is not None:
        from .lora_setup import build_lora

        capacity = capacity_settings(scenario, layout)
        lora, total_blocks, source = build_lora(
            scenario, model, gpu, tp, capacity, total_blocks, source
        )
    max_model_len = eng.max_model_len
    if max_model_len is None:
        max_model_len = (
            derive_max_model_len(model, total_blocks, eng.block_size_tokens)
            if step_model.derives_context_limit
            else 0
        )
    max_tokens, max_running, limits_source = batch_limits(scenario, gpu)
    _warn_what_vllm_refuses(
        model, eng.max_model_len, total_blocks * eng.block_size_tokens, max_tokens, max_running
    )
    engine = EngineConfig(
        total_kv_blocks=total_blocks,
        block_size=eng.block_size_tokens,
        max_num_running_reqs=max_running,
        max_num_scheduled_tokens=max_tokens,
        long_prefill_token_threshold=eng.long_prefill_token_threshold,
        max_model_len=max_model_len,
        scheduler=eng.scheduler,
        priority_policy=eng.priority_policy,
        preemption_policy=eng.preemption_policy,
        slo_priorities=eng.slo_priorities,
        batch_formation=eng.batch_formation,
        enable_prefix_caching=eng.enable_prefix_caching,
        kv_cpu_blocks=eng.kv_cpu_blocks,
        kv_offload_policy=eng.kv_offload_policy,
        kv_bytes_per_block=kv_bytes_per_token(model, tp, layout.pp) * eng.block_size_tokens,
        kv_transfer_bandwidth_gb_per_s=eng.kv_transfer_bandwidth_gb_per_s,
        kv_transfer_base_latency_us=eng.kv_transfer_base_latency_us,
        kv_reload_blocking=eng.kv_reload_blocking,
        speculative=speculative,
        lora=lora,
    )
    return Deployment(model, gpu, tp, step_model, engine, source, layout, limits_source)


# BLIS's step-time models: they price a step as BLIS does, whatever the KV cache's width.
_BLIS_BACKENDS = frozenset(
    {"roofline", "trained-roofline", "crossmodel", "trained-physics", "blackbox"}
)


def _warn_what_vllm_refuses(
    model: ModelConfig,
    max_model_len: int | None,
    kv_tokens: int,
    max_tokens: int,
    max_running: int,
) -> None:
    """Settings a vLLM server refuses at start-up, which servesim runs as given (BLIS does):
    said once per run, so that a figure from a server that could not exist is not read as
    one that could."""
    if max_model_len:
        own = model_context_limit(model)
        if own and max_model_len > own:
            warn_once(
                "engine.max_model_len %d is above %s's own context limit %d "
                "(max_position_embeddings, times its rope factor); vLLM refuses to start with "
                "it (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); servesim runs it as given",
                max_model_len,
                model.name,
                own,
            )
        if max_model_len > kv_tokens:
            warn_once(
                "engine.max_model_len %d is more than the KV cache holds (%d tokens); vLLM "
                "refuses to start with it; servesim runs it as given, and a request that "
                "outgrows the cache ends dropped_unservable",
                max_model_len,
                kv_tokens,
            )
    if max_tokens < max_running:
        warn_once(
            "engine.max_num_scheduled_tokens %d is below engine.max_num_running_reqs %d; vLLM "
            "refuses to start with it (max_num_batched_tokens must be >= max_num_seqs); "
            "servesim runs it as given",
            max_tokens,
            max_running,
        )


# BLIS's batch limits (its --max-num-scheduled-tokens and --max-num-running-reqs defaults).
BLIS_BATCH_LIMITS = (2048, 256)


def batch_limits(scenario: Scenario, gpu: GPUSpec) -> tuple[int, int, str]:
    """(max_num_scheduled_tokens, max_num_running_reqs, what they are). A limit the scenario
    leaves unset (None) is a stock vLLM server's on this GPU under servesim's `physics`
    model, which prices vLLM's steps (8,192 tokens and 1,024 sequences on a GPU of at least
    70 GiB that is not an A100, else 2,048 and 256), and BLIS's default under BLIS's
    backends, whose runs it reproduces (docs/behaviour.md §1.5). The description says what
    the values are, not who chose them, so a replay of an exported trace, which sets the
    recorded limits, reads the same as the run that wrote it."""
    from .workload.server_settings import vllm_batch_defaults

    if scenario.latency.model == "physics":
        defaults = vllm_batch_defaults(gpu.name, gpu.memory_gib)
        kind = f"vLLM's default on {gpu.name}"
    else:
        defaults = BLIS_BATCH_LIMITS
        kind = "BLIS's default"
    eng = scenario.engine
    given = (eng.max_num_scheduled_tokens, eng.max_num_running_reqs)
    tokens, running = (d if g is None else g for g, d in zip(given, defaults, strict=True))
    tokens_default, running_default = tokens == defaults[0], running == defaults[1]
    if tokens_default and running_default:
        return tokens, running, kind
    if not tokens_default and not running_default:
        return tokens, running, "set"
    default_name, set_name = ("max_num_scheduled_tokens", "max_num_running_reqs")[
        :: 1 if tokens_default else -1
    ]
    return tokens, running, f"{set_name} set; {default_name}: {kind}"


def unrecorded_token_budget(scenario: Scenario, deployment: Deployment) -> int | None:
    """The default token budget a replay of this run's exported trace would take instead of
    the run's own, or None when they agree: a TraceV2 header records the server's sequence
    limit but no token budget (BLIS's server keys), so a replay falls back to its default."""
    unset = scenario.model_copy(
        update={"engine": scenario.engine.model_copy(update={"max_num_scheduled_tokens": None})}
    )
    default_tokens = batch_limits(unset, deployment.gpu)[0]
    ran = deployment.engine.max_num_scheduled_tokens
    return default_tokens if default_tokens != ran else None


def instance_setups(scenario: Scenario, deployment: Deployment) -> list[InstanceSetup]:
    """One setup per instance: PD pools first (prefill, then decode), then unified ones.

    A pool with overrides (GPU, TP, latency model, context limit, KV blocks) gets its own
    deployment: its roofline uses the pool's GPU and TP, and its KV capacity is resolved for
    that GPU (docs/behaviour.md §7.4)."""
    cluster = scenario.cluster
    unified = InstanceSetup(
        deployment.engine, deployment.step_model, "unified", deployment.dp, deployment
    )
    pd = cluster.pd
    if not pd.enabled:
        return [unified] * cluster.num_instances
    setups = []
    pools = pool_deployments(scenario, deployment)
    for role, count in (("prefill", pd.prefill_instances), ("decode", pd.decode_instances)):
        pool = pools[role]
        setups += [InstanceSetup(pool.engine, pool.step_model, role, pool.dp, pool)] * count
    return setups + [unified] * (cluster.num_instances - len(setups))


def pool_deployments(scenario: Scenario, deployment: Deployment) -> dict[str, Deployment]:
    """The deployment of each PD pool ("prefill", "decode"): `deployment` itself unless the
    pool overrides its GPU, layout, latency model, context limit or KV blocks."""
    pd = scenario.cluster.pd
    out = {}
    for role, pool in (("prefill", pd.prefill), ("decode", pd.decode)):
        if not pool.changes_deployment:
            out[role] = deployment
            continue
        changes = {
            "hardware": pool.hardware,
            "tp": pool.tp,
            "pp": pool.pp,
            "ep": pool.ep,
            "dp": pool.dp,
            "latency.model": pool.latency_model,
            "engine.max_model_len": pool.max_model_len,
            "engine.total_kv_blocks": pool.total_kv_blocks,
        }
        pool_scenario = apply_overrides(
            scenario,
            {k: v for k, v in changes.items() if v is not None},
            source=f"cluster.pd.{role}",
        )
        try:
            with warnings_of(f"cluster.pd.{role}"):
                out[role] = resolve_deployment(
                    pool_scenario, f"cluster.pd.{role}_instances (--{role}-instances)"
                )
        except ConfigError as exc:
            # Name the pool: the bare field (`tp`, `dp`, a GPU) reads as the top level's.
            raise ConfigError(f"cluster.pd.{role}: {exc}") from None
    warn_decode_context_limit([out["prefill"]], [out["decode"]])
    return out


def warn_decode_context_limit(prefill: list[Deployment], decode: list[Deployment]) -> None:
    """Warn when a decode deployment's context limit is below a prefill deployment's: a
    disaggregated request is length-capped there (docs/pd.md). The pools are given either as
    `cluster.pd.prefill` / `decode` overrides or as deployments with `role: prefill` /
    `decode` (until 2026-12-07 only the first form warned); 0 is no limit."""
    prefill_lens = [d.engine.max_model_len for d in prefill]
    decode_lens = [d.engine.max_model_len for d in decode if d.engine.max_model_len]
    if not decode_lens or not prefill_lens:
        return
    prefill_len = 0 if 0 in prefill_lens else max(prefill_lens)
    decode_len = min(decode_lens)
    if prefill_len == 0 or decode_len < prefill_len:
        warn_once(
            "the decode pool's context limit (%d tokens) is below the prefill pool's (%s): a "
            "disaggregated request the prefill pool accepts but the decode pool could not is "
            "length-capped at the decode pool's limit, as in BLIS (a vLLM decode server would "
            "refuse it)",
            decode_len,
            f"{prefill_len} tokens" if prefill_len else "none",
        )


def transfer_bytes_per_token(prefill: Deployment) -> float:
    """The KV bytes per token a PD transfer moves from an instance of `prefill`: what one of
    its GPUs holds (its TP and PP shard; an MLA latent whole on every TP GPU), each GPU sending
    its own share over its own lane of the link. Under BLIS's backends as BLIS sizes it (the
    whole KV / TP, even with fewer KV heads than GPUs), else as vLLM stores it (one whole head
    per GPU then)."""
    layout = prefill.parallelism
    per_gpu = (
        kv_bytes_per_token if prefill.step_model.name == "physics" else blis_kv_bytes_per_token
    )
    return per_gpu(prefill.model, prefill.tp, layout.pp if layout is not None else 1)


def _validate_cluster(scenario: Scenario) -> None:
    """Reject unknown policies, scorers and fitness keys before anything runs."""
    import numpy as np

    from .cluster.cluster import build_policies, decider_for
    from .cluster.disaggregation import decider_options
    from .metrics.fitness import parse_fitness_weights

    c = scenario.cluster
    pd = c.pd
    decider_for(pd, scenario.engine.block_size_tokens)
    reads = decider_options(pd.decider)
    for option in ("prefix_threshold", "prompt_length_threshold"):
        if getattr(pd, option) is not None and option not in reads:
            warn_once("pd.%s is set but the decider %r does not read it", option, pd.decider)
    if pd.prefix_mode != "global" and "prefix_mode" not in reads:
        warn_once("pd.prefix_mode is set but the decider %r does not read it", pd.decider)
    pools_from_deployments = any(d.role in ("prefill", "decode") for d in scenario.deployments)
    if not pd.enabled and not pools_from_deployments:
        # Pool and link settings of a cluster without PD pools change nothing: said, as a
        # decider's unread option is, rather than run as a unified fleet without a word.
        link = ("transfer_bandwidth_gb_per_s", "transfer_base_latency_ms", "kv_bytes_per_token",
                "transfer_contention", "transfer_slots")  # fmt: skip
        unused = [f for f in link if getattr(pd, f) != type(pd).model_fields[f].default]
        unused += [
            role
            for role in ("prefill", "decode")
            if getattr(pd, role).changes_deployment or getattr(pd, role).routing_scorers
        ]
        if unused:
            warn_once(
                "cluster.pd.%s %s set but the cluster has no PD pools (prefill_instances and "
                "decode_instances are 0): unused",
                ", cluster.pd.".join(unused),
                "is" if len(unused) == 1 else "are",
            )
    admission = c.admission
    if admission.policy != "token-bucket":
        for option in ("token_bucket_capacity", "token_bucket_refill_rate"):
            if getattr(admission, option) is not None:
                warn_once(
                    "admission.%s is set but the admission policy %r does not read it "
                    "(token-bucket does)",
                    option,
                    admission.policy,
                )
    build_policies(c, np.random.default_rng(0), scenario.engine.block_size_tokens, lambda _i, _r: 0)
    if c.fitness_weights:
        parse_fitness_weights(c.fitness_weights)


def capacity_settings(scenario: Scenario, layout: Parallelism) -> dict[str, Any]:
    """The engine and layout settings the KV capacity formula takes besides model, GPU, TP."""
    eng = scenario.engine
    return {
        "block_size": eng.block_size_tokens,
        "gpu_memory_utilization": eng.gpu_memory_utilization,
        "pp": layout.pp,
        "expert_fraction": layout.tp / layout.expert_shards if layout.ep_ranks > 1 else 1.0,
        "rule": capacity_rule(scenario),
        "instance_gpus": layout.gpus,
    }


def capacity_rule(scenario: Scenario) -> str:
    """The KV capacity rule in force: `auto` is vLLM's per-GPU allocation under servesim's
    `physics` model (the measured block counts agree with it) and BLIS's formula under BLIS's
    backends, whose runs it reproduces (docs/models-and-hardware.md, Capacity rules)."""
    rule = scenario.engine.kv_capacity_rule
    if rule == "auto":
        return "vllm" if scenario.latency.model == "physics" else "blis"
    return rule


# The settings a measured defaults.yaml block count was logged at: a stock vLLM server's.
MEASURED_ROW_SETTINGS = {"gpu_memory_utilization": 0.9, "block_size_tokens": 16}


def settings_unlike_measured_row(scenario: Scenario) -> str | None:
    """Why a measured block count (a defaults.yaml row) was not logged at this scenario's
    engine settings (None when it was): a row is a stock server's count, at utilisation 0.9,
    16-token blocks and the model's own weight and cache dtypes; another setting there
    changes the count (an FP8 cache doubles it, utilisation 0.3 leaves a sixth of it)."""
    eng = scenario.engine
    for name, stock in MEASURED_ROW_SETTINGS.items():
        if getattr(eng, name) != stock:
            return f"engine.{name} is {getattr(eng, name)}, the row was measured at {stock}"
    if eng.kv_cache_dtype != "auto" or scenario.weight_dtype != "auto":
        return "a weight or KV-cache dtype other than the model's own is set"
    return None


def _unlike_measured_row(
    scenario: Scenario,
    model: ModelConfig,
    gpu: GPUSpec,
    tp: int,
    layout: Parallelism,
    blocks: int,
) -> str | None:
    """Why a defaults.yaml block count does not describe this instance under the `vllm` rule
    (None when it does). A row is what a stock vLLM server of (model, GPU, TP) allocated: at
    utilisation 0.9, 16-token blocks, the model's own weight and cache dtypes, on TP GPUs
    alone; another setting there changes the count (an FP8 cache doubles it). And a row whose
    blocks' KV does not fit beside the weights in the memory vLLM may use (the GPUs' memory x
    utilisation) is not vLLM's per-GPU count (BLIS's rows for TP > 1 can count each block once
    per GPU): the rule computes those. (Until 2026-12-07 the KV alone was compared with all the
    GPUs' memory, and Llama-4-Scout FP8 at TP 2 took 74.5 GiB of KV beside 100.4 GiB of
    weights on 2 x 80 GiB.) The activation reserve is left out: the rows were logged by
    servers that kept less than the formula's (Llama-3.1-8B's 29,205 blocks on one H100 leave
    1.5 MiB beside the weights at 0.9)."""
    eng = scenario.engine
    stock_gpu = get_gpu(gpu.name)
    if gpu.memory_gib != stock_gpu.memory_gib:
        # A hardware file's entry replacing the built-in GPU the row was measured on.
        return (
            f"the GPU has {gpu.memory_gib:g} GiB, the built-in {stock_gpu.name} the row was "
            f"measured on {stock_gpu.memory_gib:g}"
        )
    unstock = settings_unlike_measured_row(scenario)
    if unstock is not None:
        return unstock
    if layout.gpus != tp:
        return f"the instance has {layout.gpus} GPUs (pipeline, data or expert parallel), not TP"
    kv_bytes = blocks * eng.block_size_tokens * kv_bytes_per_token(model, tp) * tp
    weight_bytes = model_weight_bytes(model)
    usable = gpu.memory_gib * GIB_BYTES * eng.gpu_memory_utilization * tp
    if kv_bytes + weight_bytes > usable:
        return (
            f"its KV ({kv_bytes / GIB_BYTES:,.1f} GiB) and the weights "
            f"({weight_bytes / GIB_BYTES:,.1f} GiB) exceed the {usable / GIB_BYTES:,.1f} GiB "
            f"vLLM may use on the instance's {tp} GPU(s) ({gpu.memory_gib:g} GiB x "
            f"{eng.gpu_memory_utilization:g} utilisation x {tp})"
        )
    return None


def _total_kv_blocks(
    scenario: Scenario, model: ModelConfig, gpu: GPUSpec, tp: int, layout: Parallelism
) -> tuple[int, str]:
    """Explicit > measured defaults.yaml entry > auto-calculation > 1,000,000 (docs/behaviour.md
    §2.5)."""
    eng = scenario.engine
    if eng.total_kv_blocks is not None:
        return eng.total_kv_blocks, "explicit"
    version = scenario.latency.vllm_version or (model_defaults(model.name) or {}).get(
        "vllm_version"
    )
    entry = lookup_coefficients(model.name, gpu.name, tp, version)
    # trained-physics is BLIS-current's model, whose defaults.yaml has no block counts: it
    # always computes them.
    if entry is not None and entry.total_kv_blocks and scenario.latency.model != "trained-physics":
        if capacity_rule(scenario) == "blis":
            # BLIS-Mar takes its row whatever else is set; a setting that changes the count
            # (utilisation, block size, a dtype) is taken as asked, with BLIS's formula, as
            # BLIS-current computes it (until 2026-12-07 such settings changed nothing).
            departure = settings_unlike_measured_row(scenario)
        else:
            departure = _unlike_measured_row(
                scenario, model, gpu, tp, layout, entry.total_kv_blocks
            )
        if departure is None:
            return entry.total_kv_blocks, "defaults.yaml"
        log.info(
            "defaults.yaml's %d KV blocks for %s on %s TP %d not used: %s",
            entry.total_kv_blocks,
            model.name,
            gpu.name,
            tp,
            departure,
        )
    try:
        blocks = compute_kv_blocks(model, gpu, tp, **capacity_settings(scenario, layout))
        return blocks, "auto"
    except ConfigError as exc:
        # With `deployments`, this is the scenario's top-level layout, which no instance need
        # run (each deployment is resolved on its own, with its own warning): not a warning.
        level = logging.INFO if scenario.deployments else logging.WARNING
        # A named deployment is resolved as a scenario of its own, with the layout the
        # user gave that deployment: the warning says which one, as its other warnings do.
        whose = f"{_WHOSE[-1]}: " if _WHOSE and _WHOSE[-1] else ""
        log.log(
            level,
            "%sKV capacity auto-calculation failed (%s); using %d blocks",
            whose,
            exc,
            FALLBACK_KV_BLOCKS,
        )
        return FALLBACK_KV_BLOCKS, "fallback"
