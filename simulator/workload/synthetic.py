"""A scenario's synthetic workload (BLIS preset / distribution mode) as a v2 spec (docs/behaviour.md
§9.1).

servesim generates every workload through the v2 generator; a synthetic workload is the
smallest v2 spec, built by `presets.distribution_spec`: one client, one arrival process,
Gaussian (or constant) lengths and an optional shared prefix. With `concurrency` the client
is closed-loop instead (BLIS `--concurrency`): that many users, no arrival process.
"""

from __future__ import annotations

from typing import Any

from ..errors import in_field, invalid, unknown
from ..scenario import LengthSpec, SyntheticWorkload
from .presets import DISTRIBUTION_DEFAULTS, distribution_spec, presets
from .spec import WorkloadSpec, workload_spec_from_dict

# The synthetic workload's fields (BLIS's distribution-mode flags, as scenario paths) that also
# mean something for a v2 workload spec, and the spec field each sets: `--rate` and
# `--num-requests` on the command line, a sweep's grid over them.
V2_EQUIVALENTS = {"workload.rate": "aggregate_rate", "workload.num_requests": "num_requests"}


def _gaussian_flags(spec: LengthSpec | None, base: dict[str, Any], which: str) -> dict[str, Any]:
    """distribution_spec keyword arguments for one length law: the fields `spec` sets, the
    others the preset's (or the defaults without one), so `--prompt-tokens-max 600` beside
    `--workload chatbot` caps chatbot's prompts rather than drawing N(512, 256)."""
    keys = {f"{which}_tokens": "mean", f"{which}_tokens_stdev": "stdev"}
    keys |= {f"{which}_tokens_min": "min", f"{which}_tokens_max": "max"}
    flags = {k: base[k] for k in keys}
    if spec is None or spec.distribution == "constant":
        return flags
    for key, field in keys.items():
        if getattr(spec, field) is not None:
            flags[key] = getattr(spec, field)
    low, high = flags[f"{which}_tokens_min"], flags[f"{which}_tokens_max"]
    if low > high:
        side = "prompt_tokens" if which == "prompt" else "output_tokens"
        raise invalid(
            f"workload.{side}.{'max' if spec.max is not None else 'min'}",
            high if spec.max is not None else low,
            f"min ({low}) must be <= max ({high}); the bound not given is the preset's "
            "or the default",
        )
    return flags


def synthetic_to_spec(workload: SyntheticWorkload) -> WorkloadSpec:
    name = workload.preset
    known = presets()
    if name is not None and name != "distribution" and name not in known:
        with in_field("workload.preset"):
            raise unknown("workload preset", name, [*known, "distribution"])
    base = known.get(name or "", DISTRIBUTION_DEFAULTS)
    spec = distribution_spec(
        workload.rate,
        workload.num_requests,
        **_gaussian_flags(workload.prompt_tokens, base, "prompt"),
        **_gaussian_flags(workload.output_tokens, base, "output"),
        prefix_tokens=workload.prefix_tokens or int(base.get("prefix_tokens") or 0),
        arrival=workload.arrival,
        client_id=f"preset-{name}" if name in known else "distribution",
    )
    data = spec.model_dump(exclude_none=True)
    client = data["clients"][0]
    for which, length in (("input", workload.prompt_tokens), ("output", workload.output_tokens)):
        if length is not None and length.distribution == "constant":
            client[f"{which}_distribution"] = {
                "type": "constant",
                "params": {"value": length.value},
            }
    if workload.timeout_us:
        client["timeout"] = workload.timeout_us
    if workload.concurrency:
        # BLIS's --concurrency: the same lengths, sent by virtual users instead of at a rate.
        for key in ("rate_fraction", "arrival"):
            client.pop(key, None)
        client["concurrency"] = workload.concurrency
        client["think_time_us"] = workload.think_time_us
        # timeout_us 0 means no deadline here as for open-loop traffic (a spec's users get
        # 300 s when their client sets no timeout).
        client["timeout"] = workload.timeout_us
        data.pop("aggregate_rate", None)
    return workload_spec_from_dict(data, source="workload")
