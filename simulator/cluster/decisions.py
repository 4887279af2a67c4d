"""Decision trace and counterfactual regret (docs/behaviour.md §6.7).

With level "decisions" every admission and routing decision is recorded as a plain dict. With
`counterfactual_k` > 0 each routing record also keeps the k best candidates and the regret of
the choice: candidates are scored by the policy's own scores when it produced any, otherwise by
−effective_load, and regret = max(best − chosen, 0).

BLIS only summarises the trace; servesim can also write it as JSON Lines (`write`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic_io import atomic_open
from ..engine.request import Request
from ..errors import invalid
from .routing import RoutingDecision
from .snapshot import InstanceSnapshot

if TYPE_CHECKING:
    import pandas as pd


TRACE_LEVELS = ("none", "decisions")


def natural_key(instance_id: str) -> tuple:
    """Sort key that puts instance_2 before instance_10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", instance_id))


def _snapshot_fields(s: InstanceSnapshot) -> dict[str, Any]:
    return {
        "instance_id": s.instance_id,
        "queue_depth": s.queue_depth,
        "batch_size": s.batch_size,
        "in_flight": s.in_flight,
        "effective_load": s.effective_load,
        "kv_utilization": s.kv_utilization,
        "free_kv_blocks": s.free_kv_blocks,
        "cache_hit_rate": s.cache_hit_rate,
    }


class DecisionTrace:
    """Append-only record of the control plane's decisions during one run."""

    def __init__(self, level: str = "none", counterfactual_k: int = 0) -> None:
        if level not in TRACE_LEVELS:
            raise invalid("trace level (--trace-level)", level, f"valid: {', '.join(TRACE_LEVELS)}")
        if isinstance(counterfactual_k, bool) or not isinstance(counterfactual_k, int):
            raise invalid("counterfactual_k (--counterfactual-k)", counterfactual_k, "an integer")
        if counterfactual_k < 0:
            raise invalid("counterfactual_k (--counterfactual-k)", counterfactual_k, "must be >= 0")
        self.level = level
        self.counterfactual_k = counterfactual_k
        self.enabled = level != "none"
        self.admissions: list[dict[str, Any]] = []
        self.routings: list[dict[str, Any]] = []
        # Other decisions (PD disaggregation, prefill/decode routing, KV transfers).
        self.events: list[dict[str, Any]] = []
        # Every record in recording order (the same dicts as above).
        self._log: list[dict[str, Any]] = []

    # ----------------------------------------------------------------- recording
    def record_admission(self, req: Request, clock_us: int, admitted: bool, reason: str) -> None:
        if not self.enabled:
            return
        record = {
            "kind": "admission",
            "request_id": req.request_id,
            "clock_us": clock_us,
            "admitted": bool(admitted),
            "reason": reason,
        }
        self.admissions.append(record)
        self._log.append(record)

    def record_routing(
        self,
        req: Request,
        clock_us: int,
        decision: RoutingDecision,
        candidates: Sequence[InstanceSnapshot],
    ) -> None:
        if not self.enabled:
            return
        chosen = next((c for c in candidates if c.index == decision.target), None)
        chosen_id = chosen.instance_id if chosen is not None else f"instance_{decision.target}"
        record: dict[str, Any] = {
            "kind": "routing",
            "request_id": req.request_id,
            "clock_us": clock_us,
            "chosen": chosen_id,
            "reason": decision.reason,
            "scores": dict(decision.scores) if decision.scores is not None else None,
        }
        if self.counterfactual_k > 0 and candidates:
            if decision.scores is not None:
                scores = {
                    c.instance_id: decision.scores.get(c.instance_id, 0.0) for c in candidates
                }
            else:
                scores = {c.instance_id: float(-c.effective_load) for c in candidates}
            ranked = sorted(candidates, key=lambda c: (-scores[c.instance_id], c.instance_id))
            best = scores[ranked[0].instance_id]
            record["candidates"] = [
                {**_snapshot_fields(c), "score": scores[c.instance_id]}
                for c in ranked[: self.counterfactual_k]
            ]
            record["regret"] = max(best - scores.get(chosen_id, best), 0.0)
        else:
            record["candidates"] = []
            record["regret"] = 0.0
        self.routings.append(record)
        self._log.append(record)

    def record_event(self, kind: str, req: Request, clock_us: int, **fields: Any) -> None:
        """Any other decision (e.g. kind="disaggregation", "kv_transfer") with its fields."""
        if not self.enabled:
            return
        record = {"kind": kind, "request_id": req.request_id, "clock_us": clock_us, **fields}
        self.events.append(record)
        self._log.append(record)

    # ----------------------------------------------------------------- reading
    def summary(self) -> dict[str, Any]:
        admitted = sum(1 for a in self.admissions if a["admitted"])
        counts: dict[str, int] = {}
        for r in self.routings:
            counts[r["chosen"]] = counts.get(r["chosen"], 0) + 1
        regrets = [r["regret"] for r in self.routings]
        decode: dict[str, int] = {}
        for e in self.events:
            if e["kind"] == "decode_routing":
                decode[e["chosen"]] = decode.get(e["chosen"], 0) + 1
        out = {
            "total_decisions": len(self.admissions),
            "admitted": admitted,
            "rejected": len(self.admissions) - admitted,
            "routing_decisions": len(self.routings),
            "unique_targets": len(counts),
            "target_distribution": {k: counts[k] for k in sorted(counts, key=natural_key)},
            "mean_regret": sum(regrets) / len(regrets) if regrets else 0.0,
            "max_regret": max(regrets) if regrets else 0.0,
        }
        if decode:
            # Disaggregated requests: the decode pool's choices (the targets above are their
            # prefill instances).
            out["decode_target_distribution"] = {
                k: decode[k] for k in sorted(decode, key=natural_key)
            }
        return out

    def summary_text(self) -> str:
        s = self.summary()
        lines = [
            "=== Trace Summary ===",
            f"Total Decisions: {s['total_decisions']}",
            f"  Admitted: {s['admitted']}",
            f"  Rejected: {s['rejected']}",
            f"Unique Targets: {s['unique_targets']}",
            "Target Distribution:",
            *(f"  {iid}: {n}" for iid, n in s["target_distribution"].items()),
            f"Mean Regret: {s['mean_regret']:.6f}",
            f"Max Regret: {s['max_regret']:.6f}",
        ]
        if "decode_target_distribution" in s:
            lines += [
                "Decode Target Distribution:",
                *(f"  {iid}: {n}" for iid, n in s["decode_target_distribution"].items()),
            ]
        return "\n".join(lines)

    def admissions_frame(self) -> pd.DataFrame:
        import pandas as pd

        cols = ["request_id", "clock_ms", "admitted", "reason"]
        rows = [
            (a["request_id"], a["clock_us"] / 1000, a["admitted"], a["reason"])
            for a in self.admissions
        ]
        return pd.DataFrame(rows, columns=cols)

    def routings_frame(self) -> pd.DataFrame:
        """One row per routing decision; `best` is the top counterfactual candidate (k > 0)."""
        import pandas as pd

        cols = ["request_id", "clock_ms", "chosen", "reason", "best", "regret", "scores"]
        rows = [
            (
                r["request_id"],
                r["clock_us"] / 1000,
                r["chosen"],
                r["reason"],
                r["candidates"][0]["instance_id"] if r["candidates"] else None,
                r["regret"],
                r["scores"],
            )
            for r in self.routings
        ]
        return pd.DataFrame(rows, columns=cols)

    def records(self) -> list[dict[str, Any]]:
        """All records in the order they were made (the simulation's event order)."""
        return list(self._log)

    def write(self, path: str | Path) -> Path:
        """Write every record as JSON Lines, atomically (temp file + os.replace)."""
        target = Path(path)
        with atomic_open(target) as f:
            for record in self.records():
                f.write(json.dumps(record, sort_keys=True) + "\n")
        return target
