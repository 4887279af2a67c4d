"""A GPU file entry that replaces a built-in in another case (`h100:`) is that built-in under
its own name, so it keeps the links and the physics fit servesim keys by that name; an entry
with a new name borrows no other GPU's (docs/models-and-hardware.md, "Adding or overriding
GPUs with a file")."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.api import resolve_deployment
from simulator.catalog.hardware import get_gpu, load_gpu_file
from simulator.latency.parallel import links_for
from simulator.latency.physics import default_coefficients

MODEL = "meta-llama/llama-3.1-8b-instruct"
# The built-in H100's own figures (BLIS hardware_config.json).
H100_FIGURES = """
  TFlopsPeak: 989.5
  TFlopsFP8: 1979.0
  BwPeakTBs: 3.35
  mfuPrefill: 0.45
  mfuDecode: 0.30
  MemoryGiB: 80
"""


def _gpu_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(f"{name}:{H100_FIGURES}")
    return path


@pytest.mark.parametrize("spelling", ["h100", "H100", " h100 "])
def test_an_entry_replacing_a_builtin_takes_its_name_links_and_fit(tmp_path, spelling):
    extra = load_gpu_file(_gpu_file(tmp_path, repr(spelling)))
    builtin = get_gpu("H100")
    for asked in ("H100", "h100"):
        gpu = get_gpu(asked, extra)
        assert gpu.name == "H100"
        assert gpu == builtin  # same figures, and now the same name
        assert gpu.source.startswith("GPU file")  # it is the file's entry
        assert links_for(gpu) == links_for(builtin)  # NVLink 450 GB/s, not PCIe's 32
        assert links_for(gpu).scale_up_gb_per_s == 450.0
        _, source = default_coefficients(gpu)
        assert (source.kind, source.covers_gpu) == ("calibrated", True)


def test_a_run_with_h100_spelled_in_lower_case_is_the_builtin_run(tmp_path):
    """The QA case: `--hardware-config lower.yaml --hardware H100 --tp 2` where the file's
    `h100` repeats the built-in's figures ran at TTFT 35.8 / ITL 4.58 ms (PCIe links,
    transferred fit, "gpu": "h100") against the built-in's 23.9 / 4.19."""
    base = {"model": MODEL, "hardware": "H100", "tp": 2}
    builtin = resolve_deployment(base)
    ours = resolve_deployment({**base, "hardware_file": str(_gpu_file(tmp_path, "h100"))})
    assert ours.gpu.name == "H100"
    for key in ("gpu", "gpu_covered_by_fit", "source", "efficiencies"):
        assert ours.step_model.provenance()[key] == builtin.step_model.provenance()[key], key
    for batch, context in ((1, 1_000), (32, 64_000)):
        assert ours.step_model.decode_step_time_us(batch, context) == (
            builtin.step_model.decode_step_time_us(batch, context)
        )


def test_an_entry_with_a_new_name_gets_the_defaults_not_another_gpus(tmp_path):
    extra = load_gpu_file(_gpu_file(tmp_path, "H100-custom"))
    gpu = get_gpu("h100-CUSTOM", extra)
    assert gpu.name == "H100-custom"
    links = links_for(gpu)
    assert (links.scale_up_gb_per_s, links.domain_gpus) == (32.0, 8)  # physics.yaml default
    _, source = default_coefficients(gpu)
    assert (source.kind, source.fit_gpu, source.covers_gpu) == ("transferred", "H100", False)
    assert get_gpu("H100", extra).source.startswith("BLIS")  # the built-in is untouched


def test_the_file_table_keeps_its_own_spelling(tmp_path):
    """load_gpu_file returns the table as written; get_gpu canonicalises."""
    assert set(load_gpu_file(_gpu_file(tmp_path, "h100"))) == {"h100"}


def test_a_measured_block_count_is_not_taken_for_a_gpu_the_file_changed(tmp_path):
    """defaults.yaml's 29,205 blocks were measured on the built-in 80 GiB H100; a file entry
    replacing it with 141 GiB gets its blocks computed from its own memory, as it did before
    the entry took the built-in's name."""
    path = tmp_path / "gpus.yaml"
    path.write_text("h100:" + H100_FIGURES.replace("MemoryGiB: 80", "MemoryGiB: 141"))
    scenario = {"model": MODEL, "hardware": "H100", "hardware_file": str(path)}
    deployment = resolve_deployment(scenario)
    assert deployment.engine.total_kv_blocks == 56_903  # the `vllm` rule on 141 GiB
    assert deployment.describe()["kv_blocks_source"] == "auto"
    same = tmp_path / "same.yaml"
    same.write_text("h100:" + H100_FIGURES)
    stock = resolve_deployment(scenario | {"hardware_file": str(same)})
    assert stock.engine.total_kv_blocks == 29_205  # the stock figures: the row applies
