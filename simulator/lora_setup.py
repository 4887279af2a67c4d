"""The scenario's `lora` section and how it becomes an engine's LoRAConfig (docs/lora.md):
the adapters and their sizes from the model's shape, the costs from the GPU, and the KV
capacity vLLM's adapter buffers take."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .limits import Bandwidth, TimeUs, integer

if TYPE_CHECKING:
    from .catalog.types import GPUSpec, ModelConfig
    from .engine.lora import LoRAConfig, ModuleShapes
    from .scenario import Scenario

MAX_ADAPTERS = 100_000
Rank = integer(1, 1024, "", "a LoRA rank (vLLM accepts up to 512)")
AdapterCount = integer(1, MAX_ADAPTERS, "adapters", "adapters of one instance")
TargetModule = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class AdapterSpec(_Strict):
    """One adapter (vLLM --lora-modules), or with `count` a family `name-0` .. `name-(n-1)` of
    adapters alike."""

    name: str = Field(min_length=1, max_length=200)
    rank: Rank
    count: AdapterCount | None = None
    target_modules: list[TargetModule] | None = Field(None, min_length=1)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if v != v.strip() or any(c in v for c in ",:\n"):
            raise ValueError(f"{v!r}: an adapter name has no surrounding blanks, ',' or ':'")
        return v


class LoRASpec(_Strict):
    """Multi-LoRA serving (vLLM --enable-lora): the adapters, the GPU slots and CPU cache,
    and what loading costs."""

    adapters: list[AdapterSpec] = Field(min_length=1)
    max_loras: AdapterCount = 1  # vLLM's default
    max_cpu_loras: AdapterCount | None = Field(None, description="None = max_loras (vLLM)")
    max_lora_rank: Rank | None = Field(None, description="None = the largest adapter's rank")
    target_modules: list[TargetModule] | None = Field(None, min_length=1)
    load_bandwidth_gb_per_s: Bandwidth = Field(50.0, description="host link per GPU")
    load_base_latency_us: TimeUs = 0
    disk_bandwidth_gb_per_s: Bandwidth = Field(5.0, description="disk -> host memory")
    disk_base_latency_us: TimeUs = 1500
    step_overhead_us: TimeUs = 0

    @model_validator(mode="after")
    def _consistent(self) -> LoRASpec:
        names = self.names()
        if len(names) > MAX_ADAPTERS:
            raise ValueError(f"adapters: {len(names):,} in all; at most {MAX_ADAPTERS:,}")
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ValueError(f"adapters: name {name!r} is used twice; names must be unique")
            seen.add(name)
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}): "
                "an adapter in a GPU slot is also in the CPU cache (vLLM's rule)"
            )
        if self.max_lora_rank is not None:
            for a in self.adapters:
                if a.rank > self.max_lora_rank:
                    raise ValueError(
                        f"adapter {a.name!r}: rank {a.rank} exceeds max_lora_rank "
                        f"{self.max_lora_rank} (vLLM refuses it)"
                    )
        return self

    def names(self) -> list[str]:
        out = []
        for a in self.adapters:
            out += [a.name] if a.count is None else [f"{a.name}-{i}" for i in range(a.count)]
        return out


def parse_lora_flag(text: str) -> list[dict]:
    """`--lora NAME:RANK[:COUNT],...` as the section's `adapters` list."""
    from .errors import ConfigError

    adapters = []
    for part in text.split(","):
        fields = part.strip().split(":")
        try:
            if len(fields) not in (2, 3) or not fields[0]:
                raise ValueError
            entry: dict = {"name": fields[0], "rank": int(fields[1])}
            if len(fields) == 3:
                entry["count"] = int(fields[2])
        except ValueError:
            raise ConfigError(
                f"--lora: invalid value {part.strip()!r}; expected NAME:RANK or "
                "NAME:RANK:COUNT (a family NAME-0 .. NAME-COUNT-1), comma-separated"
            ) from None
        adapters.append(entry)
    return adapters


def module_shapes(model: ModelConfig) -> ModuleShapes:
    """The (input, output) widths of the modules LoRA can target, per decoder layer. The MLP
    is the dense one (`intermediate_size`); adapters on MoE experts are not modelled."""
    from .engine.lora import ModuleShapes

    d = model.hidden_dim
    head = int(model.head_dim)
    q = model.num_heads * head
    kv = model.effective_kv_heads * head
    ff = model.intermediate_dim or 4 * d
    return ModuleShapes(
        {
            "q_proj": (d, q),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (q, d),
            "gate_proj": (d, ff),
            "up_proj": (d, ff),
            "down_proj": (ff, d),
        },
        model.num_layers,
    )


def build_lora(
    scenario: Scenario,
    model: ModelConfig,
    gpu: GPUSpec,
    tp: int,
    capacity: dict[str, Any],
    total_blocks: int,
    blocks_source: str,
) -> tuple[LoRAConfig, int, str]:
    """The engine's LoRA config, and the KV blocks left beside vLLM's adapter buffers: a cache
    sized by the formula or by a measurement of vLLM without LoRA shrinks; an explicit block
    count is taken as given. `capacity`: the capacity formula's settings
    (`deployment.capacity_settings`)."""
    from .engine.lora import ALL_TARGET_MODULES, Adapter, LoRAConfig, LoRACost
    from .speculative_setup import blocks_beside, shrinks

    spec = scenario.lora
    assert spec is not None
    default_modules = tuple(spec.target_modules or ALL_TARGET_MODULES)
    adapters = {}
    for a in spec.adapters:
        modules = tuple(a.target_modules or default_modules)
        names = [a.name] if a.count is None else [f"{a.name}-{i}" for i in range(a.count)]
        for name in names:
            adapters[name] = Adapter(name, a.rank, modules)
    shapes = module_shapes(model)
    widths = {}
    by_modules: dict[tuple[str, ...], int] = {}
    for name, adapter in adapters.items():
        modules = adapter.target_modules
        if modules not in by_modules:
            by_modules[modules] = shapes.widths(modules)
        widths[name] = by_modules[modules]
    peak_flops = (gpu.tflops_peak * 1e12) * gpu.mfu_decode
    cost = LoRACost(
        flop_us=1e6 / (tp * peak_flops),
        byte_us=1e6 / (tp * gpu.bw_peak_tbs * 1e12),
        load_byte_us=1e6 / (tp * spec.load_bandwidth_gb_per_s * 1e9),
        disk_byte_us=1e6 / (spec.disk_bandwidth_gb_per_s * 1e9),
        load_base_us=spec.load_base_latency_us,
        disk_base_us=spec.disk_base_latency_us,
        bytes_per_param=float(model.bytes_per_param),
        step_overhead_us=spec.step_overhead_us,
    )
    config = LoRAConfig(
        adapters,
        spec.max_loras,
        spec.max_cpu_loras or spec.max_loras,
        spec.max_lora_rank or max(a.rank for a in adapters.values()),
        shapes,
        cost,
        widths,
    )
    if shrinks(blocks_source):
        left = blocks_beside(
            capacity, model, gpu, tp, total_blocks, config.reserved_bytes(), 0.0, "lora"
        )
        if left is not None:
            config = _with_reserved(config, total_blocks - left)
            total_blocks = left
            blocks_source = f"{blocks_source}, less vLLM's LoRA buffers"
    return config, total_blocks, blocks_source


def _with_reserved(config: LoRAConfig, blocks: int) -> LoRAConfig:
    from dataclasses import replace

    return replace(config, reserved_kv_blocks=blocks)
