"""PD parents kept as compact rows (issue 30): a finished parent becomes a row of the request
table with what the PD results read of its sub-requests, and the objects go.

Laws: every PD view — the summaries (cluster and per instance, which count sub-requests),
the PD metrics, the transfers and requests frames, the link's records, the results
document, the report's text and page, a saved result's files, and each parent's and
sub-request's fields — is the same with compaction on as with the objects kept
(`EngineOptions(compact_finished_requests=False)`), on random small PD clusters (some cut by
a horizon, so some parents are still live) and on the shipped PD scenarios; a row reads back
every sub-request field with its value and type, fractional times included; and after a run
no finished parent or sub-request is kept alive as an object.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from simulator.engine.options import EngineOptions
from simulator.engine.request import Request, RequestState
from simulator.metrics.request_table import (
    PD_SUB_FIELDS,
    RequestRow,
    RequestTable,
    SubRow,
)
from simulator.report.build import render_report, report_data
from tests.cluster.test_pd import pd_scenarios

ROOT = Path(__file__).resolve().parents[2]
PD_SCENARIOS = sorted((ROOT / "scenarios").glob("*pd*.yaml"))
SUB_FIELDS = (
    "request_id",
    "pd_role",
    "state",
    "instance_id",
    "length_capped",
    *PD_SUB_FIELDS["prefill"],
    "index",
    "arrival_us",
    "input_tokens",
    "output_tokens",
    "deadline_us",
    "slo_class",
    "tenant_id",
    "model",
    "client_id",
    "session_id",
    "round_index",
    "prefix_group",
    "streaming",
    "is_finished",
    "disaggregated",
)
PARENT_FIELDS = (
    "request_id",
    "state",
    "instance_id",
    "arrival_us",
    "enqueue_us",
    "first_schedule_us",
    "schedule_us",
    "first_token_us",
    "last_token_us",
    "completion_us",
    "generated_tokens",
    "preemptions",
    "cached_tokens",
    "transfer_start_us",
    "transfer_end_us",
    "dropped_at_decode_kv",
    "decode_instance_index",
    "private_from_token",
    "disaggregated",
)


def _same_fields(a, b, fields) -> None:
    for name in fields:
        x, y = getattr(a, name), getattr(b, name)
        assert x == y and type(x) is type(y), (name, x, y)


def _same_parent(a, b) -> None:
    _same_fields(a, b, PARENT_FIELDS)
    for role in ("prefill_sub", "decode_sub"):
        x, y = getattr(a, role), getattr(b, role)
        assert (x is None) == (y is None), role
        if x is not None:
            _same_fields(x, y, SUB_FIELDS)
            assert x.parent.request_id == a.request_id


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _assert_same_pd_views(compact, plain, tmp_path: Path) -> None:
    for name in ("summary", "instance_summaries", "pd_metrics", "anomalies", "kv_metrics"):
        a, b = getattr(compact, name), getattr(plain, name)
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True), name
    for frame in ("requests", "transfers", "instances"):
        pd.testing.assert_frame_equal(getattr(compact, frame), getattr(plain, frame))
    assert compact.report_text() == plain.report_text()
    doc_a, doc_b = compact.results_document(), plain.results_document()
    assert json.dumps(doc_a, sort_keys=True) == json.dumps(doc_b, sort_keys=True)
    # Also for a PD run in which no request arrived (tests/report/test_report_data.py).
    data_a, data_b = report_data(compact), report_data(plain)
    assert json.dumps(data_a, sort_keys=True) == json.dumps(data_b, sort_keys=True)
    assert render_report(compact) == render_report(plain)
    assert _files(compact.save(tmp_path / "on")) == _files(plain.save(tmp_path / "off"))
    if plain.pd is None:
        return
    link_a, link_b = compact.pd.link, plain.pd.link
    assert list(link_a.records) == list(link_b.records)
    assert link_a.initiated == link_b.initiated >= len(link_a.records)
    parents_a, parents_b = compact.pd.parents, plain.pd.parents
    assert len(parents_a) == len(parents_b)
    for a, b in zip(parents_a, parents_b, strict=True):
        _same_parent(a, b)
    for a, b in zip(compact.request_records, plain.request_records, strict=True):
        _same_parent(a, b)
    # Compaction happened: every finished parent is a row, its sub-requests row views.
    for parent in parents_a:
        if parent.is_finished:
            assert isinstance(parent, RequestRow)
            assert isinstance(parent.prefill_sub, SubRow)
    # The result keeps each engine's record (its counts), never the engine's lists.
    assert [e.completed_count for e in compact.engines] == [
        e.completed_count for e in plain.engines
    ]


def _run_both(scenario):
    return (
        simulator.simulate(scenario, warn_unsteady=False),
        simulator.simulate(
            scenario,
            warn_unsteady=False,
            options=EngineOptions(compact_finished_requests=False),
        ),
    )


@st.composite
def pd_runs(draw):
    scenario = draw(pd_scenarios())
    scenario["horizon_us"] = draw(st.sampled_from([None, None, 300_000, 1_000_000]))
    scenario["engine"]["enable_prefix_caching"] = draw(st.booleans())
    return scenario


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pd_runs())
def test_compact_parents_give_every_pd_view_unchanged(tmp_path_factory, scenario):
    compact, plain = _run_both(scenario)
    _assert_same_pd_views(compact, plain, tmp_path_factory.mktemp("pd"))


@pytest.mark.parametrize("path", PD_SCENARIOS, ids=[p.stem for p in PD_SCENARIOS])
def test_shipped_pd_scenarios_are_unchanged_by_compaction(path, tmp_path):
    compact, plain = _run_both(path)
    _assert_same_pd_views(compact, plain, tmp_path)


# --------------------------------------------------------------------------- the table

timestamps = st.one_of(st.integers(-1, 10**12), st.floats(0, 1e9, allow_nan=False))
FINAL = [RequestState.COMPLETED, RequestState.TIMED_OUT, RequestState.DROPPED]


def _draw_request(draw, rid: str, arrival: int) -> Request:
    req = Request(rid, arrival, draw(st.integers(1, 5000)), draw(st.integers(0, 4000)))
    req.state = draw(st.sampled_from(FINAL))
    req.instance_id = draw(st.sampled_from(["", "instance_0", "instance_3"]))
    req.private_from_token = draw(st.sampled_from([-1, 0, 7]))
    for name in (
        "enqueue_us",
        "first_schedule_us",
        "schedule_us",
        "first_token_us",
        "last_token_us",
        "completion_us",
    ):
        setattr(req, name, draw(timestamps))
    for name in ("generated_tokens", "preemptions", "cached_tokens"):
        setattr(req, name, draw(st.integers(0, 4000)))
    req.length_capped = draw(st.booleans())
    return req


@st.composite
def finished_parents(draw) -> Request:
    rid = f"r{draw(st.integers(0, 10**6))}"
    parent = _draw_request(draw, rid, draw(st.integers(0, 10**12)))
    if not draw(st.booleans()):
        return parent  # served whole
    parent.transfer_start_us = draw(timestamps)
    parent.transfer_end_us = draw(timestamps)
    parent.decode_instance_index = draw(st.integers(0, 300))
    for role in ("prefill", "decode"):
        if role == "decode" and not draw(st.booleans()):
            break
        sub = parent.sub_request(role)
        drawn = _draw_request(draw, sub.request_id, parent.arrival_us)
        for name in (
            *PD_SUB_FIELDS[role],
            "state",
            "instance_id",
            "length_capped",
        ):
            setattr(sub, name, getattr(drawn, name))
        setattr(parent, f"{role}_sub", sub)
    return parent


@settings(max_examples=60, deadline=None)
@given(st.lists(finished_parents(), min_size=1, max_size=20))
def test_a_parent_row_reads_back_its_sub_requests_as_they_were(parents):
    table = RequestTable()
    retired = []

    def retire(parent: Request) -> int:
        retired.append(parent)
        return len(retired) - 1

    table.track_pd(retire)
    table.FLUSH_ROWS = 3  # several bulk flushes, some after a column met a fractional time
    for seq, parent in enumerate(parents):
        table.append(parent, seq)
    assert retired == [p for p in parents if p.prefill_sub is not None]
    for i, parent in enumerate(parents):
        row = table.row(i)
        _same_parent(row, parent)
        assert repr(row) == repr(parent)
        for role in ("prefill_sub", "decode_sub"):
            sub = getattr(row, role)
            if sub is not None:
                assert repr(sub) == repr(getattr(parent, role))


def _live(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def test_finished_parents_and_sub_requests_are_not_kept_as_objects():
    before = _live(Request)
    result = simulator.simulate(
        {
            "model": "meta-llama/llama-3.1-8b-instruct",
            "hardware": "H100",
            "cluster": {
                "num_instances": 4,
                "pd": {"prefill_instances": 2, "decode_instances": 2, "decider": "always"},
            },
            "workload": {
                "rate": 50,
                "num_requests": 300,
                "prompt_tokens": {"distribution": "constant", "value": 200},
                "output_tokens": {"distribution": "constant", "value": 20},
            },
        }
    )
    assert result.summary["completed_requests"] == result.pd_metrics["transfers"] == 300
    assert all(isinstance(p, RequestRow) for p in result.pd.parents)
    # The result keeps the PD flow's record, not the disaggregator (whose routing policies
    # reached the engines and their last step's working lists): no request object survives.
    assert _live(Request) <= before
