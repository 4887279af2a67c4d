"""Measure a real OpenAI-compatible server with a servesim workload (docs/behaviour.md §12.2
observe).

`observe(scenario, server_url=..., model=...)` sends the scenario's traffic (its workload,
workload spec or trace) to the server at the scheduled arrival times and returns an
`Observation` whose `write_trace(header, data)` writes a TraceV2 pair that `servesim replay`
simulates and `servesim calibrate` compares against.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..errors import unknown
from ..interruption import signal_of
from ..scenario import Scenario
from .observation import (
    Observation,
    ObserveOptions,
    Progress,
    observe_requests,
    run_observation,
)

__all__ = ["Observation", "ObserveOptions", "observe", "observe_async"]


def _describe(sc: Scenario) -> str:
    """The header's `workload_spec`: where the traffic came from."""
    if sc.workload_spec is not None:
        return str(sc.workload_spec)
    if sc.trace is not None:
        return str(sc.trace.data)
    workload = sc.workload
    if workload is None:
        return "distribution defaults"
    return "inline workload: " + json.dumps(workload.model_dump(mode="json", exclude_none=True))


async def observe_async(
    scenario: Scenario | dict | str | Path,
    *,
    server_url: str,
    model: str,
    progress: Progress | None = None,
    handle_interrupt: bool = True,
    **options: Any,
) -> Observation:
    """`observe` for code already inside an event loop (notebooks: `await observe_async(...)`)."""
    from ..api import as_scenario, build_traffic

    valid = {f.name for f in fields(ObserveOptions)} - {"server_url", "model"}
    if set(options) - valid:
        raise unknown("observe option", sorted(set(options) - valid)[0], valid)
    sc = as_scenario(scenario)
    options.setdefault("workload_description", _describe(sc))
    opts = ObserveOptions(server_url=server_url, model=model, **options)
    opts.validate()
    requests, stream = build_traffic(sc)
    sessions = stream.sessions if stream is not None and stream.spec.has_sessions else None
    return await observe_requests(
        requests, opts, sessions=sessions, progress=progress, handle_interrupt=handle_interrupt
    )


async def _observe_keeping(kept: list[Observation], *args: Any, **kwargs: Any) -> Observation:
    observation = await observe_async(*args, **kwargs)
    kept.append(observation)
    return observation


def observe(
    scenario: Scenario | dict | str | Path, *, server_url: str, model: str, **options: Any
) -> Observation:
    """Send the scenario's traffic to `server_url` and record every request.

    Keyword options are the fields of `ObserveOptions` (api_format, streaming,
    max_concurrency, warmup_requests, api_key, rtt_ms, force_output, record_itl,
    request_timeout_s, server_type), plus `progress` (called with counts after each send and
    each finish) and `handle_interrupt` (Ctrl-C returns what was measured; default on; inside
    the `servesim` command SIGTERM too). A server that is down, not OpenAI-compatible or does
    not serve `model` raises ConfigError before anything is sent; an interrupt raises
    KeyboardInterrupt only before any request was started.
    """
    kept: list[Observation] = []
    try:
        return run_observation(
            _observe_keeping(kept, scenario, server_url=server_url, model=model, **options)
        )
    except KeyboardInterrupt as exc:
        # A signal while the event loop shut down, after the measurement was complete.
        if not kept or not options.get("handle_interrupt", True):
            raise
        observation = kept[0]
        if observation.interrupted:
            return observation
        return replace(observation, interrupted=True, signal_number=signal_of(exc))
