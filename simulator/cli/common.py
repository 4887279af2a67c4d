"""Helpers every `servesim` command shares: running a command body with one-line errors and
exit statuses (`guarded`), refusing an unusable output before any work (`check_writable`),
logging, the stderr console. The command modules import from here; nothing here imports a
command module."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from ..atomic_io import check_output, check_output_folder
from ..errors import ConfigError, ServesimError
from ..interruption import to_report

# `-h` as well as `--help`, on the app and (inherited by their contexts) on every command.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_HELP = "log level on stderr: " + " | ".join(LOG_LEVELS)


# BLIS (logrus) spells warning `warn`; both are taken.
LOG_ALIASES = {"warn": "warning"}


def setup_logging(level: str) -> None:
    name = LOG_ALIASES.get(level.lower(), level.lower())
    if name not in LOG_LEVELS:
        raise ConfigError(
            f"--log: invalid value {level!r}; valid: {', '.join(LOG_LEVELS)} (or warn)"
        )
    numeric = getattr(logging, name.upper())
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(levelname)s %(message)s")


def check_writable(flag: str, path: str | os.PathLike[str] | None) -> None:
    """Refuse, before any work, an output servesim could not or must not replace."""
    if path is not None:
        check_output(path, flag)


def refuse_shared_outputs(
    outputs: list[tuple[str, str | os.PathLike[str] | None]],
    inputs: list[tuple[str, str | os.PathLike[str] | None]] = (),
) -> None:
    """Refuse an output that names a file the run reads (`inputs`: what the file is, path;
    the run would destroy its own input), and two outputs of one run that name the same file
    (one would silently replace the other): `outputs` are (flag, path), None for an output
    not asked for."""
    from ..input_files import refuse_writing_inputs

    refuse_writing_inputs(outputs, inputs)
    claimed: dict[str, str] = {}
    for flag, path in outputs:
        if path is None:
            continue
        real = os.path.realpath(path)
        if real in claimed:
            raise ConfigError(
                f"{flag}: {str(path)!r} is also the file {claimed[real]} writes; give each "
                "output its own path"
            )
        claimed[real] = flag


def check_figure_format(flag: str, path: str | os.PathLike[str] | None) -> None:
    """A figure's format comes from its file's extension (none: PNG); refuse one matplotlib
    cannot write before any work, not after it."""
    if path is None:
        return
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = figure_format(path)
    supported = FigureCanvasBase.get_supported_filetypes()
    if suffix not in supported:
        raise ConfigError(
            f"{flag}: invalid value {str(path)!r}; the figure's format comes from the "
            f"extension, one of: {', '.join(sorted(supported))}"
        )


def figure_format(path: str | os.PathLike[str]) -> str:
    return Path(path).suffix.lstrip(".").lower() or "png"


def check_folder_writable(flag: str, path: str | os.PathLike[str] | None) -> None:
    """The same for an output folder (files are written inside it)."""
    if path is not None:
        check_output_folder(path, flag)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def guarded(fn: Callable[[], None]) -> None:
    """Run a command body; bad input or an unusable output, a broken invariant or an
    interrupt end it with one line on stderr and exit status 2, 3, or 128 + the signal
    number."""
    from ..invariants import InvariantViolation

    try:
        fn()
    except ServesimError as exc:
        # Parsers write one-line messages; a line break that slips through is still shown
        # on one line (the fuzz tests catch the parser that let it through).
        error_line(" ".join(str(exc).splitlines()))
        raise typer.Exit(2) from None
    except InvariantViolation as exc:
        error_line(str(exc))
        raise typer.Exit(INVARIANT_EXIT_CODE) from None
    except KeyboardInterrupt as exc:
        # Commands without their own `interruptible` block (validate, plan, ...) too.
        stopped, untold = to_report(exc)
        if untold:
            error_line(stopped.message())
        raise typer.Exit(stopped.exit_code) from None
    except OSError as exc:
        # Every writer raises OutputError and every reader ConfigError; an OSError that
        # still gets here (a folder a library creates itself) is the environment's, not a
        # bug's: one line, like any other unusable file.
        error_line(os_error_text(exc))
        raise typer.Exit(2) from None


def error_line(text: str) -> None:
    """`error: TEXT` on stderr; a stderr that cannot be written to is not worth a traceback."""
    with contextlib.suppress(OSError):
        typer.echo(f"error: {text}", err=True)


def os_error_text(exc: OSError) -> str:
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return reason
    return f"{str(exc.filename)!r}: {reason}"


INVARIANT_EXIT_CODE = 3


# `validate` and `calibrate` replay recorded servers with prefix caching as each server had it.
PrefixCachingOverride = Annotated[
    bool | None,
    typer.Option(
        "--prefix-caching/--no-prefix-caching",
        metavar="",
        help="override what each recorded server did (default: its configuration, "
        "else vLLM's default, on)",
        show_default=False,
    ),
]
