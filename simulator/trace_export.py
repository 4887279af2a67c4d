"""What a run's exported trace carries, and what a replay of it needs besides.

A TraceV2 header records its server in BLIS's keys only: model, TP, sequence limit, block
size, memory utilisation and context limit (`Result.write_trace`). A replay takes those from
the header (`workload.server_settings.recorded_settings`) and everything else from its own flags or
scenario. A run that set anything else (another GPU, its own KV-block count, a step-time
model, several instances, a token budget the replay would not default to, ...) would be
replayed on another deployment, so the export lists those settings: `servesim run
--trace-output` prints them as the flags to give `servesim replay`, and `export` (for Python)
returns and logs them (docs/traces.md, "Replaying an exported trace"). This module sits above
the run (it resolves deployments and reads scenarios); `Result.write_trace` only writes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .scenario import Scenario

# Fields that describe the run or its traffic rather than the deployment a replay simulates:
# the trace replaces the traffic.
_NOT_DEPLOYMENT = frozenset(
    {"name", "description", "workload", "workload_spec", "trace", "check_invariants"}
)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A dump's leaves by dotted path (a list or an empty mapping is one leaf)."""
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flat(item, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: value}


def unrecorded_settings(
    scenario: Scenario,
    trace_header: str | os.PathLike[str],
    trace_data: str | os.PathLike[str],
) -> dict[str, Any]:
    """The scenario fields (dotted paths, with the run's values) a replay of the run's exported
    trace does not take from it: those the run set to something other than a default
    scenario's, less what a replay takes from the recording as the run had it (the header's server
    keys, the prefix caching default); and the token budget, when a replay would
    default to another one (`deployment.unrecorded_token_budget`). Given these, the replay
    simulates the run's deployment."""
    from .deployment import resolve_deployment, unrecorded_token_budget
    from .workload.server_settings import SHARED_BY_DEPLOYMENTS, recorded_settings

    default = Scenario()
    recorded, _, _ = recorded_settings(default, {}, trace_header, trace_data)
    if scenario.deployments:
        # A replay with the run's deployments takes no more than this from the header (the
        # header's server is one deployment's), so a top-level setting that equals it is
        # still the run's to pass.
        recorded = {p: v for p, v in recorded.items() if p in SHARED_BY_DEPLOYMENTS}
    ran = _flat(scenario.model_dump(mode="json", exclude=_NOT_DEPLOYMENT))
    stock = _flat(default.model_dump(mode="json", exclude=_NOT_DEPLOYMENT))
    missing = object()
    settings = {
        path: value
        for path, value in ran.items()
        if value != stock.get(path, missing)
        # What the replay takes from the recording (the header's server keys, its prefix
        # caching default) counts only where it is what the run had: a run without prefix
        # caching is replayed with vLLM's default, on, unless told.
        and recorded.get(path, missing) != value
        # Inside a section the default scenario leaves unset, an unset field is the section's
        # own default.
        and not (path not in stock and value in (None, {}, []))
    }
    deployment = resolve_deployment(scenario)
    if unrecorded_token_budget(scenario, deployment) is not None:
        settings["engine.max_num_scheduled_tokens"] = deployment.engine.max_num_scheduled_tokens
    return settings


def unexported_traffic(scenario: Scenario) -> list[str]:
    """What of the run's traffic a trace cannot carry, one sentence each (empty when the
    trace replays it as it ran): today, sessions whose rounds accumulate their context (a
    row holds each round's whole prompt, not that it repeats the round before); and, for a
    replay through a client cap, that a replay of the export needs the cap again."""
    from .workload.spec import WorkloadSpec, load_workload_spec

    if scenario.trace is not None:
        cap = scenario.trace.max_in_flight
        if cap is None:
            return []
        return [
            f"this replay sent its requests through a client cap of {cap} outstanding; each "
            "row records its scheduled time (arrival_time_us) and its send (send_time_us), "
            f"and a replay of it with --max-in-flight {cap} (Python: max_in_flight={cap}) "
            "applies the same cap (docs/traces.md)"
        ]
    if scenario.workload_spec is not None:
        spec = load_workload_spec(scenario.workload_spec)
    elif isinstance(scenario.workload, WorkloadSpec):
        spec = scenario.workload
    else:
        return []  # a synthetic workload's requests never accumulate context
    # Cohorts too: their members are clients of the same fields.
    growing = [
        c.id
        for c in [*spec.clients, *spec.cohorts]
        if c.multi_turn is not None and c.multi_turn.context_growth == "accumulate"
    ]
    if not growing:
        return []
    return [
        f"client(s) or cohort(s) {', '.join(growing)} grow each session's context round by "
        "round; a trace "
        "row holds a round's whole prompt but not that it repeats the round before, so a "
        "replay recomputes what this run found in its prefix cache (docs/workloads.md)"
    ]


def run_scenario(result: Any) -> Scenario:
    """The scenario a result ran (its recorded dump, without the resolved deployment)."""
    return Scenario.model_validate(
        {key: value for key, value in result.scenario.items() if key != "resolved"}
    )


def export(
    result: Any, prefix: str | os.PathLike[str], *, note: bool = True
) -> tuple[Path, Path, dict[str, Any]]:
    """`result.write_trace(prefix)`, and the run's settings a replay needs besides the trace
    (`unrecorded_settings`: dotted scenario paths and values, which `simulator.replay(header,
    data, **overrides)` takes with `__` for the dots). With `note` they are logged as a
    warning (`servesim` logger), with what of the traffic no trace can carry."""
    header, data = result.write_trace(prefix)
    scenario = run_scenario(result)
    settings = unrecorded_settings(scenario, header, data)
    if result.horizon_us is not None and "horizon_us" not in settings:
        # The run's horizon whichever gave it (the scenario, or the workload's own): a trace
        # replays every row to its end without one.
        settings["horizon_us"] = result.horizon_us
    if note:
        log = logging.getLogger("servesim")
        if settings:
            shown = ", ".join(f"{path}={value!r}" for path, value in settings.items())
            log.warning(
                "%s: a replay of this trace takes only the model, TP, sequence limit, block "
                "size, memory utilisation and context limit from it; give it the run's other "
                "settings to simulate the same deployment: %s",
                prefix,
                shown,
            )
        for loss in unexported_traffic(scenario):
            log.warning("%s: %s", prefix, loss)
    return header, data, settings
