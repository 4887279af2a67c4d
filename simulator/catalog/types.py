"""Plain records shared by the catalogs and the step-time models.

They live apart from the parsers so that latency models and tests can build them directly
without touching files.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    """Architecture facts of one model, as parsed from a HuggingFace config.json (docs/behaviour.md
    §5)."""

    name: str
    num_layers: int
    hidden_dim: int
    num_heads: int
    num_kv_heads: int
    intermediate_dim: int
    vocab_size: int = 0
    # Compute / activation / KV dtype width in bytes (bf16 -> 2).
    bytes_per_param: float = 2.0
    # Quantised weight width in bytes; 0 means "same as bytes_per_param" (docs/behaviour.md §4).
    weight_bytes_per_param: float = 0.0
    # MoE: 0 experts means dense.
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    moe_expert_ffn_dim: int = 0
    shared_expert_ffn_dim: int = 0
    # `head_dim` as written in config.json (None when absent). BLIS ignores it for step time.
    config_head_dim: int | None = None
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 0
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    model_type: str = ""
    # True when only n_shared_experts / num_experts_per_tok signal MoE without an expert count.
    moe_count_missing: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 1

    @property
    def head_dim(self) -> float:
        """hidden / heads, the head dimension BLIS uses everywhere (config head_dim ignored)."""
        return self.hidden_dim / self.num_heads

    @property
    def effective_kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def effective_weight_bytes_per_param(self) -> float:
        return self.weight_bytes_per_param or self.bytes_per_param


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator type (docs/behaviour.md §3.5): peak rates, calibrated MFU and memory."""

    name: str
    tflops_peak: float
    tflops_fp8: float
    bw_peak_tbs: float
    mfu_prefill: float
    mfu_decode: float
    memory_gib: float
