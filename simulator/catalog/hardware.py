"""GPU catalog (docs/behaviour.md §3.5): the bundled BLIS table plus H200 and B200, and user GPU
files."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from simulator.catalog.types import GPUSpec
from simulator.errors import ConfigError, excerpt, invalid, unknown
from simulator.input_files import check_path, load_json, load_yaml, read_text

_HARDWARE_CONFIG_PATH = Path(__file__).parent / "data" / "hardware_config.json"

# hardware_config.json key -> GPUSpec field.
_FIELDS: dict[str, str] = {
    "TFlopsPeak": "tflops_peak",
    "TFlopsFP8": "tflops_fp8",
    "BwPeakTBs": "bw_peak_tbs",
    "mfuPrefill": "mfu_prefill",
    "mfuDecode": "mfu_decode",
    "MemoryGiB": "memory_gib",
}
_COMMENT_KEY = "_comment"
# 0 is meaningful here: "no FP8 tensor cores", so the roofline uses the BF16 rate.
_MAY_BE_ZERO = {"TFlopsFP8"}
_FRACTIONS = {"mfuPrefill", "mfuDecode"}

# docs/behaviour.md §3.5 [Mar-27]: BLIS set the L40S FP8 rate after the bundled table was copied.
_L40S_TFLOPS_FP8 = 1466.0

# GPUs absent from BLIS-Mar's table. Peak figures are NVIDIA's dense (no sparsity) datasheet
# numbers; MFU is not calibrated for them, so both borrow H100's (0.45 prefill / 0.30 decode)
# as the closest measured parts -- treat their step times as rougher than H100's.
#
# H200 SXM -- NVIDIA H200 product page (nvidia.com/en-us/data-center/h200): 1,979 TFLOPS
#   BF16 and 3,958 TFLOPS FP8 *with sparsity* -> 989.5 / 1979 dense (the H100 SXM compute);
#   141 GB HBM3e at 4.8 TB/s. NVIDIA's "141 GB" is a binary-sized figure: nvidia-smi reports
#   143,771 MiB = 140.4 GiB (the H100's "80 GB" likewise reports 81,559 MiB = 79.6 GiB and
#   BLIS lists it as 80.0 GiB). A decimal conversion (141e9 B = 131.3 GiB) would understate
#   the real memory by ~9 GiB, so we use the device-reported 140.4 GiB.
# B200 (HGX/DGX B200, 1,000 W) -- NVIDIA HGX B200 / DGX B200 datasheets: 2.25 PFLOPS
#   BF16 and 4.5 PFLOPS FP8 dense (4.5 / 9 PFLOPS with sparsity), 8 TB/s HBM3e, 180 GB per
#   GPU (DGX B200: 1,440 GB over 8 GPUs; the 192 GB often quoted is the raw stack size).
#   nvidia-smi reports 183,359 MiB = 179.1 GiB, used here for the same reason as H200.
_EXTRA_GPUS: dict[str, dict[str, float]] = {
    "H200": {
        "TFlopsPeak": 989.5,
        "TFlopsFP8": 1979.0,
        "BwPeakTBs": 4.8,
        "mfuPrefill": 0.45,
        "mfuDecode": 0.30,
        "MemoryGiB": 140.4,
    },
    "B200": {
        "TFlopsPeak": 2250.0,
        "TFlopsFP8": 4500.0,
        "BwPeakTBs": 8.0,
        "mfuPrefill": 0.45,
        "mfuDecode": 0.30,
        "MemoryGiB": 179.1,
    },
}


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range
        return False


def _spec_from_entry(gpu: str, entry: Any, source: str) -> GPUSpec:
    """Validate one table entry (hardware_config.json shape) and build its GPUSpec."""
    where = f"{source}: GPU {excerpt(gpu, 40)}"
    if not isinstance(entry, Mapping):
        raise invalid(where, type(entry).__name__, "must be a mapping of " + ", ".join(_FIELDS))
    extra = sorted(str(k) for k in entry if k not in _FIELDS and k != _COMMENT_KEY)
    if extra:
        raise ConfigError(
            f"{where}: unknown key {excerpt(extra[0], 40)}; "
            f"valid: {', '.join(_FIELDS)}, {_COMMENT_KEY}"
        )
    missing = [k for k in _FIELDS if k not in entry]
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r}; required: {', '.join(_FIELDS)}")
    values: dict[str, float] = {}
    for key, attr in _FIELDS.items():
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
            raise invalid(f"{where}: {key}", value, "must be a finite number")
        if key in _MAY_BE_ZERO:
            if value < 0:
                raise invalid(f"{where}: {key}", value, "must be >= 0 (0 = no FP8 support)")
        elif value <= 0:
            raise invalid(f"{where}: {key}", value, "must be > 0")
        if key in _FRACTIONS and value > 1:
            raise invalid(f"{where}: {key}", value, "must be in (0, 1]")
        values[attr] = float(value)
    return GPUSpec(name=gpu, **values)


def _specs_from_table(table: Any, source: str) -> dict[str, GPUSpec]:
    if not isinstance(table, Mapping) or not table:
        raise invalid(source, type(table).__name__, "must be a non-empty mapping GPU name -> specs")
    specs: dict[str, GPUSpec] = {}
    seen: dict[str, str] = {}
    for gpu, entry in table.items():
        if not isinstance(gpu, str) or not gpu.strip():
            raise invalid(f"{source}: GPU name", gpu, "must be a non-empty string")
        if gpu.lower() in seen:
            raise ConfigError(
                f"{source}: GPU {excerpt(gpu, 40)} duplicates {excerpt(seen[gpu.lower()], 40)} "
                "(names are case-insensitive)"
            )
        seen[gpu.lower()] = gpu
        specs[gpu] = _spec_from_entry(gpu, entry, source)
    return specs


@cache
def _builtin() -> dict[str, GPUSpec]:
    with _HARDWARE_CONFIG_PATH.open(encoding="utf-8") as fh:
        table = json.load(fh)
    table["L40S"]["TFlopsFP8"] = _L40S_TFLOPS_FP8
    table.update(_EXTRA_GPUS)
    return _specs_from_table(table, "built-in GPU table")


def list_gpus() -> list[str]:
    """Built-in GPU names (canonical spelling), in table order."""
    return list(_builtin())


def load_gpu_file(path: str | Path) -> dict[str, GPUSpec]:
    """Read a user GPU table (YAML or JSON, same keys as hardware_config.json)."""
    file_path = check_path(path, "GPU file")
    with contextlib.suppress(RuntimeError):  # `~user` of an unknown user stays as written
        file_path = file_path.expanduser()
    source = f"GPU file {str(file_path)!r}"
    text = read_text(file_path, "GPU file")
    # YAML is a superset of JSON, but json gives better messages for .json files.
    if file_path.suffix.lower() == ".json":
        table = load_json(text, "GPU file", file_path)
    else:
        table = load_yaml(text, "GPU file", file_path)
    return _specs_from_table(table, source)


def get_gpu(name: str, extra: Mapping[str, GPUSpec] | None = None) -> GPUSpec:
    """Look a GPU up case-insensitively. Entries in `extra` (user files) override built-ins."""
    if not isinstance(name, str):
        raise invalid("GPU", name, "must be a string")
    catalog: dict[str, GPUSpec] = {**_builtin(), **dict(extra or {})}
    by_lower: dict[str, GPUSpec] = {}
    for key, spec in catalog.items():
        # A user entry "h100" must replace built-in "H100", not sit beside it.
        by_lower[key.lower()] = spec
    spec = by_lower.get(name.strip().lower())
    if spec is None:
        raise unknown("GPU", name, _valid_names(catalog))
    return spec


def _valid_names(catalog: Iterable[str]) -> list[str]:
    names: dict[str, str] = {}
    for key in catalog:
        names[key.lower()] = key
    return list(names.values())
