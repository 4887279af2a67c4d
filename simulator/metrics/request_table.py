"""Finished requests as compact rows: typed arrays, not objects.

A `Request` object costs over a kilobyte once its timestamps and prompt description are
counted, and a million finished ones would keep a gigabyte alive for nothing but the results.
When a request leaves the system for good, the cluster copies what results read into a
`RequestTable` (one typed array per numeric field, small integer codes for repeated strings)
and lets the object go. `RequestRow` is a two-slot view that reads one row back with the
same attribute names and values as the object had, so results, invariants and reports take
rows and live requests alike; `RequestRecords` lists both in arrival (injection) order.

A table made for a PD run (`track_pd`) also keeps, with each disaggregated parent's row, what
the PD results read of its two sub-requests and its place in the disaggregator's order;
`SubRow` reads a sub-request back and `ParentRecords` lists the parents in that order.
"""

from __future__ import annotations

import itertools
import struct
from array import array
from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter

import numpy as np

from simulator.engine.request import Request, RequestState, group_prefix_tokens

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
    "client_wait_us": "q",
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
    "adapter",  # the LoRA adapter asked for: a replay of an exported trace needs it
)
_BOOL_FIELDS = frozenset(f for f, code in NUMERIC_FIELDS.items() if code == "b")
_EXACT_TYPE = {"q": int, "d": float, "b": bool}
# Integer columns are stored in the narrowest type that holds their values so far (most
# counts fit in a byte or two, timestamps need eight) and widen when a value does not fit;
# readers get int64. A million finished requests keep about half the bytes this way.
_WIDER = {"b": "h", "h": "i", "i": "q"}
_NARROWEST = {"q": "b", "d": "d", "b": "b"}
_NUMPY_TYPE = {"q": np.int64, "d": np.float64, "b": np.int8}

# PD parents: per sub-request field, the parent's field it nearly always equals (the parent
# takes its enqueue and schedule times from its prefill, its tokens and completion from its
# decode; the prefill ends where the transfer starts): a sub-request's value is stored as
# its difference from that (0, one byte), or as itself where there is none. A value that is
# not an int (a fractional time) turns its column into a plain list of the values themselves.
PD_SUB_FIELDS: dict[str, dict[str, str | None]] = {
    "prefill": {
        "enqueue_us": "enqueue_us",
        "first_schedule_us": "first_schedule_us",
        "schedule_us": "schedule_us",
        "first_token_us": "transfer_start_us",
        "last_token_us": "transfer_start_us",
        "completion_us": "transfer_start_us",
        "generated_tokens": None,
        "preemptions": None,
        "cached_tokens": "cached_tokens",
        "private_from_token": "private_from_token",
    },
    "decode": {
        "enqueue_us": "transfer_end_us",
        "first_schedule_us": "first_token_us",
        "schedule_us": "first_token_us",
        "first_token_us": "first_token_us",
        "last_token_us": "last_token_us",
        "completion_us": "completion_us",
        "generated_tokens": "generated_tokens",
        "preemptions": "preemptions",
        "cached_tokens": None,
        "private_from_token": "private_from_token",
    },
}
# Strings and flags of each sub-request; its state is None when the parent never had it.
PD_SUB_CODED = ("state", "instance_id")
PD_SUB_FLAGS = ("length_capped",)
# The parent's own PD fields the main columns lack: its place in the disaggregator's order
# (-1: not disaggregated), the decode instance chosen for it, and its private-content mark.
PD_PARENT_FIELDS = ("pd_ordinal", "decode_instance_index", "private_from_token")
# A sub-request's attributes that are its parent's (`Request.sub_request` copies them).
SUB_FROM_PARENT = (
    "index",
    "arrival_us",
    "input_tokens",
    "deadline_us",
    "slo_class",
    "tenant_id",
    "model",
    "client_id",
    "session_id",
    "round_index",
    "prefix_group",
    "streaming",
)


def extend_widening(column: array, values: Sequence[int], widest: str) -> array:
    """`column` extended by the integers `values`, widened (a new array) as far as they need,
    up to `widest`; beyond that the OverflowError propagates as from an array of that type."""
    # struct packs a whole batch in one C call, cheaper per value than array.extend (as the
    # step log's pack does; benchmarks/instructions.py measures it); it refuses a value the
    # type cannot hold, and the column widens.
    while True:
        try:
            column.frombytes(struct.pack(f"{len(values)}{column.typecode}", *values))
            return column
        except struct.error:
            if column.typecode == widest:
                column.extend(array(widest, values))  # raises OverflowError, as the type does
                return column
            column = array(_WIDER[column.typecode], column)


class StringColumn(Sequence):
    """Strings stored as one UTF-8 buffer and the end offset of each (about 4 bytes plus
    its characters a string, against some 70 for a short `str` object and its pointer);
    reading one decodes it, equal to what was stored. A value that is not a `str` turns the
    column into a plain list from then on."""

    def __init__(self) -> None:
        self._blob = bytearray()
        self._ends = array("i")
        self._list: list | None = None

    def __len__(self) -> int:
        return len(self._ends) if self._list is None else len(self._list)

    def append(self, value) -> None:
        self.extend((value,))

    def extend(self, values: Sequence) -> None:
        if self._list is None:
            if set(map(type, values)) <= {str}:
                encoded = [v.encode("utf-8", "surrogatepass") for v in values]
                ends = list(itertools.accumulate(map(len, encoded), initial=len(self._blob)))
                self._blob += b"".join(encoded)
                self._ends = extend_widening(self._ends, ends[1:], "q")
                return
            self._list = list(self)
            self._blob, self._ends = bytearray(), array("i")
        self._list.extend(values)

    def _at(self, i: int):
        if self._list is not None:
            return self._list[i]
        ends = self._ends
        if i < 0:
            i += len(ends)
        start = ends[i - 1] if i > 0 else 0
        return self._blob[start : ends[i]].decode("utf-8", "surrogatepass")

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._at(k) for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError("string column index out of range")
        return self._at(i)

    def __iter__(self) -> Iterator:
        if self._list is not None:
            return iter(self._list)
        return map(self._at, range(len(self._ends)))


def _extend_column(column: array | list, declared: str, values: Sequence) -> array | list:
    """`column` (a typed array, or a list once it met a value of another type) extended by
    `values`; returns the column, a new object if it had to widen or become a list."""
    if type(column) is array:
        if set(map(type, values)) == {_EXACT_TYPE[declared]}:
            if declared == "q":
                return extend_widening(column, values, "q")
            column.extend(values)
            return column
        # A value of another type (a fractional timestamp): keep the column as objects.
        column = list(column)
    column.extend(values)
    return column


class _Codes:
    """A coded string column: small integer codes into the list of distinct values."""

    __slots__ = ("codes", "values", "_lookup")

    def __init__(self) -> None:
        self.codes = array("b")
        self.values: list = []
        self._lookup: dict = {}

    def extend(self, values: Sequence) -> None:
        lookup = self._lookup
        for value in set(values) - lookup.keys():
            lookup[value] = len(self.values)
            self.values.append(value)
        self.codes = extend_widening(self.codes, list(map(lookup.__getitem__, values)), "i")

    def __getitem__(self, i: int):
        return self.values[self.codes[i]]

    def code_of(self, value) -> int:
        """The code of `value`, or -1 if no row has it."""
        return self._lookup.get(value, -1)


class RequestTable:
    """Append-only columns of finished requests; `seq` is each one's injection ordinal.

    Appends go to a short buffer of tuples (one C-level attribute read per request) that is
    moved into the columns in bulk, column by column, every `FLUSH_ROWS` rows and before any
    read.
    """

    FLUSH_ROWS = 4096

    def __init__(self) -> None:
        self.seq = array("q")
        self.request_id = StringColumn()
        self.numeric = {name: array(_NARROWEST[code]) for name, code in NUMERIC_FIELDS.items()}
        self.codes = {name: array("b") for name in CODED_FIELDS}
        self.values: dict[str, list] = {name: [] for name in CODED_FIELDS}
        self._lookup: dict[str, dict] = {name: {} for name in CODED_FIELDS}
        self._object_fields = [n for n in NUMERIC_FIELDS if n != "group_prefix_tokens"]
        self._read = attrgetter("request_id", *self._object_fields, *CODED_FIELDS)
        self._pending: list[tuple] = []
        # The PD columns, in a PD run (`track_pd`).
        self.pd: PDColumns | None = None

    def track_pd(self, retire: Callable[[Request], int]) -> PDColumns:
        """Keep PD parents' sub-requests with their rows from now on (before any append).
        `retire(parent)` is called as a disaggregated parent becomes a row, once its fields
        are read, and returns the parent's ordinal in the disaggregator's order."""
        if len(self):
            raise ValueError("track_pd before the first row")
        self.pd = PDColumns(self, retire)
        return self.pd

    def __len__(self) -> int:
        return len(self.seq) + len(self._pending)

    def append(self, req: Request, seq: int) -> None:
        """Copy `req` (finished, in a final state) as row len(self)."""
        pending = self._pending
        if self.pd is None:
            pending.append((seq, group_prefix_tokens(req), *self._read(req)))
        else:
            pending.append((seq, group_prefix_tokens(req), *self._read(req), *self.pd.read(req)))
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
        end = 3 + n_numeric + len(CODED_FIELDS)
        for name, values in zip(CODED_FIELDS, columns[3 + n_numeric : end], strict=True):
            lookup = self._lookup[name]
            for value in set(values) - lookup.keys():
                lookup[value] = len(self.values[name])
                self.values[name].append(value)
            codes = list(map(lookup.__getitem__, values))
            self.codes[name] = extend_widening(self.codes[name], codes, "i")
        if self.pd is not None:
            pending_main = dict(zip(self._object_fields, columns[3 : 3 + n_numeric], strict=True))
            self.pd.flush(columns[end:], pending_main)

    def _extend(self, name: str, values: tuple) -> None:
        self.numeric[name] = _extend_column(self.numeric[name], NUMERIC_FIELDS[name], values)

    def row(self, i: int) -> RequestRow:
        self.flush()
        return RequestRow(self, i)


class PDColumns:
    """What a PD run's results read of each row's sub-requests, and the parent's own PD
    fields (`PD_PARENT_FIELDS`), one entry per row of the table. A row that was not
    disaggregated has ordinal -1 and no sub-requests (state None)."""

    def __init__(self, table: RequestTable, retire: Callable[[Request], int]) -> None:
        self.table = table
        self.retire = retire
        self.parent: dict[str, array | list] = {name: array("b") for name in PD_PARENT_FIELDS}
        self.sub_fields = list(PD_SUB_FIELDS["prefill"])
        self.numeric: dict[str, array | list] = {}
        self.refs: dict[str, str | None] = {}
        self.raw: set[str] = set()  # columns of values, not differences (a non-int came)
        self.coded: dict[str, _Codes] = {}
        self.flags: dict[str, array | list] = {}
        for role, fields in PD_SUB_FIELDS.items():
            if list(fields) != self.sub_fields:
                raise ValueError("both sub-requests keep the same fields, in the same order")
            for name in PD_SUB_CODED:
                self.coded[f"{role}.{name}"] = _Codes()
            for name in PD_SUB_FLAGS:
                self.flags[f"{role}.{name}"] = array("b")
            for name, ref in fields.items():
                self.numeric[f"{role}.{name}"] = array("b")
                self.refs[f"{role}.{name}"] = ref
        self._read_sub = attrgetter(*PD_SUB_CODED, *PD_SUB_FLAGS, *self.sub_fields)
        self._missing = (
            (None,) * len(PD_SUB_CODED) + (False,) * len(PD_SUB_FLAGS) + (0,) * len(self.sub_fields)
        )

    def read(self, req: Request) -> tuple:
        """The PD part of `req`'s row (a disaggregated parent is retired once read)."""
        pre = req.prefill_sub
        if pre is None:
            missing = self._missing
            return (-1, req.decode_instance_index, req.private_from_token, *missing, *missing)
        dec = req.decode_sub
        subs = (*self._read_sub(pre), *(self._missing if dec is None else self._read_sub(dec)))
        return (self.retire(req), req.decode_instance_index, req.private_from_token, *subs)

    def flush(self, columns: Sequence[tuple], main: dict[str, tuple]) -> None:
        """Append the PD parts of a flush's rows (`columns`, as `read` laid them out);
        `main` holds the same rows' values of the main numeric fields."""
        n_parent = len(PD_PARENT_FIELDS)
        parent_values = dict(zip(PD_PARENT_FIELDS, columns[:n_parent], strict=True))
        for name, values in parent_values.items():
            self.parent[name] = _extend_column(self.parent[name], "q", values)
        refs = {**main, **parent_values}
        n_coded, n_flags = len(PD_SUB_CODED), len(PD_SUB_FLAGS)
        width = len(self._missing)
        for k, role in enumerate(PD_SUB_FIELDS):
            block = columns[n_parent + k * width : n_parent + (k + 1) * width]
            states = block[0]
            for name, values in zip(PD_SUB_CODED, block[:n_coded], strict=True):
                self.coded[f"{role}.{name}"].extend(values)
            for name, values in zip(PD_SUB_FLAGS, block[n_coded : n_coded + n_flags], strict=True):
                key = f"{role}.{name}"
                self.flags[key] = _extend_column(self.flags[key], "b", values)
            for name, values in zip(self.sub_fields, block[n_coded + n_flags :], strict=True):
                key = f"{role}.{name}"
                ref = self.refs[key]
                if ref is not None and key not in self.raw:
                    ref_values = refs[ref]
                    if set(map(type, values)) == {int} and set(map(type, ref_values)) == {int}:
                        values = [
                            0 if state is None else value - base
                            for value, base, state in zip(values, ref_values, states, strict=True)
                        ]
                    else:
                        self._to_values(key)
                self.numeric[key] = _extend_column(self.numeric[key], "q", values)

    def _ref_column(self, ref: str) -> array | list:
        column = self.table.numeric.get(ref)
        return column if column is not None else self.parent[ref]

    def _to_values(self, key: str) -> None:
        """Store `key`'s column as values from now on (its differences become values)."""
        base = self._ref_column(self.refs[key])
        self.numeric[key] = [base[i] + d for i, d in enumerate(self.numeric[key])]
        self.raw.add(key)

    def value(self, key: str, i: int):
        """Sub-request field `key` ("prefill.enqueue_us") of row `i`."""
        ref = self.refs[key]
        if ref is None or key in self.raw:
            return self.numeric[key][i]
        return self._ref_column(ref)[i] + self.numeric[key][i]

    def column(self, key: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Sub-request field `key` of every row, or of the rows `rows` selects (rows without
        that sub-request: anything)."""
        values = _as_numpy(self.numeric[key], "q")
        if rows is not None:
            values = values[rows]
        ref = self.refs[key]
        if ref is None or key in self.raw:
            return values
        base = self.table.numeric.get(ref)
        declared = NUMERIC_FIELDS[ref] if base is not None else "q"
        base = _as_numpy(self._ref_column(ref), declared)
        return (base if rows is None else base[rows]) + values

    def present(self, role: str) -> np.ndarray:
        """Rows whose parent had a `role` sub-request."""
        states = self.coded[f"{role}.state"]
        missing = states.code_of(None)
        codes = np.asarray(states.codes, dtype=np.int64)
        return codes != missing if missing >= 0 else np.ones(len(codes), dtype=bool)


def _as_numpy(column: array | list, declared: str) -> np.ndarray:
    if type(column) is array:  # its declared type, whatever width it is stored in
        return np.asarray(column, dtype=_NUMPY_TYPE[declared])
    return np.asarray(column)


def _numeric(name: str):
    if name in _BOOL_FIELDS:
        return property(lambda self: bool(self._table.numeric[name][self._i]))
    return property(lambda self: self._table.numeric[name][self._i])


def _coded(name: str):
    return property(lambda self: self._table.values[name][self._table.codes[name][self._i]])


def _pd_parent(name: str, default):
    def read(self):
        pd = self._table.pd
        if pd is None:
            if default is AttributeError:
                raise AttributeError(f"{name} is kept only for the requests of a PD run")
            return default
        return pd.parent[name][self._i]

    return property(read)


class RequestRow:
    """One finished request read back from a `RequestTable`, attribute for attribute."""

    __slots__ = ("_table", "_i")

    def __init__(self, table: RequestTable, i: int) -> None:
        self._table = table
        self._i = i

    @property
    def request_id(self) -> str:
        return self._table.request_id[self._i]

    def _sub(self, role: str) -> SubRow | None:
        pd = self._table.pd
        if pd is None or pd.coded[f"{role}.state"][self._i] is None:
            return None
        return SubRow(self._table, self._i, role)

    @property
    def prefill_sub(self) -> SubRow | None:
        return self._sub("prefill")

    @property
    def decode_sub(self) -> SubRow | None:
        return self._sub("decode")

    @property
    def disaggregated(self) -> bool:
        return self._sub("prefill") is not None

    decode_instance_index = _pd_parent("decode_instance_index", -1)
    private_from_token = _pd_parent("private_from_token", AttributeError)
    parent = None
    steady = False

    # The object's own definitions, read through this row's attributes.
    is_finished = Request.is_finished
    __repr__ = Request.__repr__


for _name in NUMERIC_FIELDS:
    setattr(RequestRow, _name, _numeric(_name))
for _name in CODED_FIELDS:
    setattr(RequestRow, _name, _coded(_name))


def _sub_field(name: str):
    if name in PD_SUB_FLAGS:
        return property(lambda self: bool(self._table.pd.flags[f"{self.pd_role}.{name}"][self._i]))
    if name in PD_SUB_CODED:
        return property(lambda self: self._table.pd.coded[f"{self.pd_role}.{name}"][self._i])
    return property(lambda self: self._table.pd.value(f"{self.pd_role}.{name}", self._i))


class SubRow:
    """A prefill or decode sub-request of a PD parent kept as a row: its own timestamps,
    counts, state and instance as they were, the rest its parent's (as `sub_request` made
    it). Fields no PD result reads (its KV blocks, progress counters) are not kept."""

    __slots__ = ("_table", "_i", "pd_role")

    def __init__(self, table: RequestTable, i: int, role: str) -> None:
        self._table = table
        self._i = i
        self.pd_role = role

    @property
    def request_id(self) -> str:
        return f"{self._table.request_id[self._i]}_{self.pd_role}"

    @property
    def parent(self) -> RequestRow:
        return RequestRow(self._table, self._i)

    @property
    def output_tokens(self) -> int:
        return 0 if self.pd_role == "prefill" else self._table.numeric["output_tokens"][self._i]

    prefill_sub = None
    decode_sub = None
    disaggregated = False
    steady = False
    is_finished = Request.is_finished
    __repr__ = Request.__repr__


for _name in SUB_FROM_PARENT:
    setattr(SubRow, _name, _numeric(_name) if _name in NUMERIC_FIELDS else _coded(_name))
for _name in (*PD_SUB_CODED, *PD_SUB_FLAGS, *PD_SUB_FIELDS["prefill"]):
    setattr(SubRow, _name, _sub_field(_name))


class _RowsAndLive(Sequence):
    """Rows of a table and live request objects, in an order given by position: p >= 0 is
    table row p, p < 0 is live[-p - 1]."""

    table: RequestTable
    _order: array
    _live: list

    def _set_order(self, keys: np.ndarray, positions: np.ndarray | None) -> None:
        """Positions sorted by `keys` (`positions` None: the keys are the table's rows')."""
        self._order = array("q")
        sort = np.argsort(keys, kind="stable")
        self._order.frombytes(memoryview(sort if positions is None else positions[sort]).cast("B"))

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

    def _ordered(self, table_values: np.ndarray, live_values: list) -> np.ndarray:
        """Per entry in order: its table row's value, or its live object's."""
        order = np.frombuffer(self._order, dtype=np.int64)
        if not live_values:  # every position is a table row: index with them as they are
            return table_values[order]
        live = np.asarray(live_values, dtype=object if table_values.dtype == object else None)
        table_values = np.concatenate([table_values, live])
        return table_values[np.where(order >= 0, order, len(self.table.seq) - order - 1)]

    def column(self, name: str) -> np.ndarray:
        """Main numeric field `name` of every entry, in order (int64, or float64 where a
        value is fractional)."""
        table_values = _as_numpy(self.table.numeric[name], NUMERIC_FIELDS[name])
        return self._ordered(table_values, [getattr(r, name) for r in self._live])


class RequestRecords(_RowsAndLive):
    """Every request that arrived, in injection order: rows of finished ones, objects of
    the rest (still queued or running at the horizon)."""

    def __init__(self, table: RequestTable, live: list[tuple[int, Request]]) -> None:
        table.flush()
        self.table = table
        seqs = np.frombuffer(table.seq, dtype=np.int64)
        if live:
            seqs = np.concatenate([seqs, np.array([s for s, _ in live], np.int64)])
            positions = np.concatenate(
                [np.arange(len(table.seq), dtype=np.int64), -np.arange(1, len(live) + 1)]
            )
            self._set_order(seqs, positions)
        else:  # a million rows: no position array
            self._set_order(seqs, None)
        self._live = [req for _s, req in live]


class ParentRecords(_RowsAndLive):
    """Every PD parent in the disaggregator's order: rows of those that finished, objects of
    the rest."""

    def __init__(self, table: RequestTable, live: list[tuple[int, Request]]) -> None:
        table.flush()
        self.table = table
        ordinals = _as_numpy(table.pd.parent["pd_ordinal"], "q")
        rows = np.flatnonzero(ordinals >= 0)
        keys = np.concatenate([ordinals[rows], np.array([o for o, _ in live], np.int64)])
        positions = np.concatenate([rows.astype(np.int64), -np.arange(1, len(live) + 1)])
        self._set_order(keys, positions)
        self._live = [req for _o, req in live]

    def transfer_ends(self) -> tuple[list, list, list]:
        """Per parent in order: its id, its prefill sub-request's instance ("" without one)
        and the index of the decode instance chosen for it."""
        pd = self.table.pd
        prefill = pd.coded["prefill.instance_id"]
        prefill_ids = np.asarray(
            [v if v is not None else "" for v in prefill.values] + [""], object
        )
        live = self._live
        ids = self._ordered(
            np.array(list(self.table.request_id), dtype=object), [p.request_id for p in live]
        )
        where = self._ordered(
            prefill_ids[np.asarray(prefill.codes, dtype=np.int64)],
            [p.prefill_sub.instance_id if p.prefill_sub is not None else "" for p in live],
        )
        decode = self._ordered(
            _as_numpy(pd.parent["decode_instance_index"], "q"),
            [p.decode_instance_index for p in live],
        )
        return ids.tolist(), where.tolist(), decode.tolist()


def request_columns(records: Sequence, numeric: Sequence[str], coded: Sequence[str] = ()) -> dict:
    """Columns of every request in `records` as numpy arrays (numeric fields int64/float64,
    coded fields object arrays), in the records' order (so a float sum over them does not
    depend on whether the run compacted its finished requests): straight from a
    `RequestRecords` table's columns plus its live requests, or read from request objects
    one by one."""
    if isinstance(records, RequestRecords):
        table, live = records.table, records._live  # noqa: SLF001 - same module family
        out = {}
        for name in numeric:
            column = _as_numpy(table.numeric[name], NUMERIC_FIELDS[name])
            extra = [getattr(r, name) for r in live]
            out[name] = records._ordered(column, extra)  # noqa: SLF001
        for name in coded:
            values = np.asarray(table.values[name] + [None], dtype=object)
            codes = np.asarray(table.codes[name])
            if live:
                extra = [getattr(r, name) for r in live]
                out[name] = records._ordered(values[codes], extra)  # noqa: SLF001
            else:  # order the small codes, then look the values up
                out[name] = values[records._ordered(codes, [])]  # noqa: SLF001
        return out
    out = {name: np.asarray([getattr(r, name) for r in records]) for name in numeric}
    for name in coded:
        out[name] = np.asarray([getattr(r, name) for r in records], dtype=object)
    return out


# --------------------------------------------------------------------------- summaries

_STATES = list(RequestState)
_STATE_CODE = {state: code for code, state in enumerate(_STATES)}
STATS_FIELDS = ("arrival_us", "first_token_us", "schedule_us", "completion_us")


class RequestStats:
    """What a summary reads of a set of requests, as columns: `state` (codes into
    `RequestState`'s members in order) and the timestamps of `STATS_FIELDS`."""

    def __init__(self, state: np.ndarray, **times: np.ndarray) -> None:
        self.state = state
        self.times = times

    def __len__(self) -> int:
        return len(self.state)

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["times"][name]
        except KeyError:
            raise AttributeError(name) from None

    def state_counts(self) -> dict[RequestState, int]:
        tally = np.bincount(self.state, minlength=len(_STATES))
        return {state: int(tally[code]) for code, state in enumerate(_STATES)}

    def is_state(self, state: RequestState) -> np.ndarray:
        return self.state == _STATE_CODE[state]

    def where(self, mask: np.ndarray) -> RequestStats:
        if mask.all():
            return self
        return RequestStats(self.state[mask], **{k: v[mask] for k, v in self.times.items()})

    @staticmethod
    def join(parts: Sequence[RequestStats]) -> RequestStats:
        parts = [p for p in parts if len(p)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return _stats_of_objects([])
        common = [k for k in parts[0].times if all(k in p.times for p in parts)]
        return RequestStats(
            np.concatenate([p.state for p in parts]),
            **{k: np.concatenate([p.times[k] for p in parts]) for k in common},
        )


def _stats_of_objects(requests: Sequence, fields: Sequence[str] = STATS_FIELDS) -> RequestStats:
    state = np.array([_STATE_CODE[r.state] for r in requests], dtype=np.int8)
    if not len(requests):
        return RequestStats(state, **{k: np.zeros(0, dtype=np.int64) for k in fields})
    return RequestStats(state, **{k: np.asarray([getattr(r, k) for r in requests]) for k in fields})


def _state_codes(codes: array, values: list) -> np.ndarray:
    """A coded state column as `RequestState` codes (-1 where there is none), one byte each."""
    lut = np.array([_STATE_CODE.get(v, -1) for v in values] + [-1], dtype=np.int8)
    return lut[np.asarray(codes)]


def _instance_index(codes: array, values: list, instance_ids: Sequence[str]) -> np.ndarray:
    """A coded instance-id column as indices into `instance_ids` (-1: none of them)."""
    index = {iid: k for k, iid in enumerate(instance_ids)}
    lut = np.array([index.get(v, -1) for v in values] + [-1], dtype=np.int32)
    return lut[np.asarray(codes)]


def _main_times(table: RequestTable) -> dict[str, np.ndarray]:
    # Views of the eight-byte columns (no copy): a million requests' summary reads them.
    return {k: _as_numpy(table.numeric[k], NUMERIC_FIELDS[k]) for k in STATS_FIELDS}


def request_stats(records: Sequence, fields: Sequence[str] = STATS_FIELDS) -> RequestStats:
    """`records` (a `RequestRecords` or request objects) as `RequestStats` with the
    timestamps `fields` (of `STATS_FIELDS`), in no particular order. A table's columns come
    as views (no copy); objects are read field by field."""
    if isinstance(records, RequestRecords):
        table = records.table
        rows = RequestStats(
            _state_codes(table.codes["state"], table.values["state"]), **_main_times(table)
        )
        live = _stats_of_objects(records._live, fields)  # noqa: SLF001
        return RequestStats.join([rows, live])
    return _stats_of_objects(records, fields)


class _Served:
    """Per instance, what it served, built when asked (one instance's columns at a time)."""

    def __init__(self, parts: list[tuple[np.ndarray, Callable[[np.ndarray], RequestStats]]]):
        self.parts = parts  # (instance index per row, rows -> their stats)

    def __getitem__(self, k: int) -> RequestStats:
        chosen = []
        for where, take in self.parts:
            rows = where == k
            if rows.any():
                chosen.append(take(rows))
        return RequestStats.join(chosen)


def served_stats(records: Sequence, parents: Sequence, instance_ids: Sequence[str]) -> _Served:
    """Per instance of `instance_ids` (indexed by position), what it served: the requests of
    `records` that were not split into PD sub-requests (rejected ones aside), and the
    sub-requests of `parents`; in no particular order."""
    parts: list[tuple[np.ndarray, Callable[[np.ndarray], RequestStats]]] = []

    def add_objects(requests: list) -> None:
        stats = _stats_of_objects(requests)
        index = {iid: k for k, iid in enumerate(instance_ids)}
        where = np.array([index.get(r.instance_id, -1) for r in requests], dtype=np.int32)
        parts.append((where, stats.where))

    if isinstance(records, RequestRecords):
        table = records.table
        state = _state_codes(table.codes["state"], table.values["state"])
        times = _main_times(table)
        where = _instance_index(
            table.codes["instance_id"], table.values["instance_id"], instance_ids
        )
        where[state == _STATE_CODE[RequestState.REJECTED]] = -1
        if table.pd is not None:
            where[table.pd.present("prefill")] = -1
        parts.append(
            (
                where,
                lambda rows: RequestStats(state[rows], **{k: v[rows] for k, v in times.items()}),
            )
        )
        if table.pd is not None:
            for role in PD_SUB_FIELDS:
                parts.append(_sub_part(table, role, instance_ids))
        live = records._live  # noqa: SLF001
    else:
        live = records
    add_objects([r for r in live if r.state is not RequestState.REJECTED and not r.disaggregated])
    live_parents = parents._live if isinstance(parents, ParentRecords) else parents  # noqa: SLF001
    add_objects([s for p in live_parents for s in (p.prefill_sub, p.decode_sub) if s is not None])
    return _Served(parts)


def _sub_part(table: RequestTable, role: str, instance_ids: Sequence[str]):
    pd = table.pd
    states = pd.coded[f"{role}.state"]
    state = _state_codes(states.codes, states.values)
    ids = pd.coded[f"{role}.instance_id"]
    where = _instance_index(ids.codes, ids.values, instance_ids)
    where[state < 0] = -1  # no such sub-request
    arrival = _as_numpy(table.numeric["arrival_us"], NUMERIC_FIELDS["arrival_us"])

    def take(rows: np.ndarray) -> RequestStats:
        times = {k: pd.column(f"{role}.{k}", rows) for k in STATS_FIELDS if k != "arrival_us"}
        return RequestStats(state[rows], arrival_us=arrival[rows], **times)

    return where, take
