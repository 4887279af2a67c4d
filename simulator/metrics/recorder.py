"""Append-only logs written during a run; DataFrames are built once at the end."""

from __future__ import annotations

import itertools
import operator
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
# Storage starts narrower than a column's declared type and widens when a value does not fit
# (struct refuses to pack it): most steps' counts fit in a byte or two, and a million
# requests log millions of steps. Readers get the declared type, so values read back the same.
_NARROWEST = {"d": "i", "i": "b", "q": "b"}
_WIDER = {"b": "h", "h": "i", "i": "q", "q": "d"}
_LAST_CODE = {"d": "d", "i": "i", "q": "q"}

# Rows a log holds in its tail before the engine packs them into the typed arrays.
PACK_AFTER_ROWS = 4096


class StepLog:
    """One row per engine step, stored column-wise.

    The engine appends each row to a plain list, `tail`, as one tuple of the stored columns'
    values in `written`'s order: one append per step rather than one per column (the engine
    writes a row every step), and appending to a list costs a third of appending to a typed
    `array`, whose every append parses a format string. `pack()` moves the tail's rows into
    typed arrays, one per column, 1 to 8 bytes a value instead of a pointer plus an int
    object, as a run can log millions of steps; the engine packs whenever the tail reaches
    PACK_AFTER_ROWS rows. A column's array starts at the narrowest type and widens when a
    value needs it.

    Readers use `column(name)` (or the attribute of that name), a NumPy array of the whole
    column, and `len(log)`. Two kinds of column are not stored: the CPU tier's columns of an
    engine without one (all 0), and `itl_regular_gap_us`, which is the step's end minus the
    previous step's end (-1 before the first) plus the output-token processing time, and is
    computed from the stored times with the same floating-point operations the engine would
    have used.

    batch_size counts the requests that got tokens in the step; kv_used_blocks, queue_length
    and running_requests are read at the step's end, after completions.
    """

    __slots__ = ("_packed", "_stored", "_start_base", "_start_last", "otp_us", "tail", "written")

    def __init__(self, has_cpu_tier: bool = False, otp_us: int = 0) -> None:
        self._stored = {**_WRITTEN, **(_CPU_TIER if has_cpu_tier else {})}
        # The names of a tail row's values, in order: the written columns, then the CPU
        # tier's (an engine with one writes them last); the derived gap is not stored.
        self.written: tuple[str, ...] = tuple(self._stored)
        self.tail: list[tuple] = []  # rows not yet packed (emptied in place, never replaced)
        self._packed = {name: array(_NARROWEST[code]) for name, code in self._stored.items()}
        # start_us is stored as the difference from the previous row's start while every start
        # is a whole number (the clock's µs): a run's later steps start past 2**31 µs, which
        # would take eight bytes a row, and consecutive starts are a step apart. `_start_base`
        # is the first start and `_start_last` the last packed one; `_start_base` is None once a
        # start that is not an int has made the column plain times (`_packed` then holds the
        # starts themselves, as every other column holds its values).
        self._packed["start_us"] = array("b")  # differences: most fit in two bytes
        self._start_base: int | None = 0
        self._start_last = 0
        self.otp_us = otp_us

    def __len__(self) -> int:
        return len(self._packed["start_us"]) + len(self.tail)

    def pack(self) -> None:
        """Move the tail's rows to the end of the typed arrays, a column each."""
        rows = self.tail
        if not rows:
            return
        packed = self._packed
        columns = list(zip(*rows, strict=True))
        columns[0] = self._start_tail_as_deltas(columns[0])  # start_us, the first written
        for name, values in zip(self.written, columns, strict=True):
            column = packed[name]
            # struct converts a batch in one C call, cheaper per value than array.fromlist
            # (which parses the format per item, as append does) or NumPy (benchmarks/
            # instructions.py measures it); a typecode's native format is its item layout.
            try:
                column.frombytes(struct.pack(f"{len(values)}{column.typecode}", *values))
            except struct.error:
                self._widen_and_pack(name, values)
        rows.clear()

    def _start_tail_as_deltas(self, starts: tuple) -> tuple | list:
        """The tail's starts as they are stored: their differences from the previous start
        (the first row's from itself), or the starts themselves once the column is plain,
        which it becomes for good when a start is not an int (a fractional time: the
        differences of floats would not add back exactly)."""
        if self._start_base is None:
            return starts
        if set(map(type, starts)) != {int}:
            packed_starts = self._starts_packed()
            self._packed["start_us"] = array("d", packed_starts.tolist())
            self._start_base = None
            return starts
        if not self._packed["start_us"]:
            self._start_base = self._start_last = starts[0]
        previous = self._start_last
        self._start_last = starts[-1]
        return list(map(operator.sub, starts, itertools.chain((previous,), starts)))

    def _starts_packed(self) -> np.ndarray:
        """The packed rows' starts, as int64 (delta storage) or as stored (plain)."""
        column = self._packed["start_us"]
        if self._start_base is None:
            return np.array(column, dtype=np.float64)
        return self._start_base + np.cumsum(np.array(column, dtype=np.int64))

    def _widen_and_pack(self, name: str, tail: list) -> None:
        """Pack `tail` into a wider array than the column's: the next type up that holds
        every value (a float, a fractional time, goes to "d"; beyond the declared type
        struct raises as an array of that type would)."""
        last = _LAST_CODE[self._stored[name]]
        code = self._packed[name].typecode
        while code != last:
            code = _WIDER[code]
            try:
                packed = struct.pack(f"{len(tail)}{code}", *tail)
            except struct.error:
                continue
            column = array(code, self._packed[name])
            column.frombytes(packed)
            self._packed[name] = column
            return
        struct.pack(f"{len(tail)}{last}", *tail)  # raises, as packing into the declared type did

    def column(self, name: str) -> np.ndarray:
        """The whole column (a copy), packing the tail first."""
        if name == "itl_regular_gap_us":
            ends_us = self.column("start_us") + self.column("step_us")
            previous_ends_us = np.concatenate(([-1.0], ends_us[:-1]))
            return ends_us - previous_ends_us + self.otp_us
        if name not in self._stored:
            if name not in _CPU_TIER:
                raise KeyError(f"no step column {name!r}; columns: {', '.join(STEP_COLUMNS)}")
            return np.zeros(len(self), dtype=np.intc)
        self.pack()
        if name == "start_us":
            return self._starts_packed().astype(np.float64)
        return np.array(self._packed[name], dtype=_NUMPY_TYPE[self._stored[name]])

    def itl_regular_counted(self, chunk_rows: int = 1 << 18) -> tuple[np.ndarray, np.ndarray]:
        """The regular inter-token gaps as (distinct gaps, how many tokens saw each), both
        int64, the gaps sorted: what `itl_regular_gap_us` and `itl_regular_count` hold,
        reduced `chunk_rows` rows at a time so that memory stays a few chunks' worth however
        long the log is. Each gap is computed as `column("itl_regular_gap_us")` computes it
        and truncated to an integer as `np.asarray(gaps, dtype=np.int64)` does."""
        self.pack()
        total = len(self)
        distinct, counts = [], []
        previous_end_us = -1.0
        start_col, step_col = self._packed["start_us"], self._packed["step_us"]
        count_col = self._packed["itl_regular_count"]
        deltas = self._start_base is not None
        start = self._start_base  # before the chunk's first row, in delta storage
        for lo in range(0, total, chunk_rows):
            hi = min(total, lo + chunk_rows)
            if deltas:
                starts_us = start + np.cumsum(np.array(start_col[lo:hi], dtype=np.int64))
                start = int(starts_us[-1])
            else:
                starts_us = start_col[lo:hi]
            ends_us = np.array(starts_us, dtype=np.float64) + np.array(
                step_col[lo:hi], dtype=np.float64
            )
            previous_ends_us = np.concatenate(([previous_end_us], ends_us[:-1]))
            previous_end_us = ends_us[-1]
            gaps = np.asarray(ends_us - previous_ends_us + self.otp_us, dtype=np.int64)
            values, total_counts = distinct_counts(gaps, np.array(count_col[lo:hi], dtype=np.int64))
            distinct.append(values)
            counts.append(total_counts)
        if not distinct:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return distinct_counts(np.concatenate(distinct), np.concatenate(counts))

    def regular_gaps_of_runs(self, start_rows: np.ndarray, last_end_us: np.ndarray) -> np.ndarray:
        """The regular gaps (int64, one per gap, as `itl_regular_counted` counts them) of runs
        of consecutive token steps (engine/itl_pool.py): a run that started at row `s` and
        whose last token came at the step ending at `e` saw the gap of every row after `s` up
        to the first row from `s` on that ends at `e`."""
        if not len(start_rows):
            return np.zeros(0, dtype=np.int64)
        gaps = np.asarray(self.column("itl_regular_gap_us"), dtype=np.int64)
        ends_us = self.column("start_us") + self.column("step_us")
        # Half a microsecond of slack: a step ends a whole number of µs after it starts, and
        # only a blocking reload makes a time fractional.
        last_rows = np.maximum(start_rows, np.searchsorted(ends_us, last_end_us - 0.5))
        lengths = np.minimum(last_rows, len(gaps) - 1) - start_rows
        lengths = np.maximum(lengths, 0)
        total = int(lengths.sum())
        firsts = np.repeat(start_rows + 1, lengths)
        offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return gaps[firsts + offsets]

    def last_values(self, name: str, count: int) -> list:
        """The last `count` values of a written column (fewer if it is shorter), unpacked."""
        at = self.written.index(name)
        tail = [row[at] for row in self.tail[max(0, len(self.tail) - count) :]]
        if len(tail) >= count:
            return tail
        packed = self._packed[name]
        head = packed[max(0, len(packed) - (count - len(tail))) :]
        if name == "start_us" and self._start_base is not None and head:
            # Differences: walk back from the last packed start.
            starts = [self._start_last]
            for delta in reversed(head[1:]):
                starts.append(starts[-1] - delta)
            head = starts[::-1]
        if self._stored[name] == "d" and packed.typecode != "d":
            head = map(float, head)  # as a "d" array would have given them
        return [*head, *tail]


def distinct_counts(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, summed counts) of a multiset given as values with counts,
    entries with a count of 0 left out; int64 both."""
    keep = counts > 0
    values, counts = values[keep], counts[keep].astype(np.int64)
    if not len(values):
        return values.astype(np.int64), counts
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return values[starts].astype(np.int64), np.add.reduceat(counts, starts)


def _column_attribute(name: str) -> property:
    return property(lambda log: log.column(name), doc=f"The whole {name} column.")


for _name in STEP_COLUMNS:
    setattr(StepLog, _name, _column_attribute(_name))
