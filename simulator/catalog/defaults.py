"""The bundled defaults.yaml (docs/behaviour.md §3.6): per-model default deployment, workload
presets, fitted blackbox coefficients and the global cross-model / trained-roofline coefficients.

The file is read and validated once per process; the accessors hand out copies so callers
cannot mutate the cached tables.
"""

from __future__ import annotations

import copy
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from simulator.errors import invalid, key_text
from simulator.input_files import bundled_yaml, read_yaml

_TOP_KEYS = {
    "defaults",
    "workloads",
    "models",
    "crossmodel_defaults",
    "trained_roofline_defaults",
    "version",
}
_DEFAULT_KEYS = {"GPU", "tensor_parallelism", "vllm_version", "hf_repo"}
_WORKLOAD_KEYS = {
    "prefix_tokens",
    "prompt_tokens",
    "prompt_tokens_stdev",
    "prompt_tokens_min",
    "prompt_tokens_max",
    "output_tokens",
    "output_tokens_stdev",
    "output_tokens_min",
    "output_tokens_max",
}
_MODEL_KEYS = {
    "id",
    "GPU",
    "tensor_parallelism",
    "vllm_version",
    "alpha_coeffs",
    "beta_coeffs",
    "total_kv_blocks",
    "best_loss",
}
_MODEL_REQUIRED = {"id", "GPU", "tensor_parallelism", "vllm_version", "alpha_coeffs", "beta_coeffs"}
_GLOBAL_COEFF_KEYS = {"alpha_coeffs", "beta_coeffs"}

# defaults.yaml writes A100 entries as "A100-80"; hardware_config.json calls the same part
# "A100-SXM" and keeps "A100-80" as an alias, so both spellings must find the same entries.
_GPU_ALIASES = {"A100-80": "A100-SXM"}


@dataclass(frozen=True)
class CoefficientEntry:
    """One fitted blackbox row of defaults.yaml `models:`."""

    model_id: str
    gpu: str
    tp: int
    vllm_version: str
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    total_kv_blocks: int | None
    best_loss: float | None = None


@dataclass(frozen=True)
class DefaultsFile:
    """Parsed, validated content of a defaults.yaml."""

    model_defaults: dict[str, dict[str, Any]]
    workloads: dict[str, dict[str, Any]]
    coefficients: tuple[CoefficientEntry, ...]
    crossmodel: dict[str, list[float]]
    trained_roofline: dict[str, list[float]]
    version: str


def canonical_gpu(name: str) -> str:
    return _GPU_ALIASES.get(name, name)


def normalize_vllm_version(version: str) -> str:
    """`vllm/vllm-openai:v0.8.4`, `v0.8.4` and `0.8.4` all become `0.8.4`."""
    tag = str(version).strip().rsplit(":", 1)[-1].strip()
    return tag[1:] if tag[:1] in ("v", "V") else tag


def _check_keys(where: str, mapping: object, allowed: set[str], required: set[str]) -> dict:
    if not isinstance(mapping, dict):
        raise invalid(where, mapping, "must be a mapping")
    unknown_keys = sorted(str(k) for k in set(mapping) - allowed)
    if unknown_keys:
        raise invalid(where, unknown_keys, f"unknown keys; allowed: {', '.join(sorted(allowed))}")
    missing = sorted(required - set(mapping))
    if missing:
        raise invalid(where, mapping, f"missing required keys {missing}")
    return mapping


def _coeff_list(where: str, value: object, length: int | None) -> list[float]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        want = f"{length} numbers" if length is not None else "numbers"
        raise invalid(where, value, f"must be a list of {want}")
    out: list[float] = []
    for v in value:
        if not _is_finite_number(v):
            raise invalid(where, value, "every coefficient must be a finite number")
        out.append(float(v))
    return out


def _section(top: dict, key: str, source: str) -> dict:
    value = top.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{source}: {key}", value, "must be a mapping")
    return value


def _whole_number(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise invalid(where, value, "must be a whole number > 0")
    return value


def _is_finite_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range
        return False


def _finite(where: str, value: object) -> float:
    if not _is_finite_number(value):
        raise invalid(where, value, "must be a finite number")
    return float(value)


def _model_defaults(top: dict, source: str) -> dict[str, dict[str, Any]]:
    model_defaults: dict[str, dict[str, Any]] = {}
    for model_id, spec in _section(top, "defaults", source).items():
        where = f"{source}: defaults.{key_text(model_id)}"
        spec = _check_keys(where, spec, _DEFAULT_KEYS, {"GPU", "tensor_parallelism"})
        model_defaults[str(model_id).lower()] = dict(spec)
    return model_defaults


def _coefficient_entry(row: object, where: str) -> CoefficientEntry:
    row = _check_keys(where, row, _MODEL_KEYS, _MODEL_REQUIRED)
    kv_blocks = row.get("total_kv_blocks")
    return CoefficientEntry(
        model_id=str(row["id"]),
        gpu=str(row["GPU"]),
        tp=_whole_number(f"{where}.tensor_parallelism", row["tensor_parallelism"]),
        vllm_version=str(row["vllm_version"]),
        alpha=tuple(_coeff_list(f"{where}.alpha_coeffs", row["alpha_coeffs"], 3)),
        beta=tuple(_coeff_list(f"{where}.beta_coeffs", row["beta_coeffs"], 3)),
        total_kv_blocks=(
            _whole_number(f"{where}.total_kv_blocks", kv_blocks) if kv_blocks is not None else None
        ),
        best_loss=(
            _finite(f"{where}.best_loss", row["best_loss"])
            if row.get("best_loss") is not None
            else None
        ),
    )


def _workloads(top: dict, source: str) -> dict[str, dict[str, Any]]:
    workloads: dict[str, dict[str, Any]] = {}
    for name, spec in _section(top, "workloads", source).items():
        where = f"{source}: workloads.{key_text(name)}"
        workloads[str(name)] = dict(_check_keys(where, spec, _WORKLOAD_KEYS, set()))
    return workloads


def _parse(raw: object, source: str) -> DefaultsFile:
    top = _check_keys(source, raw, _TOP_KEYS, {"models"})
    model_defaults = _model_defaults(top, source)

    workloads = _workloads(top, source)

    models = top.get("models") or []
    if not isinstance(models, list):
        raise invalid(f"{source}: models", models, "must be a list")
    entries = [_coefficient_entry(row, f"{source}: models[{i}]") for i, row in enumerate(models)]

    def global_coeffs(key: str) -> dict[str, list[float]]:
        spec = top.get(key)
        if spec is None:
            return {}
        spec = _check_keys(f"{source}: {key}", spec, _GLOBAL_COEFF_KEYS, _GLOBAL_COEFF_KEYS)
        return {k: _coeff_list(f"{source}: {key}.{k}", v, None) for k, v in spec.items()}

    return DefaultsFile(
        model_defaults=model_defaults,
        workloads=workloads,
        coefficients=tuple(entries),
        crossmodel=global_coeffs("crossmodel_defaults"),
        trained_roofline=global_coeffs("trained_roofline_defaults"),
        version=str(top.get("version", "")),
    )


def load_defaults_file(path: str | Path) -> DefaultsFile:
    """Parse and validate a defaults.yaml at `path` (strict: unknown keys are errors)."""
    raw = read_yaml(path, "defaults file")
    return _parse(raw, str(path))


@functools.cache
def _bundled_text() -> str:
    return (
        resources.files("simulator.catalog")
        .joinpath("data/defaults.yaml")
        .read_text(encoding="utf-8")
    )


@functools.cache
def bundled_defaults() -> DefaultsFile:
    """The defaults.yaml shipped in simulator/catalog/data, parsed once per process."""
    return _parse(bundled_yaml(_bundled_text()), "defaults.yaml")


# Every run reads its model's defaults and the workload presets; the rest of the shipped file
# (1,600 of its 1,760 lines are blackbox coefficients) is parsed only when a run needs it,
# which keeps ~10 ms of YAML off every run's start-up. Each top-level section runs from its
# key at the start of a line to the next top-level key.
def _top_level_block(key: str) -> str | None:
    found = re.search(rf"^{key}:\n(?:[- #].*\n|\n)*", _bundled_text(), re.MULTILINE)
    return found.group() if found is not None else None


def _parsed_block(key: str, parse: Callable[[dict, str], Any], field: str) -> Any:
    """One top-level section of the shipped file, parsed and checked alone as `parse` does
    in the whole file; the whole file's `field` when the section cannot be cut out."""
    block = _top_level_block(key)
    if block is None:
        return getattr(bundled_defaults(), field)
    return parse(bundled_yaml(block), "defaults.yaml")


@functools.cache
def _bundled_model_defaults() -> dict[str, dict[str, Any]]:
    """The shipped `defaults:` table, parsed alone (the whole file's table: a test)."""
    return _parsed_block("defaults", _model_defaults, "model_defaults")


@functools.cache
def _bundled_workloads() -> dict[str, dict[str, Any]]:
    """The shipped `workloads:` presets, parsed alone (the whole file's: a test)."""
    return _parsed_block("workloads", _workloads, "workloads")


def _id_matches(query: str, entry_id: str) -> bool:
    """Case-insensitive id match; a query without an org (`llama-3.1-8b-instruct`, the name of
    a bundled config folder) matches on the part after the slash."""
    q = query.lower()
    e = entry_id.lower()
    return q == e or ("/" not in q and e.rsplit("/", 1)[-1] == q)


def model_defaults(model_id: str) -> dict[str, Any] | None:
    """{GPU, tensor_parallelism, vllm_version, hf_repo?} for a model, or None if not listed."""
    table = _bundled_model_defaults()
    spec = table.get(model_id.lower())
    if spec is None:
        matches = [v for k, v in table.items() if _id_matches(model_id, k)]
        spec = matches[0] if len(matches) == 1 else None
    return dict(spec) if spec is not None else None


def workload_presets() -> dict[str, dict[str, Any]]:
    """Workload presets by name (chatbot, contentgen, summarization, multidoc)."""
    return copy.deepcopy(_bundled_workloads())


def crossmodel_defaults() -> dict[str, list[float]]:
    """{alpha_coeffs: [3], beta_coeffs: [4]} of the cross-model backend (docs/behaviour.md §3.3)."""
    return copy.deepcopy(bundled_defaults().crossmodel)


def trained_roofline_defaults() -> dict[str, list[float]]:
    """{alpha_coeffs: [3], beta_coeffs: [7]} of the trained-roofline backend (docs/behaviour.md
    §3.4)."""
    return copy.deepcopy(bundled_defaults().trained_roofline)


# The shipped `models:` list: each entry starts with "- " at the line's start and names its
# model on one "  id: ..." line.
_ENTRY_START = re.compile(r"^- ", re.MULTILINE)
_ENTRY_ID = re.compile(r"^  id: (\S+)$", re.MULTILINE)


@functools.cache
def _bundled_entry_texts() -> tuple[tuple[str, str], ...] | None:
    """The shipped `models:` entries as (id, YAML text), in file order, without parsing them:
    a run asks for its own model's rows, and parsing all 111 (most of the file) took ~10 ms
    of every run's start-up. None when the file is not laid out as above (then the whole file
    is parsed); a test checks that every id reads the same rows either way."""
    block = _top_level_block("models")
    if block is None:
        return None
    body = block.removeprefix("models:\n")
    starts = [m.start() for m in _ENTRY_START.finditer(body)]
    ids = _ENTRY_ID.findall(body)
    if not starts or len(ids) != len(starts) or body[: starts[0]].strip(" \n"):
        return None
    ends = [*starts[1:], len(body)]
    return tuple(zip(ids, (body[a:b] for a, b in zip(starts, ends, strict=True)), strict=True))


@functools.cache
def _bundled_entries_of(model_id: str) -> tuple[CoefficientEntry, ...]:
    texts = _bundled_entry_texts()
    if texts is None:
        every = bundled_defaults().coefficients
        return tuple(e for e in every if _id_matches(model_id, e.model_id))
    return tuple(
        _coefficient_entry(bundled_yaml(text)[0], f"defaults.yaml: models[{i}]")
        for i, (entry_id, text) in enumerate(texts)
        if _id_matches(model_id, entry_id)
    )


def coefficient_entries(model_id: str) -> list[CoefficientEntry]:
    """Every fitted row for a model, in file order."""
    return list(_bundled_entries_of(model_id))


def fitted_deployments(model_id: str) -> list[str]:
    """Each distinct (GPU, TP, vLLM version) the model has coefficients for, as error
    messages list them (`H100 TP2 (v0.8.4)`), in file order."""
    labels: list[str] = []
    for e in coefficient_entries(model_id):
        label = f"{e.gpu} TP{e.tp} ({e.vllm_version.rsplit(':', 1)[-1]})"
        if label not in labels:
            labels.append(label)
    return labels


def lookup_coefficients(
    model_id: str, gpu: str, tp: int, vllm_version: str | None = None
) -> CoefficientEntry | None:
    """First row matching (model, GPU, TP[, vLLM version]); None when there is none.

    Model ids compare case-insensitively; GPUs exactly, except that A100-SXM and A100-80 are
    one part. The version is compared only when given, in either `v0.8.4` or
    `vllm/vllm-openai:v0.8.4` form; without it the first row for (model, GPU, TP) wins.
    """
    want_gpu = canonical_gpu(gpu)
    want_version = normalize_vllm_version(vllm_version) if vllm_version else None
    for entry in coefficient_entries(model_id):
        if canonical_gpu(entry.gpu) != want_gpu or entry.tp != tp:
            continue
        if want_version is not None and normalize_vllm_version(entry.vllm_version) != want_version:
            continue
        return entry
    return None
