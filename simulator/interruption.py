"""What happens when a user stops a command (Ctrl-C = SIGINT, or SIGTERM from a scheduler).

Both signals become one exception, `Interrupted`, raised wherever the program is; outputs are
written atomically (atomic_io), so unwinding never leaves half a file. The command catches
it, says on one line what was lost, and exits with 128 + the signal number (130 for SIGINT,
143 for SIGTERM), the shell's convention for "killed by a signal".
"""

from __future__ import annotations

import contextlib
import signal
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


def _raise_interrupted(signal_number: int, _frame: object) -> None:
    raise Interrupted(signal_number)


@contextlib.contextmanager
def interruptible(describe_loss: Callable[[], str]) -> Iterator[None]:
    """Inside the block SIGINT and SIGTERM raise `Interrupted`; leaving the block through one
    attaches `describe_loss()` (what was not written, what is kept). Outside the main thread
    signal handlers cannot be installed; the block then runs unprotected."""
    try:
        previous = {s: signal.signal(s, _raise_interrupted) for s in HANDLED_SIGNALS}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    except KeyboardInterrupt as exc:
        number = exc.signal_number if isinstance(exc, Interrupted) else signal.SIGINT
        raise Interrupted(number, describe_loss()) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def ignore_interrupts_in_worker() -> None:
    """Process-pool initializer: the parent alone decides what an interrupt means (a terminal's
    Ctrl-C reaches every process of the group; workers would each print a traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
