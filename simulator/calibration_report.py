"""BLIS's calibration report (docs/behaviour.md §12.2): a real TraceV2 trace against a simulation of
it.

Requests are joined by request_id, skipping the real trace's warm-up requests. Real TTFT is
first chunk − send and real E2E last chunk − send, as the client saw them; the simulated
values get what the client adds on top of the server: the network round trip and the time to
upload the prompt and download the answer (4 bytes per token over the given bandwidth).
A request the client did not stream (`streaming` false) has no measured TTFT: its "first
chunk" is the first byte of the whole answer. It counts towards E2E only.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError, counted, invalid
from .workload.trace import not_streamed

BYTES_PER_TOKEN = 4
PERCENTILES = (50, 90, 95, 99)
# (grade, MAPE below, Pearson r above), best first.
QUALITY_GRADES = (("excellent", 0.10, 0.95), ("good", 0.20, 0.85), ("fair", 0.35, 0.70))
# Mean signed error within this fraction of the real mean counts as unbiased.
BIAS_TOLERANCE = 0.01
KNOWN_LIMITATIONS = (
    "token IDs are synthesised from lengths, so prefix-cache hits in the real server that "
    "the trace does not record (prefix_group empty) are not reproduced",
    "the network is modelled as a fixed round trip plus a constant bandwidth",
    "sampling, detokenisation and HTTP framing costs are folded into the latency model",
)


@dataclass(frozen=True)
class Joined:
    """Per matched request (same order): real and simulated E2E in ms; real and simulated
    TTFT in ms of the matched requests that were streamed (the others measured none)."""

    real_ttft_ms: np.ndarray
    sim_ttft_ms: np.ndarray
    real_e2e_ms: np.ndarray
    sim_e2e_ms: np.ndarray
    info: dict[str, Any]


def _sim_times_from_result(result: Any) -> dict[str, tuple[float, float, int, int]]:
    """request_id -> (server TTFT µs, server E2E µs, input tokens, output tokens), completed."""
    from .engine.request import RequestState

    out = {}
    for r in result.request_records:
        if r.state is RequestState.COMPLETED:
            rid = r.request_id.removeprefix("request_")
            out[rid] = (
                r.first_token_us - r.arrival_us,
                r.completion_us - r.arrival_us,
                r.input_tokens,
                r.generated_tokens,
            )
    return out


def _sim_times_from_trace(data: Path) -> dict[str, tuple[float, float, int, int]]:
    from .workload.trace import read_rows

    return {
        r.request_id: (
            r.first_chunk_time_us - r.arrival_time_us,
            r.last_chunk_time_us - r.arrival_time_us,
            r.input_tokens,
            r.output_tokens,
        )
        for r in read_rows(data)
        if r.status == "ok"
    }


def left_out(
    rows: list[Any],
    warm_up_requests: int,
    early: int = 0,
    warm_up_s: float = 0.0,
) -> tuple[int, str]:
    """(how many rows, why) a recorded trace's `rows` give no request to compare or fit: the
    first `warm_up_requests` (the header's warm-up), the rows whose status is not `ok` (or
    that are `ok` without chunk times), counted by status, and `early` rows sent within
    `warm_up_s` of the first send. One line's worth: `not ok: 8 (error 8); warm-up: 2`."""
    warm = min(warm_up_requests, len(rows))
    by_status = Counter(
        row.status if row.status != "ok" else "ok without chunk times"
        for row in rows[warm:]
        if row.status != "ok" or row.first_chunk_time_us <= 0 or row.last_chunk_time_us <= 0
    )
    statuses = ", ".join(f"{status} {n:,}" for status, n in by_status.most_common())
    not_ok = sum(by_status.values())
    parts = [
        f"not ok: {not_ok:,}" + (f" ({statuses})" if statuses else ""),
        f"warm-up: {warm:,} (the header's warm_up_requests)",
    ]
    if warm_up_s > 0:
        parts.append(f"sent within --warm-up-s {warm_up_s:g} of the first: {early:,}")
    return warm + not_ok + early, "; ".join(parts)


def nothing_to_compare(
    where: str,
    rows: list[Any],
    warm_up_requests: int,
    unmatched: int = 0,
    early: int = 0,
    warm_up_s: float = 0.0,
    purpose: str = "compare",
) -> str:
    """The one-line error for a recorded trace of which no row is left to compare (or, with
    `purpose` "fit", to fit): how many rows were left out and why (`left_out`), and how many
    found no simulated request. `where` starts it (`calibration report: no request of
    'real.csv'`)."""
    if not rows:
        return f"{where} to {purpose}: the trace has no rows"
    count, why = left_out(rows, warm_up_requests, early, warm_up_s)
    if unmatched:
        return (
            f"{where} matches a completed simulated request by request_id: of its "
            f"{len(rows):,} rows, {unmatched:,} have none and {count:,} were left out: {why}"
        )
    return f"{where} to {purpose}: all {len(rows):,} of its rows were left out: {why}"


def check_network(rtt_ms: float | None, network_bandwidth_mbps: float) -> None:
    if rtt_ms is not None and not (math.isfinite(rtt_ms) and rtt_ms >= 0):
        raise invalid("--rtt-ms", rtt_ms, "must be a number >= 0")
    if not (math.isfinite(network_bandwidth_mbps) and network_bandwidth_mbps >= 0):
        raise invalid("--network-bandwidth-mbps", network_bandwidth_mbps, "must be >= 0 (0 = off)")


def network_ms(
    header: dict[str, Any],
    input_tokens: int,
    output_tokens: int,
    rtt_ms: float | None = None,
    network_bandwidth_mbps: float = 0.0,
) -> tuple[float, float]:
    """What the client's network adds to a request's (TTFT, E2E), ms: the round trip
    (`rtt_ms`, else the header's `network.measured_rtt_ms`), the prompt's upload and, for
    E2E, the answer's download at BYTES_PER_TOKEN over the bandwidth (0 = not modelled).
    The report and calibrate's fit both add this to the simulated side, so a fitted server
    does not absorb the network and the two agree on every error."""
    check_network(rtt_ms, network_bandwidth_mbps)
    if rtt_ms is None:
        rtt_ms = float((header.get("network") or {}).get("measured_rtt_ms") or 0.0)
    bytes_per_ms = network_bandwidth_mbps * 1e6 / 8 / 1e3
    upload_ms = input_tokens * BYTES_PER_TOKEN / bytes_per_ms if bytes_per_ms else 0.0
    download_ms = output_tokens * BYTES_PER_TOKEN / bytes_per_ms if bytes_per_ms else 0.0
    return rtt_ms + upload_ms, rtt_ms + upload_ms + download_ms


# A simulated run whose requests share ids with the recording but not their prompts is a
# replay of something else (ids are 0, 1, 2, ... in every run): at or above this share of the
# matched requests, the report refuses it rather than scoring unrelated requests.
OTHER_RUN_SHARE = 0.1


def prompt_tokens_of(row: Any) -> tuple[int, ...]:
    """The prompt lengths a replay of `row` may record: the suffix it sends (a v3 export keeps
    a group's prefix apart) or, for a prefix-group row, the suffix with its prefix (a Result,
    or a v2 export, counts the whole prompt)."""
    from .workload.trace import REPLAY_PREFIX_TOKENS

    tokens = (row.replay_input_tokens,)
    if row.prefix_group:
        prefix = REPLAY_PREFIX_TOKENS if row.prefix_length is None else row.prefix_length
        tokens += (row.input_tokens + prefix,)
    return tokens


def refuse_another_run(
    other_prompt: list[tuple[str, int, int]], matched: int, real_data: Path, simulated: Any
) -> None:
    """Refuse a simulated side whose matched requests' prompts are not the recording's."""
    if not other_prompt or len(other_prompt) < OTHER_RUN_SHARE * matched:
        return
    rid, real_tokens, sim_tokens = other_prompt[0]
    side = repr(str(simulated)) if isinstance(simulated, str | Path) else "the simulated run"
    raise ConfigError(
        f"calibration report: {side} is not a replay of {str(real_data)!r}: "
        f"{len(other_prompt):,} of the {matched:,} requests matched by id have another prompt "
        f"length (request {rid}: {real_tokens:,} tokens recorded, {sim_tokens:,} simulated); "
        "replay this trace (`servesim replay --trace-header ... --trace-data ... "
        "--trace-output SIM`) and compare SIM.csv"
    )


def join(
    real_header: Path,
    real_data: Path,
    simulated: Any,
    rtt_ms: float | None = None,
    network_bandwidth_mbps: float = 0.0,
    warm_up_s: float = 0.0,
) -> Joined:
    """Match real and simulated requests; `simulated` is a Result or a simulated TraceV2 CSV.
    `warm_up_s` > 0 leaves out the requests sent less than that after the first send, as
    calibrate's fit and validate do (`MeasuredRun.after_warm_up`)."""
    from .validate import check_warm_up_s
    from .workload.trace import never_sent, read_header, read_rows, refuse_decreasing_times

    warm_up_s = check_warm_up_s(warm_up_s, "--warm-up-s")

    check_network(rtt_ms, network_bandwidth_mbps)
    header = read_header(real_header)
    if header.get("mode", "generated") != "real":
        raise invalid(
            f"calibration report: {str(real_header)!r} mode",
            header.get("mode"),
            "the real side must be a trace recorded from a server (mode: real)",
        )
    warm_up = int(header.get("warm_up_requests") or 0)
    if rtt_ms is None:
        rtt_ms = float((header.get("network") or {}).get("measured_rtt_ms") or 0.0)
    sim = (
        _sim_times_from_trace(Path(simulated))
        if isinstance(simulated, str | Path)
        else _sim_times_from_result(simulated)
    )
    rows = read_rows(real_data)
    unsent = never_sent(rows)
    sent = [r.injection_basis_us for r, never in zip(rows, unsent, strict=True) if not never]
    first_sent_us = min(sent, default=0)
    real_ttft, sim_ttft, real_e2e, sim_e2e = [], [], [], []
    skipped_status = unmatched = early = unstreamed = 0
    other_prompt: list[tuple[str, int, int]] = []  # (request id, real, simulated) tokens
    for i, row in enumerate(rows):
        if i < warm_up:
            continue
        if row.status != "ok" or row.first_chunk_time_us <= 0 or row.last_chunk_time_us <= 0:
            skipped_status += 1
            continue
        if row.injection_basis_us - first_sent_us < warm_up_s * 1e6:
            early += 1
            continue
        simulated_row = sim.get(row.request_id)
        if simulated_row is None:
            unmatched += 1
            continue
        ttft_us, e2e_us, n_in, n_out = simulated_row
        if n_in not in prompt_tokens_of(row):
            other_prompt.append((row.request_id, row.replay_input_tokens, n_in))
        added_ttft_ms, added_e2e_ms = network_ms(
            header, n_in, n_out, rtt_ms, network_bandwidth_mbps
        )
        sent_us = row.send_time_us or row.arrival_time_us
        refuse_decreasing_times(row, sent_us, f"calibration report: {str(real_data)!r}")
        real_e2e.append((row.last_chunk_time_us - sent_us) / 1e3)
        sim_e2e.append(e2e_us / 1e3 + added_e2e_ms)
        if not_streamed(header, row):
            unstreamed += 1
            continue
        real_ttft.append((row.first_chunk_time_us - sent_us) / 1e3)
        sim_ttft.append(ttft_us / 1e3 + added_ttft_ms)
    refuse_another_run(other_prompt, len(real_e2e), real_data, simulated)
    if not real_e2e:
        raise ConfigError(
            nothing_to_compare(
                f"calibration report: no request of {str(real_data)!r}",
                rows,
                warm_up,
                unmatched,
                early,
                warm_up_s,
            )
        )
    info = {
        "real_requests": len(rows),
        "warm_up_skipped": min(warm_up, len(rows)),
        "not_ok_skipped": skipped_status,
        **({"warm_up_s_skipped": early} if warm_up_s > 0 else {}),
        "unmatched": unmatched,
        "matched": len(real_e2e),
        # Matched by id with another prompt length: fewer than the share refused above.
        **({"prompt_tokens_differ": len(other_prompt)} if other_prompt else {}),
        # Matched but not streamed: E2E only (no measured TTFT).
        **({"not_streamed": unstreamed} if unstreamed else {}),
        "rtt_ms": rtt_ms,
        "network_bandwidth_mbps": network_bandwidth_mbps,
    }
    return Joined(
        np.asarray(real_ttft), np.asarray(sim_ttft), np.asarray(real_e2e), np.asarray(sim_e2e), info
    )


def quality(mape: float, pearson_r: float) -> str:
    for grade, max_mape, min_r in QUALITY_GRADES:
        if mape < max_mape and pearson_r > min_r:
            return grade
    return "poor"


def metric_report(real: np.ndarray, sim: np.ndarray) -> dict[str, Any]:
    """count, MAPE (real = 0 skipped), Pearson r (n >= 3), percentiles, bias and quality."""
    nonzero = real != 0
    mape = (
        float(np.mean(np.abs(sim[nonzero] - real[nonzero]) / real[nonzero]))
        if nonzero.any()
        else math.nan
    )
    if real.size >= 3 and np.std(real) > 0 and np.std(sim) > 0:
        pearson_r = float(np.corrcoef(real, sim)[0, 1])
    else:
        pearson_r = math.nan
    signed = float(np.mean(sim - real) / np.mean(real)) if np.mean(real) else math.nan
    if not math.isfinite(signed) or abs(signed) < BIAS_TOLERANCE:
        bias = "neutral"
    else:
        bias = "over-predicts" if signed > 0 else "under-predicts"
    report: dict[str, Any] = {"count": int(real.size), "mape": mape, "pearson_r": pearson_r}
    for p in PERCENTILES:
        report[f"real_p{p}"] = float(np.percentile(real, p))
        report[f"sim_p{p}"] = float(np.percentile(sim, p))
    report["mean_signed_error"] = signed
    report["bias"] = bias
    report["quality"] = quality(mape, pearson_r if math.isfinite(pearson_r) else -1.0)
    return report


def calibration_report(
    real_header: str | Path,
    real_data: str | Path,
    simulated: Any,
    rtt_ms: float | None = None,
    network_bandwidth_mbps: float = 0.0,
    warm_up_s: float = 0.0,
) -> dict[str, Any]:
    """The report as a dict: {"ttft": {...}, "e2e": {...}, "trace_info": {...},
    "known_limitations": [...]}; `simulated` is a servesim Result or a simulated TraceV2 CSV.
    "ttft" covers the matched requests that were streamed, and is None when none was (a
    non-streamed answer's first chunk is its whole body: `trace_info["not_streamed"]`)."""
    joined = join(
        Path(real_header), Path(real_data), simulated, rtt_ms, network_bandwidth_mbps, warm_up_s
    )
    return {
        "ttft": (
            metric_report(joined.real_ttft_ms, joined.sim_ttft_ms)
            if joined.real_ttft_ms.size
            else None
        ),
        "e2e": metric_report(joined.real_e2e_ms, joined.sim_e2e_ms),
        "trace_info": joined.info,
        "known_limitations": list(KNOWN_LIMITATIONS),
    }


def format_report(report: dict[str, Any]) -> str:
    lines = ["calibration report (simulated vs real, ms)"]
    info = report["trace_info"]
    unstreamed = info.get("not_streamed", 0)
    for metric in ("ttft", "e2e"):
        m = report[metric]
        if m is None:
            lines.append(
                f"  {metric.upper():<5} not measured: none of the {info['matched']:,} matched "
                "requests was streamed (streaming=false: the first chunk is the whole answer, "
                "so first chunk - send is E2E); E2E only"
            )
            continue
        lines.append(
            f"  {metric.upper():<5} n={m['count']} MAPE {m['mape']:.1%}  Pearson r "
            f"{m['pearson_r']:.3f}  bias {m['bias']} ({m['mean_signed_error']:+.1%})  "
            f"quality {m['quality']}"
        )
        lines.append(
            "        "
            + "  ".join(
                f"p{p} real {m[f'real_p{p}']:.1f} sim {m[f'sim_p{p}']:.1f}" for p in PERCENTILES
            )
        )
    if unstreamed and report["ttft"] is not None:
        lines.append(
            f"  note: TTFT over the {report['ttft']['count']:,} streamed requests only; "
            f"{counted(unstreamed, 'request')} not streamed (streaming=false: the first chunk "
            "is the whole answer) count towards E2E only"
        )
    lines.append("  trace: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    lines.append("  known limitations: " + "; ".join(report["known_limitations"]))
    return "\n".join(lines)


__all__ = ["calibration_report", "format_report", "metric_report", "quality"]
