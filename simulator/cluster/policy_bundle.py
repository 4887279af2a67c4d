"""BLIS's policy bundle (`--policy-config`, docs/behaviour.md §6.6), read strictly (R10).

```yaml
admission: {policy: token-bucket, token_bucket_capacity: 5000, token_bucket_refill_rate: 500}
routing:
  policy: weighted
  scorers: [{name: prefix-affinity, weight: 3}, {name: queue-depth, weight: 2}]
priority: {policy: slo-based}
scheduler: priority-fcfs
preemption: {policy: priority}   # BLIS-current's; with admission.slo_priorities: {batch: 5}
```

The bundle becomes dotted scenario overrides; the caller applies them under explicitly set
CLI flags (flags beat the bundle, R18). Keys that are absent or null are left unset (R9).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engine.policies import PRIORITY_POLICIES, SCHEDULERS
from ..engine.preemption import PREEMPTION_POLICIES, SLO_CLASS_PRIORITY, SLO_PRIORITY_BOUND
from ..errors import ConfigError, excerpt, is_finite_positive, unknown
from ..input_files import read_yaml
from .admission import ADMISSION_POLICIES
from .routing import ROUTING_POLICIES, check_scorers

_SECTIONS: dict[str, tuple[str, ...]] = {
    "admission": ("policy", "token_bucket_capacity", "token_bucket_refill_rate", "slo_priorities"),
    "routing": ("policy", "scorers"),
    "priority": ("policy",),
    "scheduler": (),  # a plain string, not a mapping
    "preemption": ("policy",),  # BLIS-current's
}
_SCORER_KEYS = ("name", "weight")


def load_policy_bundle(path: str | Path) -> dict[str, Any]:
    """Read a policy bundle and return dotted scenario overrides, e.g.
    {"cluster.routing.policy": "weighted", "cluster.routing.scorers": "queue-depth:2"}."""
    src = f"policy bundle {str(path)!r}"
    # The reader refuses duplicate keys (PyYAML would keep the last one silently).
    return policy_bundle_overrides(read_yaml(path, "policy bundle"), src)


def policy_bundle_overrides(data: Any, src: str = "policy bundle") -> dict[str, Any]:
    """Validate an already parsed bundle and map it to dotted scenario overrides."""
    if data is None:
        return {}
    section = _mapping(data, src, "(top level)")
    _known(section, tuple(_SECTIONS), src, "(top level)")
    out: dict[str, Any] = {}

    adm = _mapping(section.get("admission"), src, "admission")
    _known(adm, _SECTIONS["admission"], src, "admission")
    if adm.get("policy") is not None:
        out["cluster.admission.policy"] = _name(
            adm["policy"], ADMISSION_POLICIES, "admission policy", src, "admission.policy"
        )
    for key in ("token_bucket_capacity", "token_bucket_refill_rate"):
        if adm.get(key) is not None:
            out[f"cluster.admission.{key}"] = _positive(adm[key], src, f"admission.{key}")
    if adm.get("slo_priorities") is not None:
        # BLIS-current keeps the class priorities with admission; servesim's engine reads
        # them (priority preemption, the slo-class priority policy). The scenario's schema
        # checks the classes and the range, naming the field.
        priorities = _mapping(adm["slo_priorities"], src, "admission.slo_priorities")
        for slo_class, value in priorities.items():
            where = "admission.slo_priorities"
            if slo_class not in SLO_CLASS_PRIORITY:
                raise ConfigError(
                    f"{src}: {where}: {unknown('SLO class', slo_class, SLO_CLASS_PRIORITY)}"
                )
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or abs(value) > SLO_PRIORITY_BOUND
            ):
                raise ConfigError(
                    f"{src}: {where}.{slo_class}: invalid value {excerpt(value)}; must be an "
                    f"integer from -{SLO_PRIORITY_BOUND} to {SLO_PRIORITY_BOUND}"
                )
        out["engine.slo_priorities"] = dict(priorities)

    routing = _mapping(section.get("routing"), src, "routing")
    _known(routing, _SECTIONS["routing"], src, "routing")
    if routing.get("policy") is not None:
        out["cluster.routing.policy"] = _name(
            routing["policy"], ROUTING_POLICIES, "routing policy", src, "routing.policy"
        )
    if routing.get("scorers") is not None:
        out["cluster.routing.scorers"] = _scorers(routing["scorers"], src)

    priority = _mapping(section.get("priority"), src, "priority")
    _known(priority, _SECTIONS["priority"], src, "priority")
    if priority.get("policy") is not None:
        out["engine.priority_policy"] = _name(
            priority["policy"], PRIORITY_POLICIES, "priority policy", src, "priority.policy"
        )

    preemption = _mapping(section.get("preemption"), src, "preemption")
    _known(preemption, _SECTIONS["preemption"], src, "preemption")
    if preemption.get("policy") is not None:
        out["engine.preemption_policy"] = _name(
            preemption["policy"], PREEMPTION_POLICIES, "preemption policy", src, "preemption.policy"
        )

    if section.get("scheduler") is not None:
        out["engine.scheduler"] = _name(
            section["scheduler"], SCHEDULERS, "scheduler", src, "scheduler"
        )
    return out


# --------------------------------------------------------------------------- helpers


def _mapping(value: Any, src: str, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{src}: {where} must be a mapping, got {type(value).__name__}")
    return value


def _known(section: dict, allowed: tuple[str, ...], src: str, parent: str) -> None:
    for key in section:
        if key not in allowed:
            raise ConfigError(
                f"{src}: unknown key {excerpt(key, 40)} in {parent}; "
                f"valid keys: {', '.join(allowed)}"
            )


def _name(value: Any, registry: dict, kind: str, src: str, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{src}: {where} must be a string, got {excerpt(value)}")
    if value not in registry:
        raise ConfigError(f"{src}: {where}: {unknown(kind, value, registry)}")
    return value


def _positive(value: Any, src: str, where: str) -> float:
    if not is_finite_positive(value):
        raise ConfigError(
            f"{src}: {where}: invalid value {excerpt(value)}; must be a finite number > 0"
        )
    return float(value)


def _scorers(value: Any, src: str) -> str:
    where = "routing.scorers"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{src}: {where} must be a non-empty list of {{name, weight}} mappings")
    pairs: list[tuple[str, float]] = []
    for i, item in enumerate(value):
        entry = _mapping(item, src, f"{where}[{i}]")
        _known(entry, _SCORER_KEYS, src, f"{where}[{i}]")
        missing = [k for k in _SCORER_KEYS if entry.get(k) is None]
        if missing:
            raise ConfigError(f"{src}: {where}[{i}] needs {' and '.join(missing)}")
        if not isinstance(entry["name"], str):
            raise ConfigError(
                f"{src}: {where}[{i}].name must be a string, got {excerpt(entry['name'])}"
            )
        pairs.append((entry["name"], entry["weight"]))
    checked = check_scorers(pairs, field=f"{src}: {where}")
    # repr() keeps every digit of the weight, so the string round-trips exactly.
    return ",".join(f"{name}:{weight!r}" for name, weight in checked)
