"""GPU catalog (docs/behaviour.md §3.5): BLIS's bundled table, servesim's additions (H200,
B200, GB200, MI300X, MI325X; data/gpus.yaml) and user GPU files."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from simulator.catalog.types import GPUSpec
from simulator.errors import ConfigError, excerpt, invalid, unknown
from simulator.input_files import bundled_yaml, check_path, load_json, load_yaml, read_text

_HARDWARE_CONFIG_PATH = Path(__file__).parent / "data" / "hardware_config.json"
_SERVESIM_GPUS_PATH = Path(__file__).parent / "data" / "gpus.yaml"

# hardware_config.json key -> GPUSpec field.
_FIELDS: dict[str, str] = {
    "TFlopsPeak": "tflops_peak",
    "TFlopsFP8": "tflops_fp8",
    "BwPeakTBs": "bw_peak_tbs",
    "mfuPrefill": "mfu_prefill",
    "mfuDecode": "mfu_decode",
    "MemoryGiB": "memory_gib",
}
# Keys BLIS's table does not have; absent means 0 (no FP4 units) and "MFU measured on this GPU".
_OPTIONAL_NUMBERS: dict[str, str] = {"TFlopsFP4": "tflops_fp4"}
_MFU_FROM_KEY = "mfuFrom"
_COMMENT_KEY = "_comment"
# 0 is meaningful here: "no FP8 (FP4) tensor cores", so the roofline uses the BF16 rate.
_MAY_BE_ZERO = {"TFlopsFP8", "TFlopsFP4"}
_FRACTIONS = {"mfuPrefill", "mfuDecode"}

# docs/behaviour.md §3.5 [Mar-27]: BLIS set the L40S FP8 rate after the bundled table was copied.
# NVIDIA's L40S datasheet lists 1,466 TFLOPS FP8 *with sparsity* (733 dense); BLIS uses the
# sparse figure and servesim keeps it, so its BLIS backends price FP8 on L40S as BLIS does;
# physics, which prices dense GEMMs, takes the dense half (GPUSpec.tflops_fp8_dense).
_L40S_TFLOPS_FP8 = 1466.0
# Every entry of BLIS's table carries MFU "calibrated per Discussion #589" (its _comment).
_BLIS_SOURCE = "BLIS hardware_config.json"


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
    known = {*_FIELDS, *_OPTIONAL_NUMBERS, _MFU_FROM_KEY, _COMMENT_KEY}
    extra = sorted(str(k) for k in entry if k not in known)
    if extra:
        raise ConfigError(
            f"{where}: unknown key {excerpt(extra[0], 40)}; "
            f"valid: {', '.join(_FIELDS)}, {', '.join(_OPTIONAL_NUMBERS)}, {_MFU_FROM_KEY}, "
            f"{_COMMENT_KEY}"
        )
    missing = [k for k in _FIELDS if k not in entry]
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r}; required: {', '.join(_FIELDS)}")
    values: dict[str, Any] = {}
    for key, attr in {**_FIELDS, **_OPTIONAL_NUMBERS}.items():
        if key not in entry:
            continue
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
            raise invalid(f"{where}: {key}", value, "must be a finite number")
        if key in _MAY_BE_ZERO:
            if value < 0:
                raise invalid(f"{where}: {key}", value, "must be >= 0 (0 = no such tensor cores)")
        elif value <= 0:
            raise invalid(f"{where}: {key}", value, "must be > 0")
        if key in _FRACTIONS and value > 1:
            raise invalid(f"{where}: {key}", value, "must be in (0, 1]")
        values[attr] = float(value)
    mfu_from = entry.get(_MFU_FROM_KEY, "")
    if not isinstance(mfu_from, str):
        raise invalid(f"{where}: {_MFU_FROM_KEY}", mfu_from, "must be the name of a GPU")
    comment = entry.get(_COMMENT_KEY)
    return GPUSpec(
        name=gpu,
        **values,
        source=f"{source}: {comment}" if isinstance(comment, str) and comment else source,
        mfu_from=mfu_from,
    )


def _specs_from_table(table: Any, source: str) -> dict[str, GPUSpec]:
    if not isinstance(table, Mapping) or not table:
        raise invalid(source, type(table).__name__, "must be a non-empty mapping GPU name -> specs")
    specs: dict[str, GPUSpec] = {}
    seen: dict[str, str] = {}
    for gpu, entry in table.items():
        if not isinstance(gpu, str) or not gpu.strip():
            raise invalid(f"{source}: GPU name", gpu, "must be a non-empty string")
        key = gpu.strip().lower()
        if key in seen:
            raise ConfigError(
                f"{source}: GPU {excerpt(gpu, 40)} duplicates {excerpt(seen[key], 40)} "
                "(names are case-insensitive)"
            )
        seen[key] = gpu
        specs[gpu] = _spec_from_entry(gpu, entry, source)
    return specs


@cache
def _builtin() -> dict[str, GPUSpec]:
    with _HARDWARE_CONFIG_PATH.open(encoding="utf-8") as fh:
        table = json.load(fh)
    table["L40S"]["TFlopsFP8"] = _L40S_TFLOPS_FP8
    for entry in table.values():
        entry.pop(_COMMENT_KEY, None)  # the shared source line below says it
    specs = _specs_from_table(table, _BLIS_SOURCE)
    specs["L40S"] = replace(specs["L40S"], tflops_fp8_dense=_L40S_TFLOPS_FP8 / 2)
    ours = bundled_yaml(_SERVESIM_GPUS_PATH.read_text(encoding="utf-8"))
    ours = _specs_from_table(ours, "servesim data/gpus.yaml")
    return {**specs, **ours}


def list_gpus() -> list[str]:
    """Built-in GPU names (canonical spelling), in table order."""
    return list(_builtin())


def _canonical_name(name: str) -> str:
    """The built-in's spelling of `name` when it names a built-in GPU (any case), else `name`
    as written (surrounding spaces dropped)."""
    key = name.strip()
    for builtin in _builtin():
        if builtin.lower() == key.lower():
            return builtin
    return key


def _as_builtin_name(specs: Mapping[str, GPUSpec]) -> dict[str, GPUSpec]:
    """Key (and name) every entry that replaces a built-in by the built-in's spelling, so a
    file entry "h100" is H100 everywhere GPUs are matched by name (its links and physics fit in
    physics.yaml, the provenance statement); an entry with a new name keeps the name given
    (and gets physics.yaml's defaults, not another GPU's figures)."""
    out: dict[str, GPUSpec] = {}
    for key, spec in specs.items():
        name = _canonical_name(key)
        out[name] = spec if spec.name == name else replace(spec, name=name)
    return out


def load_gpu_file(path: str | Path) -> dict[str, GPUSpec]:
    """Read a user GPU table (YAML or JSON, same keys as hardware_config.json), keyed as the
    file spells its GPUs; `get_gpu` gives an entry that replaces a built-in the built-in's
    name."""
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
    """Look a GPU up case-insensitively. Entries in `extra` (user files) override built-ins;
    one that replaces a built-in ("h100" for H100) is returned under the built-in's name, which
    is what physics.yaml keys its links and fits by (docs/models-and-hardware.md)."""
    if not isinstance(name, str):
        raise invalid("GPU", name, "must be a string")
    catalog: dict[str, GPUSpec] = {**_builtin(), **_as_builtin_name(extra or {})}
    by_lower: dict[str, GPUSpec] = {}
    for key, spec in catalog.items():
        # A user entry "h100" must replace built-in "H100", not sit beside it.
        by_lower[key.strip().lower()] = spec
    spec = by_lower.get(name.strip().lower())
    if spec is None:
        raise unknown("GPU", name, _valid_names(catalog))
    return spec


def _valid_names(catalog: Iterable[str]) -> list[str]:
    names: dict[str, str] = {}
    for key in catalog:
        names[key.strip().lower()] = key
    return list(names.values())


def mfu_provenance(gpu: GPUSpec) -> str:
    """Whether the GPU's MFU (the roofline's efficiencies) was measured on it or carried over
    from another GPU, and from where, in words."""
    mfu = f"MFU {gpu.mfu_prefill:g} prefill / {gpu.mfu_decode:g} decode"
    if gpu.mfu_from:
        return (
            f"{mfu} carried over from {gpu.mfu_from} (calibrated there); not measured on {gpu.name}"
        )
    if gpu.source.startswith(_BLIS_SOURCE):
        return f"{mfu} calibrated on {gpu.name} (BLIS discussion #589)"
    return f"{mfu} as given in {gpu.source.split(': ', 1)[0] or 'the GPU entry'}"
