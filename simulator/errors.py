"""Errors servesim raises for bad input.

Every message names the field, the offending value and what is allowed, so the CLI can print
it as one line and exit with status 2.
"""

from __future__ import annotations

from collections.abc import Iterable


class ServesimError(Exception):
    """Base class of errors caused by input (configuration, files, flags)."""


class ConfigError(ServesimError, ValueError):
    """A configuration value is invalid."""


def invalid(field: str, value: object, allowed: str) -> ConfigError:
    """Build the standard message: `<field>: invalid value <value>; <allowed>`."""
    return ConfigError(f"{field}: invalid value {value!r}; {allowed}")


def unknown(kind: str, value: object, valid: Iterable[str]) -> ConfigError:
    """Build the standard message for a name that is not in a registry or catalog."""
    names = ", ".join(sorted(valid))
    return ConfigError(f"unknown {kind} {value!r}; valid: {names}")


def is_finite_positive(value: object) -> bool:
    """A real number (not a bool) that is finite and > 0."""
    import math

    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
