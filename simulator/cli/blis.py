"""Flags of current BLIS's `run` and `replay` that map onto servesim's scenario in more than
one field: closed-loop load (`--concurrency`, `--think-time-ms`), `--timeout` in seconds,
`--metrics-path`, closed-loop replay (`--session-mode`, `--think-time-*`) and
`--defaults-filepath` (docs/cli.md, "BLIS flags").

Each function turns the parsed flags (a dict, typer's parameter names) into scenario overrides
and refuses combinations BLIS refuses, naming the flags.

The annotations here are evaluated when the module is imported (no `from __future__ import
annotations`, on purpose): typer reads every option's `Annotated[...]` with
`typing.get_type_hints` each time it builds a command, and a string annotation costs an `eval`
there, about 10 ms of every `run`'s start-up for ~130 options (tests/test_startup.py).
"""

import re
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ConfigError, excerpt
from .flags import WORKLOAD_FIELDS, naming_flags

_WL = "Workload"


def _opt(flag: str, help: str) -> Any:  # noqa: A002
    return typer.Option(flag, help=help, rich_help_panel=_WL)


def closed_loop_flags(
    concurrency: Annotated[
        int | None,
        _opt(
            "--concurrency",
            "closed loop: this many virtual users, each sending its next request when its "
            "previous one finished plus the think time (instead of --rate)",
        ),
    ] = None,
    think_time_ms: Annotated[
        int | None,
        _opt("--think-time-ms", "closed loop: a user's pause after each response, ms (default 0)"),
    ] = None,
    timeout: Annotated[
        int | None,
        _opt(
            "--timeout",
            "client deadline after arrival, s (BLIS's unit; negative = none; default: none, "
            "or the spec's own)",
        ),
    ] = None,
) -> None:
    """Template: `run`'s closed-loop and deadline flags (current BLIS)."""


def closed_loop_overrides(flags: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any]:
    """`workload` (synthetic-workload overrides) with the closed-loop and --timeout flags."""
    workload = dict(workload)
    users = flags.get("concurrency")
    think_ms = flags.get("think_time_ms")
    if users is not None:
        if users <= 0:
            raise ConfigError(f"--concurrency: invalid value {users}; must be >= 1 (users)")
        if flags.get("rate") is not None:
            raise ConfigError(
                "--concurrency: closed-loop users send as their requests finish; it cannot be "
                "combined with --rate (open loop)"
            )
        if flags.get("workload_spec") is not None:
            raise ConfigError(
                "--concurrency: cannot be combined with --workload-spec; give the spec's "
                "client `concurrency` and `think_time_us` instead"
            )
        workload["workload.concurrency"] = users
    if think_ms is not None:
        if think_ms < 0:
            raise ConfigError(f"--think-time-ms: invalid value {think_ms}; must be >= 0 (ms)")
        # With --concurrency, or a scenario whose users are closed-loop already; the scenario
        # refuses a think time for an open loop (0, no pause, passes).
        workload["workload.think_time_us"] = think_ms * 1000
    seconds = flags.get("timeout")
    if seconds is not None:
        if flags.get("timeout_us") is not None:
            raise ConfigError("--timeout: seconds, the same deadline as --timeout-us; give one")
        from ..limits import MAX_TIME_S  # pydantic: not at import, which `--help` pays for

        if seconds == 0 or seconds > MAX_TIME_S:
            # Refused here, in seconds: the scenario's check of workload.timeout_us would name
            # --timeout-us, the flag that sets the field as it is (µs).
            raise ConfigError(
                f"--timeout: invalid value {seconds}; give the deadline in seconds, from 1 to "
                f"{MAX_TIME_S:,} (the clock's range), or a negative number for none"
            )
        workload["workload.timeout_us"] = seconds * 1_000_000 if seconds > 0 else 0
    return workload


def results_path(flags: dict[str, Any]) -> Path | None:
    """--results-path, or its current BLIS name --metrics-path (not both)."""
    results, metrics = flags.get("results_path"), flags.get("metrics_path")
    if results is not None and metrics is not None:
        raise ConfigError(
            "--metrics-path: current BLIS's name of --results-path (the same file); give one"
        )
    return results if results is not None else metrics


SESSION_MODES = ("fixed", "closed-loop")


def session_mode_trace(
    session_mode: str, think_time_ms: int | None, think_time_dist: str | None
) -> dict[str, Any]:
    """The trace fields of `replay --session-mode/--think-time-ms/--think-time-dist`."""
    from ..workload.closed_loop import parse_think_time

    if session_mode not in SESSION_MODES:
        raise ConfigError(
            f"--session-mode: invalid value {excerpt(session_mode)}; valid: fixed, closed-loop"
        )
    if think_time_ms is not None and think_time_dist is not None:
        raise ConfigError("--think-time-ms and --think-time-dist: give one of them")
    if session_mode == "fixed":
        for flag, value in (
            ("--think-time-ms", think_time_ms),
            ("--think-time-dist", think_time_dist),
        ):
            if value is not None:
                raise ConfigError(f"{flag}: needs --session-mode closed-loop")
        return {}
    think = None
    if think_time_ms is not None:
        if think_time_ms < 0:
            raise ConfigError(f"--think-time-ms: invalid value {think_time_ms}; must be >= 0 (ms)")
        # BLIS: 0 means "derive from the trace", not a zero think time.
        think = f"constant:value={think_time_ms}ms" if think_time_ms else None
    elif think_time_dist is not None:
        parse_think_time(think_time_dist)  # refuse a bad one before anything runs
        think = think_time_dist
    return {"session_mode": "closed-loop", "think_time": think}


# --- --defaults-filepath ------------------------------------------------------------------------

# Top-level keys of BLIS's defaults.yaml (March and current); servesim reads the first five.
_DEFAULTS_KEYS = {
    "defaults",
    "workloads",
    "models",
    "trained_physics_coefficients",
    "crossmodel_defaults",
    "trained_roofline_defaults",
    "version",
    "lora",
    "kv_offload_devices",
}
# A defaults.yaml workload preset's keys are `run`'s length flags (and prefix_tokens): each
# sets the scenario field that flag sets.
_PRESET_FIELDS = {
    key: field
    for key, field in WORKLOAD_FIELDS.items()
    if key.startswith(("prompt_tokens", "output_tokens")) or key == "prefix_tokens"
}
# Backend -> the section of defaults.yaml holding its one global coefficient set.
_GLOBAL_COEFFICIENTS = {
    "trained-physics": "trained_physics_coefficients",
    "crossmodel": "crossmodel_defaults",
    "trained-roofline": "trained_roofline_defaults",
}


def _mapping(where: str, value: object) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a mapping, got {excerpt(value)}")
    return value


def _same_model(query: str, entry: str) -> bool:
    q, e = query.lower(), str(entry).lower()
    return q == e or q.rsplit("/", 1)[-1] == e.rsplit("/", 1)[-1]


def _coefficients(where: str, section: dict) -> dict[str, list[float]]:
    out = {}
    for key in ("alpha_coeffs", "beta_coeffs"):
        values = section.get(key)
        if not isinstance(values, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values
        ):
            raise ConfigError(f"{where}.{key}: must be a list of numbers, got {excerpt(values)}")
        out[key] = [float(v) for v in values]
    return out


def _row_blocks(where: str, value: object) -> int:
    from ..limits import MAX_KV_BLOCKS  # pydantic: not at import, which `--help` pays for

    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_KV_BLOCKS:
        raise ConfigError(
            f"{where}.total_kv_blocks: invalid value {excerpt(value)}; expected a whole number "
            f"of blocks from 1 to {MAX_KV_BLOCKS:,}"
        )
    return value


def defaults_file_overrides(
    path: Path,
    scenario: Path | None,
    overrides: dict[str, Any],
    workload: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a BLIS defaults.yaml (`--defaults-filepath`) supplies to this run, as scenario and
    synthetic-workload overrides: the model's default GPU and TP (`defaults:`) where neither
    the scenario nor a flag sets them, a named preset's lengths (`workloads:`) where no length
    flag is given, and the latency backend's coefficients where none are given (the global
    set of trained-physics, cross-model or trained-roofline, or the blackbox row for the
    model, GPU and TP in `models:`)."""
    from ..api import as_scenario, with_overrides
    from ..catalog.defaults import canonical_gpu, model_defaults
    from ..deployment import capacity_rule, settings_unlike_measured_row
    from ..input_files import read_yaml_mapping
    from ..scenario import Scenario, SyntheticWorkload

    where = "--defaults-filepath"
    data = read_yaml_mapping(path, "defaults file")
    unknown = sorted(set(map(str, data)) - _DEFAULTS_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: {str(path)!r}: unknown key(s) {', '.join(unknown)}; valid: "
            f"{', '.join(sorted(_DEFAULTS_KEYS))}"
        )
    sc = as_scenario(scenario) if scenario is not None else Scenario()
    with naming_flags(overrides, workload):
        sc = with_overrides(sc, overrides, workload)
    extra: dict[str, Any] = {}
    extra_workload: dict[str, Any] = {}
    entries = _mapping(f"{where}: defaults", data.get("defaults"))
    entry = next((v for k, v in entries.items() if _same_model(sc.model, k)), None)
    entry = _mapping(f"{where}: defaults.{sc.model}", entry)
    if sc.hardware is None and entry.get("GPU"):
        extra["hardware"] = str(entry["GPU"])
    if sc.tp is None and entry.get("tensor_parallelism"):
        extra["tp"] = entry["tensor_parallelism"]
    preset = sc.workload.preset if isinstance(sc.workload, SyntheticWorkload) else None
    presets = _mapping(f"{where}: workloads", data.get("workloads"))
    if preset and preset in presets:
        # A preset's lengths apply where neither a flag nor the scenario gives that length
        # (as the bundled presets do): a scenario's own output_tokens beside `preset` stood.
        given = sc.workload.model_fields_set
        for key, value in _mapping(f"{where}: workloads.{preset}", presets[preset]).items():
            field = _PRESET_FIELDS.get(key)
            if field is None or field in workload or value is None:
                continue
            if field.split(".")[1] not in given:
                extra_workload[field] = value
        if extra_workload:
            # Checked here, told as the file's: once merged with the flags' workload
            # overrides, a refused length would be blamed on its flag (--prompt-tokens).
            with_overrides(sc, {}, extra_workload, source=f"{where}: workloads.{preset}")
    backend = sc.latency.model
    # The fitted row for the run's model, GPU and TP (`models:`): blackbox's coefficients
    # and, for every backend, the measured block count, as BLIS-Mar takes them.
    bundled = model_defaults(sc.model) or {}
    gpu = extra.get("hardware") or sc.hardware or bundled.get("GPU") or "H100"
    tp = extra.get("tp") or sc.tp or bundled.get("tensor_parallelism") or 1
    rows = data.get("models") or []
    if not isinstance(rows, list):
        raise ConfigError(f"{where}: models: must be a list of fitted rows")
    row_where, fitted = "", None
    for i, row in enumerate(rows):
        row = _mapping(f"{where}: models[{i}]", row)
        if (
            _same_model(sc.model, row.get("id", ""))
            and canonical_gpu(str(row.get("GPU", ""))) == canonical_gpu(str(gpu))
            and row.get("tensor_parallelism") == tp
        ):
            row_where, fitted = f"{where}: models[{i}]", row
            break
    blocks = fitted.get("total_kv_blocks") if fitted is not None else None
    if blocks is not None and sc.engine.total_kv_blocks is None:
        blocks = _row_blocks(row_where, blocks)
        # Under BLIS's backends (the `blis` capacity rule) the file's row replaces the
        # bundled one as BLIS-Mar takes it: a count logged at stock settings, used unless a
        # setting that changes it is given (then computed). physics keeps its own rule over
        # the bundled rows (a row must also fit beside the weights on TP GPUs alone), which
        # an explicit count would skip.
        # (trained-physics, BLIS-current's, always computes: its rows carry no counts.)
        stock = settings_unlike_measured_row(sc) is None
        if capacity_rule(sc) == "blis" and backend != "trained-physics" and stock:
            extra["engine.total_kv_blocks"] = blocks
    if sc.latency.alpha_coeffs is None:
        coefficients = None
        section = _GLOBAL_COEFFICIENTS.get(backend)
        if section is not None and data.get(section) is not None:
            coefficients = _coefficients(
                f"{where}: {section}", _mapping(f"{where}: {section}", data[section])
            )
        elif backend == "blackbox" and fitted is not None:
            coefficients = _coefficients(row_where, fitted)
        if coefficients is not None:
            extra["latency.model"] = backend
            extra["latency.alpha_coeffs"] = coefficients["alpha_coeffs"]
            extra["latency.beta_coeffs"] = coefficients["beta_coeffs"]
    return extra, extra_workload


# --- --slo-ttft / --slo-itl / --slo-e2e ---------------------------------------------------------

_GO_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4, "h": 3.6e6}
_GO_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_SLO_CLASS = re.compile(r"^[A-Za-z0-9_-]+$")


def go_duration_ms(text: str, where: str) -> float:
    """A Go duration (`100ms`, `1.5s`, `1m30s`) in ms."""
    text = text.strip()
    pos, total = 0, 0.0
    for match in _GO_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _GO_UNITS_MS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise ConfigError(
            f"{where}: invalid duration {excerpt(text)}; expected a Go duration such as "
            "100ms, 1.5s or 1m30s"
        )
    return total


def goodput_flags(
    slo_ttft: Annotated[
        str | None,
        _opt("--slo-ttft", 'per-class TTFT targets, e.g. "critical=100ms,standard=500ms"'),
    ] = None,
    slo_itl: Annotated[
        str | None,
        _opt("--slo-itl", 'per-class mean ITL targets, e.g. "critical=50ms"'),
    ] = None,
    slo_e2e: Annotated[
        str | None,
        _opt("--slo-e2e", 'per-class E2E targets, e.g. "critical=5s,standard=30s"'),
    ] = None,
) -> None:
    """Template: current BLIS's per-class goodput targets (`run`, `replay`)."""


def goodput_overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """`slo.classes.<class>.<metric>` overrides from --slo-ttft/--slo-itl/--slo-e2e."""
    out: dict[str, Any] = {}
    for flag, metric in (("slo_ttft", "ttft_ms"), ("slo_itl", "itl_ms"), ("slo_e2e", "e2e_ms")):
        text = flags.get(flag)
        if text is None:
            continue
        name = "--" + flag.replace("_", "-")
        for part in text.split(","):
            slo_class, eq, value = part.partition("=")
            slo_class = slo_class.strip()
            if not eq or not _SLO_CLASS.match(slo_class):
                raise ConfigError(
                    f"{name}: invalid entry {excerpt(part)}; expected class=duration, e.g. "
                    "critical=100ms"
                )
            ms = go_duration_ms(value, f"{name}: {slo_class}")
            if ms <= 0:
                raise ConfigError(f"{name}: {slo_class}: the target must be > 0, got {value}")
            key = f"slo.classes.{slo_class}.{metric}"
            if key in out:
                raise ConfigError(f"{name}: class {slo_class!r} is given twice; give each once")
            out[key] = ms
    return out


# BLIS run flags servesim refuses, and why (docs/cli.md, "BLIS flags, March and current"):
# told instead of the command line's nearest-name guess (--max-concurrency is no --concurrency).
REFUSED_BLIS_FLAGS = {
    "--detectors": "post-hoc saturation detectors; servesim prints its own steady-state verdict",
    "--dispatch-order": "flow-control gateway",
    "--dispatch-tick-interval": "flow-control gateway",
    "--encode-decider": "encode pool",
    "--encode-instances": "encode pool",
    "--fairness-policy": "flow-control gateway",
    "--flow-control": "flow-control gateway",
    "--in-flight-eviction": "flow-control gateway",
    "--kv-cache-util-threshold": "saturation detector of the gateway",
    "--kv-offload-config": "multi-tier KV offload; servesim's CPU tier is --kv-cpu-blocks",
    "--kv-offload-threshold": (
        "servesim's CPU tier offloads by --kv-offload-policy (evict, mirror) instead"
    ),
    "--lora-adapter-capacity": "servesim's LoRA follows vLLM: --max-loras, --max-cpu-loras",
    "--lora-config": "give the scenario's lora section, or --lora",
    "--lora-footprint-bytes-per-rank": "adapter sizes come from the model's shape",
    "--lora-load-bandwidth-bytes-us": "lora.load_bandwidth_gb_per_s",
    "--lora-load-base-latency-us": "lora.load_base_latency_us",
    "--lora-scorer-weight": "give lora-affinity:w in --routing-scorers",
    "--max-concurrency": "saturation detector of the gateway",
    "--max-gateway-queue-depth": "flow-control gateway",
    "--model-autoscaler-interval-us": "give the scenario's autoscaler its interval_s",
    "--moe-comm-backend": "data parallelism of MoE models",
    "--per-band-capacity": "flow-control gateway",
    "--prefill-decode-instances": "shared-role PD instances",
    "--queue-depth-threshold": "saturation detector of the gateway",
    "--queue-shedding": "flow-control gateway",
    "--request-ttl": "flow-control gateway",
    "--saturation-config": "post-hoc saturation detectors",
    "--saturation-detector": "gateway saturation detector",
    "--saturation-final-window": "post-hoc saturation detectors",
    "--saturation-report": "post-hoc saturation detectors",
    "--slo-targets": "TTFT targets of the gateway's slo-deadline dispatch",
    "--usage-limit-threshold": "flow-control gateway",
}
