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

    # --- Architecture facts BLIS's backends do not read. servesim's `physics` model and the KV
    # capacity use them; every default keeps the plain decoder BLIS assumes.
    # MLA (DeepSeek-V2/V3, Kimi-K2, GLM-5): the cache holds one compressed latent of
    # kv_lora_rank plus the rotary key part of qk_rope_head_dim per token and layer, shared by
    # all heads; queries/keys have qk_nope_head_dim + qk_rope_head_dim dims, values v_head_dim.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    # Layers of an MoE model that keep a dense MLP (DeepSeek's first_k_dense_replace, Llama-4's
    # non-MoE layers), and that MLP's width (intermediate_size_mlp for Llama-4, else
    # intermediate_size).
    dense_layer_indices: tuple[int, ...] = ()
    dense_ffn_dim: int = 0
    # Llama-4's `interleave_moe_layer_step` as written (BLIS's trained-physics splits layers
    # with it its own way: L // (step + 1) MoE layers).
    interleave_moe_layer_step: int = 0
    # A shared expert the architecture always has but its config does not list (Llama-4: one
    # of intermediate_size in every MoE layer). BLIS counts only listed shared experts.
    unlisted_shared_expert_ffn_dim: int = 0
    # Layers whose attention sees only a window of recent keys: "sliding" (gpt-oss, Gemma,
    # Mistral-7B: the last `attention_window` keys) or "chunked" (Llama-4: keys of the same
    # `attention_window`-token chunk).
    windowed_layer_indices: tuple[int, ...] = ()
    attention_window: int = 0
    window_kind: str = ""
    # Precision beyond BLIS's two widths: the KV-cache element (0 = bytes_per_param; 1 with
    # --kv-cache-dtype fp8), the weight format that picks the tensor-core rate ("" = BLIS's
    # rule: FP8 rate for 1-byte weights; "fp4"/"mxfp4" use the FP4 rate where the GPU has one),
    # and the routed experts' width when it differs from the rest (gpt-oss: MXFP4 experts,
    # BF16 attention; 0 = effective_weight_bytes_per_param).
    kv_cache_bytes_per_element: float = 0.0
    weight_format: str = ""
    expert_weight_bytes_per_param: float = 0.0
    # The model's own multi-token-prediction layers (DeepSeek-V3, GLM: HF's
    # `num_nextn_predict_layers`), which vLLM's `mtp` speculative method drafts with.
    mtp_layers: int = 0

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

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_head_dim(self) -> float:
        """The head dimension the model really has: config `head_dim` when given, else
        hidden / heads (Qwen3-30B-A3B: 128, not 2048 / 32 = 64)."""
        return float(self.config_head_dim or self.hidden_dim / self.num_heads)

    @property
    def kv_bytes_per_element(self) -> float:
        return self.kv_cache_bytes_per_element or self.bytes_per_param

    @property
    def expert_bytes_per_param(self) -> float:
        return self.expert_weight_bytes_per_param or self.effective_weight_bytes_per_param

    @property
    def shared_ffn_dim(self) -> int:
        """FFN width of the shared expert(s) every token passes through in an MoE layer."""
        return self.shared_expert_ffn_dim or self.unlisted_shared_expert_ffn_dim

    @property
    def moe_layer_count(self) -> int:
        return self.num_layers - len(self.dense_layer_indices) if self.is_moe else 0

    def layer_is_moe(self, index: int) -> bool:
        return self.is_moe and index not in self.dense_layer_indices


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
    # Dense FP4 tensor-core rate (Blackwell); 0 = no FP4 units.
    tflops_fp4: float = 0.0
    # The dense FP8 rate where `tflops_fp8` is not one (BLIS's L40S figure is NVIDIA's with
    # sparsity; its backends keep it, physics prices dense GEMMs); 0 = `tflops_fp8` is dense.
    tflops_fp8_dense: float = 0.0
    # Where the figures come from, and the GPU whose MFU this one borrows ("" = its own);
    # provenance only, so two entries with the same numbers still compare equal.
    source: str = field(default="", compare=False)
    mfu_from: str = field(default="", compare=False)

    @property
    def has_fp8(self) -> bool:
        return self.tflops_fp8 > 0

    @property
    def has_fp4(self) -> bool:
        return self.tflops_fp4 > 0
