"""Reading a TraceV2/v3 CSV: the column-at-a-time conversion gives the row-by-row reference's
rows, and the reference's first error, on random files (workload/trace.py, `read_rows`)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.errors import ConfigError
from simulator.workload import trace as tr
from simulator.workload.trace import OPTIONAL_COLUMNS, TRACE_COLUMNS, TRACE_V3_COLUMNS, read_rows

INT_COLUMNS = set(tr._INT_FIELDS) | {"prefix_length", "think_time_us"}
# Mostly plain values, so that whole chunks take the column path, and every kind the
# reference treats specially: empty, padded, "512.0", signs, exponents, out of range, text.
PLAIN_INTS = ["0", "1", "7", "512", "20000", "1500000"]
ODD_INTS = ["", " 9 ", "512.0", "+4", "-3", "1e3", "1_0", "abc", "9" * 41, "0" * 39 + "5"]
BOOLS = ["true", "false", "1", "0", "T", "", "yes"]
RATIOS = ["0", "0.25", "", " 1 ", "1.5", "nan", "x"]
TEXTS = ["", "c0", " padded ", "tenant-a"]


def reference_rows(path: Path) -> list[tr.TraceRow]:
    """The reference read: record by record, each one checked before the next is read."""
    header = tr._csv_header(path, "trace data")
    col = tr._trace_columns(path, header)
    first_line: dict[str, int] = {}
    rows = []
    for record in tr._records(path, "trace data", len(header)):
        rows += tr._rows_one_by_one(
            path, [record], col, "prefix_length" in col, "think_time_us" in col, first_line
        )
    return rows


def outcome(read, path: Path):
    try:
        return read(path)
    except ConfigError as exc:
        return str(exc)


@st.composite
def trace_files(draw):
    """A header (v2 or v3, some optional columns) and up to 12 records of plain values, with
    up to three cells odd (empty, padded, "512.0", out of range, a repeated or empty ID, an
    unknown boolean, ...) and sometimes a record short of fields."""
    columns = list(draw(st.sampled_from([TRACE_COLUMNS, TRACE_V3_COLUMNS])))
    columns += sorted(draw(st.sets(st.sampled_from(sorted(OPTIONAL_COLUMNS)))))
    n = draw(st.integers(1, 12))
    cells = st.tuples(st.integers(0, n - 1), st.integers(0, len(columns) - 1))
    odd_cells = draw(st.sets(cells, max_size=3))

    def value(i: int, name: str, odd: bool) -> str:
        if name == "request_id":
            return draw(st.sampled_from(["", "id0", "id1", " id2 "])) if odd else f"id{i}"
        if name == "deadline_us" and not odd:
            return "0"  # no deadline (a plain one could precede its arrival: an error)
        if name in INT_COLUMNS:
            return draw(st.sampled_from(ODD_INTS if odd else PLAIN_INTS))
        if name == "streaming":
            return draw(st.sampled_from(BOOLS if odd else BOOLS[:2]))
        if name == "reason_ratio":
            return draw(st.sampled_from(RATIOS if odd else RATIOS[:2]))
        return draw(st.sampled_from(TEXTS))

    records = []
    for i in range(n):
        record = [value(i, name, (i, k) in odd_cells) for k, name in enumerate(columns)]
        if draw(st.integers(0, 19)) == 0:
            record = record[:-1]  # a line that cannot be read: too few fields
        records.append(record)
    return columns, records


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(trace_files(), st.sampled_from([1, 3, 1 << 15]))
def test_column_reads_give_the_reference_rows_and_errors(tmp_path, monkeypatch, drawn, chunk):
    columns, records = drawn
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(records)
    monkeypatch.setattr(tr, "_CHUNK_ROWS", chunk)
    assert outcome(read_rows, path) == outcome(reference_rows, path)


def test_plain_chunks_take_the_column_path(tmp_path, monkeypatch):
    # A file of plain values is converted a column at a time; one odd value sends only its
    # chunk through the reference (which accepts "512.0" as 512).
    path = tmp_path / "t.csv"
    rows = [
        [f"id{i}", "c0", "", "", "", "0", "", "false", "512.0" if i == 4 else "100", "10"]
        + ["0"] * 4
        + ["0", "", "0", "0", str(1000 * i), str(1000 * i), "0", "0", "0", "ok", "", "stop"]
        for i in range(6)
    ]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TRACE_COLUMNS)
        writer.writerows(rows)
    monkeypatch.setattr(tr, "_CHUNK_ROWS", 2)
    reference_calls = []
    one_by_one = tr._rows_one_by_one
    monkeypatch.setattr(
        tr,
        "_rows_one_by_one",
        lambda *args: reference_calls.append(len(args[1])) or one_by_one(*args),
    )
    read = read_rows(path)
    assert reference_calls == [2]  # the chunk of rows 4 and 5 only
    assert [r.input_tokens for r in read] == [100, 100, 100, 100, 512, 100]
    assert read == reference_rows(path)


def test_an_id_repeated_in_a_later_chunk_is_refused(tmp_path, monkeypatch):
    # Chunks of two: the repeated ID (line 5) sits in a chunk that is otherwise plain.
    path = tmp_path / "t.csv"
    plain = ["c0", "", "", "", "0", "", "false", "100", "10", "0", "0", "0", "0", "0", ""]
    tail = ["0", "0", "1000", "1000", "0", "0", "0", "ok", "", "stop"]
    lines = [",".join(TRACE_COLUMNS)]
    lines += [",".join([rid, *plain, *tail]) for rid in ["a", "b", "c", "a"]]
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(tr, "_CHUNK_ROWS", 2)
    with pytest.raises(ConfigError, match="line 5: column request_id: .* already used on line 2"):
        read_rows(path)


@pytest.mark.parametrize("bad_line", [3, 5])
def test_an_unreadable_line_comes_after_the_rows_before_it(tmp_path, monkeypatch, bad_line):
    # Row 2 (line 3) repeats row 1's ID; line 5 has too few fields. Read record by record,
    # the repeated ID is met first; the chunked read must say the same.
    path = tmp_path / "t.csv"
    plain = ["c0", "", "", "", "0", "", "false", "100", "10", "0", "0", "0", "0", "0", ""]
    tail = ["0", "0", "1000", "1000", "0", "0", "0", "ok", "", "stop"]
    lines = [",".join(TRACE_COLUMNS)]
    for i, rid in enumerate(["a", "a" if bad_line == 3 else "b", "c", "d"]):
        lines.append(",".join([rid, *plain, *tail]) if i != 3 else "d,c0")
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(tr, "_CHUNK_ROWS", 1 << 15)
    expected = outcome(reference_rows, path)
    assert outcome(read_rows, path) == expected
    assert ("already used on line 2" in expected) == (bad_line == 3)
    assert ("line 5: 2 columns" in expected) == (bad_line == 5)
