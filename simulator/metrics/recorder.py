"""Append-only logs written during a run; DataFrames are built once at the end."""

from __future__ import annotations

import struct
from array import array

import numpy as np

# Columns the engine writes every step, with their packed storage: "d" for times (integers,
# exact below 2**53, except with blocking CPU-tier reloads, whose durations are fractional),
# "q" for running totals, "i" for per-step counts.
_WRITTEN: dict[str, str] = {
    "start_us": "d",
    "step_us": "d",
    "batch_size": "i",
    "prefill_tokens": "i",
    "decode_tokens": "i",
    "kv_used_blocks": "i",
    "queue_length": "i",
    "running_requests": "i",
    "preemptions": "q",
    # Inter-token gaps: in a step every request that also got a token in the previous step
    # sees the same gap (itl_regular_gap_us, below), so they are counted per step, not stored
    # per token.
    "itl_regular_count": "i",
}
# Written only by an engine with a CPU tier; always 0 without one.
_CPU_TIER: dict[str, str] = {"cpu_kv_used_blocks": "i", "reloading_requests": "i"}
# Every column a reader can ask for, in the log's order.
STEP_COLUMNS: tuple[str, ...] = (
    *_WRITTEN,
    *_CPU_TIER,
    "itl_regular_gap_us",
)
_NUMPY_TYPE = {"d": np.float64, "i": np.intc, "q": np.int64}

# Rows a log holds in its tail lists before the engine packs them into the typed arrays.
PACK_AFTER_ROWS = 4096


class StepLog:
    """One row per engine step, stored column-wise.

    The engine appends each row to plain lists, one per column (`tail_<column>`): appending an
    int to a list costs a third of appending it to a typed `array`, whose every append parses a
    format string, and the engine writes a row every step. `pack()` moves the tails into typed
    arrays, 4 or 8 bytes a value instead of a pointer plus an int object, as a run can log
    millions of steps; the engine packs whenever a tail reaches PACK_AFTER_ROWS rows.

    Readers use `column(name)` (or the attribute of that name), a NumPy array of the whole
    column, and `len(log)`. Two kinds of column are not stored: the CPU tier's columns of an
    engine without one (all 0), and `itl_regular_gap_us`, which is the step's end minus the
    previous step's end (-1 before the first) plus the output-token processing time, and is
    computed from the stored times with the same floating-point operations the engine would
    have used.

    batch_size counts the requests that got tokens in the step; kv_used_blocks, queue_length
    and running_requests are read at the step's end, after completions.
    """

    # A tail per column an engine may write; the derived gap has none.
    __slots__ = (
        "_packed",
        "_stored",
        "otp_us",
        *(f"tail_{name}" for name in (*_WRITTEN, *_CPU_TIER)),
    )

    def __init__(self, has_cpu_tier: bool = False, otp_us: int = 0) -> None:
        self._stored = {**_WRITTEN, **(_CPU_TIER if has_cpu_tier else {})}
        self._packed = {name: array(code) for name, code in self._stored.items()}
        self.otp_us = otp_us
        for name in (*_WRITTEN, *_CPU_TIER):
            setattr(self, f"tail_{name}", [])

    def __len__(self) -> int:
        return len(self._packed["start_us"]) + len(self.tail_start_us)

    def pack(self) -> None:
        """Move every tail's rows to the end of its typed array."""
        if not self.tail_start_us:
            return
        for name, code in self._stored.items():
            tail = getattr(self, f"tail_{name}")
            # struct converts half as many instructions a value as array.fromlist (which goes
            # through the same format parsing as append) or NumPy; the native format of a
            # typecode is the array's own item layout.
            self._packed[name].frombytes(struct.pack(f"{len(tail)}{code}", *tail))
            tail.clear()

    def column(self, name: str) -> np.ndarray:
        """The whole column (a copy), packing the tails first."""
        if name == "itl_regular_gap_us":
            ends_us = self.column("start_us") + self.column("step_us")
            previous_ends_us = np.concatenate(([-1.0], ends_us[:-1]))
            return ends_us - previous_ends_us + self.otp_us
        if name not in self._stored:
            if name not in _CPU_TIER:
                raise KeyError(f"no step column {name!r}; columns: {', '.join(STEP_COLUMNS)}")
            return np.zeros(len(self), dtype=np.intc)
        self.pack()
        packed = self._packed[name]
        return np.array(packed, dtype=_NUMPY_TYPE[packed.typecode])

    def last_values(self, name: str, count: int) -> list:
        """The last `count` values of a written column (fewer if it is shorter), unpacked."""
        tail = getattr(self, f"tail_{name}")
        if len(tail) >= count:
            return tail[len(tail) - count :]
        packed = self._packed[name]
        return [*packed[max(0, len(packed) - (count - len(tail))) :], *tail]


def _column_attribute(name: str) -> property:
    return property(lambda log: log.column(name), doc=f"The whole {name} column.")


for _name in STEP_COLUMNS:
    setattr(StepLog, _name, _column_attribute(_name))
