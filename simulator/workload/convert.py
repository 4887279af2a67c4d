"""Converters: other workload forms as self-contained v2 specs (`servesim convert ...`).

Each returns a WorkloadSpec whose YAML (`presets.spec_to_yaml`) runs unchanged and generates
the same requests as the source: the conversion is the same expansion the generator applies
to the source in place, written out.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .cohorts import expand_inference_perf
from .servegen import (
    DEFAULT_DRAIN_S,
    DEFAULT_WINDOW_S,
    PERIODS,
    expand_servegen,
    expand_servegen_periods,
)
from .spec import WorkloadSpec, load_workload_spec, workload_spec_from_dict


def servegen_spec(
    folder: str | Path,
    seed: int = 42,
    window_s: int = DEFAULT_WINDOW_S,
    drain_s: int = DEFAULT_DRAIN_S,
    time_window: str = "",
    single_span: bool = False,
    num_requests: int | None = None,
) -> WorkloadSpec:
    """A ServeGen data folder as a v2 spec: current BLIS's periods as cohorts (absolute
    rates, bounded in time, so the spec needs no num_requests or horizon), or with
    `single_span` BLIS-Mar's clients (then give the spec a num_requests or horizon)."""
    folder = Path(folder).resolve()
    names = [name for name, _ in PERIODS]
    if time_window and time_window not in names:
        raise ConfigError(f"--time: invalid value {time_window!r}; valid: {', '.join(names)}")
    if window_s <= 0:
        raise ConfigError(f"--window-duration-seconds: invalid value {window_s}; must be > 0 (s)")
    if drain_s < 0:
        raise ConfigError(f"--drain-timeout-seconds: invalid value {drain_s}; must be >= 0 (s)")
    if num_requests is not None and num_requests <= 0:
        raise ConfigError(f"--num-requests: invalid value {num_requests}; must be >= 1")
    if single_span:
        if time_window:
            raise ConfigError("--time: periods only; it does not apply with --single-span")
        if num_requests is None:
            raise ConfigError(
                "--num-requests: required with --single-span (a chunk's client runs at its "
                "peak rate for ever; the count ends the workload)"
            )
        source = workload_spec_from_dict(
            {
                "version": "2",
                "seed": seed,
                "num_requests": num_requests,
                "servegen_data": {"path": str(folder)},
            },
            source="servegen",
        )
        return expand_servegen(source)
    source = workload_spec_from_dict(
        {
            "version": "2",
            "seed": seed,
            "num_requests": num_requests,
            "servegen_data": {
                "path": str(folder),
                "window_duration_secs": window_s,
                # 0 in a spec means no gap; the flag's 0 means the same.
                "drain_timeout_secs": drain_s,
                "time_window": time_window,
            },
        },
        source="servegen",
    )
    return expand_servegen_periods(source)


def inference_perf_spec(path: str | Path) -> WorkloadSpec:
    """The `inference_perf` section of a v2 spec file as plain clients."""
    spec = load_workload_spec(path)
    if spec.inference_perf is None:
        raise ConfigError(
            f"--spec: {str(path)!r} has no inference_perf section; give a v2 spec with "
            "inference_perf: {stages: [...], shared_prefix: {...}}"
        )
    return expand_inference_perf(spec)
