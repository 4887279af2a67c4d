"""BLIS's policy bundle (`--policy-config`, SPEC §6.6), read strictly (R10).

```yaml
admission: {policy: token-bucket, token_bucket_capacity: 5000, token_bucket_refill_rate: 500}
routing:
  policy: weighted
  scorers: [{name: prefix-affinity, weight: 3}, {name: queue-depth, weight: 2}]
priority: {policy: slo-based}
scheduler: priority-fcfs
```

The bundle becomes dotted scenario overrides; the caller applies them under explicitly set
CLI flags (flags beat the bundle, R18). Keys that are absent or null are left unset (R9).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..engine.policies import PRIORITY_POLICIES, SCHEDULERS
from ..errors import ConfigError, is_finite_positive, unknown
from .admission import ADMISSION_POLICIES
from .routing import ROUTING_POLICIES, check_scorers

_SECTIONS: dict[str, tuple[str, ...]] = {
    "admission": ("policy", "token_bucket_capacity", "token_bucket_refill_rate"),
    "routing": ("policy", "scorers"),
    "priority": ("policy",),
    "scheduler": (),  # a plain string, not a mapping
}
_SCORER_KEYS = ("name", "weight")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_policy_bundle(path: str | Path) -> dict[str, Any]:
    """Read a policy bundle and return dotted scenario overrides, e.g.
    {"cluster.routing.policy": "weighted", "cluster.routing.scorers": "queue-depth:2"}."""
    p = Path(path)
    src = f"policy bundle {str(p)!r}"
    try:
        data = yaml.load(p.read_text(), Loader=_StrictLoader)
    except OSError as exc:
        raise ConfigError(f"{src}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{src}: not valid YAML: {problem}{where}") from None
    return policy_bundle_overrides(data, src)


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
                f"{src}: unknown key {key!r} in {parent}; valid keys: {', '.join(allowed)}"
            )


def _name(value: Any, registry: dict, kind: str, src: str, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{src}: {where} must be a string, got {value!r}")
    if value not in registry:
        raise ConfigError(f"{src}: {where}: {unknown(kind, value, registry)}")
    return value


def _positive(value: Any, src: str, where: str) -> float:
    if not is_finite_positive(value):
        raise ConfigError(f"{src}: {where}: invalid value {value!r}; must be a finite number > 0")
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
            raise ConfigError(f"{src}: {where}[{i}].name must be a string, got {entry['name']!r}")
        pairs.append((entry["name"], entry["weight"]))
    checked = check_scorers(pairs, field=f"{src}: {where}")
    # repr() keeps every digit of the weight, so the string round-trips exactly.
    return ",".join(f"{name}:{weight!r}" for name, weight in checked)
