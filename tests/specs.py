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


# A GPU-independent server of known capacity, for tests of saturation, plans and sweeps:
# blackbox with beta = [10 ms, 0, 0] makes every step 10 ms; a 16-token prompt with 4 output
# tokens needs 4 steps (the prefill step emits the first token, then 3 decode steps), 40 ms;
# with max_num_running_reqs = 1 an instance serves one request at a time, so its capacity is
# exactly 1 / 40 ms = 25 req/s.
def evenly_spaced(rate: float, num_requests: int, prompt: int, output: int) -> dict:
    """A scenario's workload: `num_requests` arrivals at constant spacing (1 / `rate` s), every
    one with `prompt` prompt tokens and `output` output tokens."""
    return {
        "arrival": "constant",
        "rate": rate,
        "num_requests": num_requests,
        "prompt_tokens": {"distribution": "constant", "value": prompt},
        "output_tokens": {"distribution": "constant", "value": output},
    }


CAPACITY_25_RPS = {
    "model": "meta-llama/llama-3.1-8b-instruct",
    "hardware": "H100",
    "tp": 1,
    "latency": {"model": "blackbox", "alpha_coeffs": [0, 0, 0], "beta_coeffs": [10_000, 0, 0]},
    "engine": {"max_num_running_reqs": 1, "total_kv_blocks": 10_000},
    "workload": evenly_spaced(rate=5, num_requests=300, prompt=16, output=4),
}


def one_prefill_one_decode(**pools) -> dict:
    """A scenario's `cluster`: one prefill and one decode instance, every request
    disaggregated, with `pools` (prefill=..., decode=...) as the pools' own settings."""
    pd = {"prefill_instances": 1, "decode_instances": 1, "decider": "always", **pools}
    return {"num_instances": 2, "pd": pd}
