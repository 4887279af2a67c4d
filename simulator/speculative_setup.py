"""The scenario's `speculative` section and how it becomes an engine's SpeculativeConfig
(docs/speculative.md): which drafter, priced by which step-time model, and the KV capacity the
drafter's weights and KV take from the instance."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from .errors import ConfigError, invalid
from .limits import Gpus, TimeUs, integer

if TYPE_CHECKING:
    from .catalog.types import GPUSpec, ModelConfig
    from .engine.speculative import SpeculativeConfig
    from .latency.base import StepTimeModel
    from .scenario import Scenario

# vLLM's own ceiling is the drafter's; beyond a few tens a draft is all but never accepted.
MAX_SPECULATIVE_TOKENS = 64
SpeculativeTokens = integer(
    1, MAX_SPECULATIVE_TOKENS, "tokens", "drafts per request per step (vLLM typically 1-8)"
)
DraftLayers = integer(1, 1000, "layers", "an EAGLE head or MTP module has one or a few layers")


def _rates(value: Any) -> Any:
    """One acceptance rate or a list of them (per draft position), each a number in [0, 1]."""
    values = value if isinstance(value, list | tuple) else [value]
    if not values or len(values) > MAX_SPECULATIVE_TOKENS:
        raise ValueError(
            f"give one rate or a list of 1 to {MAX_SPECULATIVE_TOKENS} rates (one per draft "
            "position)"
        )
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
            raise ValueError(f"{v!r}: an acceptance rate is a number in [0, 1]")
    return [float(v) for v in values] if isinstance(value, list | tuple) else float(value)


AcceptanceRates = Annotated[float | list[float], BeforeValidator(_rates)]


class SpeculativeSpec(BaseModel):
    """Speculative decoding (vLLM's speculative_config): the method, the drafts per step, the
    acceptance model and what prices the drafter."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    method: Literal["draft_model", "eagle", "ngram", "mtp"]
    num_speculative_tokens: SpeculativeTokens
    # Per-position acceptance α: one number, or a list for draft positions 1, 2, ... (the last
    # repeats). No default: it depends on the drafter and the traffic, so a run states it.
    acceptance_rate: AcceptanceRates
    acceptance_by_client: dict[str, AcceptanceRates] = Field(default_factory=dict)
    # draft_model: the drafter (a catalog id or a config folder), its TP (default: the
    # target's) and the latency model pricing it (default: the run's).
    draft_model: str | None = None
    draft_tp: Gpus | None = None
    draft_latency_model: str | None = None
    # eagle / mtp: the drafter's layers (default 1), priced as that share of the target's.
    draft_layers: DraftLayers | None = None
    # CPU time per step with drafts (proposal bookkeeping; the whole cost of n-gram lookup).
    draft_overhead_us: TimeUs = 0

    @model_validator(mode="after")
    def _fields_of_the_method(self) -> SpeculativeSpec:
        model_only = ("draft_model", "draft_tp", "draft_latency_model")
        if self.method == "draft_model":
            if not self.draft_model:
                raise ValueError("method draft_model needs `draft_model` (the drafter's id)")
        else:
            for name in model_only:
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} applies to method draft_model, not {self.method}")
        if self.draft_layers is not None and self.method not in ("eagle", "mtp"):
            raise ValueError(f"draft_layers applies to methods eagle and mtp, not {self.method}")
        return self


def build_speculation(
    scenario: Scenario,
    model: ModelConfig,
    gpu: GPUSpec,
    tp: int,
    capacity: dict[str, Any],
    step_model: StepTimeModel,
    total_blocks: int,
    blocks_source: str,
) -> tuple[SpeculativeConfig, int, str]:
    """The engine's speculative config, and the KV blocks left beside the drafter: a cache
    sized by the formula or by a measurement of vLLM without a drafter shrinks; an explicit
    block count is taken as given. `capacity`: the capacity formula's settings
    (`deployment.capacity_settings`)."""
    from .engine.speculative import (
        DraftModelDrafter,
        EagleDrafter,
        MTPDrafter,
        NgramDrafter,
        SpeculativeConfig,
        layer_share_price,
        parse_acceptance,
    )
    from .latency.kv_capacity import kv_bytes_per_token, model_weight_bytes

    spec = scenario.speculative
    assert spec is not None
    overhead = spec.draft_overhead_us
    reserved_bytes = 0.0
    kv_share = 0.0
    if spec.method == "ngram":
        drafter = NgramDrafter(overhead)
    elif spec.method == "draft_model":
        from .catalog.models import load_model, validate_tp
        from .catalog.precision import apply_precision, served_dtype
        from .latency import build_step_time_model

        try:
            draft_config = load_model(spec.draft_model)
        except ConfigError as exc:
            # The loader names the target's field (`model: path ... does not exist`).
            why = str(exc).removeprefix("model: ")
            raise type(exc)(f"speculative.draft_model: {why}") from None
        draft = apply_precision(draft_config, gpu, "auto", scenario.engine.kv_cache_dtype)
        lat = scenario.latency
        draft_latency_model = spec.draft_latency_model or lat.model
        if draft_latency_model == "physics":  # as the target: what vLLM's dtype=auto serves
            draft = served_dtype(draft)
        draft_tp = spec.draft_tp or tp
        validate_tp(draft, draft_tp, "speculative.draft_tp" if spec.draft_tp else "tp")
        # The drafter's pricing fails for the drafter's fields (a blackbox without coefficients
        # for the draft model, an unknown name), not the target's.
        draft_field = (
            "speculative.draft_latency_model" if spec.draft_latency_model else "latency.model"
        )
        try:
            draft_step = build_step_time_model(
                draft_latency_model, draft, gpu, draft_tp, None, None, lat.vllm_version
            )
        except ConfigError as exc:
            # A drafter takes no coefficients of its own: the way out is another model.
            raise type(exc)(
                f"{draft_field} (pricing the draft model): {exc}; for the draft model alone, "
                "set speculative.draft_latency_model (e.g. roofline)"
            ) from None
        drafter = DraftModelDrafter(
            draft_step.decode_step_time_us,
            overhead,
            {"draft_model": draft.name, "draft_tp": draft_tp, "priced_by": draft_step.name},
        )
        reserved_bytes = float(model_weight_bytes(draft))
        kv_share = kv_bytes_per_token(draft) / kv_bytes_per_token(model)
    else:
        if spec.method == "mtp" and model.mtp_layers <= 0:
            raise ConfigError(
                f"speculative.method: invalid value 'mtp'; {model.name!r} has no "
                "multi-token-prediction layers (num_nextn_predict_layers in its config.json); "
                "use eagle, ngram or draft_model"
            )
        layers = spec.draft_layers or 1
        cls = EagleDrafter if spec.method == "eagle" else MTPDrafter
        drafter = cls(
            layer_share_price(step_model.decode_step_time_us, layers, model.num_layers),
            overhead,
            {"draft_layers": layers, "priced_by": f"{layers}/{model.num_layers} of the target"},
        )
        reserved_bytes = float(model_weight_bytes(model)) * layers / model.num_layers
        kv_share = layers / model.num_layers
    rates = {"speculative.acceptance_rate": spec.acceptance_rate} | {
        f"speculative.acceptance_by_client.{c}": r for c, r in spec.acceptance_by_client.items()
    }
    for field, given in rates.items():
        # One rate per draft position: more than k name positions no verification has.
        if isinstance(given, list | tuple) and len(given) > spec.num_speculative_tokens:
            raise invalid(
                field,
                list(given),
                f"{len(given)} per-position rates for num_speculative_tokens "
                f"{spec.num_speculative_tokens}: give at most one per drafted token",
            )
    config = SpeculativeConfig(
        drafter,
        spec.num_speculative_tokens,
        parse_acceptance("speculative.acceptance_rate", spec.acceptance_rate),
        {
            client: parse_acceptance(f"speculative.acceptance_by_client.{client}", rates)
            for client, rates in spec.acceptance_by_client.items()
        },
    )
    if shrinks(blocks_source) and (reserved_bytes or kv_share):
        left = blocks_beside(
            capacity, model, gpu, tp, total_blocks, reserved_bytes, kv_share, "speculative"
        )
        if left is not None:
            total_blocks = left
            blocks_source = f"{blocks_source}, less the {spec.method} drafter's weights and KV"
    return config, total_blocks, blocks_source


def shrinks(blocks_source: str) -> bool:
    """Does a KV block count from this source lose what a drafter or LoRA buffers take? Yes
    for the capacity formula and for defaults.yaml's measurements (of vLLM without them);
    no for an explicit count (the user's word) or the fallback."""
    return blocks_source.startswith(("auto", "defaults.yaml"))


def blocks_beside(
    capacity: dict[str, Any],
    model: ModelConfig,
    gpu: GPUSpec,
    tp: int,
    blocks: int,
    reserved_bytes: float,
    kv_share: float,
    what: str,
) -> int | None:
    """KV blocks of an auto-sized cache once `reserved_bytes` of its pool hold something else
    (a drafter's weights, LoRA buffers) and every block also holds `kv_share` of the target's
    KV bytes per token (a drafter's KV). `capacity` holds the settings the capacity formula
    takes besides model, GPU and TP (`deployment.capacity_settings`, passed in by the
    deployment that resolves this setup, which this module must not import). `what` names
    the section in an error. None when the model's memory cannot be sized (a measured count
    is then kept as it is)."""
    from .engine.speculative import reserve_kv_blocks
    from .latency.kv_capacity import GIB_BYTES, kv_capacity

    try:
        cap = kv_capacity(model, gpu, tp, **capacity)
    except ConfigError:
        return None
    pool_bytes = (cap.available_gib - cap.overhead_gib) * GIB_BYTES
    return reserve_kv_blocks(blocks, pool_bytes, reserved_bytes, kv_share, what)
