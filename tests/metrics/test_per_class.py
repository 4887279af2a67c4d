"""Per-class views read as columns (`per_class_metrics`, `tenant_tokens`) equal their
per-request definitions, written here as the plain loops they replace: on request objects
(hypothesis) and on the compact rows of a real run."""

from __future__ import annotations

import numpy as np
import yaml
from hypothesis import given
from hypothesis import strategies as st

import simulator
from simulator.engine.request import Request, RequestState
from simulator.metrics.anomalies import tenant_tokens
from simulator.metrics.summary import mean, pct, per_class_metrics


def per_class_reference(requests, key) -> dict:
    groups: dict[str, list] = {}
    for r in requests:
        groups.setdefault(key(r), []).append(r)
    out = {}
    for name in sorted(groups):
        members = groups[name]
        ttft = np.array(
            [r.first_token_us - r.arrival_us for r in members if r.first_token_us >= 0],
            dtype=np.int64,
        )
        e2e = np.array(
            [r.completion_us - r.arrival_us for r in members if r.state is RequestState.COMPLETED],
            dtype=np.int64,
        )
        row = {"requests": len(members), "completed_requests": len(e2e)}
        for metric, values in (("ttft", ttft), ("e2e", e2e)):
            # A statistic of no samples is null (docs/results.md), not 0 ms.
            none = len(values) == 0
            row[f"{metric}_mean_ms"] = None if none else mean(values) / 1000
            for p in (50, 90, 99):
                row[f"{metric}_p{p}_ms"] = None if none else pct(values, p) / 1000
        out[name] = row
    return out


def tenant_tokens_reference(requests) -> dict:
    # Every tenant that sent a request is listed, with 0 when none of its requests completed.
    out: dict[str, int] = {}
    for r in requests:
        name = r.tenant_id or "default"
        served = r.generated_tokens if r.state is RequestState.COMPLETED else 0
        out[name] = out.get(name, 0) + served
    return {k: out[k] for k in sorted(out)}


LABELS = st.sampled_from([None, "", "batch", "interactive", "default"])


@st.composite
def requests(draw) -> list[Request]:
    out = []
    for i in range(draw(st.integers(0, 30))):
        arrival = draw(st.integers(0, 10_000))
        r = Request(f"r{i}", arrival, 10, 5, slo_class=draw(LABELS), tenant_id=draw(LABELS))
        r.state = draw(st.sampled_from(list(RequestState)))
        if draw(st.booleans()):
            r.first_token_us = arrival + draw(st.integers(0, 5_000))
        r.completion_us = arrival + draw(st.integers(0, 20_000))
        r.generated_tokens = draw(st.integers(0, 50))
        out.append(r)
    return out


@given(requests())
def test_columns_equal_the_per_request_definitions(rs):
    assert per_class_metrics(rs, "slo_class") == per_class_reference(
        rs, lambda r: r.slo_class or "default"
    )
    assert per_class_metrics(rs, "tenant_id") == per_class_reference(
        rs, lambda r: r.tenant_id or "default"
    )
    assert tenant_tokens(rs) == tenant_tokens_reference(rs)


def test_a_runs_compact_rows_give_the_per_request_definitions(tmp_path):
    """Hand check on a run with two SLO classes and two tenants: the columnar views of its
    compact rows equal the loops over the same rows read one by one."""
    spec = {
        "version": "2",
        "seed": 3,
        "aggregate_rate": 40.0,
        "num_requests": 200,
        "clients": [
            {
                "id": name,
                "tenant_id": name,
                "slo_class": slo,
                "rate_fraction": 0.5,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant", "params": {"value": 256}},
                "output_distribution": {"type": "constant", "params": {"value": 32}},
            }
            for name, slo in (("alpha", "critical"), ("beta", "batch"))
        ],
    }
    path = tmp_path / "two_classes.workload.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = simulator.simulate({"latency": {"model": "roofline"}, "workload_spec": str(path)})
    rows = list(result.request_records)
    assert result.per_slo == per_class_reference(rows, lambda r: r.slo_class or "default")
    assert set(result.per_slo) == {"batch", "critical"}
    assert result.per_tenant["tokens"] == tenant_tokens_reference(rows)
    assert sum(result.per_tenant["tokens"].values()) == 200 * 32
