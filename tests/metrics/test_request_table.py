"""Finished requests as compact rows: they read back exactly as the objects, and the objects go.

Laws: a row returns every field with the value and type its request had (property-tested over
random values, fractional timestamps included); a run with compaction gives the same
results, frames, reports and trace as one keeping every object; and after a run no finished
request is kept alive as an object.
"""

from __future__ import annotations

import gc
import json

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.engine.options import EngineOptions
from simulator.engine.request import Request, RequestState, group_prefix_tokens, prefix_key
from simulator.metrics.request_table import (
    CODED_FIELDS,
    NUMERIC_FIELDS,
    RequestRecords,
    RequestRow,
    RequestTable,
)
from tests.engine.test_fast_paths import SAME_SETTINGS, cluster_scenarios

FINAL = [
    RequestState.COMPLETED,
    RequestState.TIMED_OUT,
    RequestState.DROPPED,
    RequestState.REJECTED,
]
timestamps = st.one_of(st.integers(-1, 10**12), st.floats(0, 1e9, allow_nan=False))


@st.composite
def finished_requests(draw) -> Request:
    group = draw(st.sampled_from(["", "system", "other"]))
    tokens = draw(st.integers(1, 5000))
    shared = draw(st.integers(1, tokens)) if group else 0
    rid = f"r{draw(st.integers(0, 10**6))}"
    segments = [(prefix_key(group), shared), (("req", rid), tokens - shared)] if group else None
    req = Request(
        rid,
        draw(st.integers(0, 10**12)),
        tokens,
        draw(st.integers(0, 4000)),
        index=draw(st.integers(0, 10**6)),
        segments=segments,
        slo_class=draw(st.sampled_from(["", "batch", "interactive"])),
        tenant_id=draw(st.sampled_from(["", "t1"])),
        prefix_group=group,
        session_id=draw(st.sampled_from(["", "s1", "s2"])),
        reason_ratio=draw(st.floats(0, 1)),
    )
    req.state = draw(st.sampled_from(FINAL))
    req.instance_id = draw(st.sampled_from(["instance_0", "instance_1"]))
    for name in ("first_token_us", "last_token_us", "completion_us", "schedule_us"):
        setattr(req, name, draw(timestamps))
    req.kv_reload_us = draw(st.one_of(st.just(0), st.floats(0, 1e6, allow_nan=False)))
    req.generated_tokens = draw(st.integers(0, 4000))
    req.length_capped = draw(st.booleans())
    req.priority = draw(st.floats(-10, 10, allow_nan=False))
    return req


@settings(max_examples=50, deadline=None)
@given(st.lists(finished_requests(), min_size=1, max_size=20))
def test_a_row_reads_back_every_field_as_its_request_had_it(requests):
    table = RequestTable()
    table.FLUSH_ROWS = 3  # buffered rows move to the columns in several bulk flushes
    for seq, req in enumerate(requests):
        table.append(req, seq)
    assert len(table) == len(requests)
    for i, req in enumerate(requests):
        row = table.row(i)
        for name in ("request_id", *NUMERIC_FIELDS, *CODED_FIELDS):
            original = (
                group_prefix_tokens(req) if name == "group_prefix_tokens" else getattr(req, name)
            )
            value = getattr(row, name)
            assert value == original and type(value) is type(original), name
        assert row.is_finished and not row.disaggregated
        assert group_prefix_tokens(row) == group_prefix_tokens(req)
        assert repr(row) == repr(req)


def test_records_list_rows_and_live_requests_in_injection_order():
    table = RequestTable()
    done = [Request(f"d{i}", i, 10, 5, index=i) for i in range(3)]
    for req in done:
        req.state = RequestState.COMPLETED
    # Injected in the order d0, live0, d1, d2, live1; d2 finished before d1.
    table.append(done[0], 0)
    table.append(done[2], 3)
    table.append(done[1], 2)
    live = [(1, Request("live0", 1, 10, 5)), (4, Request("live1", 4, 10, 5))]
    records = RequestRecords(table, live)
    assert [r.request_id for r in records] == ["d0", "live0", "d1", "d2", "live1"]
    assert len(records) == 5
    assert isinstance(records[0], RequestRow) and records[1] is live[0][1]
    assert [r.request_id for r in records[1:3]] == ["live0", "d1"]


def compaction(enabled: bool) -> EngineOptions:
    return EngineOptions(compact_finished_requests=enabled)


def _everything(result, tmp_path, tag: str) -> tuple:
    prefix = tmp_path / tag
    header, data = result.write_trace(prefix)
    return (
        json.dumps(result.summary, sort_keys=True),
        json.dumps(result.instance_summaries, sort_keys=True),
        json.dumps(result.per_slo, sort_keys=True),
        json.dumps(result.per_tenant, sort_keys=True),
        json.dumps(result.anomalies, sort_keys=True),
        json.dumps(result.steady_state.document(), sort_keys=True),
        json.dumps(result.slo, sort_keys=True),
        json.dumps(result.blis_request_records(), sort_keys=True),
        result.instances.to_json(),
        data.read_bytes(),
    )


@SAME_SETTINGS
@given(cluster_scenarios())
def test_compact_rows_give_the_same_results_as_objects(tmp_path_factory, scenario):
    tmp_path = tmp_path_factory.mktemp("compact")
    runs = {}
    for enabled in (True, False):
        runs[enabled] = simulator.simulate(scenario, options=compaction(enabled))
    compact, plain = runs[True], runs[False]
    pd.testing.assert_frame_equal(compact.requests, plain.requests)
    assert _everything(compact, tmp_path, "on") == _everything(plain, tmp_path, "off")
    if not scenario["cluster"].get("pd"):
        finished = [r for r in compact.request_records if r.is_finished]
        assert all(isinstance(r, RequestRow) for r in finished)
        # The result keeps each engine's record (its counts), never the engine's lists.
        assert [e.completed_count for e in compact.engines] == [
            e.completed_count for e in plain.engines
        ]


def _live_request_objects() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Request)


def test_finished_requests_are_not_kept_as_objects():
    before = _live_request_objects()
    result = simulator.simulate(
        {
            "model": "meta-llama/llama-3.1-8b-instruct",
            "hardware": "H100",
            "cluster": {"num_instances": 2},
            "workload": {
                "rate": 50,
                "num_requests": 300,
                "prompt_tokens": {"distribution": "constant", "value": 200},
                "output_tokens": {"distribution": "constant", "value": 20},
            },
        }
    )
    assert result.summary["completed_requests"] == 300
    assert len(result.request_records) == 300
    # The result keeps the engines' records, not the engines: not even the requests of
    # their last steps stay referenced.
    assert _live_request_objects() - before == 0
