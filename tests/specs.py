"""Hand-written model and GPU records shared by tests (values from the bundled config.json
files and BLIS's hardware_config.json), so step-time tests do not depend on the loaders."""

from __future__ import annotations

from simulator.catalog.types import GPUSpec, ModelConfig

H100 = GPUSpec(
    name="H100",
    tflops_peak=989.5,
    tflops_fp8=1979.0,
    bw_peak_tbs=3.35,
    mfu_prefill=0.45,
    mfu_decode=0.30,
    memory_gib=80.0,
)
A100_SXM = GPUSpec("A100-SXM", 312.0, 0.0, 2.039, 0.38, 0.18, 80.0)

LLAMA31_8B = ModelConfig(
    name="meta-llama/llama-3.1-8b-instruct",
    num_layers=32,
    hidden_dim=4096,
    num_heads=32,
    num_kv_heads=8,
    intermediate_dim=14336,
    vocab_size=128256,
    bytes_per_param=2.0,
)
MIXTRAL_8X7B = ModelConfig(  # MoE: 8 experts, 2 per token
    name="mistralai/mixtral-8x7b-v0.1",
    num_layers=32,
    hidden_dim=4096,
    num_heads=32,
    num_kv_heads=8,
    intermediate_dim=14336,
    vocab_size=32000,
    bytes_per_param=2.0,
    num_local_experts=8,
    num_experts_per_tok=2,
)
