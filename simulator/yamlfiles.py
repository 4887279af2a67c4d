"""Reading the YAML files users hand to servesim, with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error as one line: the problem and where (its own text spans several lines)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def read_yaml_mapping(path: str | Path, what: str, empty_ok: bool = False) -> dict[str, Any]:
    """The mapping in a YAML file; ConfigError naming `what` and the file otherwise."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {str(p)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what}: {str(p)!r} is not valid YAML: {yaml_problem(exc)}") from None
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: {str(p)!r} must be a YAML mapping")
    return data
