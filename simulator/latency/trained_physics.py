"""`trained-physics`: BLIS-current's default step-time model (BLIS f90a1e3a,
`sim/latency/trained_physics_model.go`; docs/latency-models.md "Trained physics").

Per-GPU roofline basis functions (µs) with one *global* set of learned corrections, the same
for every model, GPU and TP:

    step_us = β0·T_pf_c + β8·T_pf_kv            (prefill; β0·max(T_pf_c, T_pf_kv) if < 9 β)
            + β1·T_dc_c + β9·T_dc_kv            (decode;  β1·max(T_dc_c, T_dc_kv) if < 10 β)
            + β2·T_w + β3·(T_att + T_dense + T_moe_red) + β10·T_disp
            + β4·L + β5·B + β6 + β7·n_moe·[interleaved MoE]

with Q = TP·DP, G = TP·DP for MoE (TP for dense), h = H/TP, d_h = ⌊d/H⌋, d_kv = H_kv·d_h, peak
P in FLOP/µs (the FP8 rate when weights are exactly 1 byte), bandwidth W in bytes/µs:

    T_pf_c  = [L·2·T_pf·d·(2d + 2d_kv)/Q + L·Σ 4·h·t_i·(s_i + t_i/2)·d_h/DP + ffn(T_pf)] / P
    T_pf_kv = L·2·(d_kv/Q)·T_pf·2 / W
    T_dc_c  = [L·2·T_dc·d·(2d + 2d_kv)/Q + L·4·h·C·d_h/DP + ffn(T_dc)] / P
    T_dc_kv = L·2·(d_kv/Q)·2·(C + T_dc) / W
    ffn(X)  = n_moe·(X·k/G)·6·d·d_M + [d_S > 0]·n_moe·X·6·d·d_S/Q + n_dense·X·6·d·d_D/Q
    T_w     = [L·d·(2d + 2d_kv)·Bw/TP + n_moe·(N/G)·3·d·d_M·Bw + [d_S > 0]·n_moe·3·d·d_S·Bw/TP
               + n_dense·3·d·d_D·Bw/TP] / W
    V(u)    = u·T·d·Ba·2·(TP − 1)/TP / W  (0 when TP = 1);  T_att = V(L)/DP,
              T_dense = V(n_dense)/DP, T_moe_red = V(n_moe) for MoE with DP = 1

t_i = new tokens of prefill request i, s_i = its *full prompt length*; T_pf = Σ t_i; T_dc =
decoding requests, C = Σ of their context; T = T_pf + T_dc; B = scheduled requests. The result
is truncated to whole µs, at least 1. Queueing delay int(α0) (constant), per output token
int(α2), post-decode overhead int(α1) (added to E2E only, never to GPU time).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from ..catalog.types import GPUSpec, ModelConfig
from ..errors import invalid
from .base import StepBatch, TrainedAlphaOverheads, trained_prefill_attention
from .parallel import Parallelism

log = logging.getLogger("servesim")

COEFFICIENTS_PATH = (
    Path(__file__).resolve().parent.parent / "catalog" / "data" / "blis_trained_physics_iter29.json"
)
COEFFICIENTS_SOURCE = "BLIS f90a1e3a trained-physics iter29, global"
KV_BYTES_PER_ELEMENT = 2.0  # BLIS fixes the KV element width at 2 bytes for this backend
BETA_SLOTS = 11
_MAX_STEP_US = 2**63 - 1
# MoE dispatch/combine communication families (vLLM's --all2all-backend names).
ALLGATHER_BACKENDS = frozenset({"naive", "allgather_reducescatter"})
ALL_TO_ALL_BACKENDS = frozenset(
    {"pplx", "deepep_high_throughput", "deepep_low_latency", "mori", "flashinfer_all2allv"}
)


@cache
def _shipped_file() -> dict:
    """The shipped iter29 file, read once on first use."""
    return json.loads(COEFFICIENTS_PATH.read_text(encoding="utf-8"))


def _shipped() -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(alpha, beta) of the shipped iter29 file."""
    data = _shipped_file()
    return tuple(data["alpha_coeffs"]), tuple(data["beta_coeffs"])


def fit_coverage() -> tuple[list[str], list[str]]:
    """The GPUs and models (lower-case Hugging Face ids) of the runs BLIS fitted iter29 on:
    its file's regression experiments, the only record of what the global fit saw."""
    experiments = _shipped_file()["experiments"]
    gpus = sorted({str(e["hardware"]) for e in experiments})
    models = sorted({str(e["model"]).lower() for e in experiments})
    return gpus, models


def shipped_coefficients() -> dict[str, list[float]]:
    """{alpha_coeffs: [3], beta_coeffs: [10]} of BLIS's global iter29 fit (copies)."""
    alpha, beta = _shipped()
    return {"alpha_coeffs": list(alpha), "beta_coeffs": list(beta)}


def _coeffs(field: str, values: object, low: int, high: int) -> tuple[float, ...]:
    """Between `low` and `high` finite, non-negative numbers, or ConfigError naming `field`."""
    want = f"{low}" if low == high else f"{low} to {high}"
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise invalid(field, values, f"must be a list of {want} numbers")
    if not low <= len(values) <= high:
        raise invalid(field, list(values), f"trained-physics needs {want} numbers")
    out: list[float] = []
    for i, c in enumerate(values):
        if isinstance(c, bool) or not isinstance(c, int | float):
            raise invalid(f"{field}[{i}]", c, "must be a number")
        if not math.isfinite(c) or c < 0:
            raise invalid(f"{field}[{i}]", c, "must be finite and >= 0")
        out.append(float(c))
    return tuple(out)


class TrainedPhysics(TrainedAlphaOverheads):
    name = "trained-physics"
    coefficients_source = COEFFICIENTS_SOURCE
    # Expert parallelism is accepted with no step-time effect, as in BLIS. BLIS's DP pricing
    # (`from_deployment(parallelism=...)` with dp > 1) is one scheduler standing for all
    # ranks; a run prices each rank's own batch, so runs refuse dp > 1 here.
    parallelism_dimensions = frozenset({"ep"})

    def __init__(
        self,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        alpha: Sequence[float],
        beta: Sequence[float],
        dp: int = 1,
        moe_comm_backend: str = "allgather_reducescatter",
        interleave_moe_layer_step: int | None = None,
        intermediate_size_mlp: int | None = None,
    ) -> None:
        self.alpha = _coeffs("alpha_coeffs", alpha, 3, 3)
        given = _coeffs("beta_coeffs", beta, 7, BETA_SLOTS)
        if not any(given):
            raise invalid("beta_coeffs", list(given), "all zero: trained-physics needs a fit")
        b = list(given) + [0.0] * (BETA_SLOTS - len(given))
        if len(given) < BETA_SLOTS:
            b[10] = b[3]  # β_EP defaults to the TP-communication correction β3
        self.beta = tuple(b)
        self.prefill_split = len(given) >= 9
        self.decode_split = len(given) >= 10

        heads, kv_heads = model.num_heads, model.effective_kv_heads
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise invalid("tp", tp, "must be an integer >= 1")
        if heads % tp or kv_heads % tp:
            raise invalid(
                "tp",
                tp,
                f"trained-physics needs num_attention_heads ({heads}) and kv heads "
                f"({kv_heads}) of {model.name!r} divisible by tp",
            )
        if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
            raise invalid("dp", dp, "must be an integer >= 1")
        for field, value in (
            ("num_hidden_layers", model.num_layers),
            ("hidden_size", model.hidden_dim),
            ("num_attention_heads", heads),
            ("intermediate_size", model.intermediate_dim),
        ):
            if value <= 0:
                raise invalid(f"model {model.name!r}: {field}", value, "trained-physics needs > 0")
        if moe_comm_backend not in ALLGATHER_BACKENDS | ALL_TO_ALL_BACKENDS:
            raise invalid(
                "moe_comm_backend",
                moe_comm_backend,
                "must be one of " + ", ".join(sorted(ALLGATHER_BACKENDS | ALL_TO_ALL_BACKENDS)),
            )
        if model.is_moe and model.num_experts_per_tok <= 0:
            raise invalid(
                f"model {model.name!r}: num_experts_per_tok", model.num_experts_per_tok, "> 0"
            )
        if interleave_moe_layer_step is None:
            interleave_moe_layer_step = model.interleave_moe_layer_step
        if intermediate_size_mlp is None:
            # dense_ffn_dim is intermediate_size_mlp when the config gives it, else dff: BLIS's dD.
            intermediate_size_mlp = model.dense_ffn_dim

        L = model.num_layers
        d = float(model.hidden_dim)
        d_h = float(model.hidden_dim // heads)  # ⌊d/H⌋: config head_dim ignored, as in BLIS
        d_kv = kv_heads * d_h
        d_ff = float(model.intermediate_dim)
        is_moe = model.is_moe
        if is_moe and interleave_moe_layer_step > 0:
            n_moe = L // (interleave_moe_layer_step + 1)
            interleaved = True
        else:
            n_moe = L if is_moe else 0
            interleaved = False
        n_dense = L - n_moe
        d_m = float(model.moe_expert_ffn_dim) if model.moe_expert_ffn_dim > 0 else d_ff
        d_d = float(intermediate_size_mlp) if intermediate_size_mlp > 0 else d_ff
        d_s = float(model.shared_expert_ffn_dim) if model.shared_expert_ffn_dim > 0 else 0.0
        num_experts = float(model.num_local_experts)
        k_eff = float(max(1, model.num_experts_per_tok))
        group = float(tp * dp) if is_moe else float(tp)
        q = float(tp * dp)
        bw = model.effective_weight_bytes_per_param
        ba = model.bytes_per_param
        peak_tflops = gpu.tflops_peak
        if bw == 1.0 and gpu.tflops_fp8 > 0:
            peak_tflops = gpu.tflops_fp8
        if not (math.isfinite(peak_tflops) and peak_tflops > 0):
            raise invalid(f"GPU {gpu.name}: TFlopsPeak", peak_tflops, "must be > 0")
        if not (math.isfinite(gpu.bw_peak_tbs) and gpu.bw_peak_tbs > 0):
            raise invalid(f"GPU {gpu.name}: BwPeakTBs", gpu.bw_peak_tbs, "must be > 0")
        if not (math.isfinite(ba) and ba > 0):
            raise invalid(f"model {model.name!r}: bytes per param", ba, "must be > 0")

        self.model_name = model.name
        self.gpu_name = gpu.name
        self.layers = float(L)
        self.tp = tp
        self.dp = dp
        self.is_moe = is_moe
        self.n_moe = float(n_moe)
        self.n_dense = float(n_dense)
        self.interleaved = interleaved
        self.moe_comm_all_to_all = moe_comm_backend in ALL_TO_ALL_BACKENDS
        self.d, self.d_h, self.d_kv, self.d_m, self.d_d, self.d_s = d, d_h, d_kv, d_m, d_d, d_s
        self.k_eff, self.group, self.q = k_eff, group, q
        self.heads_per_gpu = float(heads / tp)
        self.ba = ba
        self.peak = peak_tflops * 1e6  # FLOP/µs
        self.bandwidth = gpu.bw_peak_tbs * 1e6  # bytes/µs

        weight_bytes = L * d * (2 * d + 2 * d_kv) * bw / tp
        weight_bytes += n_moe * (num_experts / group) * 3 * d * d_m * bw
        if d_s > 0:
            weight_bytes += n_moe * 3 * d * d_s * bw / tp
        weight_bytes += n_dense * 3 * d * d_d * bw / tp
        self.t_weight = weight_bytes / self.bandwidth

    @classmethod
    def from_deployment(
        cls,
        model: ModelConfig,
        gpu: GPUSpec,
        tp: int,
        alpha: Sequence[float] | None = None,
        beta: Sequence[float] | None = None,
        vllm_version: str | None = None,
        parallelism: Parallelism | None = None,
    ) -> TrainedPhysics:
        """Explicit alpha / beta win, each on its own; else BLIS's global iter29 fit. The
        fit is not keyed by model, GPU, TP or vLLM version (BLIS removed --vllm-version)."""
        shipped = shipped_coefficients()
        dp = 1
        if parallelism is not None:
            parallelism.check(model)
            dp = parallelism.dp
            if dp > 1 and not model.is_moe:
                raise invalid(
                    "dp", dp, "trained-physics prices DP ranks of MoE models only (as BLIS)"
                )
        built = cls(
            model,
            gpu,
            tp,
            alpha if alpha is not None else shipped["alpha_coeffs"],
            beta if beta is not None else shipped["beta_coeffs"],
            dp=dp,
        )
        if alpha is not None or beta is not None:
            built.coefficients_source = "given alpha/beta coefficients" + (
                "" if alpha is not None and beta is not None else f" (rest: {COEFFICIENTS_SOURCE})"
            )
        return built

    def provenance(self) -> dict:
        """With the shipped coefficients, also what their fit saw: its GPUs, and whether this
        run's GPU and model were among them (given coefficients' fit is the caller's)."""
        out = super().provenance()
        if self.coefficients_source == COEFFICIENTS_SOURCE:
            gpus, models = fit_coverage()
            out |= {
                "fit_gpus": gpus,
                "gpu": self.gpu_name,
                "gpu_covered_by_fit": self.gpu_name in gpus,
                "model_covered_by_fit": self.model_name.lower() in models,
            }
        return out

    # ------------------------------------------------------------------ basis functions
    def _ffn_flops(self, tokens: float) -> float:
        d = self.d
        flops = self.n_moe * (tokens * self.k_eff / self.group) * 6 * d * self.d_m
        if self.d_s > 0:
            flops += self.n_moe * tokens * 6 * d * self.d_s / self.q
        return flops + self.n_dense * tokens * 6 * d * self.d_d / self.q

    def basis(self, batch: StepBatch) -> dict[str, float]:
        """Every basis function of one step (µs), plus its counts T_pf, T_dc, C, B."""
        L, d, d_kv, d_h, q, dp = self.layers, self.d, self.d_kv, self.d_h, self.q, self.dp
        h = self.heads_per_gpu
        t_pf, attn = trained_prefill_attention(batch, h, d_h)
        t_dc = float(batch.decode_count)
        ctx = float(batch.decode_context_sum)
        proj = 2 * d * (2 * d + 2 * d_kv)

        pf_c = 0.0
        if t_pf > 0:
            pf_c = (L * proj * t_pf / q + L * attn / dp + self._ffn_flops(t_pf)) / self.peak
        pf_kv = L * 2 * (d_kv / q) * t_pf * KV_BYTES_PER_ELEMENT / self.bandwidth
        dc_c = 0.0
        if t_dc > 0:
            dc_c = (
                L * proj * t_dc / q + L * 4 * h * ctx * d_h / dp + self._ffn_flops(t_dc)
            ) / self.peak
        dc_kv = L * 2 * (d_kv / q) * KV_BYTES_PER_ELEMENT * (ctx + t_dc) / self.bandwidth

        tokens = t_pf + t_dc
        tp, bandwidth = self.tp, self.bandwidth

        def allreduce(layers: float) -> float:  # V(u): ring all-reduce of the step's tokens
            return layers * tokens * d * self.ba * 2 * (tp - 1) / tp / bandwidth

        t_att = t_dense = t_moe_red = t_disp = 0.0
        if tp > 1:
            t_att = allreduce(L) / dp
            t_dense = allreduce(self.n_dense) / dp
            if self.is_moe and self.n_moe > 0 and dp == 1:
                t_moe_red = allreduce(self.n_moe)
        if self.is_moe and dp > 1:
            g = self.group
            if self.moe_comm_all_to_all:
                comm_tokens = (tokens / dp) * self.k_eff * (g - 1) / g * 2
                t_disp = self.n_moe * comm_tokens * d * self.ba / bandwidth
            else:
                t_disp = self.n_moe * (tokens / dp) * (g - 1) / g * 2 * d * self.ba / bandwidth
        return {
            "T_pf": t_pf,
            "T_dc": t_dc,
            "C": ctx,
            "B": float(batch.batch_size),
            "T_pf_c": pf_c,
            "T_pf_kv": pf_kv,
            "T_dc_c": dc_c,
            "T_dc_kv": dc_kv,
            "T_w": self.t_weight,
            "T_att": t_att,
            "T_dense": t_dense,
            "T_moe_red": t_moe_red,
            "T_disp": t_disp,
        }

    def step_time_us(self, batch: StepBatch) -> int:
        if not batch.prefill_chunks and batch.decode_count <= 0:
            return 1
        f = self.basis(batch)
        b = self.beta
        if self.prefill_split:
            prefill = b[0] * f["T_pf_c"] + b[8] * f["T_pf_kv"]
        else:
            prefill = b[0] * max(f["T_pf_c"], f["T_pf_kv"])
        if self.decode_split:
            decode = b[1] * f["T_dc_c"] + b[9] * f["T_dc_kv"]
        else:
            decode = b[1] * max(f["T_dc_c"], f["T_dc_kv"])
        # Summed in BLIS's order (float addition is not associative; the sum is truncated).
        step = (
            prefill
            + decode
            + b[2] * f["T_w"]
            + b[3] * (f["T_att"] + f["T_dense"] + f["T_moe_red"])
            + b[10] * f["T_disp"]
            + b[4] * self.layers
            + b[5] * f["B"]
            + b[6]
            + (b[7] * self.n_moe if self.interleaved else 0.0)
        )
        if math.isnan(step) or step >= _MAX_STEP_US:
            return _MAX_STEP_US
        step_us = int(step)
        return step_us if step_us > 1 else 1


__all__ = ["COEFFICIENTS_SOURCE", "TrainedPhysics", "shipped_coefficients"]
