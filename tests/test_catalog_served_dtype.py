"""vLLM's `--dtype auto` serves an FP32 checkpoint in FP16 (docs/models-and-hardware.md): under
physics such a model's compute, weights and KV cache are two bytes wide, as its BF16 twin's;
BLIS's backends keep the checkpoint's four bytes (BLIS's mapping)."""

from __future__ import annotations

import json
from pathlib import Path

from simulator.api import resolve_deployment
from simulator.latency.base import StepBatch

CONFIG = (
    Path(__file__).resolve().parents[1]
    / "simulator/catalog/data/model_configs/llama-3.1-8b-instruct/config.json"
)


def _model(tmp_path: Path, dtype: str) -> str:
    folder = tmp_path / f"llama-{dtype}"
    folder.mkdir()
    config = json.loads(CONFIG.read_text()) | {"torch_dtype": dtype}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_an_fp32_checkpoint_is_served_in_fp16_under_physics(tmp_path):
    fp32, bf16 = _model(tmp_path, "float32"), _model(tmp_path, "bfloat16")
    batch = StepBatch([(0, 512)], 8, 8 * 1000)
    served = {
        name: resolve_deployment({"model": name, "hardware": "H100"}) for name in (fp32, bf16)
    }
    assert served[fp32].model.bytes_per_param == 2.0
    # 32 layers x 2 x 128 x 8 KV heads x 2 bytes = 131,072 B per token, as the BF16 twin's.
    assert served[fp32].model.kv_bytes_per_element == 2.0
    assert served[fp32].engine.total_kv_blocks == served[bf16].engine.total_kv_blocks
    assert served[fp32].step_model.step_time_us(batch) == served[bf16].step_model.step_time_us(
        batch
    )
    # BLIS's roofline keeps the checkpoint's 4 bytes: fewer blocks than the BF16 twin.
    blis = {
        name: resolve_deployment(
            {"model": name, "hardware": "H100", "latency": {"model": "roofline"}}
        )
        for name in (fp32, bf16)
    }
    assert blis[fp32].model.bytes_per_param == 4.0
    assert blis[fp32].engine.total_kv_blocks < blis[bf16].engine.total_kv_blocks


def test_an_fp32_draft_model_is_served_in_fp16_under_physics_too(tmp_path):
    """The draft model of speculative decoding is priced, and takes its weights and KV share
    from the cache, as vLLM serves it: an FP32 draft as its BF16 twin under physics."""
    fp32, bf16 = _model(tmp_path, "float32"), _model(tmp_path, "bfloat16")

    def drafted(draft: str, latency: str):
        spec = {"method": "draft_model", "draft_model": draft, "num_speculative_tokens": 3,
                "acceptance_rate": 0.7}  # fmt: skip
        scenario = {"model": "meta-llama/llama-3.1-70b-instruct", "tp": 4, "hardware": "H100",
                    "speculative": spec, "latency": {"model": latency}}  # fmt: skip
        return resolve_deployment(scenario)

    assert drafted(fp32, "physics").engine.total_kv_blocks == (
        drafted(bf16, "physics").engine.total_kv_blocks
    )
    # BLIS's roofline keeps the draft's 4 bytes: its weights leave fewer blocks.
    assert drafted(fp32, "roofline").engine.total_kv_blocks < (
        drafted(bf16, "roofline").engine.total_kv_blocks
    )
