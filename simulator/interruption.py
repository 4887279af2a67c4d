"""What happens when a user stops a command (Ctrl-C = SIGINT, or SIGTERM from a scheduler).

Both signals become one exception, `Interrupted`, raised wherever the program is; outputs are
written atomically (atomic_io), so unwinding never leaves half a file. The command catches
it, says on one line what was lost, and exits with 128 + the signal number (130 for SIGINT,
143 for SIGTERM), the shell's convention for "killed by a signal".

The first signal decides: its name is in the message and its number in the exit status. A
later signal while the command unwinds (a scheduler's SIGTERM after the user's Ctrl-C, or a
second Ctrl-C) is ignored, so it can neither interrupt the clean-up (a temporary file left
behind) nor print a second message or a traceback. SIGKILL still stops a clean-up that hangs.

The CLI's entry point installs the handlers before anything else (`stopping_on_signals`), so
that an interrupt while the simulator's modules are still loading is reported the same way.
This module imports only the standard library for that reason.
"""

from __future__ import annotations

import contextlib
import signal
import types
from collections.abc import Callable, Iterator

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by `signal_number`; `lost` says what that cost (set by the command).

    A KeyboardInterrupt subclass so that code which already cleans up on KeyboardInterrupt
    (or on BaseException) does so for SIGTERM too. Constructed from its args alone, because
    SimPy re-creates an exception raised inside a process as `type(e)(*e.args)`."""

    def __init__(self, signal_number: int, lost: str = "") -> None:
        super().__init__(signal_number, lost)
        self.signal_number = signal_number
        self.lost = lost

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signal_number).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signal_number

    def message(self) -> str:
        lost = f"; {self.lost}" if self.lost else ""
        return f"interrupted by {self.signal_name}{lost}"


class Stop:
    """The signal that stopped the command (`first`), and whether its message was printed."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.reported = False
        self.closed = False  # the command is over: its status is decided

    def record(self, exc: KeyboardInterrupt) -> int:
        """The signal to report for `exc`: the first one received (a KeyboardInterrupt that
        no handler of ours raised counts as SIGINT)."""
        if self.first is None:
            self.first = exc.signal_number if isinstance(exc, Interrupted) else signal.SIGINT
        return self.first


# The handlers in force (nested blocks share the outermost one).
_active: list[Stop] = []


def _on_signal(signal_number: int, frame: types.FrameType | None) -> None:
    # CPython runs a Python-level handler at the next bytecode boundary, and that can be inside
    # the handler of a signal that came just before (a SIGTERM right after a SIGINT, on a busy
    # machine): then `frame` is that handler's, and its signal is the first.
    if frame is not None and frame.f_code is _ON_SIGNAL_CODE:
        signal_number = frame.f_locals.get("signal_number", signal_number)
    stop = _active[-1] if _active else None
    if stop is not None:
        if stop.first is not None or stop.closed:
            return  # the first signal decided; this one must not disturb the clean-up
        stop.first = signal_number
    raise Interrupted(signal_number)


_ON_SIGNAL_CODE = _on_signal.__code__


def active_stop() -> Stop | None:
    """The current `stopping_on_signals` state, or None outside one (in-process callers)."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def stopping_on_signals(then_ignore: bool = False) -> Iterator[Stop]:
    """Inside the block the first SIGINT or SIGTERM raises `Interrupted` and later ones are
    ignored. On leaving, the previous handlers come back, or with `then_ignore` (a program's
    entry point, which exits right after) the signals are ignored: restoring the default
    would let a signal in the last instant print a KeyboardInterrupt traceback. Outside the
    main thread signal handlers cannot be installed; the block then runs unprotected."""
    if _active:
        yield _active[-1]
        return
    stop = Stop()
    _active.append(stop)  # before the handlers, which look it up
    # A signal the caller set to be ignored stays ignored (a shell's background job
    # ignores SIGINT, so a Ctrl-C meant for the script does not stop its jobs).
    previous = {s: signal.getsignal(s) for s in HANDLED_SIGNALS}
    previous = {s: handler for s, handler in previous.items() if handler is not signal.SIG_IGN}
    try:
        _install(stop, list(previous))
    except ValueError:  # not the main thread
        _active.remove(stop)
        yield stop
        return
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            if then_ignore:
                signal.signal(s, signal.SIG_IGN)
            elif handler is not None:  # None: a handler not set from Python, left as it is
                signal.signal(s, handler)
        _active.remove(stop)


def _install(stop: Stop, signals: list[int]) -> None:
    """Put `_on_signal` on `signals`. A signal can arrive between two installations, once
    the first handler is in force: it is recorded in `stop.first` (the caller finds it there
    and does not start its work) rather than raised out of the `with` line, where nothing
    would catch it. Installing a handler twice is harmless, so an interrupt right after an
    installation simply repeats it."""
    while signals:
        try:
            signal.signal(signals[0], _on_signal)
            signals.pop(0)
        except KeyboardInterrupt as exc:
            stop.record(exc)


@contextlib.contextmanager
def interruptible(describe_loss: Callable[[], str]) -> Iterator[None]:
    """Inside the block SIGINT and SIGTERM raise `Interrupted`; leaving the block through one
    attaches `describe_loss()` (what was not written, what is kept), for the first signal."""
    with stopping_on_signals() as stop:
        try:
            if stop.first is not None:  # it came while the handlers were being installed
                raise Interrupted(stop.first)
            yield
        except KeyboardInterrupt as exc:
            number = stop.record(exc)
            raise Interrupted(number, describe_loss()) from None


def signal_of(exc: KeyboardInterrupt) -> int:
    """The signal that ends the command `exc` unwinds: the first one received (a
    KeyboardInterrupt that no handler of ours raised counts as SIGINT)."""
    stop = active_stop()
    if stop is not None:
        return stop.record(exc)
    return exc.signal_number if isinstance(exc, Interrupted) else signal.SIGINT


def to_report(exc: KeyboardInterrupt) -> tuple[Interrupted, bool]:
    """The interruption that ends the command for `exc` (the first signal's, with what `exc`
    says was lost), and whether its message is still to be printed (once per command)."""
    stopped = Interrupted(signal_of(exc), exc.lost if isinstance(exc, Interrupted) else "")
    stop = active_stop()
    if stop is None:
        return stopped, True
    told, stop.reported = stop.reported, True
    return stopped, not told


def ignore_interrupts_in_worker() -> None:
    """Process-pool initializer: the parent alone decides what an interrupt means (a terminal's
    Ctrl-C reaches every process of the group; workers would each print a traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
