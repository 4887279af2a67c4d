"""GPU catalog (docs/behaviour.md §3.5) and user GPU files."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from simulator.catalog.hardware import get_gpu, list_gpus, load_gpu_file, mfu_provenance
from simulator.catalog.types import GPUSpec
from simulator.errors import ConfigError

GOOD_ENTRY = {
    "TFlopsPeak": 100.0,
    "TFlopsFP8": 0,
    "BwPeakTBs": 1.5,
    "mfuPrefill": 0.4,
    "mfuDecode": 0.2,
    "MemoryGiB": 24.0,
}


def test_builtin_catalog_names():
    assert list_gpus() == [
        "H100",
        "A100-SXM",
        "A100-80",
        "L40S",
        "H200",
        "B200",
        "GB200",
        "MI300X",
        "MI325X",
    ]


def test_blis_table_numbers_verbatim():
    assert get_gpu("H100") == GPUSpec("H100", 989.5, 1979.0, 3.35, 0.45, 0.30, 80.0)
    assert get_gpu("A100-SXM") == GPUSpec("A100-SXM", 312.0, 0.0, 2.039, 0.38, 0.18, 80.0)
    assert replace(get_gpu("A100-80"), name="A100-SXM") == get_gpu("A100-SXM")


def test_l40s_fp8_rate_is_the_mar_27_value():
    l40s = get_gpu("L40S")
    assert l40s.tflops_fp8 == 1466.0
    assert (l40s.tflops_peak, l40s.bw_peak_tbs, l40s.memory_gib) == (362.05, 0.864, 48.0)


def test_added_gpus_reuse_h100_mfu():
    h100 = get_gpu("H100")
    for name in ("H200", "B200"):
        gpu = get_gpu(name)
        assert (gpu.mfu_prefill, gpu.mfu_decode) == (h100.mfu_prefill, h100.mfu_decode)
    h200 = get_gpu("H200")
    assert (h200.tflops_peak, h200.tflops_fp8, h200.bw_peak_tbs) == (989.5, 1979.0, 4.8)
    assert 140 < h200.memory_gib < 141  # 143,771 MiB reported by the device
    b200 = get_gpu("B200")
    assert (b200.tflops_peak, b200.tflops_fp8, b200.bw_peak_tbs) == (2250.0, 4500.0, 8.0)
    assert 179 < b200.memory_gib < 180


@pytest.mark.parametrize(("spelling", "canonical"), [("h100", "H100"), ("a100-sxm", "A100-SXM")])
def test_lookup_is_case_insensitive_and_returns_canonical_name(spelling, canonical):
    assert get_gpu(spelling).name == canonical


def test_unknown_gpu_lists_valid_names():
    with pytest.raises(ConfigError) as exc:
        get_gpu("H999")
    msg = str(exc.value)
    assert msg.startswith("unknown GPU 'H999'; valid: ")
    for name in list_gpus():
        assert name in msg


def test_user_yaml_file_adds_and_overrides(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(
        """
RTX-4090:
  _comment: consumer card, numbers from the spec sheet
  TFlopsPeak: 165.2
  TFlopsFP8: 330.3
  BwPeakTBs: 1.008
  mfuPrefill: 0.35
  mfuDecode: 0.1
  MemoryGiB: 24
h100:
  TFlopsPeak: 989.5
  TFlopsFP8: 1979.0
  BwPeakTBs: 3.35
  mfuPrefill: 0.5
  mfuDecode: 0.35
  MemoryGiB: 80
"""
    )
    extra = load_gpu_file(path)
    assert set(extra) == {"RTX-4090", "h100"}
    assert get_gpu("rtx-4090", extra).memory_gib == 24.0
    assert get_gpu("H100", extra).mfu_prefill == 0.5  # user entry wins over the built-in
    assert get_gpu("H100").mfu_prefill == 0.45  # built-in untouched
    with pytest.raises(ConfigError, match="RTX-4090"):
        get_gpu("nope", extra)  # user GPUs are listed as valid too


def test_user_json_file(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"T4": GOOD_ENTRY}))
    assert load_gpu_file(path)["T4"] == GPUSpec("T4", 100.0, 0.0, 1.5, 0.4, 0.2, 24.0)


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda e: e.update(MemoryGB=24), r"GPU 'X1': unknown key 'MemoryGB'"),
        (lambda e: e.pop("BwPeakTBs"), r"GPU 'X1': missing key 'BwPeakTBs'"),
        (lambda e: e.update(MemoryGiB=0), r"GPU 'X1': MemoryGiB: invalid value 0"),
        (lambda e: e.update(TFlopsPeak=-1), r"GPU 'X1': TFlopsPeak: invalid value -1"),
        (lambda e: e.update(TFlopsFP8=-5), r"TFlopsFP8: invalid value -5"),
        (lambda e: e.update(mfuDecode=1.5), r"mfuDecode: invalid value 1.5; must be in \(0, 1\]"),
        (lambda e: e.update(BwPeakTBs="fast"), r"BwPeakTBs: invalid value 'fast'"),
        (lambda e: e.update(MemoryGiB=True), r"MemoryGiB: invalid value True"),
    ],
)
def test_bad_user_file_entries_name_file_gpu_and_key(tmp_path, mutate, pattern):
    entry = dict(GOOD_ENTRY)
    mutate(entry)
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"X1": entry}))
    with pytest.raises(ConfigError, match=pattern) as exc:
        load_gpu_file(path)
    assert "bad.yaml" in str(exc.value)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("- just\n- a list\n", "must be a non-empty mapping"),
        ("", "must be a non-empty mapping"),
        ("X1: [1, 2]\n", "GPU 'X1'"),
        ("X1: {TFlopsPeak: [\n", "not valid YAML"),
    ],
)
def test_malformed_user_files(tmp_path, text, pattern):
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=pattern):
        load_gpu_file(path)


def test_duplicate_names_differing_only_in_case(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"T4": GOOD_ENTRY, "t4": GOOD_ENTRY}))
    with pytest.raises(ConfigError, match="case-insensitive"):
        load_gpu_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_gpu_file(tmp_path / "nope.yaml")


# --- servesim's GPUs (data/gpus.yaml) and where their efficiencies come from -------------------


@pytest.mark.parametrize(
    ("name", "bf16", "fp8", "fp4", "tbs", "gib"),
    [
        # Dense datasheet figures: the with-sparsity numbers halved.
        ("H200", 989.5, 1979.0, 0.0, 4.8, 140.4),
        ("B200", 2250.0, 4500.0, 9000.0, 8.0, 179.1),  # 144 PFLOPS FP4 sparse / 8 GPUs / 2
        ("GB200", 2500.0, 5000.0, 10000.0, 8.0, 186.0),  # 1,440 PFLOPS FP4 sparse / 72 / 2
        ("MI300X", 1307.4, 2614.9, 0.0, 5.3, 192.0),
        ("MI325X", 1307.4, 2614.9, 0.0, 6.0, 256.0),
    ],
)
def test_servesim_gpu_figures(name, bf16, fp8, fp4, tbs, gib):
    gpu = get_gpu(name)
    assert (gpu.tflops_peak, gpu.tflops_fp8, gpu.tflops_fp4) == (bf16, fp8, fp4)
    assert (gpu.bw_peak_tbs, gpu.memory_gib) == (tbs, gib)
    assert gpu.has_fp8 and gpu.has_fp4 == (fp4 > 0)
    assert gpu.mfu_from == "H100"
    assert "datasheet" in gpu.source or "product page" in gpu.source


def test_mfu_provenance_says_calibrated_or_carried_over():
    assert mfu_provenance(get_gpu("H100")) == (
        "MFU 0.45 prefill / 0.3 decode calibrated on H100 (BLIS discussion #589)"
    )
    assert mfu_provenance(get_gpu("B200")) == (
        "MFU 0.45 prefill / 0.3 decode carried over from H100 (calibrated there); not "
        "measured on B200"
    )
    assert mfu_provenance(get_gpu("A100-80")).endswith(
        "calibrated on A100-80 (BLIS discussion #589)"
    )


def test_user_file_optional_keys(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"X9": {**GOOD_ENTRY, "TFlopsFP4": 500, "mfuFrom": "H100"}}))
    gpu = load_gpu_file(path)["X9"]
    assert gpu.tflops_fp4 == 500.0 and gpu.has_fp4
    assert "carried over from H100" in mfu_provenance(gpu)
    path.write_text(json.dumps({"X9": GOOD_ENTRY}))
    assert mfu_provenance(load_gpu_file(path)["X9"]).endswith(f"as given in GPU file {str(path)!r}")
    path.write_text(json.dumps({"X9": {**GOOD_ENTRY, "TFlopsFP4": -1}}))
    with pytest.raises(ConfigError, match="TFlopsFP4: invalid value -1"):
        load_gpu_file(path)
    path.write_text(json.dumps({"X9": {**GOOD_ENTRY, "mfuFrom": 3}}))
    with pytest.raises(ConfigError, match="mfuFrom: invalid value 3"):
        load_gpu_file(path)


def test_provenance_does_not_change_equality():
    # Two entries with the same numbers are the same GPU whatever their sources say.
    assert replace(get_gpu("H200"), source="elsewhere", mfu_from="") == get_gpu("H200")


def test_physics_prices_l40s_fp8_at_the_dense_rate_blis_backends_at_blis_s():
    """NVIDIA's L40S FP8 figure, 1,466 TFLOPS, is with sparsity (733 dense). BLIS's backends
    keep BLIS's number; physics prices dense GEMMs: 733 TFLOPS, twice BF16's 362, not four
    times. An 8,192-token FP8 prefill is then no faster than its FLOPs at the dense rate."""
    from simulator.catalog.models import load_model
    from simulator.catalog.precision import apply_precision
    from simulator.latency import build_step_time_model
    from simulator.latency.base import StepBatch

    gpu = get_gpu("L40S")
    model = apply_precision(load_model("meta-llama/llama-3.1-8b-instruct"), gpu, "fp8", "auto")
    physics = build_step_time_model("physics", model, gpu, 1)
    assert physics.peak_flops_per_s == 733e12
    assert build_step_time_model("roofline", model, gpu, 1).peak_flops == 1466e12
    batch = StepBatch([(0, 8192)], 0, 0)
    terms = physics.terms(batch)
    flops = (terms.prefill_compute_s + terms.prefill_attention_s) * physics.peak_flops_per_s
    assert physics.step_time_us(batch) >= flops / 733e12 * 1e6
