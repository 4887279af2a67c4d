"""`servesim` command line: the program's entry point (`main`).

The typer app and the core commands live in `commands`, which registers the other command
modules (`calibrate`, `convert`, `observe`, `plan`, `plot`, `sweep`); the flags `run` and
`replay` share are in `flags` and `blis`, the helpers every command uses in `common`. A
command module never imports `commands`, nor this module. This module stays light on
purpose: `main` must install the signal handlers and the stdout guard before typer and the
simulator are imported, which takes most of a second, so that Ctrl-C at any moment gives one
line on stderr and status 130 (SIGTERM: 143), never a traceback. Names such as
`simulator.cli.app` still resolve: they are looked up in `commands` (then `common` and
`flags`) on first use.

Exit statuses: 0 success; 2 bad input or an unusable output (one `error:` line); 3 a broken
invariant; 128 + N stopped by signal N (130 SIGINT, 143 SIGTERM); 141 (128 + SIGPIPE) when the
reader of stdout went away (`servesim run | head -1`): no message, the rest of the output is
dropped and the command still finishes writing its files.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..interruption import Stop

READER_GONE_EXIT_CODE = 141  # 128 + SIGPIPE, what a shell shows for a closed pipe


def main() -> None:
    """Console-script entry point (`servesim`, and `python -m simulator.cli`)."""
    from ..collector import fewer_collections_for_this_process, skip_the_final_collection
    from ..interruption import Interrupted, stopping_on_signals  # standard library only

    fewer_collections_for_this_process()
    # numpy's BLAS would start a thread per core on import, for matrix products servesim
    # never makes large enough to share (docs/performance.md, "What makes it fast"); a user's own
    # setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # pydantic looks for plugins (observability hooks servesim has none of) by scanning every
    # installed distribution's entry points the first time a model validates: 5-15 ms of each
    # start. A user's own setting wins.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

    with stopping_on_signals(then_ignore=True) as stop:
        status = _run_app(stop)
        if stop.first is not None:
            if not stop.reported:
                stop.reported = True
                _error_line(Interrupted(stop.first).message())
            status = 128 + stop.first
    skip_the_final_collection()
    sys.exit(status)


def _run_app(stop: Stop) -> int:
    """Run the command line; its exit status. An interrupt anywhere in here (also while the
    modules load, or after the command returned) is recorded in `stop`, for `main` to report
    once; from the moment the status is decided, signals are ignored."""
    status = 0
    try:
        stop.release()  # a signal that came while the handlers were installed comes here
        if stop.first is not None:  # recorded there (where signals cannot be held)
            raise KeyboardInterrupt  # recorded below; the first signal stays `first`
        from ..atomic_io import guard_stdout
        from ..errors import ServesimError

        stdout = guard_stdout()
        try:
            from .commands import app_for

            command_line = app_for(sys.argv[1:])
            empty = empty_path_option(command_line, sys.argv[1:])
            if empty is not None:
                _error_line(
                    f"{empty}: invalid value ''; give a path (an empty value names no file or "
                    "folder, and would mean the current folder)"
                )
                status = 2
            else:
                status = _run_command_line(command_line)
        except SystemExit as exc:
            status = _exit_status(exc.code)
        except ServesimError as exc:  # stdout failing outside a command (typer's --help)
            _error_line(str(exc))
            status = 2
        try:
            sys.stdout.flush()  # what is still buffered, so that a failure counts
        except ServesimError as exc:
            _error_line(str(exc))
            status = status or 2
        if status == 0 and stdout.reader_gone:
            status = READER_GONE_EXIT_CODE
        stop.closed = True
    except KeyboardInterrupt as exc:
        stop.record(exc)
        stop.closed = True
    return status


def _run_command_line(command_line: Any) -> int:
    """The exit status of the command typer parses from the command line."""
    usage_error, abort = _usage_exceptions()
    try:
        # Not standalone: a usage error comes back here, to be told in one line rather
        # than typer's boxed message.
        returned = command_line(standalone_mode=False)
    except usage_error as exc:
        _error_line(usage_error_text(exc, sys.argv[1:]))
        return exc.exit_code
    except abort:  # typer's answer to end-of-input at a prompt
        return 1
    return returned if isinstance(returned, int) else 0


def empty_path_option(command_line: Any, argv: list[str]) -> str | None:
    """The path option or positional path argument given an empty value (`--out ''`,
    `--out=`, `servesim run ''`), None if none is: the command line turns '' into the path
    '.', the current folder, so an output would land there unasked (or an input be looked
    for there). Looked up only when an empty value is on the line (building the command's
    options again costs start-up)."""
    if "" not in argv and not any(a.startswith("--") and a.endswith("=") for a in argv):
        return None
    from pathlib import PurePath

    import typer.main

    command = typer.main.get_command(command_line)
    depth = 0  # down the command groups named on the line (`convert preset`)
    while depth < len(argv):
        sub = getattr(command, "commands", {}).get(argv[depth])
        if sub is None:
            break
        command = sub
        depth += 1
    path_options: set[str] = set()
    valued_options: set[str] = set()  # options that take the next word as their value
    known_options: set[str] = {"--help", "-h"}
    # Per positional argument, in order: its name as the usage line gives it, if a path.
    path_arguments: list[str | None] = []
    for param in getattr(command, "params", []):
        descriptor = getattr(param, "type_descriptor", None)  # typer's own click
        annotation = getattr(descriptor, "annotation", None)
        click_path = type(getattr(param, "type", None)).__name__ == "Path"  # the click package
        # A repeatable option's annotation is list[Path]: its items are paths too.
        item = (getattr(annotation, "__args__", None) or (annotation,))[0]
        is_path = (isinstance(item, type) and issubclass(item, PurePath)) or click_path
        kind = getattr(param, "param_type_name", "")
        if kind == "option":
            known_options.update(param.opts, getattr(param, "secondary_opts", ()))
            if is_path:
                path_options.update(param.opts)
            if not getattr(param, "is_flag", False) and not getattr(param, "count", False):
                valued_options.update(param.opts)
        elif kind == "argument":
            path_arguments.append(str(param.name).upper() if is_path else None)
    positional = 0
    after_valued = False
    for i, word in enumerate(argv[depth:], start=depth):
        name, equals, value = word.partition("=")
        if equals and not value and name in path_options:
            return name
        if word == "" and i > 0 and argv[i - 1] in path_options:
            return argv[i - 1]
        if after_valued:
            after_valued = False
            continue
        if word.startswith("-") and word != "-":
            if name not in known_options:
                return None  # an unknown option: the command line tells that first
            after_valued = word in valued_options
            continue
        if word == "" and positional < len(path_arguments) and path_arguments[positional]:
            return path_arguments[positional]
        positional += 1
    return None


def _usage_exceptions() -> tuple[type[Exception], type[Exception]]:
    """The exception types of a usage error (from the click typer uses: its own copy in
    recent typers, the click package before) and of an abort."""
    import typer.core

    click = getattr(typer.core, "_click", None) or typer.core.click
    return click.exceptions.ClickException, typer.Abort


def usage_error_text(exc: Any, argv: list[str] | None = None) -> str:
    """One line for a usage error: a value an option's type refused is named with the
    value (`--rate: invalid value 'abc'; input should be a valid number, ...`), and every
    message ends with where the command's help is (for an error raised without the
    command's context, the command named first on `argv`)."""
    param = getattr(exc, "param", None)
    errors = getattr(exc.__cause__, "errors", None)  # pydantic's, when typer coerced
    errors = errors() if param is not None and callable(errors) else []
    if errors:
        first = errors[0]
        name = (
            max(param.opts, key=len)
            if getattr(param, "param_type_name", "") == "option" and param.opts
            else param.human_readable_name
        )
        reason = first.get("msg", "")
        text = f"{name}: invalid value {first.get('input')!r}; {reason[:1].lower()}{reason[1:]}"
    elif getattr(exc, "option_name", None) in _refused_blis_flags():
        # A BLIS flag servesim does not take: why, rather than the nearest name's guess.
        name = exc.option_name
        text = f"{name}: a BLIS flag servesim does not take ({_refused_blis_flags()[name]})"
    else:
        # A command group called without its command prints its help and raises with no
        # message (bare `servesim`, `servesim convert`).
        text = exc.format_message().rstrip(".") or "missing command"
    ctx = getattr(exc, "ctx", None)
    if ctx is not None and ctx.help_option_names:
        text += f"; see '{ctx.command_path} {ctx.help_option_names[0]}'"
    else:  # e.g. an option missing its value, or given one it does not take
        words = [w for w in (argv or [])[:1] if not w.startswith("-")]
        text += f"; see '{' '.join(['servesim', *words])} -h'"
    return " ".join(text.split())


def _refused_blis_flags() -> dict[str, str]:
    from .blis import REFUSED_BLIS_FLAGS

    return REFUSED_BLIS_FLAGS


def _exit_status(code: Any) -> int:
    """`sys.exit(code)`'s status: None is 0, a message is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    _error_line(str(code))
    return 1


def _error_line(text: str) -> None:
    try:
        sys.stderr.write(f"error: {text}\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # stderr closed (None, or gone): nothing
        pass  # left to tell


def __getattr__(name: str) -> Any:
    # `from simulator.cli import app` (tests, notebooks): the commands load on first use.
    if name.startswith("__"):
        raise AttributeError(name)
    from importlib import import_module

    for module in _LAZY_MODULES:
        value = getattr(import_module(f"{__name__}.{module}"), name, _MISSING)
        if value is not _MISSING:
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Where `simulator.cli.NAME` is looked up, in order (`commands` loads the other two).
_LAZY_MODULES = ("commands", "common", "flags")
_MISSING = object()
