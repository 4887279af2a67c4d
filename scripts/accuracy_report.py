"""Generate the measured-accuracy section of docs/accuracy.md from the ground truth.

    .venv/bin/python scripts/accuracy_report.py [--groundtruth groundtruth]
        [--rounds 3] [--data docs/accuracy-data.json] [--from-data]

It evaluates, on the nine moderate-load runs (general, codegen, roleplay x 3 models):
  * physics, leave-one-model-out: fitted on the six runs of two models, scored on the third's;
  * physics fitted on all nine runs (written to --ship, shipped as H100's default): in-sample;
  * physics with its physical defaults (nothing fitted);
  * roofline (nothing fitted); blackbox only where defaults.yaml has coefficients;
  * the prefix-cache sensitivity (whole prompts reused / system prompt shared by 10 groups
    round-robin / no sharing).
Every physics and roofline figure uses the prompt-reuse replay (`validate --prompt-reuse`):
the load generator cycled through a few dozen fixed prompts, so vLLM's prefix cache served
almost every prompt.
  * the step composition against step_samples.csv.
Figures go to a JSON file first, so `--from-data` re-renders the page without replaying.
Takes ~20 minutes on one core.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator import calibrate as cal  # noqa: E402
from simulator.catalog.defaults import lookup_coefficients  # noqa: E402
from simulator.latency.physics import (  # noqa: E402
    COEFFICIENT_NAMES,
    PhysicsCoefficients,
    coefficients_document,
)
from simulator.validate import (  # noqa: E402
    HARDWARE,
    default_groundtruth,
    discover_runs,
    replay_overrides,
    reuse_trace,
    shared_prefix_trace,
    validate_run,
)

DOC = ROOT / "docs" / "accuracy.md"
START, END = "<!-- accuracy-report:start -->", "<!-- accuracy-report:end -->"
SHOWN = ("e2e_mean_ms", "itl_ms", "ttft_mean_ms", "ttft_p99_ms", "e2e_p99_ms")
LABELS = {
    "e2e_mean_ms": "E2E mean",
    "itl_ms": "ITL",
    "ttft_mean_ms": "TTFT mean",
    "ttft_p99_ms": "TTFT p99",
    "e2e_p99_ms": "E2E p99",
}
# Acceptance targets of issue #7 on the median error across runs.
TARGETS = {"e2e_mean_ms": 0.05, "itl_ms": 0.05, "ttft_mean_ms": 0.15, "ttft_p99_ms": 0.25}
UNCALIBRATED_TARGETS = {"e2e_mean_ms": 0.20, "itl_ms": 0.20}
# Replays of a fit round run in this many processes.
WORKERS = 2
# The steady-state figures leave out the requests of each run's first 30 s: every 0.15.1 run
# started a fresh vLLM server, whose first 10-15 s ran slow (docs/accuracy.md, "The servers'
# warm-up"); 30 s is twice the longest transient seen, chosen from the time series.
WARM_UP_S = 30.0


def _signed(outcome: dict[str, Any]) -> dict[str, float]:
    return {s["metric"]: s["signed_error"] for s in outcome["scores"]}


def _write_yaml(path: Path, document: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# Per run, the replay trace of its repeated prompts (see `reuse_trace`).
REUSE: dict[str, tuple[Path, Path]] = {}


def _score_with(runs: list, coeffs: Path | None, latency_model: str = "physics", **extra: Any):
    """Signed errors per run; by default on the prompt-reuse replay (prefix caching on);
    `warm_up_s` scores only the requests after it (validate_run)."""
    overrides = {"latency__coeffs_file": coeffs} if coeffs is not None else {}
    out = {}
    for run in runs:
        trace = extra.get("trace", REUSE.get(run.name))
        caching = {"engine__enable_prefix_caching": trace is not None}
        outcome = validate_run(
            run,
            latency_model,
            overrides | caching | extra.get("overrides", {}),
            trace,
            warm_up_s=extra.get("warm_up_s", 0.0),
        )
        out[run.name] = _signed(outcome)
        print(f"  {run.name}: {outcome['wall_s']:.1f} s", file=sys.stderr, flush=True)
    return out


def evaluate(
    groundtruth: Path,
    rounds: int,
    ship: Path,
    forced_output: bool = True,
    fit_warm_up_s: float = 0.0,
) -> dict[str, Any]:
    """Every figure of the page; the fits see only the requests after `fit_warm_up_s` (the
    scores are made both ways, whole run and steady state, whatever it is)."""
    runs = [r for r in discover_runs(groundtruth, forced_output) if not r.overloaded]
    models = sorted({r.model for r in runs})
    data: dict[str, Any] = {
        "runs": {r.name: {"model": r.model, "workload": r.workload} for r in runs},
        "fit_warm_up_s": fit_warm_up_s,
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        for run in runs:
            REUSE[run.name] = reuse_trace(run, tmp_dir)
        lomo: dict[str, dict[str, float]] = {}
        folds = {}
        for held_out in models:
            print(f"leave out {held_out}", file=sys.stderr, flush=True)
            train = [r for r in runs if r.model != held_out]
            # From the physical defaults with the prior on them: the shipped 0.15.1 fit saw
            # the held-out model, so starting from it would leak that model into the fold.
            fitted = cal.fit(
                [cal.groundtruth_case(r, True, tmp_dir, fit_warm_up_s) for r in train],
                start="physical",
                rounds=rounds,
                workers=WORKERS,
                prior="physical",
            )
            folds[held_out] = cal.coefficients_dict(fitted.coefficients)
            path = _write_yaml(tmp_dir / f"fold-{len(folds)}.yaml", fitted.document())
            lomo |= _score_with([r for r in runs if r.model == held_out], path)
        data["lomo"] = lomo
        data["lomo_coefficients"] = folds
        print("physics, fit on all nine runs (shipped; in-sample)", file=sys.stderr, flush=True)
        full = cal.fit(
            [cal.groundtruth_case(r, True, tmp_dir, fit_warm_up_s) for r in runs],
            start="physical",
            rounds=rounds,
            workers=WORKERS,
            prior="physical",
        )
        about = {"warm_up_s": fit_warm_up_s} if fit_warm_up_s > 0 else {}
        shipped = _write_yaml(ship, full.document(groundtruth="groundtruth", **about))
        data["shipped_coefficients"] = cal.coefficients_dict(full.coefficients)
        data["shipped"] = _score_with(runs, shipped)
        data |= steady_state(runs, data, tmp_dir)
        print("physics, physical defaults", file=sys.stderr, flush=True)
        defaults = _write_yaml(
            tmp_dir / "defaults.yaml", coefficients_document(PhysicsCoefficients())
        )
        data["uncalibrated"] = _score_with(runs, defaults)
        print("roofline", file=sys.stderr, flush=True)
        data["roofline"] = _score_with(runs, None, "roofline")
        data["blackbox"] = {
            r.name: "no coefficients"
            for r in runs
            if lookup_coefficients(r.model, HARDWARE, r.tp, "v0.15.1") is None
        }
        print("prefix-cache sensitivity (shipped coefficients)", file=sys.stderr, flush=True)
        prefix = {}
        for run in runs:
            trace = shared_prefix_trace(run, tmp_dir / f"{run.name}-prefix")
            prefix |= _score_with([run], shipped, trace=trace)
        data["prefix_shared"] = prefix
        data["prefix_none"] = _score_with(runs, shipped, trace=None)
        data["step_composition"] = step_composition(groundtruth, runs, shipped)
    data["wall_s"] = time.perf_counter() - started
    return data


def steady_state(runs: list, data: dict[str, Any], tmp_dir: Path) -> dict[str, Any]:
    """The leave-one-model-out and shipped figures again, from the coefficients in `data`,
    over the requests that arrived WARM_UP_S or more after each run's first."""
    print(f"steady state (the first {WARM_UP_S:g} s left out)", file=sys.stderr, flush=True)
    for run in runs:
        if run.name not in REUSE:
            REUSE[run.name] = reuse_trace(run, tmp_dir)

    def coefficients_file(name: str, values: dict[str, float]) -> Path:
        # Files saved before the ridge's exponent was recorded were fitted with its default.
        known = {k: v for k, v in values.items() if k in COEFFICIENT_NAMES}
        document = coefficients_document(PhysicsCoefficients(**known))
        return _write_yaml(tmp_dir / f"steady-{name}.yaml", document)

    lomo = {}
    for number, (model, values) in enumerate(data["lomo_coefficients"].items()):
        path = coefficients_file(f"fold-{number}", values)
        held = [r for r in runs if r.model == model]
        lomo |= _score_with(held, path, warm_up_s=WARM_UP_S)
    shipped = coefficients_file("shipped", data["shipped_coefficients"])
    return {
        "warm_up_s": WARM_UP_S,
        "lomo_steady": lomo,
        "shipped_steady": _score_with(runs, shipped, warm_up_s=WARM_UP_S),
    }


def step_composition(groundtruth: Path, runs: list, coeffs: Path) -> dict[str, Any]:
    """Distributions of running batch, scheduled tokens per step and KV usage: real step
    samples versus servesim's steps of the same run (shipped physics coefficients)."""
    from simulator.api import replay

    samples_path = next(groundtruth.rglob("step_samples.csv"), None)
    if samples_path is None:
        return {}
    samples = pd.read_csv(samples_path)
    out = {}
    for run in runs:
        real = samples[samples["experiment_id"] == run.name]
        if real.empty:
            continue
        overrides = replay_overrides(run, "physics") | {
            "latency__coeffs_file": coeffs,
            "engine__enable_prefix_caching": True,
        }
        result = replay(*REUSE[run.name], **overrides)
        steps = result.steps
        sim = {
            "running_requests": steps["running_requests"].to_numpy(),
            "scheduled_tokens": (steps["prefill_tokens"] + steps["decode_tokens"]).to_numpy(),
            "kv_usage": steps["kv_used_blocks"].to_numpy() / run.gpu_kv_blocks,
            "prefill_step_share": (steps["prefill_tokens"] > 0).to_numpy().astype(float),
        }
        measured = {
            "running_requests": real["queue.running_depth"].to_numpy(),
            "scheduled_tokens": real["batch.scheduled_tokens"].to_numpy(),
            "kv_usage": real["kv.usage_gpu_ratio"].to_numpy(),
            "prefill_step_share": (real["batch.prefill_tokens"] > 0).to_numpy().astype(float),
        }
        out[run.name] = {
            key: {
                "real": _distribution(measured[key]),
                "servesim": _distribution(sim[key]),
                "samples": int(len(measured[key])),
                "steps": int(len(sim[key])),
            }
            for key in measured
        }
    return out


def _distribution(values: np.ndarray) -> dict[str, float]:
    p10, p50, p90, p99 = np.percentile(values, [10, 50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p10": float(p10),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
    }


# ------------------------------------------------------------------------------------ render


def _pct(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:+.1f}%"


def _summary(per_run: dict[str, dict[str, float]], metric: str) -> tuple[float, float]:
    errors = [abs(v[metric]) for v in per_run.values() if math.isfinite(v[metric])]
    return statistics.median(errors), statistics.fmean(errors)


def _per_run_table(per_run: dict[str, dict[str, float]], names: list[str], short: dict) -> list:
    """A table of signed errors: one row per run, one column per SHOWN metric."""
    lines = [
        "| run | " + " | ".join(LABELS[m] for m in SHOWN) + " |",
        "|---|" + "---|" * len(SHOWN),
    ]
    for n in names:
        lines.append(f"| {short[n]} | " + " | ".join(_pct(per_run[n][m]) for m in SHOWN) + " |")
    return lines


def _steady_lines(data: dict[str, Any], names: list[str], short: dict[str, str]) -> list[str]:
    """The summary and per-run table over the requests after each server's warm-up."""
    warm_up = data.get("warm_up_s", WARM_UP_S)
    lines = [
        "",
        f"### Steady state: the first {warm_up:g} s of each run left out",
        "",
        "The same replays and coefficients, scored over the requests that arrived "
        f"{warm_up:g} s or more after the run's first, on both sides (`servesim validate "
        f"--warm-up-s {warm_up:g}`): the freshly started servers' first seconds are left out "
        '(see "The servers\' warm-up" above). Median |error| (mean in brackets), whole run → '
        "steady state:",
        "",
        "| metric | physics, leave-one-model-out | physics, shipped H100 fit (in-sample) |",
        "|---|---|---|",
    ]
    for metric in SHOWN:
        cells = []
        for key in ("lomo", "shipped"):
            whole, whole_mean = _summary(data[key], metric)
            steady, steady_mean = _summary(data[f"{key}_steady"], metric)
            cells.append(
                f"{100 * whole:.1f}% ({100 * whole_mean:.1f}%) → "
                f"{100 * steady:.1f}% ({100 * steady_mean:.1f}%)"
            )
        lines.append(f"| {LABELS[metric]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Leave-one-model-out per run, steady state (signed error):",
        "",
        *_per_run_table(data["lomo_steady"], names, short),
    ]
    return lines


def render(data: dict[str, Any]) -> str:
    names = list(data["runs"])
    short = {
        n: f"{data['runs'][n]['model'].split('/')[-1]} {data['runs'][n]['workload']}" for n in names
    }
    lines = [START, "", "_Generated by `scripts/accuracy_report.py`; do not edit by hand._", ""]
    lines += [
        "### Summary: median |error| across the nine moderate-load runs (mean in brackets)",
        "",
        "| metric | physics, leave-one-model-out | physics, shipped H100 fit (in-sample) "
        "| physics, physical defaults | roofline |",
        "|---|---|---|---|---|",
    ]
    for metric in SHOWN:
        cells = []
        for key in ("lomo", "shipped", "uncalibrated", "roofline"):
            median, mean = _summary(data[key], metric)
            cells.append(f"{100 * median:.1f}% ({100 * mean:.1f}%)")
        lines.append(f"| {LABELS[metric]} | " + " | ".join(cells) + " |")
    lines += ["", "Acceptance (issue #7), median error across runs:", ""]
    for key, label, targets in (
        ("lomo", "leave-one-model-out", TARGETS),
        ("uncalibrated", "physical defaults", UNCALIBRATED_TARGETS),
    ):
        for metric, target in targets.items():
            median, _ = _summary(data[key], metric)
            verdict = (
                "met" if median <= target else f"**missed by {100 * (median - target):.1f} points**"
            )
            lines.append(
                f"- {label} {LABELS[metric]}: {100 * median:.1f}% "
                f"(target ≤ {100 * target:.0f}%) — {verdict}"
            )
    if "lomo_steady" in data:
        lines += _steady_lines(data, names, short)
    lines += [
        "",
        "### Leave-one-model-out, per run (signed error: + = servesim predicts more)",
        "",
        "Each model's runs are scored with coefficients fitted on the other two models' six runs "
        "(`servesim calibrate`, the same objective as the shipped fit). These are the honest, "
        "out-of-sample figures.",
        "",
        *_per_run_table(data["lomo"], names, short),
    ]
    lines += ["", "Coefficients of each fold (fitted without the named model):", ""]
    coeff_names = list(next(iter(data["lomo_coefficients"].values())))
    lines.append("| left out | " + " | ".join(f"`{c}`" for c in coeff_names) + " |")
    lines.append("|---|" + "---|" * len(coeff_names))
    for model, coeffs in data["lomo_coefficients"].items():
        lines.append(
            f"| {model.split('/')[-1]} | "
            + " | ".join(f"{coeffs[c]:.4g}" for c in coeff_names)
            + " |"
        )
    for key, title, note in (
        (
            "shipped",
            "Physics with the shipped H100 coefficients — in-sample",
            "Fitted on all nine runs, so these figures are in-sample and flatter the model.",
        ),
        (
            "uncalibrated",
            "Physics with its physical defaults — nothing fitted",
            "Every coefficient at the value `PhysicsCoefficients` derives from public "
            "hardware facts.",
        ),
        ("roofline", "Roofline (BLIS-Mar) — nothing fitted", ""),
    ):
        lines += ["", f"### {title}", ""]
        if note:
            lines += [note, ""]
        lines += _per_run_table(data[key], names, short)
    missing = data.get("blackbox", {})
    lines += [
        "",
        "Blackbox: defaults.yaml has no coefficients for "
        + (", ".join(sorted({data["runs"][n]["model"] for n in missing})) if missing else "none")
        + " on H100 with vLLM v0.15.1, so it cannot be scored here.",
        "",
        "### Prefix-cache sensitivity",
        "",
        "Shipped coefficients, three replays of the same requests: **whole prompts reused** "
        "(the main replay of every table above: the profile's distinct prompts, prefix caching "
        "on), **system prompt shared** (the README's sensitivity check: its 100-token system "
        "prompt, 150 for roleplay, shared by 10 groups round-robin, caching on) and **no "
        "sharing** (the README's baseline, caching off).",
        "",
        "| run | "
        + " | ".join(
            f"{LABELS[m]} reused / system / none" for m in ("e2e_mean_ms", "itl_ms", "ttft_mean_ms")
        )
        + " |",
        "|---|---|---|---|",
    ]
    for n in names:
        cells = [
            f"{_pct(data['shipped'][n][m])} / {_pct(data['prefix_shared'][n][m])} / "
            f"{_pct(data['prefix_none'][n][m])}"
            for m in ("e2e_mean_ms", "itl_ms", "ttft_mean_ms")
        ]
        lines.append(f"| {short[n]} | " + " | ".join(cells) + " |")
    lines += ["", "### Step composition against `step_samples.csv`", ""]
    lines += [
        "Real: the ~10% sample of engine steps of the two Llama-2-70B runs. servesim: every step "
        "of the same run replayed with the shipped coefficients. Running requests are read at the "
        "step's end in servesim and at its start in vLLM.",
        "",
        "| run | quantity | real mean / p10 / p50 / p90 / p99 "
        "| servesim mean / p10 / p50 / p90 / p99 |",
        "|---|---|---|---|",
    ]
    for n, quantities in data.get("step_composition", {}).items():
        for q, d in quantities.items():
            fmt = "{:.3f}" if q in ("kv_usage", "prefill_step_share") else "{:.1f}"
            real = " / ".join(
                fmt.format(d["real"][k]) for k in ("mean", "p10", "p50", "p90", "p99")
            )
            sim = " / ".join(
                fmt.format(d["servesim"][k]) for k in ("mean", "p10", "p50", "p90", "p99")
            )
            lines.append(f"| {short[n]} | {q} | {real} | {sim} |")
    lines += ["", f"Evaluation wall time: {data['wall_s'] / 60:.1f} min on this machine.", "", END]
    return "\n".join(lines)


def main() -> None:
    global WORKERS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--groundtruth",
        type=Path,
        default=None,
        help="ground-truth folder (default: the repository's groundtruth/)",
    )
    parser.add_argument("--rounds", type=int, default=cal.DEFAULT_ROUNDS)
    parser.add_argument("--data", type=Path, default=ROOT / "docs" / "accuracy-data.json")
    parser.add_argument("--from-data", action="store_true", help="render the saved figures only")
    parser.add_argument(
        "--fit-warm-up-s",
        type=float,
        default=0.0,
        help="fit on the requests after this many seconds of each run only (calibrate "
        "--warm-up-s); default 0, the whole runs",
    )
    parser.add_argument(
        "--steady-from-data",
        action="store_true",
        help="re-score only the steady-state figures from the saved coefficients (no fit), "
        "save them and render",
    )
    parser.add_argument(
        "--ship",
        type=Path,
        default=ROOT / "docs" / "physics-h100-fit.yaml",
        help="where to write the all-nine-runs fit (copy its coefficients into physics.yaml)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=WORKERS,
        help="processes for the replays of each fit round (1 on a busy machine)",
    )
    parser.add_argument(
        "--reported-output-length",
        action="store_true",
        help="replay the client's reported output counts, not the forced length (validate's "
        "--reported-output-length)",
    )
    args = parser.parse_args()
    WORKERS = args.workers
    if args.from_data:
        data = json.loads(args.data.read_text())
    elif args.steady_from_data:
        data = json.loads(args.data.read_text())
        groundtruth = args.groundtruth or default_groundtruth("accuracy_report")
        runs = [
            r
            for r in discover_runs(groundtruth, not args.reported_output_length)
            if not r.overloaded
        ]
        with tempfile.TemporaryDirectory() as tmp:
            data |= steady_state(runs, data, Path(tmp))
        args.data.write_text(json.dumps(data, indent=1))
    else:
        groundtruth = args.groundtruth or default_groundtruth("accuracy_report")
        data = evaluate(
            groundtruth,
            args.rounds,
            args.ship,
            not args.reported_output_length,
            args.fit_warm_up_s,
        )
        args.data.write_text(json.dumps(data, indent=1))
    text = DOC.read_text()
    section = render(data)
    if START in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    DOC.write_text(text)
    print(f"wrote {DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
