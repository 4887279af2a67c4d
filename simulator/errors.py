"""Errors servesim raises for bad input.

Every message names the field, the offending value and what is allowed, so the CLI can print
it as one line and exit with status 2.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class ServesimError(Exception):
    """Base class of errors caused by input (configuration, files, flags).

    Its text is always one line: the CLI prints it as `error: ...`, and Python callers see
    the same line. Parsers write one-line messages; a line break that slips through (from a
    library's message or a user's value) is folded here rather than shown as several lines.
    """

    def __str__(self) -> str:
        return one_line(super().__str__())


class ConfigError(ServesimError, ValueError):
    """A configuration value is invalid."""


class OutputError(ServesimError, OSError):
    """An output cannot be written: the target is not a file servesim may replace (a device,
    a FIFO, a folder, a path on /proc, ...) or writing failed ("cannot write 'PATH': No space
    left on device"). Also an OSError, so callers that already catch write failures as
    OSError keep catching them."""


# A value quoted in a message is cut to this many characters: the message must stay one
# readable line even when the value is a whole file (a CSV field with an unclosed quote).
EXCERPT_CHARS = 80


def one_line(text: str) -> str:
    """`text` with its line breaks (any of str.splitlines') folded into single spaces."""
    parts = text.splitlines()
    if len(parts) == 1 and parts[0] == text:
        return text
    return " ".join(part.strip() for part in parts if part.strip())


def shorten(text: str, limit: int = EXCERPT_CHARS, keep_end: bool = False) -> str:
    """`text` cut to `limit` characters, with "…" where something was cut: its end, or, with
    `keep_end` (a file path, whose name is at the end), its middle."""
    if len(text) <= limit:
        return text
    if keep_end:
        return text[: limit // 2] + "…" + text[len(text) - limit // 2 :]
    return text[:limit] + "…"


def excerpt(value: object, limit: int = EXCERPT_CHARS, keep_end: bool = False) -> str:
    """`repr(value)` for a message: one line, at most `limit` characters (see `shorten`)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for Python to print (over 4,300 digits)
        return f"<{type(value).__name__} too large to show>"
    return shorten(one_line(text), limit, keep_end)


def key_text(key: object) -> str:
    """A user's mapping key as one step of a field path in a message: as written when it is a
    plain name, quoted (`repr`) when it is empty or holds a line break, a control character, a
    space or a path separator (`.`, `[`, `]`) that would make the path misread."""
    name = str(key)
    if not name or not name.isprintable() or any(c in name for c in " .[]"):
        return excerpt(name)
    return name


def invalid(
    field: str, value: object, allowed: str, error: type[ConfigError] = ConfigError
) -> ConfigError:
    """Build the standard message: `<field>: invalid value <value>; <allowed>` (as `error`, a
    ConfigError or a kind of it)."""
    return error(f"{field}: invalid value {excerpt(value)}; {allowed}")


class UnknownName(ConfigError):
    """A name that is not in a registry or catalog (`unknown`): the registry does not know
    which field the name came from, its caller does (`in_field`)."""


def unknown(kind: str, value: object, valid: Iterable[str]) -> ConfigError:
    """Build the standard message for a name that is not in a registry or catalog."""
    names = ", ".join(sorted(valid))
    return UnknownName(f"unknown {kind} {excerpt(value)}; valid: {names}")


@contextmanager
def in_field(field: str) -> Iterator[None]:
    """An unknown name raised inside is told with the field it came from
    (`engine.scheduler: unknown scheduler 'x'; valid: ...`)."""
    try:
        yield
    except UnknownName as exc:
        raise UnknownName(f"{field}: {exc}") from None


def require_path(name: str, value: object, optional: bool = False) -> None:
    """A public function's file or folder argument is a path (str or os.PathLike, None when
    `optional`): anything else is a ConfigError naming the argument, not a TypeError from the
    standard library further down."""
    import os

    if value is None and optional:
        return
    if not isinstance(value, str | os.PathLike) or not isinstance(os.fspath(value), str):
        given = "None" if value is None else f"{type(value).__name__} {excerpt(value)}"
        raise ConfigError(
            f"{name}: expected a path (str or os.PathLike){' or None' if optional else ''}; "
            f"got {given}"
        )


def plain_scalar(value: object) -> object:
    """A NumPy scalar (np.int64, np.float64, np.bool_, a 0-d array) as the Python number or
    bool it holds, anything else as it is: notebook code passes `np.arange(...)` elements
    where an int is asked for. Does not import NumPy."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()  # type: ignore[attr-defined]
    return value


def require_flag(name: str, value: object) -> bool:
    """A public function's on/off argument is a bool (NumPy's included), never any truthy
    value: `end_checks="no"` must not turn the checks on."""
    value = plain_scalar(value)
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: invalid value {excerpt(value)}; expected True or False")
    return value


def require_callable(name: str, value: object) -> None:
    """An optional callback argument is a callable or None."""
    if value is not None and not callable(value):
        raise ConfigError(f"{name}: expected a function or None; got {excerpt(value)}")


def is_finite_positive(value: object) -> bool:
    """A real number (not a bool) that is finite and > 0."""
    import math

    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an int beyond float range
        return False


def counted(n: int, noun: str) -> str:
    """`n` and `noun`, pluralised by an s unless `n` is 1: "1 run", "3 runs", "1,024 requests"."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
