"""Assemble a report page for a run, a sweep or a plan, and write it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import ConfigError, shorten
from ..limits import MAX_TIME_MS, MAX_TIME_S, MAX_TOKENS
from . import figures
from .figures import fmt
from .page import Section, Table, card, esc, render
from .run_data import HEADLINE_FIELDS, run_data
from .run_source import slo_problem
from .study_data import plan_data, sweep_data, sweep_from_folder

# Verdict -> badge colour.
_VERDICT_CLASS = {"steady": "good", "saturated": "bad", "not steady": "bad", "empty": "bad"}


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


# --- a run ----------------------------------------------------------------------------------


def _offered_text(data: dict[str, Any], h: dict[str, Any]) -> str:
    """ "; 20 offered, 20 rejected" when the run was offered other than it injected: requests
    refused at admission or routing never reach an instance, and a run that rejected all 20
    it was offered read "0 / 0 completed / injected" as if nothing had been asked of it."""
    summary = data.get("summary") or {}
    offered = summary.get("offered_requests", (data.get("slo") or {}).get("offered_requests"))
    if offered is None or offered == h.get("injected_requests"):
        return ""
    counters = (data.get("anomalies") or {}).get("counters") or {}
    kinds = [counters.get(k) for k in ("admission_rejections", "routing_rejections")]
    numbers = [k for k in kinds if isinstance(k, int | float) and not isinstance(k, bool)]
    rejected = f", {fmt(sum(numbers))} rejected" if numbers else ""
    return f"; {fmt(offered)} offered{rejected}"


def _overview(data: dict[str, Any]) -> Section:
    h = data["headline"]
    slo = data.get("slo") or {}
    targets = slo.get("targets") or {}
    steady = data.get("steady") or {}
    verdict = steady.get("verdict") or data["summary"].get("steady_state") or "unknown"
    badge = _VERDICT_CLASS.get(verdict, "warn")
    lat = data["latency"]

    def target(key: str) -> str:
        return f"SLO {fmt(targets[key])} ms" if targets.get(key) is not None else ""

    itl = lat.get("itl") or lat.get("tpot") or {}
    cards = [
        card(
            "throughput",
            f"{fmt(h.get('responses_per_sec'))} req/s",
            f"{fmt(h.get('tokens_per_sec'))} output tokens/s",
        ),
        card(
            "TTFT p50 / p99",
            f"{fmt(h.get('ttft_p50_ms'))} / {fmt(h.get('ttft_p99_ms'))} ms",
            target("ttft_ms"),
        ),
        # The summary's ITL (every token gap) wherever the source has it: a saved result or
        # a results JSON keeps the summary but not the gaps, and showed the per-request mean.
        card(
            "ITL p50 / p99",
            f"{fmt(h['itl_p50_ms'])} / {fmt(h.get('itl_p99_ms'))} ms"
            if h.get("itl_p50_ms") is not None
            else f"{fmt(itl.get('p50'))} / {fmt(itl.get('p99'))} ms",
            target("itl_ms")
            or (
                "every token gap"
                if h.get("itl_p50_ms") is not None or "itl" in lat
                else "per-request mean"
            ),
        ),
        card(
            "E2E p50 / p99",
            f"{fmt(h.get('e2e_p50_ms'))} / {fmt(h.get('e2e_p99_ms'))} ms",
            target("e2e_ms"),
        ),
        card(
            "SLO attainment",
            _pct(slo.get("slo_attainment", h.get("slo_attainment"))),
            f"goodput {fmt(slo.get('goodput_rps', h.get('goodput_rps')))} req/s"
            + ("" if targets else " (no targets set: every completion counts)"),
        ),
        card(
            "requests",
            f"{fmt(h.get('completed_requests'))} / {fmt(h.get('injected_requests'))}",
            "completed / injected" + _offered_text(data, h),
        ),
        card("simulated time", f"{fmt(h.get('vllm_estimated_duration_s'))} s"),
        card(
            "preemptions",
            fmt(h.get("preemption_count")),
            f"dropped {fmt(h.get('dropped_unservable'))}, timed out "
            f"{fmt(h.get('timed_out_requests'))}",
        ),
    ]
    reasons = steady.get("reasons") or []
    verdict_html = (
        f'<p>Steady state: <span class="badge {badge}">{esc(verdict)}</span> '
        + (
            "— the latencies describe a sustainable load."
            if verdict == "steady"
            else "— the percentiles describe this run's length, not a load the server sustains."
            if verdict in ("saturated", "not steady")
            else ""
        )
        + "</p>"
    )
    if reasons:
        verdict_html += (
            '<ul class="reasons">' + "".join(f"<li>{esc(r)}</li>" for r in reasons) + "</ul>"
        )
    tables = []
    if steady:
        rows = [
            [k.replace("_", " "), v] for k, v in steady.items() if k not in ("verdict", "reasons")
        ]
        tables.append(Table("Steady-state evidence", ["what", "value"], rows))
    per_class = slo.get("per_class") or {}
    if per_class:
        rows = [
            [
                name,
                ", ".join(f"{k} ≤ {fmt(v)}" for k, v in (c.get("targets") or {}).items()),
                c.get("offered_requests"),
                c.get("met_requests"),
                c.get("slo_attainment"),
                c.get("goodput_rps"),
            ]
            for name, c in per_class.items()
        ]
        tables.append(
            Table(
                "SLO attainment per class",
                ["class", "targets (ms)", "offered", "met", "attainment (0-1)", "goodput (req/s)"],
                rows,
            )
        )
    summary = data.get("summary") or {}
    for prefix, title in (("spec_", "Speculative decoding"), ("lora_", "LoRA adapters")):
        # The features' own summary figures (spec_* for speculation, lora_* for adapters), as
        # the text report prints them: a run using them looked like a plain one here.
        rows = [[k, v] for k, v in summary.items() if k.startswith(prefix)]
        if rows:
            tables.append(Table(title, ["what", "value"], rows))
    return Section(
        "overview",
        "Overview",
        "The run's headline numbers (the summary servesim prints) and whether the server "
        "kept up with the offered load.",
        html=f'<div class="cards">{"".join(cards)}</div>{verdict_html}',
        tables=tables,
    )


def _scenario(data: dict[str, Any]) -> Section:
    rows = data["scenario"]
    notes = []
    if not rows:
        notes.append(
            "this input does not describe its scenario (a results JSON keeps only the numbers)"
        )
    return Section(
        "scenario",
        "Scenario",
        "What was simulated: the deployment and its parallel layout, the traffic, and which "
        "step-time model priced each engine step, on what evidence. Instances are "
        "data-parallel replicas behind the router.",
        tables=[Table("Deployment, traffic and latency model", ["what", "value"], rows)]
        if rows
        else [],
        notes=notes,
    )


def _latency(data: dict[str, Any], charts: list[figures.Chart]) -> Section:
    notes = [data["notes"]["itl"]] if "itl" in data["notes"] else []
    tables = []
    lat = data["latency"]
    rows = []
    for key, name in (
        ("ttft", "TTFT"),
        ("itl", "ITL (every token gap)"),
        ("tpot", "TPOT (per-request mean ITL)"),
        ("e2e", "E2E"),
    ):
        d = lat.get(key)
        if d and d.get("n"):
            rows.append([name, d["n"], d["mean"], d["p50"], d["p90"], d["p95"], d["p99"]])
    tables.append(
        Table(
            "Latency statistics (ms)",
            ["metric", "samples", "mean", "p50", "p90", "p95", "p99"],
            rows,
        )
    )
    per_slo = data.get("per_slo") or {}
    if per_slo:
        tables.append(
            Table(
                "Latency per SLO class (ms)",
                ["class", "requests", "completed", "TTFT p50", "TTFT p99", "E2E p50", "E2E p99"],
                [
                    [
                        name,
                        c.get("requests"),
                        c.get("completed_requests"),
                        c.get("ttft_p50_ms"),
                        c.get("ttft_p99_ms"),
                        c.get("e2e_p50_ms"),
                        c.get("e2e_p99_ms"),
                    ]
                    for name, c in per_slo.items()
                ],
            )
        )
    return Section(
        "latency",
        "Latency",
        "Distributions of time to first token, inter-token latency and end-to-end latency "
        "with the SLO targets. The p50/p99 in each legend are the summary's.",
        charts=charts,
        tables=tables,
        notes=notes,
    )


def _timeseries(data: dict[str, Any], charts: list[figures.Chart]) -> Section:
    notes = [data["notes"]["timeseries"]] if "timeseries" in data["notes"] else []
    return Section(
        "timeseries",
        "Over time",
        "The run as it unfolded, in fixed-width time bins: throughput, queues, KV cache, "
        "batch size and preemptions, per instance; legend entries switch lines on and off.",
        charts=charts,
        notes=notes,
    )


def _pd(data: dict[str, Any], charts: list[figures.Chart]) -> Section:
    pd = data.get("pd")
    notes = [data["notes"]["pd"]] if "pd" in data["notes"] else []
    tables = []
    if pd:
        tables.append(
            Table("PD metrics", ["metric", "value"], [[k, v] for k, v in pd["metrics"].items()])
        )
        if "stages" in pd:
            tables.append(
                Table(
                    "Time per stage of a disaggregated request (ms)",
                    ["stage", "mean", "p50", "p90", "p99"],
                    [
                        [
                            figures.STAGE_LABELS[k],
                            s["mean_ms"],
                            s["p50_ms"],
                            s["p90_ms"],
                            s["p99_ms"],
                        ]
                        for k, s in pd["stages"].items()
                    ],
                )
            )
    return Section(
        "pd",
        "Prefill/decode disaggregation",
        "Where a disaggregated request spends its time, and the KV-transfer link between the "
        "pools.",
        charts=charts,
        tables=tables,
        notes=notes,
    )


def _balance(data: dict[str, Any], charts: list[figures.Chart]) -> Section:
    bal = data.get("balance")
    notes = [data["notes"][k] for k in ("balance", "decisions") if k in data["notes"]]
    tables = []
    if bal:
        rows = bal["instances"]
        columns = [c for c in rows[0] if c not in ("label", "instance_id")]
        tables.append(
            Table(
                "Per-instance load",
                ["instance", *[c.replace("_", " ") for c in columns]],
                [[r["label"], *[r.get(c) for c in columns]] for r in rows],
            )
        )
        dec = bal.get("decisions") or {}
        if dec:
            s = dec["summary"]
            summary_rows = [
                [k.replace("_", " "), v] for k, v in s.items() if not isinstance(v, dict)
            ]
            if dec.get("regret"):
                summary_rows += [[f"regret {k}", v] for k, v in dec["regret"].items()]
            tables.append(Table("Decision trace", ["what", "value"], summary_rows))
            if dec.get("reasons"):
                tables.append(
                    Table(
                        "Routing reasons (most frequent 20)",
                        ["reason", "decisions"],
                        [[r["reason"], r["decisions"]] for r in dec["reasons"]],
                    )
                )
        if bal.get("per_model"):
            first = bal["per_model"][0]
            cols = list(first)
            tables.append(
                Table(
                    "Per model",
                    [c.replace("_", " ") for c in cols],
                    [[r.get(c) for c in cols] for r in bal["per_model"]],
                )
            )
    return Section(
        "balance",
        "Routing and balance",
        "How evenly the router spread the load over the instances, and what it decided.",
        charts=charts,
        tables=tables,
        notes=notes,
    )


def _lifecycle(data: dict[str, Any], charts: list[figures.Chart]) -> Section:
    lc = data.get("lifecycle")
    notes = [data["notes"]["lifecycle"]] if "lifecycle" in data["notes"] else []
    tables = []
    if lc and lc.get("events_total"):
        notes.append(
            f"the first {len(lc['events']):,} of {lc['events_total']:,} transitions "
            "are shown; --timeline-path writes them all"
        )
    if lc:
        if lc.get("fleet"):
            tables.append(
                Table(
                    "Fleet totals",
                    ["what", "value"],
                    [[k.replace("_", " "), v] for k, v in lc["fleet"].items()],
                )
            )
        if lc.get("instances"):
            cols = list(lc["instances"][0])
            tables.append(
                Table(
                    "Instances the fleet created (uptime s, cost USD)",
                    [c.replace("_", " ") for c in cols],
                    [[r.get(c) for c in cols] for r in lc["instances"]],
                )
            )
        if lc["events"]:
            tables.append(
                Table(
                    "Lifecycle transitions",
                    ["time (s)", "kind", "id", "from", "to", "reason"],
                    [
                        [e["time_s"], e["kind"], e["id"], e["from"], e["to"], e["reason"]]
                        for e in lc["events"]
                    ],
                )
            )
    return Section(
        "lifecycle",
        "Fleet lifecycle",
        "Nodes and instances appearing, loading, warming up, draining and failing, on the run's "
        "time axis.",
        charts=charts,
        tables=tables,
        notes=notes,
    )


def _anomalies(data: dict[str, Any]) -> Section:
    an = data["anomalies"]
    flags = an["flags"]
    body = (
        '<ul class="reasons">'
        + "".join(
            f"<li><strong>{esc(fmt(f['count']))}</strong> {esc(f['what'])}</li>" for f in flags
        )
        + "</ul>"
        if flags
        else "<p>Nothing unusual: no drops, time-outs, preemptions, inversions or rejections.</p>"
    )
    tables = []
    if an.get("counters"):
        tables.append(
            Table(
                "Anomaly counters",
                ["counter", "count"],
                [[k.replace("_", " "), v] for k, v in an["counters"].items()],
            )
        )
    if an.get("kv_cache"):
        tables.append(
            Table(
                "KV cache",
                ["metric", "value"],
                [[k.replace("_", " "), v] for k, v in an["kv_cache"].items()],
            )
        )
    return Section(
        "anomalies",
        "Anomalies",
        "Counters that should be zero in a healthy run, and the KV cache's hit and "
        "preemption rates.",
        html=body,
        tables=tables,
    )


def render_run(data: dict[str, Any]) -> str:
    charts = figures.run_charts(data)
    sections = [
        _overview(data),
        _scenario(data),
        _latency(data, charts["latency"]),
        _timeseries(data, charts["timeseries"]),
        _pd(data, charts["pd"]),
        _balance(data, charts["balance"]),
        _lifecycle(data, charts["lifecycle"]),
        _anomalies(data),
    ]
    facts = dict((row[0], row[1]) for row in data["scenario"])
    subtitle = [
        " · ".join(
            str(x)
            for x in (
                facts.get("model"),
                facts.get("GPU") and f"{facts['GPU']} TP{facts.get('tensor parallel (TP)', '')}",
                facts.get("instances (data-parallel replicas)")
                and f"{facts['instances (data-parallel replicas)']} instance(s)",
                facts.get("traffic"),
            )
            if x
        )
        or "servesim run",
    ]
    return render(f"servesim report: {data['title']}", subtitle, sections, data)


# --- a sweep and a plan -----------------------------------------------------------------------


def render_sweep(data: dict[str, Any]) -> str:
    charts = figures.sweep_charts(data)
    knees = [c for c in data["curves"] if c.get("knee")]
    overview_rows = [
        ["grid parameters", ", ".join(data["params"]) or "(none)"],
        ["load axis", data["load"] or "(none)"],
        ["seeds", ", ".join(map(str, data["seeds"]))],
        ["runs", data["runs"]],
        ["95% CI method", data["ci_method"]],
    ]
    if data.get("latency_models"):
        overview_rows.append(["step-time model", data["latency_models"].split(": ", 1)[1]])
    for c in data["curves"]:
        knee = c.get("knee")
        if knee:
            others = ", ".join(f"{n} {v}" for v, n in knee.get("verdicts", {}).items())
            text = (
                f"{data['load']} = {fmt(knee['load'])} ({knee['steady_seeds']}/"
                f"{knee['n_seeds']} seeds steady{'; ' + others if others else ''})"
            )
        elif "knee" in c:
            text = f"none: every seed steady up to {fmt(max(c['load']))}"
        else:
            text = "unknown (no steady-state verdicts)"
        overview_rows.append([f"saturation knee ({c['label']})", text])
    notes = list(data["notes"].values())
    metrics = data["table_metrics"]
    rows = []
    for p in data["points"]:
        row = [p["point"], *[p[k] for k in data["params"]], p["n_seeds"]]
        if "steady_seeds" in p:
            row.append(p["steady_seeds"])
        for m in metrics:
            row += [p[f"{m}_mean"], p[f"{m}_ci95"]]
        rows.append(row)
    headers = ["point", *data["params"], "seeds"]
    if data["points"] and "steady_seeds" in data["points"][0]:
        headers.append("steady seeds")
    for m in metrics:
        headers += [f"{m} mean", f"{m} ±95%"]
    sections = [
        Section(
            "overview",
            "Overview",
            "A grid of scenario variations, each simulated at every seed. The knee is the "
            "first load at which some seed's run did not reach a steady state.",
            html=f'<div class="cards">{card("points", fmt(len(data["points"])))}'
            f"{card('saturation knees found', fmt(len(knees)))}</div>",
            tables=[Table("Sweep", ["what", "value"], overview_rows)],
            notes=notes,
        ),
        Section(
            "curves",
            "Latency and throughput against load",
            "Each metric's mean across seeds (line) with its 95% confidence band. An X marks a "
            "load at which some seed's run did not reach a steady state; the dotted line is the "
            "first such load, the knee, labelled saturation when a seed there was judged "
            "saturated (beyond it latencies describe the run's length, not what the server "
            "sustains) and not steady otherwise (runs too short to judge, or that lost "
            "requests).",
            charts=charts,
            notes=[] if charts else ["nothing to draw against load"],
        ),
        Section(
            "points",
            "Every point",
            "Mean and 95% half-width across seeds (the same numbers as points.csv).",
            tables=[Table("Points", headers, rows)],
        ),
    ]
    return render(f"servesim report: {data['title']}", [f"{data['runs']} run(s)"], sections, data)


def render_plan(data: dict[str, Any]) -> str:
    charts = figures.plan_charts(data)
    cost = [c for c in charts if c.fid == "plan-cost"]
    frontier = [c for c in charts if c.fid != "plan-cost"]
    best = data.get("best")
    bounds = [f"{m} ≤ {fmt(v)}" for m, v in data["slos"].items()]
    if data.get("min_goodput") is not None:
        bounds.append(f"completed fraction ≥ {fmt(data['min_goodput'])}")
    cards = [
        card(
            "answer",
            f"{best['gpu']} × {best['instances']}" if best else "none",
            f"{best.get('layout') or 'TP ' + str(best['tp'])}, {best['total_gpus']} GPU(s), "
            f"{figures._usd(best['cost_per_hour_usd'])}/h"
            if best
            else data["no_answer"],  # study_data's, the text plan's line
        ),
        card(
            "SLO bounds",
            "; ".join(bounds) or "-",
            f"worst of seeds {', '.join(map(str, data['seeds']))}",
        ),
        card("attainment required", _pct(data["min_attainment"]), "of offered requests"),
    ]
    notes = [*data["notes_text"], *(f"warning: {w}" for w in data["warnings"])]
    per_gpu = data["per_gpu"]
    gpu_cols = list(per_gpu[0]) if per_gpu else []
    probe_cols = list(data["frontier"][0]) if data["frontier"] else []
    sections = [
        Section(
            "overview",
            "Overview",
            "The fewest instances per GPU type whose every seed reaches a steady state, meets "
            "every SLO bound and serves enough offered requests within the targets; the "
            "cheapest of them wins.",
            html=f'<div class="cards">{"".join(cards)}</div>',
            notes=notes,
        ),
        Section(
            "frontier",
            "Capacity frontier",
            "Every probe the search made, per GPU type.",
            charts=frontier,
        ),
        Section(
            "cost",
            "Cost per GPU type",
            "The smallest passing fleet of each GPU type and what it costs per hour.",
            charts=cost,
            tables=[
                Table(
                    "Per GPU type",
                    [c.replace("_", " ") for c in gpu_cols],
                    [[r.get(c) for c in gpu_cols] for r in per_gpu],
                )
            ],
        ),
        Section(
            "probes",
            "Every probe",
            "Each simulated fleet size: its worst-seed figures and why it failed.",
            tables=[
                Table(
                    "Probes",
                    [c.replace("_", " ") for c in probe_cols],
                    [[r.get(c) for c in probe_cols] for r in data["frontier"]],
                )
            ],
        ),
    ]
    return render(f"servesim report: {data['title']}", ["; ".join(bounds)], sections, data)


# --- entry points ---------------------------------------------------------------------------


def report_data(obj: Any) -> dict[str, Any]:
    """The data dict of any reportable object: a run (live, saved or a results document), a
    SweepResult or a PlanResult."""
    if hasattr(obj, "frontier") and hasattr(obj, "per_gpu"):
        return plan_data(obj)
    if hasattr(obj, "points") and hasattr(obj, "runs") and hasattr(obj, "params"):
        return sweep_data(obj)
    if isinstance(obj, dict):
        # A results document handed over in Python gets the checks a file gets.
        _check_results_document("report: the results document", obj)
    return run_data(obj)


def render_report(obj: Any) -> str:
    """The report page of `obj` (see `report_data`) as a string."""
    data = report_data(obj)
    renderer = {"run": render_run, "sweep": render_sweep, "plan": render_plan}[data["kind"]]
    return renderer(data)


def write_report(obj: Any, path: str | Path) -> Path:
    """Write the report page of `obj` to `path` atomically; return the path."""
    from ..atomic_io import check_output, require_output_path, write_text_atomically

    # A number or None is a ConfigError naming the argument, not a TypeError from pathlib.
    require_output_path("report: path", path)
    target = check_output(path, "report")
    return write_text_atomically(target, render_report(obj))


def load_input(path: str | Path) -> Any:
    """What `servesim report PATH` reports: a folder written by `Result.save` (summary.json),
    a sweep's --out folder (runs.parquet or runs.csv) or a --results-path JSON file."""
    from ..input_files import check_path, read_json

    p = Path(path)
    if p.is_dir():
        if (p / "summary.json").is_file():
            from ..metrics.persistence import load_result

            return load_result(p)
        if (p / "runs.parquet").is_file() or (p / "runs.csv").is_file():
            return sweep_from_folder(p)
        raise ConfigError(
            f"report: {str(p)!r} is neither a saved result (no summary.json) nor a sweep's "
            "--out folder (no runs.parquet or runs.csv)"
        )
    if not p.exists():
        raise ConfigError(
            f"report: {str(p)!r} does not exist; give a saved result folder, a sweep's --out "
            "folder or a --results-path JSON file"
        )
    check_path(p, "report")
    doc = read_json(p, "report")
    _check_results_document(f"report: {str(p)!r}", doc)
    return doc


# The --results-path entries the report reads besides the summary's numbers.
_RESULTS_MAPPINGS = (
    "slo", "steady_state_detail", "anomalies", "kv_cache", "latency_model", "engine_policies",
    "fleet", "pd", "per_slo_class",
)  # fmt: skip
# The entries the report reads row by row (each row a mapping): a mapping of rows by name, or
# a list of rows.
_RESULTS_ROWS_BY_NAME = ("per_slo_class",)
_RESULTS_ROW_LISTS = ("instances", "per_model")
# Each per-request number and its largest value: times within the simulator's clock (s or
# ms), token counts within its prompt size. Every request of a results file has all of them,
# a number (0 for a stage it did not reach), whether servesim or BLIS wrote it.
_RECORD_NUMBERS = {
    "arrived_at": MAX_TIME_S, "num_prefill_tokens": MAX_TOKENS, "num_decode_tokens": MAX_TOKENS,
    "ttft_ms": MAX_TIME_MS, "itl_ms": MAX_TIME_MS, "e2e_ms": MAX_TIME_MS,
    "scheduling_delay_ms": MAX_TIME_MS,
}  # fmt: skip


def _check_results_document(source: str, doc: Any) -> None:
    """A results JSON edited after it was written (`source` says which, as "report: 'PATH'"):
    a wrong kind of entry is one ConfigError naming it, not a failure deep inside the page's
    tables."""
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("requests"), list)
        or ("completed_requests" not in doc)
    ):
        raise ConfigError(
            f"{source} is not a results file (expected the JSON that --results-path writes: "
            "the summary fields and a 'requests' list)"
        )

    def refuse(where: str, value: Any, allowed: str) -> ConfigError:
        return ConfigError(
            f"{source}: {where}: invalid value {shorten(repr(value))}; {allowed} "
            "(as --results-path writes it)"
        )

    for key in _RESULTS_MAPPINGS:
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise refuse(key, doc[key], "must be a mapping")
    for key in _RESULTS_ROWS_BY_NAME:
        for name, row in (doc.get(key) or {}).items():
            if not isinstance(row, dict):
                raise refuse(f"{key}.{name}", row, "must be a mapping")
    for key in _RESULTS_ROW_LISTS:
        rows = doc.get(key)
        if rows is None:
            continue
        if not isinstance(rows, list):
            raise refuse(key, rows, "must be a list of mappings")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise refuse(f"{key}[{i}]", row, "must be a mapping")
    problem = slo_problem(doc.get("slo") or {})
    if problem is not None:
        raise refuse(*problem)
    for key in HEADLINE_FIELDS:
        # The Overview's figures: counts, rates, latencies and a duration, none negative.
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise refuse(key, value, "must be a number")
        if not 0 <= value < math.inf:
            raise refuse(key, value, "must be a number >= 0")
    for i, record in enumerate(doc["requests"]):
        if not isinstance(record, dict):
            raise refuse(f"requests[{i}]", record, "must be a mapping")
        for field, limit in _RECORD_NUMBERS.items():
            allowed = f"must be a number from 0 to {limit:,}"
            # A missing or null number was read as 0 or cast from NaN to a huge negative
            # integer: a page of nonsense (an E2E mean of -4.6e13 ms) with exit status 0.
            if field not in record:
                raise ConfigError(
                    f"{source}: requests[{i}].{field}: missing; {allowed} "
                    "(as --results-path writes it)"
                )
            value = record[field]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise refuse(f"requests[{i}].{field}", value, allowed)
            # NaN (JSON's non-standard NaN), or a time past the clock: a page of nonsense.
            if not 0 <= value <= limit:
                raise refuse(f"requests[{i}].{field}", value, f"must be from 0 to {limit:,}")


def default_output(path: str | Path) -> Path:
    """`report.html` inside a folder, or the file's name with .html beside it."""
    p = Path(path)
    return p / "report.html" if p.is_dir() else p.with_suffix(".html")
