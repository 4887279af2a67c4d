"""TraceV2/v3 writing and reading, and the ground-truth request CSVs (docs/behaviour.md §9.5,
§12.2)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from simulator.engine.request import Request, RequestState
from simulator.errors import ConfigError
from simulator.workload import trace as tr
from simulator.workload.trace import (
    STATUSES,
    TRACE_COLUMNS,
    TRACE_V3_COLUMNS,
    load_requests_file,
    load_trace,
    prefix_key,
    read_groundtruth_csv,
    read_groundtruth_rows,
    read_header,
    read_rows,
    trace_status,
    write_trace,
)

GROUNDTRUTH = Path(__file__).resolve().parents[2] / "groundtruth"  # shipped with the repository
GT_REQUESTS = GROUNDTRUTH / "vllm-0.15.1-h100" / "requests"


def _done(req: Request, first_us: int, last_us: int, *, capped: bool = False) -> Request:
    req.state = RequestState.COMPLETED
    req.first_token_us = first_us
    req.last_token_us = last_us
    req.completion_us = last_us
    req.generated_tokens = req.output_tokens
    req.length_capped = capped
    return req


def _requests() -> list[Request]:
    """Hand-made, deliberately out of order; two tie on arrival (index breaks the tie)."""
    a = _done(
        Request(
            "request_a",
            2_000,
            300,
            20,
            index=1,
            deadline_us=9_000_000,
            segments=[(prefix_key("sys"), 100), (("req", "request_a"), 200)],
            slo_class="critical",
            tenant_id="t1",
            model="m/one",
            client_id="c1",
            session_id="s1",
            round_index=2,
            prefix_group="sys",
            streaming=True,
            text_tokens=250,
            image_tokens=50,
            reason_ratio=0.25,
        ),
        2_500,
        4_000,
    )
    b = _done(
        Request(
            "request_b",
            1_000,
            80,
            5,
            index=0,
            client_id="c2",
            audio_tokens=30,
            video_tokens=10,
            text_tokens=40,
        ),
        1_700,
        2_100,
        capped=True,
    )
    c = Request(
        "request_c",
        2_000,
        150,
        9,
        index=2,
        segments=[(prefix_key("sys"), 100), (("req", "request_c"), 50)],
        prefix_group="sys",
        streaming=True,
    )
    c.state = RequestState.RUNNING
    c.first_token_us = 3_000
    c.last_token_us = 3_400
    c.generated_tokens = 3
    return [a, c, b]


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_round_trip_keeps_order_fields_and_absolute_times(tmp_path):
    header_path, data_path = write_trace(
        tmp_path / "run",
        _requests(),
        server={"type": "servesim", "model": "m/one", "block_size": 16},
        workload_spec="w.yaml",
        warm_up_requests=1,
        created_at="2026-03-28T00:00:00Z",
    )
    assert (header_path, data_path) == (tmp_path / "run.yaml", tmp_path / "run.csv")
    header = read_header(header_path)
    assert header == {
        "trace_version": 2,
        "time_unit": "microseconds",
        "created_at": "2026-03-28T00:00:00Z",
        "mode": "generated",
        "warm_up_requests": 1,
        "workload_spec": "w.yaml",
        "server": {"type": "servesim", "model": "m/one", "block_size": 16},
        "network": {"measured_rtt_ms": 0},
    }
    with data_path.open() as handle:
        assert handle.readline().strip() == ",".join(TRACE_COLUMNS)
    raw = _csv(data_path)
    # Sorted by arrival, ties by index; request_id is the row number.
    assert [r["request_id"] for r in raw] == ["0", "1", "2"]
    assert [r["client_id"] for r in raw] == ["c2", "c1", ""]
    b, a, c = raw
    assert a == {
        "request_id": "1",
        "client_id": "c1",
        "tenant_id": "t1",
        "slo_class": "critical",
        "session_id": "s1",
        "round_index": "2",
        "prefix_group": "",  # BLIS: the prefix is already inside input_tokens
        "streaming": "true",
        "input_tokens": "300",
        "output_tokens": "20",
        "text_tokens": "250",
        "image_tokens": "50",
        "audio_tokens": "0",
        "video_tokens": "0",
        "reason_ratio": "0.25",
        "model": "m/one",
        "deadline_us": "9000000",
        "server_input_tokens": "300",
        "arrival_time_us": "2000",
        "send_time_us": "2000",
        "first_chunk_time_us": "2500",
        "last_chunk_time_us": "4000",
        "num_chunks": "20",
        "status": "ok",
        "error_message": "",
        "finish_reason": "stop",
    }
    assert (b["finish_reason"], b["num_chunks"], b["streaming"]) == ("length", "1", "false")
    assert (c["status"], c["first_chunk_time_us"], c["last_chunk_time_us"]) == (
        "incomplete",
        "3000",
        "3400",
    )
    assert (c["num_chunks"], c["finish_reason"]) == ("3", "")

    _, back = load_trace(header_path, data_path)
    assert [r.request_id for r in back] == ["request_0", "request_1", "request_2"]
    rb, ra, rc = back
    assert (ra.arrival_us, ra.input_tokens, ra.output_tokens, ra.deadline_us) == (
        2_000,
        300,
        20,
        9_000_000,
    )
    assert (ra.client_id, ra.tenant_id, ra.slo_class, ra.model) == ("c1", "t1", "critical", "m/one")
    assert (ra.session_id, ra.round_index, ra.streaming, ra.reason_ratio) == ("s1", 2, True, 0.25)
    assert (ra.text_tokens, ra.image_tokens, ra.prefix_group) == (250, 50, "")
    assert (rb.audio_tokens, rb.video_tokens, rb.text_tokens, rb.streaming) == (30, 10, 40, False)
    assert rc.input_tokens == 150 and rc.index == 2
    assert all(r.state is RequestState.CREATED for r in back)


def test_keep_prefix_groups_writes_v3_that_replays_the_same_prompts(tmp_path):
    header_path, data_path = write_trace(tmp_path / "t", _requests(), keep_prefix_groups=True)
    assert read_header(header_path)["trace_version"] == 3
    with data_path.open() as handle:
        assert handle.readline().strip() == ",".join(TRACE_V3_COLUMNS)
    raw = _csv(data_path)
    assert [(r["prefix_group"], r["prefix_length"], r["input_tokens"]) for r in raw] == [
        ("", "0", "80"),
        ("sys", "100", "200"),
        ("sys", "100", "50"),
    ]
    assert [r["server_input_tokens"] for r in raw] == ["80", "300", "150"]
    _, back = load_trace(header_path, data_path)
    assert [r.input_tokens for r in back] == [80, 300, 150]
    # Both group members share the same 100-token prefix again.
    assert back[1].segments[0] == back[2].segments[0] == (prefix_key("sys"), 100)
    assert back[1].prefix_group == "sys"


def test_status_mapping():
    def req(state: RequestState, **attrs) -> Request:
        r = Request("r", 0, 10, 4)
        r.state = state
        for name, value in attrs.items():
            setattr(r, name, value)
        return r

    assert trace_status(req(RequestState.COMPLETED)) == ("ok", "", "stop")
    assert trace_status(req(RequestState.COMPLETED, length_capped=True)) == ("ok", "", "length")
    assert trace_status(req(RequestState.TIMED_OUT)) == ("timeout", "", "")
    assert trace_status(req(RequestState.DROPPED)) == ("error", "dropped_unservable", "")
    assert trace_status(req(RequestState.REJECTED)) == ("error", "rejected", "")
    # Lost to the fleet: not "incomplete", which means still in flight when the run stopped.
    assert trace_status(req(RequestState.DROPPED_ON_DRAIN)) == ("error", "dropped_on_drain", "")
    assert trace_status(req(RequestState.FAILED)) == ("error", "failed", "")
    for state in (RequestState.QUEUED, RequestState.RUNNING, RequestState.CREATED):
        assert trace_status(req(state)) == ("incomplete", "", "")
    # Every state has exactly one status: a state added later must be placed here too.
    assert {trace_status(req(state))[0] for state in RequestState} == set(STATUSES)


def test_timed_out_and_dropped_rows(tmp_path):
    timed_out = Request("x", 10, 10, 8, deadline_us=500, streaming=True)
    timed_out.state = RequestState.TIMED_OUT
    timed_out.first_token_us, timed_out.last_token_us = 100, 300
    timed_out.generated_tokens, timed_out.completion_us = 3, 500
    dropped = Request("y", 20, 10, 8, index=1)
    dropped.state, dropped.completion_us = RequestState.DROPPED, 20
    _, data_path = write_trace(tmp_path / "t", [timed_out, dropped])
    x, y = _csv(data_path)
    assert (x["status"], x["first_chunk_time_us"], x["last_chunk_time_us"]) == (
        "timeout",
        "100",
        "300",
    )
    assert (x["num_chunks"], x["deadline_us"]) == ("3", "500")
    assert (y["status"], y["error_message"], y["first_chunk_time_us"], y["num_chunks"]) == (
        "error",
        "dropped_unservable",
        "0",
        "0",
    )


class _Boom:
    def __iter__(self):
        yield Request("r0", 0, 10, 2)
        raise RuntimeError("generator failed")


def test_write_is_atomic_when_iteration_fails(tmp_path):
    with pytest.raises(RuntimeError, match="generator failed"):
        write_trace(tmp_path / "t", _Boom())
    assert list(tmp_path.iterdir()) == []


def test_write_is_atomic_when_a_row_fails_midway(tmp_path, monkeypatch):
    old = write_trace(tmp_path / "t", _requests()[:1])
    before = [p.read_bytes() for p in old]
    real_row = tr._trace_row

    def failing_row(i, req, *options):
        if i == 1:
            raise OSError("disk full")
        return real_row(i, req, *options)

    monkeypatch.setattr(tr, "_trace_row", failing_row)
    with pytest.raises(OSError, match="disk full"):
        write_trace(tmp_path / "t", _requests())
    # The previous trace is intact and no temporary file is left behind.
    assert [p.read_bytes() for p in old] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.yaml"]


def test_write_rejects_unknown_server_key(tmp_path):
    with pytest.raises(ConfigError, match="server: unknown key"):
        write_trace(tmp_path / "t", [], server={"gpu": "H100"})
    assert list(tmp_path.iterdir()) == []


V3_HEADER = """\
trace_version: 3
time_unit: microseconds
mode: real
warm_up_requests: 0
goodput_slo_targets:
  critical: {ttft_ms: 100}
"""


def _v3_csv(rows: list[dict[str, object]]) -> str:
    lines = [",".join(TRACE_V3_COLUMNS)]
    for i, row in enumerate(rows):
        values = {c: "" for c in TRACE_V3_COLUMNS}
        values.update(
            request_id=i,
            round_index=0,
            prefix_length=0,
            streaming="true",
            reason_ratio=0,
            deadline_us=0,
            status="ok",
        )
        values.update(row)
        lines.append(",".join(str(values[c]) for c in TRACE_V3_COLUMNS))
    return "\n".join(lines) + "\n"


def test_v3_header_and_prefix_length(tmp_path):
    (tmp_path / "t.yaml").write_text(V3_HEADER)
    (tmp_path / "t.csv").write_text(
        _v3_csv(
            [
                dict(
                    prefix_group="g",
                    prefix_length=64,
                    input_tokens=10,
                    output_tokens=3,
                    arrival_time_us=5,
                ),
                dict(
                    prefix_group="g",
                    prefix_length=64,
                    input_tokens=20,
                    output_tokens=3,
                    arrival_time_us=9,
                ),
                dict(
                    prefix_group="z",
                    prefix_length=0,
                    input_tokens=7,
                    output_tokens=1,
                    arrival_time_us=12,
                ),
            ]
        )
    )
    header, reqs = load_trace(tmp_path / "t.yaml", tmp_path / "t.csv")
    assert header["trace_version"] == 3
    assert [r.input_tokens for r in reqs] == [74, 84, 7]
    assert reqs[0].segments == [(prefix_key("g"), 64), (("req", "request_0"), 10)]
    assert reqs[1].segments[0] == (prefix_key("g"), 64)
    # A v3 group with prefix_length 0 shares nothing (as in BLIS).
    assert reqs[2].segments == [(("req", "request_2"), 7)]
    assert all(r.streaming for r in reqs)


def test_v2_prefix_group_gets_blis_50_token_prefix(tmp_path):
    _, data_path = write_trace(tmp_path / "t", _requests()[:2])
    text = data_path.read_text().splitlines()
    rows = [line.split(",") for line in text]
    group = TRACE_COLUMNS.index("prefix_group")
    rows[1][group] = rows[2][group] = "grp"
    data_path.write_text("\n".join(",".join(r) for r in rows) + "\n")
    reqs = load_requests_file(data_path, tmp_path / "t.yaml")
    assert [r.input_tokens for r in reqs] == [300 + 50, 150 + 50]
    assert reqs[0].segments[0] == reqs[1].segments[0] == (prefix_key("grp"), 50)


def test_reads_25_column_v2(tmp_path):
    (tmp_path / "t.csv").write_text(
        ",".join(TRACE_COLUMNS[:-1]) + "\n0,c,,,,0,,false,12,3,0,0,0,0,0,,0,0,100,100,0,0,0,ok,\n"
    )
    (row,) = read_rows(tmp_path / "t.csv")
    assert (row.input_tokens, row.output_tokens, row.arrival_time_us, row.finish_reason) == (
        12,
        3,
        100,
        "",
    )


GT_CSV = """\
index,arrival_time_us,input_tokens,output_tokens,prefix_group,has_error,ttft_s,e2e_s
0,0,591,140,,0,0.13,1.94
1,53490,589,0,,0,0.07,1.89
2,64932,0,0,,1,,300.5
"""


def test_groundtruth_reader(tmp_path):
    path = tmp_path / "run.requests.csv"
    path.write_text(GT_CSV)
    rows = read_groundtruth_rows(path)
    assert rows[2].has_error and rows[2].ttft_s is None and rows[2].e2e_s == 300.5
    reqs = read_groundtruth_csv(path)
    assert [r.request_id for r in reqs] == ["request_0", "request_1", "request_2"]
    assert [r.arrival_us for r in reqs] == [0, 53490, 64932]
    assert [r.output_tokens for r in reqs] == [140, 1, 1]  # max(1, output_tokens)
    # The failed request the server never counted gets the mean known prompt length.
    assert [r.input_tokens for r in reqs] == [591, 589, 590]
    assert read_groundtruth_csv(path, fill_missing_input=False)[2].input_tokens == 1
    assert all(r.prefix_group == "" for r in reqs)
    # Detected by its columns when no header file is given.
    assert [r.input_tokens for r in load_requests_file(path)] == [591, 589, 590]


def test_groundtruth_reader_on_a_real_run():
    path = sorted(GT_REQUESTS.glob("*llama-2-7b-tp1-codegen.requests.csv"))[0]
    reqs = load_requests_file(path)
    with path.open() as handle:
        assert len(reqs) == sum(1 for _ in handle) - 1
    arrivals = [r.arrival_us for r in reqs]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals)
    assert all(r.input_tokens > 0 and r.output_tokens >= 1 for r in reqs)
    assert len({r.request_id for r in reqs}) == len(reqs)


def test_headerless_trace_csv_is_read_as_v2(tmp_path):
    _, data_path = write_trace(tmp_path / "t", _requests())
    reqs = load_requests_file(data_path)
    assert [r.input_tokens for r in reqs] == [80, 300, 150]


def _good_v2(tmp_path: Path) -> tuple[Path, Path]:
    return write_trace(tmp_path / "t", _requests()[:2], created_at="x")


def test_unrecognised_requests_file(tmp_path):
    path = tmp_path / "odd.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ConfigError, match=r"odd\.csv.*ground-truth CSV.*index,arrival_time_us"):
        load_requests_file(path)


def test_missing_column(tmp_path):
    path = tmp_path / "t.csv"
    columns = [c for c in TRACE_COLUMNS if c != "output_tokens"]
    path.write_text(",".join(columns) + "\n")
    with pytest.raises(ConfigError, match=r"t\.csv.*missing column\(s\) output_tokens"):
        read_rows(path)
    gt = tmp_path / "gt.csv"
    gt.write_text("index,arrival_time_us,input_tokens\n0,0,5\n")
    with pytest.raises(ConfigError, match=r"gt\.csv.*missing column\(s\) output_tokens"):
        read_groundtruth_rows(gt)


@pytest.mark.parametrize("value", ["abc", "1.5", ""])
def test_non_integer_arrival(tmp_path, value):
    _, data_path = _good_v2(tmp_path)
    lines = data_path.read_text().splitlines()
    fields = lines[2].split(",")
    fields[TRACE_COLUMNS.index("arrival_time_us")] = value
    lines[2] = ",".join(fields)
    data_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        read_rows(data_path)
    msg = str(err.value)
    assert "t.csv" in msg and "line 3" in msg and "column arrival_time_us" in msg


def test_non_integer_groundtruth_arrival(tmp_path):
    path = tmp_path / "gt.csv"
    path.write_text(GT_CSV.replace("53490", "soon"))
    with pytest.raises(ConfigError, match=r"gt\.csv' line 3: column arrival_time_us: .*'soon'"):
        read_groundtruth_csv(path)


@pytest.mark.parametrize(
    "column, value, problem",
    [
        ("ttft_s", "nan", "finite number of seconds >= 0"),
        ("ttft_s", "inf", "finite number of seconds >= 0"),
        ("ttft_s", "-0.5", "finite number of seconds >= 0"),
        ("e2e_s", "1e400", "finite number of seconds >= 0"),
        ("e2e_s", "0.001", "below ttft_s"),
    ],
)
def test_measured_times_must_be_durations(tmp_path, column, value, problem):
    """A NaN TTFT was scored as a NaN error and fitted around silently; a negative one moved
    the mean. Each is refused at its line and column."""
    lines = GT_CSV.splitlines()
    header = lines[0].split(",")
    row = lines[1].split(",")
    row[header.index(column)] = value
    path = tmp_path / "gt.csv"
    path.write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    with pytest.raises(ConfigError, match=rf"line 2: column {column}: .*{problem}"):
        read_groundtruth_csv(path)


def test_bad_row_values(tmp_path):
    _, data_path = _good_v2(tmp_path)
    text = data_path.read_text()
    for column, value, problem in [
        ("streaming", "maybe", "true or false"),
        ("reason_ratio", "1.5", r"\[0.0, 1.0\]"),
        ("input_tokens", "-3", ">= 0"),
        ("deadline_us", "5", "precedes arrival_time_us"),
    ]:
        lines = text.splitlines()
        fields = lines[1].split(",")
        fields[TRACE_COLUMNS.index(column)] = value
        lines[1] = ",".join(fields)
        data_path.write_text("\n".join(lines) + "\n")
        with pytest.raises(ConfigError, match=rf"line 2: column {column}: .*{problem}"):
            read_rows(data_path)


def test_unknown_column_and_short_row(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(",".join([*TRACE_COLUMNS, "colour"]) + "\n")
    with pytest.raises(ConfigError, match="unknown column.*colour"):
        read_rows(path)
    path.write_text(",".join(TRACE_COLUMNS) + "\n0,c\n")
    with pytest.raises(ConfigError, match="line 2: 2 columns, expected 26"):
        read_rows(path)


def test_unknown_header_key(tmp_path):
    header_path, _ = _good_v2(tmp_path)
    data = yaml.safe_load(header_path.read_text())
    data["colour"] = "blue"
    header_path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"t\.yaml.*unknown key\(s\) \['colour'\]"):
        read_header(header_path)


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("trace_version", 7, "trace_version: invalid value 7; must be 2 or 3"),
        ("time_unit", "ms", "time_unit: invalid value 'ms'"),
        ("mode", "dreamed", "mode: invalid value 'dreamed'"),
        ("server", {"gpu": "H100"}, r"server: unknown key\(s\) \['gpu'\]"),
    ],
)
def test_bad_header_values(tmp_path, key, value, problem):
    header_path, _ = _good_v2(tmp_path)
    data = yaml.safe_load(header_path.read_text())
    data[key] = value
    header_path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=rf"t\.yaml.*{problem}"):
        read_header(header_path)


def test_blis_reference_traces_still_load():
    data = Path(__file__).resolve().parents[1] / "data" / "blis"
    header, reqs = load_trace(data / "r1_fixed512.trace.yaml", data / "r1_fixed512.trace.csv")
    assert header["trace_version"] == 2
    assert reqs and all(r.input_tokens == 512 and r.output_tokens == 128 for r in reqs)


def test_replayed_requests_mark_their_own_tokens_private_only_under_a_unique_id():
    rows = [
        tr.TraceRow("a", 0, 100, 5),
        tr.TraceRow("b", 10, 100, 5, prefix_group="sys", prefix_length=64),
        tr.TraceRow("c", 20, 100, 5),
        tr.TraceRow("c", 30, 100, 5),  # the same ID names the same content: not private
    ]
    marks = [r.private_from_token for r in tr.requests_from_rows(rows)]
    assert marks == [0, 64, -1, -1]
    c1, c2 = tr.requests_from_rows(rows)[2:]
    assert c1.block_hashes(6, 16) == c2.block_hashes(6, 16)  # why the twins are not private


@pytest.mark.parametrize("value", ["1e3", "1_000", "\u0661\u0662", "5x"])
def test_an_integer_column_takes_decimal_digits_only(tmp_path, value):
    """As BLIS's parser: what Python's int() or float() would also read (separators, other
    scripts' digits, exponents) is refused with the column and the value named."""
    from simulator.workload.trace import read_rows

    source = Path("tests/data/blis/r1_fixed512.trace.csv").read_text().splitlines()
    header = source[0].split(",")
    row = source[1].split(",")
    row[header.index("input_tokens")] = value
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([source[0], ",".join(row), *source[2:5]]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"column input_tokens: invalid value '{value}'"):
        read_rows(bad)


@pytest.mark.parametrize("reader", [read_rows, tr.trace_spans])
@pytest.mark.parametrize("send", ["-1", "-1782183937704455"])
def test_a_send_before_the_clock_starts_is_refused(tmp_path, reader, send):
    """send_time_us is a time on the run's clock or the wall clock, and 0 means "never sent":
    nothing a trace can mean lies below 0, and a negative send, taken as a send, moved every
    other request by decades (a 56-year run). Both readers refuse it at its line and column
    with the bound, before anything replays, fits or scores it."""
    _, data_path = _good_v2(tmp_path)
    lines = data_path.read_text().splitlines()
    fields = lines[2].split(",")
    fields[TRACE_COLUMNS.index("send_time_us")] = send
    lines[2] = ",".join(fields)
    data_path.write_text("\n".join(lines) + "\n")
    pattern = rf"t\.csv' line 3: column send_time_us: invalid value '{send}'; .*>= 0"
    with pytest.raises(ConfigError, match=pattern):
        reader(data_path)
