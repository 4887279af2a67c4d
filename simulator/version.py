"""servesim's own version, as the installed package's metadata gives it."""

from __future__ import annotations


def package_version() -> str:
    """servesim's version ("unknown" when run from a source tree never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servesim")
    except PackageNotFoundError:
        return "unknown"
