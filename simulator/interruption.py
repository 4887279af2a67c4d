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
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

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
        # The signal mask to restore once the handlers are in place (`stopping_on_signals`).
        self.held: Any = None

    def release(self) -> None:
        """Let the signals held while the handlers were installed through: one that came
        meanwhile is handled now, in the caller (call it inside the `try` that catches it).
        Later calls do nothing."""
        held, self.held = self.held, None
        _restore(held)

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
    main thread signal handlers cannot be installed; the block then runs unprotected.

    The handlers are installed with both signals held pending in this thread (where POSIX
    allows), so none can be handled half-way through, outside any `try`; the block calls
    `Stop.release()` inside its own `try`, and a signal that came meanwhile is handled there
    (recorded, or raised where the block catches it). A block that never releases them gets
    them on leaving. Whatever happens, leaving removes the block's state: a signal escaping
    the `with` line once left every later block interrupted before it began."""
    if threading.current_thread() is not threading.main_thread():
        yield Stop()  # handlers belong to the main thread; this block is not the command's
        return
    if _active:
        yield _active[-1]
        return
    stop = Stop()
    previous: dict[int, Any] = {}
    stop.held = _hold(HANDLED_SIGNALS)
    try:
        _active.append(stop)  # before the handlers, which look it up
        # A signal the caller set to be ignored stays ignored (a shell's background job
        # ignores SIGINT, so a Ctrl-C meant for the script does not stop its jobs).
        wanted = {s: signal.getsignal(s) for s in HANDLED_SIGNALS}
        for number, handler in wanted.items():
            if handler is signal.SIG_IGN:
                continue
            previous[number] = handler  # first: restored on leaving whatever comes next
            try:
                signal.signal(number, _on_signal)
            except KeyboardInterrupt as exc:  # only where signals cannot be held (no POSIX)
                stop.record(exc)
                signal.signal(number, _on_signal)  # again: ours ignore the next ones now
        yield stop
    finally:
        for number, handler in previous.items():
            if then_ignore:
                signal.signal(number, signal.SIG_IGN)
            elif handler is not None:  # None: a handler not set from Python, left as it is
                signal.signal(number, handler)
        if stop in _active:
            _active.remove(stop)
        stop.release()


def _hold(signals: tuple[int, ...]) -> Any:
    """Hold `signals` pending in this thread; the mask to restore, None where a process
    cannot mask signals (then they are handled as they come)."""
    if not signals or not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, signals)


def _restore(mask: Any) -> None:
    """Put back the mask `_hold` returned (a signal held meanwhile is handled now)."""
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextlib.contextmanager
def signals_held(signals: tuple[int, ...]) -> Iterator[None]:
    """Inside the block `signals` wait in this thread (where the platform can hold them)."""
    mask = _hold(signals)
    try:
        yield
    finally:
        _restore(mask)


@contextlib.contextmanager
def interruptible(describe_loss: Callable[[], str]) -> Iterator[None]:
    """Inside the block SIGINT and SIGTERM raise `Interrupted`; leaving the block through one
    attaches `describe_loss()` (what was not written, what is kept), for the first signal."""
    with stopping_on_signals() as stop:
        try:
            stop.release()  # a signal held while the handlers were installed comes here
            if stop.first is not None:
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
