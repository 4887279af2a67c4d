"""Named workload presets, the CLI "distribution" mode, composing specs and writing them back
as YAML (docs/behaviour.md §9.1, §12.2 convert / compose).

A preset or the distribution mode becomes a one-client v2 WorkloadSpec: Gaussian prompt and
output lengths with BLIS's parameter names, and a shared prefix group "shared" when
prefix_tokens > 0. Arrivals are Poisson unless asked otherwise (docs/behaviour.md §A8); BLIS-Mar
used constant spacing in this mode, which `arrival="constant"` reproduces.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..catalog.defaults import workload_presets
from ..errors import ConfigError, invalid, unknown
from ..limits import MAX_RATE_PER_S, MAX_REQUESTS, MAX_TOKENS, MIN_RATE_PER_S
from .arrivals import ARRIVAL_PROCESSES
from .cohorts import expand_cohorts, expand_inference_perf
from .spec import ClientSpec, WorkloadSpec, format_spec_error, workload_spec_from_dict


@functools.cache
def presets() -> dict[str, dict[str, Any]]:
    """defaults.yaml `workloads:` (chatbot, contentgen, summarization, multidoc); multidoc
    leaves prefix_tokens unset, which means 0. Read on first use: parsing defaults.yaml is
    most of a run's start-up, and most runs name no preset."""
    return {name: {"prefix_tokens": 0, **values} for name, values in workload_presets().items()}


def __getattr__(name: str) -> Any:
    if name == "PRESETS":  # the old constant, computed when first read
        return presets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The CLI distribution mode's defaults (BLIS `blis run` flags).
DISTRIBUTION_DEFAULTS: dict[str, int] = {
    "prefix_tokens": 0,
    "prompt_tokens": 512,
    "prompt_tokens_stdev": 256,
    "prompt_tokens_min": 2,
    "prompt_tokens_max": 7000,
    "output_tokens": 512,
    "output_tokens_stdev": 256,
    "output_tokens_min": 2,
    "output_tokens_max": 7000,
}


def _gaussian(mean: float, std_dev: float, lo: int, hi: int) -> dict[str, Any]:
    return {
        "type": "gaussian",
        "params": {
            "mean": float(mean),
            "std_dev": float(std_dev),
            "min": float(lo),
            "max": float(hi),
        },
    }


# The bounds of simulator/limits.py, said with the flag names of this mode.
_TOKENS_WHY = f"at most {MAX_TOKENS:,} tokens, the bound of a request's size (simulator/limits.py)"


def _check_lengths(prefix: str, mean: float, stdev: float, lo: int, hi: int) -> None:
    if not (math.isfinite(mean) and 0 <= mean <= MAX_TOKENS):
        raise invalid(f"{prefix}_tokens", mean, f"must be a finite number >= 0, {_TOKENS_WHY}")
    if not (math.isfinite(stdev) and 0 <= stdev <= MAX_TOKENS):
        raise invalid(
            f"{prefix}_tokens_stdev", stdev, f"must be a finite number >= 0, {_TOKENS_WHY}"
        )
    if lo < 1:
        raise invalid(f"{prefix}_tokens_min", lo, "must be >= 1")
    if hi < lo:
        raise invalid(f"{prefix}_tokens_max", hi, f"must be >= {prefix}_tokens_min ({lo})")
    if hi > MAX_TOKENS:
        raise invalid(f"{prefix}_tokens_max", hi, f"must be {_TOKENS_WHY}")


def distribution_spec(
    rate: float,
    num_requests: int,
    prompt_tokens: float = 512,
    prompt_tokens_stdev: float = 256,
    prompt_tokens_min: int = 2,
    prompt_tokens_max: int = 7000,
    output_tokens: float = 512,
    output_tokens_stdev: float = 256,
    output_tokens_min: int = 2,
    output_tokens_max: int = 7000,
    prefix_tokens: int = 0,
    arrival: str = "poisson",
    *,
    client_id: str = "distribution",
) -> WorkloadSpec:
    """The CLI distribution mode as a one-client v2 spec (rate in req/s). The client is named
    as `run`'s own (and BLIS's) is, `distribution`: a client's random streams are seeded by
    its id, so the same id draws the same requests."""
    if not (math.isfinite(rate) and MIN_RATE_PER_S <= rate <= MAX_RATE_PER_S):
        raise invalid(
            "rate",
            rate,
            f"must be from {MIN_RATE_PER_S:g} to {MAX_RATE_PER_S:g} requests per second: the "
            "mean gap must fit the simulator's clock (simulator/limits.py)",
        )
    if not 0 <= num_requests <= MAX_REQUESTS:
        raise invalid(
            "num_requests",
            num_requests,
            f"must be from 0 to {MAX_REQUESTS:,}: a run keeps every finished request",
        )
    if not 0 <= prefix_tokens <= MAX_TOKENS:
        raise invalid("prefix_tokens", prefix_tokens, f"must be >= 0, {_TOKENS_WHY}")
    if arrival not in ARRIVAL_PROCESSES:
        raise unknown("arrival process", arrival, ARRIVAL_PROCESSES)
    _check_lengths(
        "prompt", prompt_tokens, prompt_tokens_stdev, prompt_tokens_min, prompt_tokens_max
    )
    _check_lengths(
        "output", output_tokens, output_tokens_stdev, output_tokens_min, output_tokens_max
    )
    client: dict[str, Any] = {
        "id": client_id,
        "rate_fraction": 1.0,
        "arrival": {"process": arrival},
        "input_distribution": _gaussian(
            prompt_tokens, prompt_tokens_stdev, prompt_tokens_min, prompt_tokens_max
        ),
        "output_distribution": _gaussian(
            output_tokens, output_tokens_stdev, output_tokens_min, output_tokens_max
        ),
    }
    if prefix_tokens > 0:
        client["prefix_group"] = "shared"
        client["prefix_length"] = prefix_tokens
    return workload_spec_from_dict(
        {
            "version": "2",
            "category": "language",
            "aggregate_rate": float(rate),
            "num_requests": num_requests,
            "clients": [client],
        },
        source="distribution workload",
    )


def preset_spec(
    name: str, rate: float, num_requests: int, arrival: str = "poisson"
) -> WorkloadSpec:
    """A named defaults.yaml preset as a one-client v2 spec (client id "preset-<name>")."""
    if name not in presets():
        raise unknown("workload preset", name, presets())
    return distribution_spec(
        rate, num_requests, **presets()[name], arrival=arrival, client_id=f"preset-{name}"
    )


# --- compose ----------------------------------------------------------------------------------


def _as_clients(spec: WorkloadSpec) -> WorkloadSpec:
    if spec.inference_perf is not None:
        return expand_inference_perf(spec)
    if spec.servegen_data is not None:
        raise ConfigError(
            "compose: servegen_data specs must be converted to clients first "
            "(servesim convert servegen)"
        )
    return spec.model_copy(update={"clients": expand_cohorts(spec), "cohorts": []})


def _unused(name: str, index: int, taken: set[str]) -> str:
    """`name` with the suffix "-<spec index>" (then "-<spec index>-<k>") that `taken` lacks."""
    candidate, k = f"{name}-{index}", 1
    while candidate in taken:
        candidate, k = f"{name}-{index}-{k}", k + 1
    return candidate


def with_absolute_files(spec: WorkloadSpec, base_dir: Path | None) -> WorkloadSpec:
    """`spec` with every relative empirical `file` made absolute against `base_dir` (the
    folder of the file the spec came from), so that it reads the same tables from anywhere,
    as a composed spec printed elsewhere must."""
    if base_dir is None:
        return spec
    changed = False

    def walk(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, dict):
            out = {k: walk(v) for k, v in value.items()}
            name = out.get("file")
            if isinstance(name, str) and name and "type" in out and not Path(name).is_absolute():
                out["file"] = str((Path(base_dir) / name).resolve())
                changed = True
            return out
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    data = walk(spec.model_dump(mode="json", exclude_none=True))
    return WorkloadSpec.model_validate(data) if changed else spec


def _merged_slo_targets(specs: list[WorkloadSpec]) -> dict[str, Any]:
    """The specs' goodput_slo_targets together; a class two specs give different targets is
    an error (which would the merged run judge by?)."""
    merged: dict[str, Any] = {}
    for index, spec in enumerate(specs):
        for slo_class, targets in spec.goodput_slo_targets.items():
            if slo_class in merged and merged[slo_class] != targets:
                raise ConfigError(
                    f"compose: goodput_slo_targets[{slo_class!r}]: spec {index} gives "
                    f"{targets.model_dump(exclude_none=True)}, an earlier spec "
                    f"{merged[slo_class].model_dump(exclude_none=True)}; give one class one set "
                    "of targets"
                )
            merged[slo_class] = targets
    return merged


def _rate_kind(spec: WorkloadSpec) -> str:
    """How a spec (its cohorts expanded) gives its rates: "absolute" (no aggregate_rate; every
    window's trace_rate in req/s, as `convert servegen` writes them), "shared" (an
    aggregate_rate shared by rate fractions) or "none" (closed-loop users only: no rate, and
    an aggregate_rate it gives is used by no client)."""
    if not spec.open_loop:
        return "none"
    return "absolute" if spec.absolute_rate_mode else "shared"


def _rescaled(client: ClientSpec, factor: float) -> dict[str, Any]:
    """The update that multiplies every rate weight of an open-loop client by `factor`: its
    rate_fraction and each window's trace_rate (a cohort's spike is such a window once
    expanded), which weigh against the fractions as the rate_fraction does (generator
    `period_rate`)."""
    update: dict[str, Any] = {"rate_fraction": client.rate_fraction * factor}
    lifecycle = client.lifecycle
    if lifecycle is not None and any(w.trace_rate for w in lifecycle.windows):
        windows = [
            w.model_copy(update={"trace_rate": w.trace_rate * factor}) if w.trace_rate else w
            for w in lifecycle.windows
        ]
        update["lifecycle"] = lifecycle.model_copy(update={"windows": windows})
    return update


def compose_specs(specs: list[WorkloadSpec], names: list[str] | None = None) -> WorkloadSpec:
    """Merge specs into one whose traffic is the sum of theirs (docs/behaviour.md §12.2).

    aggregate_rate = Σ rates; each client keeps its absolute rate in every period: its
    fraction, and each of its windows' trace_rate weights, normalised within its own spec,
    times that spec's share of the total. (BLIS multiplies the raw fraction; the two agree when
    each spec's fractions sum to 1.) A spec of closed-loop users only has no rate: it takes no
    share, whatever aggregate_rate it gives. Cohorts and inference_perf sections are expanded
    to clients first. Client ids are kept; a colliding id gets a
    suffix "-<spec index>" (then "-<spec index>-<k>"), and so does a prefix group an earlier
    spec also uses, so that each spec's clients share prefixes with their own spec's alone
    (BLIS keeps the name, and the later spec's clients take the earlier prefix, its length
    included: their traffic would change). Seed and category come from the first
    spec; horizon is the longest given; num_requests is the sum when every spec sets one;
    goodput_slo_targets are merged. Specs whose rates are all absolute (windows in req/s, no
    aggregate_rate) keep them as given; one cannot be merged with a spec of shared rates.

    Every spec's length laws are checked first, as a run would check them
    (`check_length_laws`), each error named by `names[i]` (the spec's file) or its index.
    """
    from .generator import check_length_laws

    if not specs:
        raise ConfigError("compose: no specs given; need at least one")
    for index, spec in enumerate(specs):
        label = names[index] if names is not None else f"compose: spec {index}"
        check_length_laws(spec, where=f"{label}: ")
    flat = [_as_clients(s) for s in specs]
    kinds = [_rate_kind(s) for s in flat]
    if "absolute" in kinds and "shared" in kinds:
        first = kinds.index("absolute")
        other = kinds.index("shared")
        raise ConfigError(
            f"compose: spec {first} gives absolute rates (no aggregate_rate; each window's "
            f"trace_rate in req/s, as `convert servegen` writes them) and spec {other} an "
            "aggregate_rate shared by rate fractions; one spec cannot hold both: compose specs "
            "of one kind (closed-loop-only specs go with either)"
        )
    # Absolute rates (every window its own req/s) are kept as given: no fractions to rescale
    # and no aggregate rate. Only specs with open-loop clients share the aggregate rate.
    rescale = "shared" in kinds
    total_rate = sum(
        s.aggregate_rate or 0.0 for s, kind in zip(flat, kinds, strict=True) if kind == "shared"
    )
    if rescale and not (math.isfinite(total_rate) and total_rate > 0):
        raise invalid("aggregate_rate", total_rate, "the composed rate must be finite and > 0")
    seen: set[str] = set()
    groups: set[str] = set()  # prefix groups of the specs before this one
    clients = []
    for index, (spec, kind) in enumerate(zip(flat, kinds, strict=True)):
        fraction_sum = sum(c.rate_fraction or 0.0 for c in spec.clients)
        # The spec's weights, normalised within it, become its share of the merged rate.
        factor = (
            (spec.aggregate_rate or 0.0) / total_rate / fraction_sum if kind == "shared" else 1.0
        )
        own_groups = {c.prefix_group for c in spec.clients if c.prefix_group}
        renamed = {}
        for group in sorted(own_groups & groups):
            renamed[group] = _unused(group, index, groups | own_groups | set(renamed.values()))
        groups |= own_groups | set(renamed.values())
        for client in spec.clients:
            cid = client.id
            if cid in seen:
                cid = _unused(client.id, index, seen)
            seen.add(cid)
            update: dict[str, Any] = {"id": cid}
            if client.prefix_group in renamed:
                update["prefix_group"] = renamed[client.prefix_group]
            if kind == "shared" and not client.concurrency_users:  # users have no rate
                update.update(_rescaled(client, factor))
            clients.append(client.model_copy(update=update))
    horizons = [s.horizon for s in flat if s.horizon]
    counts = [s.num_requests for s in flat]
    try:
        return WorkloadSpec(
            version="2",
            seed=flat[0].seed,
            category=flat[0].category,
            aggregate_rate=total_rate or None,
            horizon=max(horizons) if horizons else None,
            num_requests=sum(counts) if all(c for c in counts) else None,
            clients=clients,
            goodput_slo_targets=_merged_slo_targets(flat),
        )
    except ValidationError as exc:
        # Each spec is within bounds; their sums (rate, request count) may not be.
        raise ConfigError(format_spec_error(exc, "compose (the merged spec)")) from None


# --- YAML -------------------------------------------------------------------------------------


def _clean(value: Any, key: str = "") -> Any:
    """Drop None and empty containers, put ids first, write whole-number params as ints."""
    if isinstance(value, dict):
        out = {"id": value["id"]} if "id" in value else {}
        for k, v in value.items():
            v = _clean(v, k)
            if v is None or v == {} or v == []:
                continue
            out[k] = v
        return out
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if key and isinstance(value, float) and value.is_integer() and key in _WHOLE_NUMBER_KEYS:
        return int(value)
    return value


# Distribution parameters that are token counts, written without a trailing ".0".
_WHOLE_NUMBER_KEYS = {"mean", "std_dev", "min", "max", "value", "xm"}


def spec_to_yaml(spec: WorkloadSpec) -> str:
    """Clean v2 YAML a user can save and load again (None, defaults and empty fields omitted)."""
    data = spec.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data = {"version": "2", **_clean(data)}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
