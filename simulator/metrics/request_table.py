"""Finished requests as compact rows: typed arrays, not objects.

A `Request` object costs over a kilobyte once its timestamps and prompt description are
counted, and a million finished ones would keep a gigabyte alive for nothing but the results.
When a request leaves the system for good, the cluster copies what results read into a
`RequestTable` (one typed array per numeric field, small integer codes for repeated strings)
and lets the object go. `RequestRow` is a two-slot view that reads one row back with the
same attribute names and values as the object had, so results, invariants and reports take
rows and live requests alike; `RequestRecords` lists both in arrival (injection) order.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from operator import attrgetter

import numpy as np

from simulator.engine.request import Request
from simulator.workload.trace import group_prefix_tokens

# Field -> array typecode: "q" for integers (µs timestamps exceed 32 bits), "d" for floats, "b"
# for flags. A value of another type (a timestamp made fractional by a blocking CPU-tier
# reload) turns its column into a plain list, so every value reads back as it was.
NUMERIC_FIELDS: dict[str, str] = {
    "index": "q",
    "arrival_us": "q",
    "enqueue_us": "q",
    "first_schedule_us": "q",
    "schedule_us": "q",
    "first_token_us": "q",
    "last_token_us": "q",
    "completion_us": "q",
    "input_tokens": "q",
    "output_tokens": "q",
    "max_output_tokens": "q",
    "generated_tokens": "q",
    "computed_tokens": "q",
    "prefill_target": "q",
    "cached_tokens": "q",
    "preemptions": "q",
    "round_index": "q",
    "deadline_us": "q",
    "reroutes": "q",
    "transfer_start_us": "q",
    "transfer_end_us": "q",
    "text_tokens": "q",
    "image_tokens": "q",
    "audio_tokens": "q",
    "video_tokens": "q",
    "kv_reload_us": "q",
    "priority": "d",
    "reason_ratio": "d",
    "length_capped": "b",
    "streaming": "b",
    "dropped_at_decode_kv": "b",
    # What results read of the prompt's segments (the trace writer's prefix length).
    "group_prefix_tokens": "q",
}
# Strings few distinct values repeat across requests: stored as codes into a value list.
CODED_FIELDS = (
    "state",
    "instance_id",
    "slo_class",
    "tenant_id",
    "model",
    "client_id",
    "session_id",
    "prefix_group",
    "pd_role",
)
_BOOL_FIELDS = frozenset(f for f, code in NUMERIC_FIELDS.items() if code == "b")
_EXACT_TYPE = {"q": int, "d": float, "b": bool}
# Integer columns are stored in the narrowest type that holds their values so far (most
# counts fit in a byte or two, timestamps need eight) and widen when a value does not fit;
# readers get int64. A million finished requests keep about half the bytes this way.
_WIDER = {"b": "h", "h": "i", "i": "q"}
_NARROWEST = {"q": "b", "d": "d", "b": "b"}
_NUMPY_TYPE = {"q": np.int64, "d": np.float64, "b": np.int8}


def extend_widening(column: array, values: Sequence[int], widest: str) -> array:
    """`column` extended by the integers `values`, widened (a new array) as far as they need,
    up to `widest`; beyond that the OverflowError propagates as from an array of that type."""
    size = len(column)
    while True:
        try:
            column.extend(values)
            return column
        except OverflowError:
            del column[size:]  # extend appended the values before the one that did not fit
            if column.typecode == widest:
                raise
            column = array(_WIDER[column.typecode], column)


class RequestTable:
    """Append-only columns of finished requests; `seq` is each one's injection ordinal.

    Appends go to a short buffer of tuples (one C-level attribute read per request) that is
    moved into the columns in bulk, column by column, every `FLUSH_ROWS` rows and before any
    read.
    """

    FLUSH_ROWS = 4096

    def __init__(self) -> None:
        self.seq = array("q")
        self.request_id: list[str] = []
        self.numeric = {name: array(_NARROWEST[code]) for name, code in NUMERIC_FIELDS.items()}
        self.codes = {name: array("b") for name in CODED_FIELDS}
        self.values: dict[str, list] = {name: [] for name in CODED_FIELDS}
        self._lookup: dict[str, dict] = {name: {} for name in CODED_FIELDS}
        self._object_fields = [n for n in NUMERIC_FIELDS if n != "group_prefix_tokens"]
        self._read = attrgetter("request_id", *self._object_fields, *CODED_FIELDS)
        self._pending: list[tuple] = []

    def __len__(self) -> int:
        return len(self.seq) + len(self._pending)

    def append(self, req: Request, seq: int) -> None:
        """Copy `req` (finished, in a final state) as row len(self)."""
        pending = self._pending
        pending.append((seq, group_prefix_tokens(req), *self._read(req)))
        if len(pending) >= self.FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Move the buffered rows into the columns."""
        if not self._pending:
            return
        columns = list(zip(*self._pending, strict=True))
        self._pending = []
        self.seq.extend(columns[0])
        self._extend("group_prefix_tokens", columns[1])
        self.request_id.extend(columns[2])
        n_numeric = len(self._object_fields)
        for name, values in zip(self._object_fields, columns[3 : 3 + n_numeric], strict=True):
            self._extend(name, values)
        for name, values in zip(CODED_FIELDS, columns[3 + n_numeric :], strict=True):
            lookup = self._lookup[name]
            for value in set(values) - lookup.keys():
                lookup[value] = len(self.values[name])
                self.values[name].append(value)
            codes = list(map(lookup.__getitem__, values))
            self.codes[name] = extend_widening(self.codes[name], codes, "i")

    def _extend(self, name: str, values: tuple) -> None:
        column = self.numeric[name]
        if type(column) is array:
            declared = NUMERIC_FIELDS[name]
            if set(map(type, values)) == {_EXACT_TYPE[declared]}:
                if declared == "q":
                    self.numeric[name] = extend_widening(column, values, "q")
                else:
                    column.extend(values)
                return
            # A value of another type (a fractional timestamp): keep the column as objects.
            column = self.numeric[name] = list(column)
        column.extend(values)

    def row(self, i: int) -> RequestRow:
        self.flush()
        return RequestRow(self, i)


def _numeric(name: str):
    if name in _BOOL_FIELDS:
        return property(lambda self: bool(self._table.numeric[name][self._i]))
    return property(lambda self: self._table.numeric[name][self._i])


def _coded(name: str):
    return property(lambda self: self._table.values[name][self._table.codes[name][self._i]])


class RequestRow:
    """One finished request read back from a `RequestTable`, attribute for attribute."""

    __slots__ = ("_table", "_i")

    def __init__(self, table: RequestTable, i: int) -> None:
        self._table = table
        self._i = i

    @property
    def request_id(self) -> str:
        return self._table.request_id[self._i]

    # A compacted request was never split into PD sub-requests (PD runs keep objects).
    prefill_sub = None
    decode_sub = None
    parent = None
    disaggregated = False
    steady = False

    # The object's own definitions, read through this row's attributes.
    is_finished = Request.is_finished
    __repr__ = Request.__repr__


for _name in NUMERIC_FIELDS:
    setattr(RequestRow, _name, _numeric(_name))
for _name in CODED_FIELDS:
    setattr(RequestRow, _name, _coded(_name))


class RequestRecords(Sequence):
    """Every request that arrived, in injection order: rows of finished ones, objects of
    the rest (still queued or running at the horizon)."""

    def __init__(self, table: RequestTable, live: list[tuple[int, Request]]) -> None:
        table.flush()
        self.table = table
        # Positions in injection order: p >= 0 is table row p, p < 0 is live[-p - 1].
        seqs = np.concatenate(
            [np.frombuffer(table.seq, dtype=np.int64), np.array([s for s, _ in live], np.int64)]
        )
        positions = np.concatenate(
            [np.arange(len(table.seq), dtype=np.int64), -np.arange(1, len(live) + 1)]
        )
        self._order = array("q")
        self._order.frombytes(positions[np.argsort(seqs, kind="stable")].tobytes())
        self._live = [req for _s, req in live]

    def __len__(self) -> int:
        return len(self._order)

    def _at(self, position: int) -> Request | RequestRow:
        if position >= 0:
            return RequestRow(self.table, position)
        return self._live[-position - 1]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._at(p) for p in self._order[i]]
        return self._at(self._order[i])

    def __iter__(self) -> Iterator[Request | RequestRow]:
        return map(self._at, self._order)


def request_columns(records: Sequence, numeric: Sequence[str], coded: Sequence[str] = ()) -> dict:
    """Columns of every request in `records` as numpy arrays (numeric fields int64/float64,
    coded fields object arrays), in no particular order: straight from a `RequestRecords`
    table's columns plus its live requests, or read from request objects one by one."""
    if isinstance(records, RequestRecords):
        table, live = records.table, records._live  # noqa: SLF001 - same module family
        out = {}
        for name in numeric:
            column = table.numeric[name]
            if type(column) is array:  # its declared type, whatever width it is stored in
                column = np.asarray(column, dtype=_NUMPY_TYPE[NUMERIC_FIELDS[name]])
            else:
                column = np.asarray(column)
            extra = np.asarray([getattr(r, name) for r in live], dtype=column.dtype)
            out[name] = np.concatenate([column, extra]) if len(extra) else column
        for name in coded:
            values = np.asarray(table.values[name] + [None], dtype=object)
            codes = np.asarray(table.codes[name], dtype=np.int64)
            column = values[codes]
            extra = np.asarray([getattr(r, name) for r in live], dtype=object)
            out[name] = np.concatenate([column, extra]) if len(extra) else column
        return out
    out = {name: np.asarray([getattr(r, name) for r in records]) for name in numeric}
    for name in coded:
        out[name] = np.asarray([getattr(r, name) for r in records], dtype=object)
    return out
