"""SLO attainment and goodput: how many of the offered requests were served within their
latency targets (docs/results.md#slo-attainment-and-goodput).

A request *meets* its SLOs when it completed and each target its class has is met: TTFT
(arrival → first token), ITL (its own mean inter-token time, TPOT) and E2E (arrival → last
token), all in ms. Every other outcome is a miss: rejected by admission, dropped as
unservable, timed out, failed with its instance, or still queued or running when the run
ended. Attainment = met / offered, where offered counts every request that arrived (rejected
ones included); goodput = met requests (and their output tokens) per second of the run.
Without targets every completed request meets them, so goodput equals throughput.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine.request import RequestState
from .summary import DEFAULT_CLASS, class_masks

METRICS = ("ttft_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True)
class SloTargets:
    """Upper bounds in ms; None = no bound on that metric."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def given(self) -> dict[str, float]:
        return {m: getattr(self, m) for m in METRICS if getattr(self, m) is not None}

    def over(self, fallback: SloTargets) -> SloTargets:
        """These targets, with `fallback`'s where these have none."""
        return SloTargets(*(getattr(self, m) if getattr(self, m) is not None
                            else getattr(fallback, m) for m in METRICS))  # fmt: skip


@dataclass(frozen=True)
class SloPolicy:
    """The run's targets: `default` for every class, `classes` overriding per SLO class."""

    default: SloTargets = SloTargets()
    classes: Mapping[str, SloTargets] = field(default_factory=dict)

    def targets(self, slo_class: str) -> SloTargets:
        own = self.classes.get(slo_class or DEFAULT_CLASS)
        return own.over(self.default) if own is not None else self.default

    @property
    def has_targets(self) -> bool:
        return bool(self.default.given()) or any(t.given() for t in self.classes.values())

    @classmethod
    def from_scenario(cls, spec: Mapping[str, Any] | None) -> SloPolicy:
        """From a scenario's `slo` section as a dict (scenario JSON)."""
        spec = spec or {}
        classes = {
            name: SloTargets(**{m: targets.get(m) for m in METRICS})
            for name, targets in (spec.get("classes") or {}).items()
        }
        return cls(SloTargets(**{m: spec.get(m) for m in METRICS}), classes)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.default.given())
        if self.classes:
            out["classes"] = {k: v.given() for k, v in sorted(self.classes.items())}
        return out


COLUMNS = ("arrival_us", "first_token_us", "last_token_us", "completion_us", "generated_tokens")
CODED = ("state", "slo_class")


def met_mask(cols: Mapping[str, np.ndarray], targets: SloTargets) -> np.ndarray:
    """Per request: did it complete within every target in `targets`? (`request_columns`)"""
    ok = cols["state"] == RequestState.COMPLETED
    arrival, first = cols["arrival_us"], cols["first_token_us"]
    if targets.ttft_ms is not None:
        ok &= (first - arrival) <= targets.ttft_ms * 1000
    if targets.e2e_ms is not None:
        ok &= (cols["completion_us"] - arrival) <= targets.e2e_ms * 1000
    if targets.itl_ms is not None:
        gen = cols["generated_tokens"]
        gaps = np.maximum(gen - 1, 1)
        decoded = (gen > 1) & (first >= 0)
        mean_itl_us = np.where(decoded, (cols["last_token_us"] - first) / gaps, 0.0)
        ok &= mean_itl_us <= targets.itl_ms * 1000
    return ok


def _figures(offered: int, met: int, met_tokens: int, duration_s: float) -> dict[str, Any]:
    return {
        "offered_requests": offered,
        "met_requests": met,
        "slo_attainment": met / offered if offered else None,
        "goodput_rps": met / duration_s if duration_s > 0 else 0.0,
        "goodput_tokens_per_s": met_tokens / duration_s if duration_s > 0 else 0.0,
    }


def slo_report(records: Sequence[Any], policy: SloPolicy, duration_s: float) -> dict[str, Any]:
    """Overall and per-class attainment and goodput of every arrived request."""
    from .request_table import request_columns

    cols = request_columns(records, COLUMNS, CODED)
    classes = class_masks(cols["slo_class"])  # unset: DEFAULT_CLASS; sorted by name
    names = list(classes)
    if len(names) == 1:  # the usual run: no copy of a million requests' columns per class
        met = met_mask(cols, policy.targets(names[0]))
    else:
        met = np.zeros(len(cols["state"]), dtype=bool)
        for name, members in classes.items():
            met[members] = met_mask({k: v[members] for k, v in cols.items()}, policy.targets(name))
    tokens = cols["generated_tokens"]
    report = {
        "targets": policy.describe(),
        **_figures(len(met), int(met.sum()), int(tokens[met].sum()), duration_s),
    }
    if len(names) > 1 or policy.classes:
        report["per_class"] = {}
        for name, members in classes.items():
            hit = met & members
            report["per_class"][name] = {
                "targets": policy.targets(name).given(),
                **_figures(int(members.sum()), int(hit.sum()), int(tokens[hit].sum()), duration_s),
            }
    return report
