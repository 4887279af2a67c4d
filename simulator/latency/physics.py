"""`physics`: a first-principles step-time model with a few calibratable efficiencies.

One engine step is one forward pass of a mixed batch (prefill chunks and decode tokens
together) on each of the `tp` GPUs of the instance. Per GPU it costs

    step = per-step overhead (+ single-process overhead when tp == 1)
         + batch × per-sequence overhead + layers × per-layer overhead
         + all-reduces × (2(tp − 1) × all-reduce step latency
                          + all-reduce bytes / (link bandwidth × link eff.))
         + max(weight bytes / (peak bandwidth × bandwidth eff.)
               + KV bytes / (peak bandwidth × KV bandwidth eff.),
               prefill FLOPs / (peak × prefill eff.) + decode FLOPs / (peak × decode eff.))

Bytes are the weights streamed once per step (attention, all three SwiGLU matrices, the MoE
experts the step's tokens actually touch, the router, the LM head, the embedding rows looked
up) plus the KV cache read and written. FLOPs are the GEMMs of the tokens computed plus causal
attention over their context plus one LM-head row per sequence. Every GEMM also pays a fixed
cost worth `gemm_fixed_rows` rows (tiles are 128 rows tall, so a GEMM's last tile is partly
empty, and each kernel fills and drains the GPU): that is why an MoE step, which runs one small
GEMM per touched expert, computes less efficiently than a dense one. Every term is in
`PhysicsTerms` at *peak* rates; `PhysicsCoefficients` turns them into time. Because the
terms do not depend on the coefficients, calibration records the terms of every step once and
re-prices them for any coefficients without re-simulating (see simulator/calibrate.py).

Once per request: `request_overhead_us` (HTTP, tokenisation) before it reaches the engine, then
`output_lag_steps` × the duration of the step in flight (the instance charges it: vLLM V1's
async scheduler has already planned the next step, so the request misses it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import ConfigError, excerpt, invalid, is_finite_positive
from simulator.latency.base import StepBatch, StepTimeModel
from simulator.latency.roofline import validate_roofline_inputs

# A SwiGLU MLP has three matrices: gate and up (d -> d_ff) and down (d_ff -> d).
SWIGLU_MATRICES = 3
# FLOPs of one multiply-accumulate.
FLOPS_PER_MAC = 2
# K and V.
KV_TENSORS = 2
# Tensor parallelism needs one all-reduce after attention's output projection and one after
# the MLP's down projection (Megatron-style sharding) in every layer.
ALLREDUCES_PER_LAYER = 2

COEFFICIENTS_FILE_VERSION = 1
_DATA = Path(__file__).resolve().parent.parent / "catalog" / "data" / "physics.yaml"


@dataclass(frozen=True)
class PhysicsCoefficients:
    """The efficiencies and overheads that turn peak-rate terms into time.

    Defaults are public hardware facts and common measurements, not fits (see
    docs/latency-models.md); `calibrate` replaces them with values fitted to real runs."""

    # Sustained / datasheet HBM bandwidth for large streaming reads (H100 ~0.8 in STREAM-like
    # copies; BLIS's roofline experiment H1 measured 0.82).
    bandwidth_efficiency: float = 0.80
    # The KV cache streams like the weights: vLLM's FlashAttention layout keeps each 16-token
    # block's K (and V) of one layer contiguous, 16 x kv_heads x head_dim x 2 B per GPU (4 KiB
    # and up; 128 KiB for Llama-2-7B), runs long enough for HBM to stream them at full rate.
    kv_bandwidth_efficiency: float = 0.80
    # Large BF16 GEMMs reach ~60-70% of the dense tensor-core peak on Hopper.
    prefill_compute_efficiency: float = 0.60
    # Decode GEMMs have a handful of rows: tile quantisation wastes most of each MMA.
    decode_compute_efficiency: float = 0.30
    # NCCL / custom all-reduce reaches ~70% of the per-direction link bandwidth.
    interconnect_efficiency: float = 0.70
    # Latency of one step of an all-reduce on NVLink (launch + synchronisation), µs. A ring
    # all-reduce over tp GPUs takes 2(tp - 1) steps (reduce-scatter, then all-gather), the
    # same count the bytes term uses, so one all-reduce costs 2(tp - 1) x this. A small
    # all-reduce on 2 H100s takes ~6 µs (nccl-tests with CUDA graphs, NVIDIA/nccl#1259):
    # 3 µs a step; 18 µs on 4 GPUs.
    allreduce_latency_us: float = 3.0
    # Launch gaps and small kernels (norms, rotary, residual adds) per layer, µs.
    per_layer_overhead_us: float = 10.0
    # Fixed time per step beyond the streams (sampling, the host-device sync, launches), µs.
    # From a public measurement: Llama-3.1-8B on one H100 under vLLM V1 decodes alone at
    # 6.48 ms per token, of which the weights (15.0 GB at 0.8 x 3.35 TB/s), the layers and
    # the KV take 5.94 ms (docs/latency-models.md).
    per_step_overhead_us: float = 500.0
    # Exposed time per scheduled sequence per step (sampling, logits and input rows), µs. The
    # async scheduler runs the scheduler's per-request CPU work in the GPU's shadow; the same
    # public sweep bounds the whole per-sequence cost at about 22 µs.
    per_sequence_overhead_us: float = 5.0
    # Extra CPU work per step when tp == 1, µs (vLLM V1 then runs the model runner inside the
    # engine-core process). Default 0 and not fitted: the measured Llama-2-7B TP1 runs, replayed
    # with their true output lengths, keep less fixed time per step than the TP > 1 models
    # (docs/accuracy.md); the term stays for coefficient files that set it.
    single_process_overhead_us: float = 0.0
    # Once per request before it reaches the engine (HTTP, tokenisation), µs.
    request_overhead_us: float = 3000.0
    # Fixed cost of every GEMM in rows: half of Hopper's 128-row output tile.
    gemm_fixed_rows: float = 64.0
    # vLLM V1's async scheduling (the default since vllm#27614) plans step N+1 while step N runs,
    # so a request reaching the engine during step N misses N+1: it waits this many times the
    # duration of the step in flight (as loaded as it is), then for the next step boundary.
    output_lag_steps: float = 1.0

    def check(self, where: str = "physics coefficients") -> PhysicsCoefficients:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("efficiency"):
                if not (is_finite_positive(value) and value <= 1.0):
                    raise invalid(f"{where}: {f.name}", value, "must be a number in (0, 1]")
            elif f.name in ("gemm_fixed_rows", "output_lag_steps") and not (
                is_finite_positive(value) or value == 0
            ):
                raise invalid(f"{where}: {f.name}", value, "must be a number >= 0")
            elif not (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= 0
            ):
                raise invalid(f"{where}: {f.name}", value, "must be a number >= 0 (µs)")
        return self


COEFFICIENT_NAMES = tuple(f.name for f in fields(PhysicsCoefficients))


class PhysicsTerms(NamedTuple):
    """One step's work per GPU at peak rates (seconds), plus the counts overheads scale with."""

    memory_s: float  # weight (and embedding-row) bytes / peak bandwidth
    prefill_compute_s: float  # prefill FLOPs / peak FLOP rate
    decode_compute_s: float  # decode FLOPs / peak FLOP rate
    allreduce_transfer_s: float  # all-reduce bytes on the link / link bandwidth
    collectives: int  # all-reduce latency steps: all-reduces x 2(tp - 1) (0 without TP)
    layers: int
    sequences: int  # requests that got tokens this step
    weight_row_compute_s: float  # FLOPs of one row through every weight matrix / peak
    kv_memory_s: float  # KV cache bytes read and written / peak bandwidth
    single_process: int  # 1 when tp == 1 (scheduler and model runner in one process)


def price_terms(
    terms: PhysicsTerms | Sequence[Any],
    c: PhysicsCoefficients,
    maximum: Callable[[Any, Any], Any] = max,
) -> Any:
    """Step time in seconds. Works element-wise on arrays when `maximum` is numpy.maximum."""
    (
        memory_s,
        prefill_s,
        decode_s,
        transfer_s,
        collectives,
        layers,
        sequences,
        row_s,
        kv_s,
        single_process,
    ) = terms
    gpu_s = maximum(
        memory_s / c.bandwidth_efficiency + kv_s / c.kv_bandwidth_efficiency,
        (prefill_s + c.gemm_fixed_rows * row_s) / c.prefill_compute_efficiency
        + decode_s / c.decode_compute_efficiency,
    )
    communication_s = (
        collectives * c.allreduce_latency_us * 1e-6 + transfer_s / c.interconnect_efficiency
    )
    overhead_s = (
        c.per_step_overhead_us
        + single_process * c.single_process_overhead_us
        + layers * c.per_layer_overhead_us
        + sequences * c.per_sequence_overhead_us
    ) * 1e-6
    return overhead_s + communication_s + gpu_s


def request_delay_s(c: PhysicsCoefficients) -> float:
    """Once per request: the client path (HTTP, tokenisation), charged before the request
    reaches the engine. The scheduling lag that follows (`output_lag_steps` x the step in
    flight, `StepTimeModel.scheduling_lag_steps`) is charged by the instance, which knows the
    step. Both delay TTFT and E2E alike, not ITL."""
    return c.request_overhead_us * 1e-6


@dataclass(frozen=True)
class ModelShape:
    """Per-GPU constants of one model under tensor parallelism (bytes, FLOPs, counts)."""

    layers: int
    attention_weight_bytes: float  # all layers, per GPU
    expert_weight_bytes: float  # one expert (or the dense MLP), all layers, per GPU
    router_weight_bytes: float  # MoE gate, all layers, per GPU
    lm_head_bytes: float  # vocab × hidden, per GPU (vocab-parallel)
    embedding_row_bytes: float  # one token's embedding row, per GPU
    kv_bytes_per_token: float  # K and V of one token, all layers, per GPU
    linear_flops_per_token: float  # attention projections + active experts + router, per GPU
    lm_head_flops_per_sequence: float  # logits of one position, per GPU
    attention_flops_per_pair: float  # QK^T and AV for one (query, key) pair, all layers, per GPU
    allreduce_bytes_per_token: float  # one all-reduce's payload per token (hidden × bytes)
    num_experts: int  # 0 for dense
    experts_per_token: int


def model_shape(model: ModelConfig, tp: int) -> ModelShape:
    """Count bytes and FLOPs from the architecture; see the module docstring for the terms."""
    layers = model.num_layers
    d = float(model.hidden_dim)
    heads = model.num_heads
    head_dim = float(model.config_head_dim or d / heads)
    kv_heads = model.effective_kv_heads
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    d_ff = float(model.intermediate_dim) if model.intermediate_dim > 0 else 4.0 * d
    moe = model.is_moe
    d_expert = float(model.moe_expert_ffn_dim) if moe and model.moe_expert_ffn_dim > 0 else d_ff
    experts = model.num_local_experts if moe else 0
    k = model.num_experts_per_tok if moe else 1
    act_bytes = float(model.bytes_per_param)
    w_bytes = float(model.effective_weight_bytes_per_param)
    # Q, K, V and output projections.
    attention_params = d * (q_dim + 2 * kv_dim) + q_dim * d
    mlp_params = SWIGLU_MATRICES * d * d_expert
    router_params = d * experts
    # KV heads are split across GPUs; with fewer KV heads than GPUs each GPU keeps a replica.
    kv_heads_per_gpu = max(kv_heads / tp, 1.0)
    return ModelShape(
        layers=layers,
        attention_weight_bytes=layers * attention_params * w_bytes / tp,
        expert_weight_bytes=layers * mlp_params * w_bytes / tp,
        router_weight_bytes=layers * router_params * w_bytes,
        lm_head_bytes=model.vocab_size * d * w_bytes / tp,
        embedding_row_bytes=d * w_bytes,
        kv_bytes_per_token=KV_TENSORS * layers * kv_heads_per_gpu * head_dim * act_bytes,
        linear_flops_per_token=FLOPS_PER_MAC
        * layers
        * (attention_params + k * mlp_params + router_params)
        / tp,
        lm_head_flops_per_sequence=FLOPS_PER_MAC * model.vocab_size * d / tp,
        # QK^T and AV each take head_dim MACs per head per (query, key) pair.
        attention_flops_per_pair=2 * FLOPS_PER_MAC * layers * heads * head_dim / tp,
        allreduce_bytes_per_token=d * act_bytes,
        num_experts=experts,
        experts_per_token=k if moe else 0,
    )


def causal_pairs(context_tokens: int, new_tokens: int) -> int:
    """(query, key) pairs a chunk attends: every new token sees the context and the new
    tokens up to itself."""
    return new_tokens * context_tokens + new_tokens * (new_tokens + 1) // 2


@cache
def _hardware_table() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(_DATA.read_text())


def interconnect_gb_per_s(gpu: GPUSpec) -> float:
    """Per-direction GPU-to-GPU bandwidth (GB/s) from the bundled table; PCIe for unknown GPUs."""
    table = _hardware_table()["interconnect_gb_per_s"]
    return float(table.get(gpu.name, table["default"]))


@dataclass(frozen=True)
class CoefficientSource:
    """Where a physics model's coefficients come from, as every result reports it.

    `fit` is the calibration used ("" for the physical defaults or given coefficients),
    `fit_gpu` / `fit_vllm` what it was fitted on, and `covers_gpu` whether the run's GPU is
    the one the fit saw (a fit transfers to other GPUs as fractions of their peaks)."""

    kind: str  # "calibrated" | "transferred" | "physical defaults" | "given"
    fit_gpu: str = ""
    fit_vllm: str = ""
    fitted_on: str = ""
    covers_gpu: bool = False
    note: str = ""
    fit_models: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "calibrated":
            return f"fit for {self.fit_gpu}, vLLM {self.fit_vllm} ({self.fitted_on}){self.note}"
        if self.kind == "transferred":
            return (
                f"transferred from the {self.fit_gpu} fit, vLLM {self.fit_vllm} "
                f"({self.fitted_on}): efficiencies as fractions of this GPU's peaks, not "
                f"measured on it{self.note}"
            )
        return self.kind + self.note


# The GPU whose fits carry to GPUs without one of their own (docs/latency-models.md).
REFERENCE_GPU = "H100"


def _version_key(version: str) -> tuple[int, ...]:
    digits = [int(p) for p in version.lstrip("vV").split(".") if p.isdigit()]
    return tuple(digits)


def calibrations() -> dict[str, dict[str, dict[str, Any]]]:
    """Shipped fits: GPU -> vLLM version -> {coefficients: ..., fitted_on: ...}."""
    return _hardware_table().get("calibrated", {}) or {}


def choose_calibration(
    gpu_name: str, vllm_version: str | None
) -> tuple[str, str, dict[str, Any]] | None:
    """(fit GPU, fit vLLM version, entry) for a GPU and an optional vLLM version.

    The GPU's own fits, else the reference GPU's (transferred). Without a version the newest
    fit; with one, that version's fit, else the nearest older one, else the oldest."""
    fits = calibrations()
    fit_gpu = gpu_name if gpu_name in fits else REFERENCE_GPU
    by_version = fits.get(fit_gpu)
    if not by_version:
        return None
    ordered = sorted(by_version, key=_version_key)
    if vllm_version is None:
        chosen = ordered[-1]
    else:
        wanted = _version_key(vllm_version)
        older = [v for v in ordered if _version_key(v) <= wanted]
        chosen = older[-1] if older else ordered[0]
    return fit_gpu, chosen, by_version[chosen]


def default_coefficients(
    gpu: GPUSpec, vllm_version: str | None = None
) -> tuple[PhysicsCoefficients, CoefficientSource]:
    """The shipped calibration for this GPU and vLLM version (newest when none is given), the
    reference GPU's transferred to it when it has none, else the physical defaults."""
    chosen = choose_calibration(gpu.name, vllm_version)
    if chosen is None:
        return PhysicsCoefficients(), CoefficientSource("physical defaults")
    fit_gpu, fit_vllm, entry = chosen
    where = f"physics.yaml calibrated.{fit_gpu}.{fit_vllm}"
    coefficients = coefficients_from_mapping(entry["coefficients"], where)
    note = ""
    if vllm_version is not None and _version_key(vllm_version) != _version_key(fit_vllm):
        note = f"; no fit for vLLM {vllm_version}, nearest used"
    kind = "calibrated" if fit_gpu == gpu.name else "transferred"
    source = CoefficientSource(
        kind,
        fit_gpu,
        fit_vllm,
        str(entry.get("fitted_on", "")),
        kind == "calibrated",
        note,
        tuple(m.lower() for m in entry.get("models", ())),
    )
    return coefficients, source


def coefficients_from_mapping(data: Mapping[str, Any], where: str) -> PhysicsCoefficients:
    """Strict: unknown names are errors; missing names keep the physical defaults."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: coefficients must be a mapping of name: number")
    # Keys of a user's file may be of any type (null, numbers): sort them as text.
    extra = sorted(set(data) - set(COEFFICIENT_NAMES), key=repr)
    if extra:
        raise ConfigError(
            f"{where}: unknown coefficient {excerpt(extra[0], 40)}; "
            f"valid: {', '.join(COEFFICIENT_NAMES)}"
        )
    for name, value in data.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**1023:
            raise invalid(f"{where}: {name}", value, "must be a number within float range")
    return replace(PhysicsCoefficients(), **dict(data)).check(where)


def load_coefficients_file(path: str | Path) -> PhysicsCoefficients:
    """Read a file written by `servesim calibrate` (or by hand): `coefficients: {name: value}`."""
    from simulator.input_files import read_yaml_mapping

    data = read_yaml_mapping(path, "latency coefficients file")
    model = data.get("latency_model", PhysicsModel.name)
    if model != PhysicsModel.name:
        raise invalid(
            f"latency coefficients file {str(path)!r}: latency_model", model, "must be 'physics'"
        )
    if "coefficients" not in data:
        raise ConfigError(f"latency coefficients file {str(path)!r}: missing key 'coefficients'")
    return coefficients_from_mapping(data["coefficients"], f"{str(path)!r} coefficients")


def coefficients_document(c: PhysicsCoefficients, **about: Any) -> dict[str, Any]:
    """The YAML document `load_coefficients_file` reads, with free-form provenance."""
    return {
        "version": COEFFICIENTS_FILE_VERSION,
        "latency_model": PhysicsModel.name,
        "coefficients": {k: float(v) for k, v in asdict(c).items()},
        **about,
    }


class PhysicsModel(StepTimeModel):
    """First-principles step time with calibrated efficiencies; see the module docstring."""

    name = "physics"
    accepts_coeffs_file = True

    def __init__(
        self,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        coefficients: PhysicsCoefficients | None = None,
        vllm_version: str | None = None,
        given_from: str = "",
    ) -> None:
        validate_roofline_inputs(model, gpu, tp)
        if coefficients is None:
            coefficients, self.source = default_coefficients(gpu, vllm_version)
        else:
            self.source = CoefficientSource("given", note=f" ({given_from})" if given_from else "")
        self.coefficients = coefficients.check()
        self.model, self.gpu, self.tp = model, gpu, tp
        self.shape = model_shape(model, tp)
        bytes_weight = model.effective_weight_bytes_per_param
        flops_tera = (
            gpu.tflops_fp8 if bytes_weight == 1.0 and gpu.tflops_fp8 > 0 else gpu.tflops_peak
        )
        self.peak_flops_per_s = flops_tera * 1e12
        self.weight_bytes_per_param = bytes_weight
        self.peak_bytes_per_s = gpu.bw_peak_tbs * 1e12
        link_bytes_per_s = interconnect_gb_per_s(gpu) * 1e9
        # Ring all-reduce: each GPU sends and receives 2(tp-1)/tp of the payload.
        self.allreduce_s_per_token = (
            ALLREDUCES_PER_LAYER
            * self.shape.layers
            * 2
            * (tp - 1)
            / tp
            * self.shape.allreduce_bytes_per_token
            / link_bytes_per_s
        )
        # Ring all-reduce: 2(tp - 1) latency steps each.
        self.collectives = ALLREDUCES_PER_LAYER * self.shape.layers * 2 * (tp - 1)
        self.queueing_us = int(request_delay_s(self.coefficients) * 1e6)

    @classmethod
    def from_deployment(
        cls,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        alpha: Sequence[float] | None = None,
        beta: Sequence[float] | None = None,
        vllm_version: str | None = None,
        coeffs_file: str | Path | None = None,
    ) -> PhysicsModel:
        if alpha is not None or beta is not None:
            raise invalid(
                "alpha_coeffs/beta_coeffs",
                {"alpha_coeffs": alpha, "beta_coeffs": beta},
                "latency model 'physics' takes a coefficients file (latency.coeffs_file / "
                "--latency-coeffs), not alpha/beta",
            )
        coefficients = load_coefficients_file(coeffs_file) if coeffs_file is not None else None
        return cls(
            model,
            gpu,
            tp,
            coefficients,
            vllm_version=vllm_version,
            given_from=f"file {str(coeffs_file)!r}" if coeffs_file is not None else "",
        )

    def expected_experts(self, step_tokens: int) -> float:
        """Distinct experts per layer that `step_tokens` uniformly routed tokens touch."""
        n, k = self.shape.num_experts, self.shape.experts_per_token
        if n == 0:
            return 1.0
        return n * (1.0 - ((n - k) / n) ** step_tokens)

    def terms(self, batch: StepBatch) -> PhysicsTerms:
        shape = self.shape
        pairs_prefill = 0
        prefill_tokens = 0
        context_read = 0
        for context, new in batch.prefill_chunks:
            pairs_prefill += causal_pairs(context, new)
            prefill_tokens += new
            context_read += context
        decodes = batch.decode_count
        # A decode token attends its whole context plus itself.
        pairs_decode = batch.decode_context_sum + decodes
        context_read += batch.decode_context_sum
        tokens = prefill_tokens + decodes
        sequences = len(batch.prefill_chunks) + decodes
        weight_bytes = (
            shape.attention_weight_bytes
            + shape.expert_weight_bytes * self.expected_experts(tokens)
            + shape.router_weight_bytes
            + shape.lm_head_bytes
        )
        kv_bytes = shape.kv_bytes_per_token * (context_read + tokens)
        prefill_flops = (
            shape.linear_flops_per_token * prefill_tokens
            + shape.attention_flops_per_pair * pairs_prefill
            + shape.lm_head_flops_per_sequence * len(batch.prefill_chunks)
        )
        decode_flops = (
            shape.linear_flops_per_token + shape.lm_head_flops_per_sequence
        ) * decodes + shape.attention_flops_per_pair * pairs_decode
        return PhysicsTerms(
            (weight_bytes + shape.embedding_row_bytes * tokens) / self.peak_bytes_per_s,
            prefill_flops / self.peak_flops_per_s,
            decode_flops / self.peak_flops_per_s,
            self.allreduce_s_per_token * tokens,
            self.collectives,
            shape.layers,
            sequences,
            FLOPS_PER_MAC * weight_bytes / self.weight_bytes_per_param / self.peak_flops_per_s,
            kv_bytes / self.peak_bytes_per_s,
            1 if self.tp == 1 else 0,
        )

    @property
    def coefficients_source(self) -> str:
        return self.source.describe()

    def provenance(self) -> dict[str, Any]:
        return {
            "latency_model": self.name,
            "coefficients": self.source.describe(),
            "source": self.source.kind,
            "fit_gpu": self.source.fit_gpu,
            "fit_vllm_version": self.source.fit_vllm,
            "gpu": self.gpu.name,
            "gpu_covered_by_fit": self.source.covers_gpu,
            "model_covered_by_fit": self.model.name.lower() in self.source.fit_models,
        }

    def step_time_us(self, batch: StepBatch) -> int:
        if batch.batch_size == 0:
            return 1
        step_us = int(price_terms(self.terms(batch), self.coefficients) * 1e6)
        return step_us if step_us > 1 else 1

    def queueing_time_us(self, input_tokens: int) -> int:
        return self.queueing_us

    def scheduling_lag_steps(self) -> float:
        return float(self.coefficients.output_lag_steps)


class RecordingStepModel(StepTimeModel):
    """Wraps a PhysicsModel and keeps every step's terms, in step order (for calibration)."""

    def __init__(self, inner: PhysicsModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.terms: list[PhysicsTerms] = []

    def step_time_us(self, batch: StepBatch) -> int:
        # Every call is one row of the engine's step log, empty steps included.
        self.terms.append(self.inner.terms(batch))
        return self.inner.step_time_us(batch)

    def queueing_time_us(self, input_tokens: int) -> int:
        return self.inner.queueing_time_us(input_tokens)

    def scheduling_lag_steps(self) -> float:
        return self.inner.scheduling_lag_steps()


__all__ = [
    "COEFFICIENT_NAMES",
    "PhysicsCoefficients",
    "PhysicsModel",
    "PhysicsTerms",
    "RecordingStepModel",
    "causal_pairs",
    "coefficients_document",
    "load_coefficients_file",
    "model_shape",
    "price_terms",
    "request_delay_s",
]
