"""Plotly figures of a report, drawn from the data dicts of run_data / study_data only (never
from the result itself), so what the page shows is exactly what it embeds.

Every figure has a title and axis titles with units. Colours come from the page's template
(light or dark, chosen in the browser), except neutral greys for reference lines (SLOs,
capacities), which read on both backgrounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

# Reference lines (SLO targets, capacities, knees): a grey that reads on white and on black.
REFERENCE = "#8a8a8a"
# Plotly's default colour sequence (both page templates use it), for figures that tie a band
# to its line.
COLORWAY = (
    "#636efa",
    "#EF553B",
    "#00cc96",
    "#ab63fa",
    "#FFA15A",
    "#19d3f3",
    "#FF6692",
    "#B6E880",
    "#FF97FF",
    "#FECB52",
)


# A figure's height before its legend rows, px.
HEIGHT = 360


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


@dataclass
class Chart:
    """One figure on the page: `fid` (its element id), `caption` (one line on how to read
    it) and the figure."""

    fid: str
    figure: go.Figure
    caption: str = ""
    wide: bool = False


def _layout(fig: go.Figure, title: str, x: str, y: str, height: int = HEIGHT) -> go.Figure:
    """Title at the top, the legend in its own band at the bottom of the figure (below the
    x-axis title, whatever the tick labels take), axes titled with units."""
    fig.update_layout(
        title={
            "text": title,
            "x": 0.01,
            "xanchor": "left",
            "font": {"size": 15},
            "automargin": True,
            "yref": "container",
            "y": 0.98,
            "yanchor": "top",
        },
        height=height,
        margin={"l": 64, "r": 20, "t": 40, "b": 40},
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
            "x": 0,
            "font": {"size": 11},
        },
        hovermode="closest",
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
    )
    fig.update_xaxes(title_text=x, automargin=True)
    fig.update_yaxes(title_text=y, automargin=True)
    return fig


def _subtitle(fig: go.Figure, text: str) -> None:
    fig.update_layout(
        title_subtitle_text=text,
        title_subtitle_font_size=12,
        margin_t=(fig.layout.margin.t or 40) + 18,
    )


def _fit_legend(fig: go.Figure) -> None:
    """Grow the figure by the rows its bottom legend needs (about two short entries per row
    in a third of a laptop screen; a long one takes a row), so the plot keeps its height."""
    names = [t.name or "" for t in fig.data if t.showlegend is not False]
    if len(names) < 2 and fig.layout.showlegend is not True:
        return
    rows = math.ceil(sum(1.0 if len(n) > 26 else 0.5 for n in names))
    fig.update_layout(height=(fig.layout.height or HEIGHT) + 20 * rows)


def _hline(fig: go.Figure, y: float, text: str, dash: str = "dash") -> None:
    fig.add_hline(
        y=y,
        line={"color": REFERENCE, "dash": dash, "width": 1.5},
        annotation_text=text,
        annotation_position="top left",
        annotation_font_size=11,
    )


def _vline(fig: go.Figure, x: float, text: str, dash: str = "dash") -> None:
    fig.add_vline(
        x=x,
        line={"color": REFERENCE, "dash": dash, "width": 1.5},
        annotation_text=text,
        annotation_position="top right",
        annotation_font_size=11,
    )


def _usd(x: Any) -> str:
    """$3.00, or "unpriced" for a GPU without a price (a plan of one unpriced GPU)."""
    return "unpriced" if x is None or (isinstance(x, float) and math.isnan(x)) else f"${x:.2f}"


def fmt(value: Any, digits: int = 4) -> str:
    """A number as a reader wants it: thousands separators for integers, `digits` significant
    digits for floats (no exponent below 10^digits), `-` for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 10**digits:
            return f"{value:,.0f}"
        if abs(value) < 1e-3:
            return f"{value:.3g}"
        return f"{value:.{digits}g}"
    return str(value)


# --- a run ----------------------------------------------------------------------------------


_CDF_PANELS = (
    # key, title, x axis, SLO target key, caption
    (
        "ttft",
        "TTFT: time to first token (CDF)",
        "TTFT (ms)",
        "ttft_ms",
        "Fraction of requests (y) whose first token came within x ms. The dashed line is the SLO "
        "target; the curve's height there is the fraction meeting it.",
    ),
    (
        "itl",
        "ITL: inter-token latency (CDF)",
        "ITL (ms)",
        "itl_ms",
        "Every gap between two tokens (the summary's ITL) and each request's own mean gap (TPOT), "
        "which is what an ITL SLO target judges.",
    ),
    (
        "e2e",
        "E2E: end-to-end latency, completed requests (CDF)",
        "E2E (ms)",
        "e2e_ms",
        "Fraction of completed requests (y) finished within x ms of arriving.",
    ),
)


def latency_cdfs(data: dict[str, Any]) -> list[Chart]:
    """One CDF per latency, its SLO target as a dashed line, p50/p99 in the legend."""
    lat = data["latency"]
    targets = (data.get("slo") or {}).get("targets") or {}
    charts = []
    for key, title, xlabel, target, caption in _CDF_PANELS:
        fig = go.Figure()
        curves = [(key, "requests")] if key != "itl" else []
        if key == "itl":
            if "itl" in lat:
                curves.append(("itl", "every token gap"))
            curves.append(("tpot", "per-request mean (TPOT)"))
        drawn = 0
        for name, label in curves:
            cdf = lat.get(name) or {}
            if not cdf.get("n"):
                continue
            drawn += 1
            fig.add_trace(
                go.Scatter(
                    x=cdf["ms"],
                    y=cdf["p"],
                    mode="lines",
                    name=f"{label}: p50 {fmt(cdf['p50'])}, p99 {fmt(cdf['p99'])} ms",
                    hovertemplate=f"{label} (n={cdf['n']:,})<br>%{{x:.4g}} ms<br>"
                    "fraction %{y:.4f}<extra></extra>",
                )
            )
        if not drawn:
            fig.add_trace(go.Scatter(x=[], y=[], name="no samples"))
        if targets.get(target) is not None:
            _vline(fig, targets[target], f"SLO {fmt(targets[target])} ms")
        ylabel = "fraction of requests" if key != "itl" else "fraction of gaps or requests"
        _layout(fig, title, xlabel, f"{ylabel} (0-1)")
        fig.update_layout(showlegend=True)
        fig.update_yaxes(range=[0, 1.02])
        charts.append(Chart(f"cdf-{key}", fig, caption))
    return charts


def _series_figure(
    ts: dict[str, Any],
    key: str,
    title: str,
    ylabel: str,
    capacity: bool = False,
) -> go.Figure:
    """A line per instance and, with several instances, the pooled fleet (the sum) as a
    legend entry to switch on: clicking a legend entry shows or hides its line, a double
    click shows it alone (plotly's own legend behaviour, no page script)."""
    fig = go.Figure()
    t = ts["t_s"]
    per = ts["instances"]
    pooled = ts["pooled"].get(key)
    for row in per:
        fig.add_trace(go.Scatter(x=t, y=row[key], mode="lines", name=row["label"]))
    if capacity:
        caps = sorted({row["kv_capacity_blocks"] for row in per if "kv_capacity_blocks" in row})
        for cap in caps:
            who = [r["label"] for r in per if r.get("kv_capacity_blocks") == cap]
            name = "KV capacity" + ("" if len(caps) == 1 else f" ({', '.join(who)})")
            fig.add_trace(
                go.Scatter(
                    x=[t[0], t[-1]],
                    y=[cap, cap],
                    mode="lines",
                    line={"dash": "dash", "color": REFERENCE},
                    name=f"{name}: {cap:,} blocks",
                )
            )
    if pooled is not None and len(per) != 1:
        fig.add_trace(
            go.Scatter(
                x=t,
                y=pooled,
                mode="lines",
                line={"width": 3},
                name="all instances (sum)",
                visible="legendonly" if per else True,
            )
        )
        total = ts["pooled"].get("kv_capacity_blocks")
        live = ts["pooled"].get("kv_capacity_blocks_live")
        if capacity and live is not None:
            # A fleet that changed: the capacity of the instances serving at each time.
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=live,
                    mode="lines",
                    line={"dash": "dot", "color": REFERENCE, "shape": "hv"},
                    name="KV capacity of the instances serving",
                    visible="legendonly" if per else True,
                )
            )
        elif capacity and total:
            fig.add_trace(
                go.Scatter(
                    x=[t[0], t[-1]],
                    y=[total, total],
                    mode="lines",
                    line={"dash": "dot", "color": REFERENCE},
                    name=f"KV capacity, all instances: {total:,} blocks",
                    visible="legendonly" if per else True,
                )
            )
    _layout(fig, title, "time since start (s)", ylabel)
    fig.update_layout(showlegend=True)
    fig.update_yaxes(rangemode="tozero")
    return fig


def time_series(data: dict[str, Any]) -> list[Chart]:
    ts = data.get("timeseries")
    if not ts:
        return []
    bin_text = f"mean per {ts['bin_s']:g} s bin"
    charts = []
    fig = go.Figure()
    per = ts["instances"]
    if len(per) > 1:
        # An instance that completes nothing (a PD prefill instance: a disaggregated request
        # completes where it decodes) would only add a line at zero.
        for row in per:
            if any(row["completions_per_s"]):
                fig.add_trace(
                    go.Scatter(
                        x=ts["t_s"], y=row["completions_per_s"], mode="lines", name=row["label"]
                    )
                )
    fig.add_trace(
        go.Scatter(
            x=ts["t_s"],
            y=ts["pooled"]["completions_per_s"],
            mode="lines",
            name="all instances",
            line={"width": 3},
        )
    )
    _layout(
        fig,
        f"Completed requests per second ({ts['bin_s']:g} s bins)",
        "time since start (s)",
        "completions (requests/s)",
    )
    charts.append(
        Chart(
            "ts-completions",
            fig,
            "Requests finishing per second. A flat line at the offered rate is a server that "
            "keeps up; a line below it while the queue grows is saturation.",
        )
    )
    if "output_tokens_per_s" in ts["pooled"]:
        fig = go.Figure(
            go.Scatter(
                x=ts["t_s"],
                y=ts["pooled"]["output_tokens_per_s"],
                mode="lines",
                name="all instances",
                fill="tozeroy",
            )
        )
        _layout(
            fig,
            f"Output tokens per second ({ts['bin_s']:g} s bins)",
            "time since start (s)",
            "output tokens (tokens/s)",
        )
        charts.append(
            Chart(
                "ts-tokens",
                fig,
                "Generated tokens per second across the fleet: first tokens and decode "
                "tokens, at the end of the step that made them (the token a preempted "
                "request's recomputation ends with, one per preemption, is not drawn).",
            )
        )
    if "queue" not in ts["pooled"]:  # no step log: completions are all there is
        return charts
    pooled_hint = (
        " Click “all instances (sum)” in the legend for the pooled fleet." if len(per) > 1 else ""
    )
    for key, fid, title, ylabel, caption, capacity in (
        (
            "queue",
            "ts-queue",
            f"Waiting queue ({bin_text})",
            "waiting requests (requests)",
            "Requests that arrived at an instance and wait to be scheduled. A queue that keeps "
            "growing means the instance cannot keep up.",
            False,
        ),
        (
            "kv_used",
            "ts-kv",
            f"KV cache in use ({bin_text})",
            "KV blocks in use (blocks)",
            "GPU KV-cache blocks held by requests; the dashed line is the capacity. Near the "
            "line, new requests wait for memory and running ones may be preempted.",
            True,
        ),
        (
            "batch",
            "ts-batch",
            f"Batch size ({bin_text})",
            "requests per step (requests)",
            "Requests that got tokens in each engine step (steps.batch_size): each one with a "
            "prefill chunk or a decode in it, whether or not the step gave it an output token. "
            "How much work one step does.",
            False,
        ),
        (
            "preemptions_per_s",
            "ts-preemptions",
            f"Preemptions per second ({ts['bin_s']:g} s bins)",
            "preemptions (per s)",
            "Running requests evicted because the KV cache was full; each one recomputes its "
            "prompt later. Zero is the healthy value.",
            False,
        ),
    ):
        fig = _series_figure(ts, key, title, ylabel, capacity=capacity)
        charts.append(Chart(fid, fig, caption + pooled_hint))
    return charts


STAGE_LABELS = {
    "prefill_wait": "prefill wait",
    "prefill": "prefill",
    "transfer": "KV transfer",
    "decode_wait": "decode wait",
    "decode": "decode",
}


def pd_charts(data: dict[str, Any]) -> list[Chart]:
    pd = data.get("pd")
    if not pd:
        return []
    charts = []
    if "stages" in pd:
        stages = pd["stages"]
        fig = go.Figure()
        for name, label in STAGE_LABELS.items():
            fig.add_trace(
                go.Bar(
                    y=["mean request"],
                    x=[stages[name]["mean_ms"]],
                    name=f"{label}: {fmt(stages[name]['mean_ms'])} ms",
                    orientation="h",
                    hovertemplate=f"{label}: %{{x:.4g}} ms<extra></extra>",
                )
            )
        fig.update_layout(barmode="stack", legend_traceorder="normal")
        _layout(
            fig,
            f"Where a disaggregated request's time goes (mean of {pd['requests']:,}; "
            f"E2E {fmt(pd['e2e_mean_ms'])} ms)",
            "time (ms)",
            "statistic",
            height=260,
        )
        charts.append(
            Chart(
                "pd-stages",
                fig,
                "Mean time per stage: waiting for a prefill instance, prefilling, the KV "
                "transfer, waiting at the decode instance, decoding. The stages add up to "
                "the mean end-to-end latency.",
                wide=True,
            )
        )
        fig = go.Figure()
        for q in (50, 90, 99):
            fig.add_trace(
                go.Bar(
                    x=[STAGE_LABELS[n] for n in STAGE_LABELS],
                    y=[stages[n][f"p{q}_ms"] for n in STAGE_LABELS],
                    name=f"p{q}",
                )
            )
        fig.update_layout(barmode="group")
        _layout(fig, "PD stage percentiles", "stage", "time (ms)")
        charts.append(
            Chart("pd-stage-percentiles", fig, "Each stage's median, p90 and p99 on its own.")
        )
    if "transfer" in pd:
        cdf = pd["transfer"]
        fig = go.Figure(
            go.Scatter(
                x=cdf["ms"],
                y=cdf["p"],
                mode="lines",
                name=f"KV transfers: p50 {fmt(cdf['p50'])} ms, p99 {fmt(cdf['p99'])} ms "
                f"(n={cdf['n']:,})",
            )
        )
        _layout(
            fig,
            "KV transfer duration (CDF)",
            "transfer duration (ms)",
            "fraction of transfers (0-1)",
        )
        fig.update_layout(showlegend=True)
        charts.append(
            Chart(
                "pd-transfer",
                fig,
                "How long prompts' KV caches took to cross the link, contention included.",
            )
        )
    return charts


def balance_charts(data: dict[str, Any]) -> list[Chart]:
    bal = data.get("balance")
    if not bal:
        return []
    rows = bal["instances"]
    labels = [r["label"] for r in rows]
    charts = []
    fig = go.Figure()
    for key, name in (("routed", "routed"), ("completed", "completed")):
        if all(key in r for r in rows):
            fig.add_trace(go.Bar(x=labels, y=[r[key] for r in rows], name=name))
    fig.update_layout(barmode="group")
    title = "Requests per instance"
    if "jain_fairness_routed" in bal:
        title += f" (Jain's fairness of routed: {bal['jain_fairness_routed']:.3f})"
    _layout(fig, title, "instance", "requests (count)")
    charts.append(
        Chart(
            "balance-requests",
            fig,
            "Requests the router sent to each instance and those it completed. Even bars are "
            "a balanced fleet (Jain's index 1)."
            + (" A disaggregated request counts on both pools." if data.get("pd") else ""),
        )
    )
    if all("mean_kv_utilization" in r for r in rows):
        fig = go.Figure()
        fig.add_trace(
            go.Bar(x=labels, y=[100 * (r["mean_kv_utilization"] or 0) for r in rows], name="mean")
        )
        if all("peak_kv_utilization" in r for r in rows):
            fig.add_trace(
                go.Scatter(
                    x=labels,
                    y=[100 * (r["peak_kv_utilization"] or 0) for r in rows],
                    mode="markers",
                    marker={"symbol": "line-ew-open", "size": 26, "line": {"width": 3}},
                    name="peak",
                )
            )
        _layout(fig, "KV cache utilisation per instance", "instance", "KV blocks in use (%)")
        fig.update_yaxes(range=[0, 105])
        charts.append(
            Chart(
                "balance-kv",
                fig,
                "Mean (bars) and peak (ticks) share of each instance's KV cache in use.",
            )
        )
    dec = bal.get("decisions") or {}
    if dec.get("per_target"):
        fig = go.Figure()
        for target, values in dec["per_target"].items():
            fig.add_trace(
                go.Scatter(x=dec["t_s"], y=values, mode="lines", stackgroup="one", name=target)
            )
        _layout(
            fig,
            f"Routing decisions per second by target ({dec['bin_s']:g} s bins)",
            "time since start (s)",
            "decisions (per s)",
        )
        charts.append(
            Chart(
                "balance-decisions",
                fig,
                "Where the router sent requests over time (stacked): a band that thins or "
                "swells shows the policy moving load.",
                wide=True,
            )
        )
    return charts


# A marker shape per lifecycle state entered (metrics/fleet.py's timeline `to_state`).
_STATE_SYMBOLS = {
    "provisioning": "diamond-open",
    "ready": "circle",
    "scheduling": "square-open",
    "loading": "diamond",
    "warming_up": "triangle-up",
    "active": "circle",
    "draining": "triangle-down",
    "terminated": "x",
    "failed": "x-thin-open",
}


def lifecycle_chart(data: dict[str, Any]) -> list[Chart]:
    lc = data.get("lifecycle")
    if not lc or not lc["events"]:
        return []
    events = lc["events"]
    fig = go.Figure()
    for state in sorted({e["to"] for e in events}):
        chosen = [e for e in events if e["to"] == state]
        fig.add_trace(
            go.Scatter(
                x=[e["time_s"] for e in chosen],
                y=[e["id"] for e in chosen],
                mode="markers",
                marker={"size": 10, "symbol": _STATE_SYMBOLS.get(state, "circle")},
                name=f"→ {state}",
                text=[f"{e['from']} → {e['to']}: {e['reason']}" for e in chosen],
                hovertemplate="%{y} at %{x:.3f} s<br>%{text}<extra></extra>",
            )
        )
    from ..cluster.decisions import natural_key

    # Nodes first, then instances, each in natural order (instance_2 before instance_10).
    order = sorted(
        {(e["kind"] != "node", e["id"]) for e in events}, key=lambda k: (k[0], natural_key(k[1]))
    )
    _layout(
        fig,
        f"Lifecycle transitions ({len(events):,})",
        "time since start (s)",
        "node or instance",
        height=max(HEIGHT, 120 + 22 * len(order)),
    )
    fig.update_yaxes(
        type="category", categoryorder="array", categoryarray=[i for _, i in reversed(order)]
    )
    # The run's whole time axis, as the time series above have it.
    end_s = max(
        [data["summary"].get("vllm_estimated_duration_s") or 0.0, *(e["time_s"] for e in events)]
    )
    fig.update_xaxes(range=[0, max(end_s, 1.0) * 1.02])
    return [
        Chart(
            "lifecycle",
            fig,
            "Each marker is a node or instance entering a state (hover for the reason). "
            "Read it against the time series above: capacity arrives only once an instance "
            "is active.",
            wide=True,
        )
    ]


def run_charts(data: dict[str, Any]) -> dict[str, list[Chart]]:
    """Charts per section id."""
    return {
        "latency": _fitted(latency_cdfs(data)),
        "timeseries": _fitted(time_series(data)),
        "pd": _fitted(pd_charts(data)),
        "balance": _fitted(balance_charts(data)),
        "lifecycle": _fitted(lifecycle_chart(data)),
    }


def _fitted(charts: list[Chart]) -> list[Chart]:
    for chart in charts:
        if not chart.wide:
            _fit_legend(chart.figure)
    return charts


# --- a sweep --------------------------------------------------------------------------------


def sweep_charts(data: dict[str, Any]) -> list[Chart]:
    return _fitted(_sweep_charts(data))


def _sweep_charts(data: dict[str, Any]) -> list[Chart]:
    from ..metrics.study import LOAD_LABELS, metric_label

    charts: list[Chart] = []
    load = data.get("load")
    if load is None:
        return charts
    n_seeds = len(data["seeds"])
    for metric in data["metrics"]:
        fig = go.Figure()
        knees: list[tuple[float, str]] = []
        for i, curve in enumerate(data["curves"]):
            m = curve["metrics"][metric]
            x = curve["load"]
            mean = m["mean"]
            half = [h if h is not None else 0.0 for h in m["ci95"]]
            upper = [None if v is None else v + h for v, h in zip(mean, half, strict=True)]
            lower = [None if v is None else v - h for v, h in zip(mean, half, strict=True)]
            group = f"g{i}"
            color = COLORWAY[i % len(COLORWAY)]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=upper,
                    mode="lines",
                    line={"width": 0},
                    showlegend=False,
                    legendgroup=group,
                    hoverinfo="skip",
                )
            )
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=lower,
                    mode="lines",
                    line={"width": 0},
                    fill="tonexty",
                    fillcolor=_rgba(color, 0.2),
                    showlegend=False,
                    legendgroup=group,
                    hoverinfo="skip",
                )
            )
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=mean,
                    mode="lines+markers",
                    name=curve["label"],
                    line={"color": color},
                    legendgroup=group,
                    customdata=list(
                        zip(
                            half,
                            curve.get("steady_seeds", [None] * len(x)),
                            curve.get("n_seeds", [None] * len(x)),
                            strict=True,
                        )
                    ),
                    hovertemplate="load %{x}<br>mean %{y:.4g} ± %{customdata[0]:.3g}"
                    "<br>steady seeds %{customdata[1]}/%{customdata[2]}<extra></extra>",
                )
            )
            if curve.get("steady_seeds") is not None:
                bad = [
                    j
                    for j, (s, k) in enumerate(
                        zip(curve["steady_seeds"], curve["n_seeds"], strict=True)
                    )
                    if s < k
                ]
                if bad:
                    fig.add_trace(
                        go.Scatter(
                            x=[x[j] for j in bad],
                            y=[mean[j] for j in bad],
                            mode="markers",
                            marker={"symbol": "x", "size": 12, "color": color},
                            name="not every seed steady",
                            legendgroup=group,
                            showlegend=i == 0,
                        )
                    )
            if curve.get("knee"):
                knees.append((curve["knee"], curve["label"]))
        for knee, label in knees:
            who = "" if len(data["curves"]) == 1 else f" ({label})"
            # Saturation only when a seed there was judged saturated; `too short` is no
            # evidence of an overload.
            verdicts = knee.get("verdicts", {})
            kind = "saturation" if "saturated" in verdicts else "not steady"
            _vline(fig, knee["load"], f"{kind}{who}: {knee['load']:g}", dash="dot")
        _layout(
            fig,
            f"{metric} vs {load}",
            LOAD_LABELS.get(load, f"{load} (grid value)"),
            metric_label(metric),
        )
        _subtitle(fig, f"mean ± 95% CI over {n_seeds} seed(s)")
        if metric.endswith(("_attainment", "_rate")):
            fig.update_yaxes(range=[0, 1.05])
        loads = [v for c in data["curves"] for v in c["load"] if v is not None]
        if loads and max(loads) > min(loads):
            # The loads probed, a little margin each side: a knee's label at the last load
            # stretched the autoranged axis to about three times the data.
            pad = (max(loads) - min(loads)) * 0.05
            fig.update_xaxes(range=[min(loads) - pad, max(loads) + pad])
        charts.append(Chart(f"sweep-{metric}", fig))
    return charts


# --- a plan ---------------------------------------------------------------------------------


def plan_charts(data: dict[str, Any]) -> list[Chart]:
    return _fitted(_plan_charts(data))


def _plan_charts(data: dict[str, Any]) -> list[Chart]:
    from ..metrics.study import metric_label

    charts: list[Chart] = []
    frontier = data["frontier"]
    gpus = list(dict.fromkeys(r["gpu"] for r in frontier))
    metrics = [(f"{m}_worst", m, b) for m, b in data["slos"].items()]
    metrics.append(("attainment_worst", "slo_attainment", data["min_attainment"]))
    for column, metric, bound in metrics:
        fig = go.Figure()
        for gpu in gpus:
            probes = sorted((r for r in frontier if r["gpu"] == gpu), key=lambda r: r["instances"])
            fig.add_trace(
                go.Scatter(
                    x=[r["instances"] for r in probes],
                    y=[r.get(column) for r in probes],
                    mode="lines+markers",
                    name=str(gpu),
                    marker={
                        "size": 11,
                        "symbol": [
                            "circle"
                            if r["meets"]
                            else ("x" if r.get("steady") is False else "circle-open")
                            for r in probes
                        ],
                    },
                    text=[r.get("reason") or "meets every SLO" for r in probes],
                    hovertemplate="%{x} instance(s): %{y:.4g}<br>%{text}<extra></extra>",
                )
            )
        label = "SLO" if column != "attainment_worst" else "required attainment"
        _hline(fig, bound, f"{label}: {bound:g}")
        ylabel = (
            "worst-seed SLO attainment (fraction)"
            if column == "attainment_worst"
            else f"worst-seed {metric_label(metric)}"
        )
        _layout(
            fig,
            f"Capacity frontier: {metric}, worst of {len(data['seeds'])} seed(s)",
            "instances (count)",
            ylabel,
        )
        fig.update_xaxes(
            dtick=1 if max((r["instances"] for r in frontier), default=1) <= 20 else None
        )
        charts.append(
            Chart(
                f"plan-{metric}",
                fig,
                "Every probe: filled markers meet every SLO, open ones miss, X marks a probe "
                "that did not reach a steady state. The dashed line is the bound.",
            )
        )
    rows = [r for r in data["per_gpu"]]
    fig = go.Figure(
        go.Bar(
            x=[r["gpu"] for r in rows],
            y=[r["cost_per_hour_usd"] if r["feasible"] else 0 for r in rows],
            text=[
                f"{int(r['instances'])} × ({r.get('layout') or 'TP ' + str(r['tp'])}) = "
                f"{int(r['total_gpus'])} GPU(s)"
                if r["feasible"]
                else f"infeasible ≤ {data['max_instances']}"
                for r in rows
            ],
            textposition="outside",
            name="cost",
        )
    )
    best = data.get("best")
    title = "Cost per GPU type at the smallest passing fleet"
    if best:
        title += f" (cheapest: {best['gpu']}, {_usd(best['cost_per_hour_usd'])}/h)"
    _layout(fig, title, "GPU type", "cost (USD per hour)")
    charts.append(
        Chart(
            "plan-cost",
            fig,
            "Instances × GPUs per instance (its layout) × price per GPU-hour for each GPU's "
            "smallest fleet meeting every "
            "SLO; prices are the plan's table (override with --price).",
        )
    )
    return charts
