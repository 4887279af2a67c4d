"""The Python entry points: a scenario (object, dict or YAML path) with overrides, its traffic,
and the run (`simulate`, `replay`). Resolving the deployment lives in `deployment`, fleet
planning in `fleet_plan`; their names are re-exported here, so `from simulator.api import
resolve_deployment, plan_fleet, ...` keeps working."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from os import PathLike, fspath
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .cluster.cluster import InstanceSetup, run_simulation
from .deployment import (
    DP_NEEDS_RANK_PRICING,
    FALLBACK_KV_BLOCKS,
    Deployment,
    capacity_rule,
    capacity_settings,
    instance_setups,
    new_run_warnings,
    pool_deployments,
    transfer_bytes_per_token,
    warn_once,
)
from .deployment import resolve_deployment as resolve_scenario_deployment
from .engine.options import EngineOptions
from .engine.request import Request
from .errors import (
    ConfigError,
    excerpt,
    plain_scalar,
    require_callable,
    require_flag,
    require_path,
)
from .fleet_plan import deployments_latency, latency_entry, plan_fleet, uses_fleet
from .latency.kv_capacity import kv_bytes_per_token
from .limits import MAX_REQUESTS
from .metrics.results import Result
from .scenario import (
    FLAGS_SOURCE,
    Scenario,
    SyntheticWorkload,
    TraceSpec,
    apply_overrides,
    load_scenario,
    scenario_from_dict,
)
from .workload.generator import WorkloadStream
from .workload.spec import WorkloadSpec as V2WorkloadSpec
from .workload.spec import format_spec_error, load_workload_spec
from .workload.synthetic import V2_EQUIVALENTS, synthetic_to_spec

if TYPE_CHECKING:
    # Traces are read only by the runs that replay one (start-up of the others).
    from .workload.trace import ClientReplay

__all__ = [
    # running (this module)
    "UNSTEADY_VERDICTS",
    "as_scenario",
    "build_requests",
    "build_traffic",
    "client_replay",
    "merged_slo",
    "replay",
    "simulate",
    "with_overrides",
    "workload_spec_of",
    # resolving a deployment (deployment.py)
    "DP_NEEDS_RANK_PRICING",
    "FALLBACK_KV_BLOCKS",
    "Deployment",
    "capacity_rule",
    "capacity_settings",
    "instance_setups",
    "pool_deployments",
    "resolve_deployment",
    # fleet planning (fleet_plan.py)
    "deployments_latency",
    "latency_entry",
    "plan_fleet",
    "uses_fleet",
]


log = logging.getLogger("servesim")
# Verdicts worth a warning; "too short" cannot judge and says so only in the report.
UNSTEADY_VERDICTS = ("saturated", "not steady", "empty")


def resolve_deployment(scenario: Scenario | dict | str | Path) -> Deployment:
    """The resolved model, GPU, TP, step-time model and engine settings of a scenario (object,
    dict or YAML path), without running it (`deployment.resolve_deployment`)."""
    return resolve_scenario_deployment(as_scenario(scenario))


def as_scenario(scenario: Scenario | dict | str | Path) -> Scenario:
    """A Scenario from a Scenario, a dict of its fields or the path of its YAML file; any
    other value is a ConfigError naming what was given (not a TypeError from deep inside)."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, dict):
        if isinstance(scenario.get("resolved"), dict):
            # `Result.scenario`: the run's scenario plus what it resolved (model, GPU, KV
            # blocks, ...), which is an output, not a setting: runs again as the same scenario.
            scenario = {k: v for k, v in scenario.items() if k != "resolved"}
        return scenario_from_dict(scenario)
    if isinstance(scenario, str | PathLike) and isinstance(fspath(scenario), str):
        if "\x00" in fspath(scenario):
            raise ConfigError(
                f"scenario: invalid value {_shown(fspath(scenario))}; a path cannot contain a "
                "NUL byte"
            )
        return load_scenario(scenario)
    given = "None" if scenario is None else f"{type(scenario).__name__} {_shown(scenario)}"
    raise ConfigError(
        f"scenario: expected a path to a YAML file, a dict or a Scenario; got {given}"
    )


def scenario_file(scenario: object) -> str | None:
    """The YAML file a scenario argument names (a path), None for a dict or a Scenario: an
    input the run's outputs must not replace."""
    return fspath(scenario) if isinstance(scenario, str | PathLike) else None


def _shown(value: object, limit: int = 80) -> str:
    """`repr(value)` cut to one short line, for a message."""
    try:
        text = " ".join(repr(value).split())
    except ValueError:  # an int too long to print
        return "(too large to show)"
    return text if len(text) <= limit else text[:limit] + "…"


def workload_spec_of(scenario: Scenario) -> V2WorkloadSpec:
    """The scenario's traffic as a v2 workload spec (synthetic, inline or from a file)."""
    if scenario.workload_spec is not None:
        return load_workload_spec(scenario.workload_spec)
    workload = scenario.workload
    if isinstance(workload, V2WorkloadSpec):
        return workload
    return synthetic_to_spec(workload or SyntheticWorkload())


def _workload_base_dir(scenario: Scenario) -> Path | None:
    if scenario.workload_spec is not None:
        return Path(scenario.workload_spec).parent
    return scenario._base_dir  # noqa: SLF001


def build_traffic(scenario: Scenario) -> tuple[Iterable[Request], WorkloadStream | None]:
    """The requests of a run: a trace's rows, or a lazy stream from the workload spec."""
    if scenario.trace is not None:
        trace = scenario.trace
        at_schedule = trace.timing == "schedule"
        from .workload.trace import closed_loop_replay, load_requests_file

        if trace.session_mode == "closed-loop":
            return closed_loop_replay(trace, scenario.seed, scenario.horizon_us)
        return load_requests_file(trace.data, trace.header, at_schedule), None
    workload = scenario.workload
    if (
        isinstance(workload, SyntheticWorkload)
        and workload.concurrency
        and {"rate", "arrival"} & workload.model_fields_set
    ):
        warn_once(
            "workload.rate and workload.arrival do not apply to closed-loop users "
            "(workload.concurrency %d): each sends its next request when its last finishes",
            workload.concurrency,
        )
    stream = WorkloadStream(
        workload_spec_of(scenario),
        scenario.seed,
        scenario.horizon_us,
        _workload_base_dir(scenario),
        # Errors found while building requests name the field where the user wrote it.
        where=f"{scenario.workload_spec}: "
        if scenario.workload_spec is not None
        else "workload."
        if isinstance(workload, V2WorkloadSpec)
        else "",
    )
    return stream, stream


def merged_slo(slo: dict[str, Any], goodput_targets: dict[str, Any]) -> dict[str, Any]:
    """The scenario's `slo` section (a dict) with a v2 spec's (or a trace header's)
    `goodput_slo_targets` filling each class's metrics the scenario leaves unset (a target of
    0 means none, as in BLIS)."""
    if not goodput_targets:
        return slo
    slo = {**slo, "classes": {k: dict(v) for k, v in (slo.get("classes") or {}).items()}}
    for slo_class, targets in goodput_targets.items():
        mine = slo["classes"].setdefault(str(slo_class), {})
        given = targets if isinstance(targets, dict) else targets.model_dump()
        for metric, value in (given or {}).items():
            if value and mine.get(metric) is None:
                mine[metric] = value
    return slo


def build_requests(scenario: Scenario) -> list[Request]:
    """Every request of the scenario, materialised (closed-loop follow-ups excluded)."""
    requests, _ = build_traffic(scenario)
    return list(requests)


def _horizon(scenario: Scenario, stream: WorkloadStream | None) -> int | None:
    """Explicit horizon, else the workload's own; a replayed trace runs until every request
    finishes (BLIS stops at twice the latest arrival, which cuts short overloaded traces)."""
    if scenario.horizon_us is not None:
        return scenario.horizon_us
    return stream.horizon_us if stream is not None else None


def simulate(
    scenario: Scenario | dict | str | Path,
    progress: Callable[[int, int], None] | None = None,
    on_deployment: Callable[[Deployment], None] | None = None,
    warn_unsteady: bool = True,
    reference: bool = False,
    options: EngineOptions | None = None,
    end_checks: bool = False,
    **overrides: Any,
) -> Result:
    """Run one scenario (object, dict or YAML path); keyword overrides use dotted paths with
    `__` for dots, e.g. simulate("x.yaml", engine__scheduler="sjf"). `on_deployment` sees the
    resolved deployment before instances are built (calibration wraps its step model).
    A run that did not reach a steady state logs a warning (`servesim` logger) unless
    `warn_unsteady` is False (sweeps and plans judge many runs and report verdicts).
    `reference=True` runs without the exact accelerations (engine/options.py): the same
    results, slower; for checking them. `options` picks them one by one instead.
    `end_checks=True` checks every end-of-run law once the run ends, each engine's own
    (KV-block conservation) included, which needs the live engines that the result does not
    keep, without the per-step checks of `check_invariants` (docs/python.md)."""
    new_run_warnings()
    require_callable("progress", progress)
    require_callable("on_deployment", on_deployment)
    warn_unsteady = require_flag("warn_unsteady", warn_unsteady)
    reference = require_flag("reference", reference)
    end_checks = require_flag("end_checks", end_checks)
    if options is not None and not isinstance(options, EngineOptions):
        raise ConfigError(f"options: expected an EngineOptions or None; got {_shown(options)}")
    sc = keyword_overrides(as_scenario(scenario), overrides)
    given = scenario_file(scenario)
    if sc.cluster.trace.path is not None:
        from .input_files import refuse_writing_inputs, scenario_input_files

        refuse_writing_inputs(
            [("cluster.trace.path", sc.cluster.trace.path)],
            scenario_input_files(sc.model_dump(), given),
        )
    deployment = resolve_deployment(sc)
    if on_deployment is not None:
        on_deployment(deployment)
    requests, stream = build_traffic(sc)
    info = sc.model_dump(mode="json")
    info["resolved"] = deployment.describe()
    sessions = stream.sessions if stream is not None and stream.has_sessions else None
    if stream is not None and getattr(stream, "spec", None) is not None:
        info["slo"] = merged_slo(info["slo"], stream.spec.goodput_slo_targets)
    elif sc.trace is not None and sc.trace.header is not None:
        from .workload.trace import read_header

        targets = read_header(sc.trace.header).get("goodput_slo_targets") or {}
        info["slo"] = merged_slo(info["slo"], targets)
    setups, fleet, sc = plan_fleet(sc, deployment)
    info["resolved"]["roles"] = [s.role for s in setups]
    pools = {s.role: s.step_model.provenance() for s in setups}
    by_deployment = deployments_latency(fleet, deployment)
    if by_deployment:
        # Each entry names its role; a per-role summary would merge deployments of one role.
        info["resolved"]["latency_by_deployment"] = by_deployment
    elif any(p != info["resolved"]["latency"] for p in pools.values()):
        info["resolved"]["latency_by_role"] = pools
    if fleet is not None and len(fleet.model_aliases) > 1:
        info["resolved"]["models"] = sorted(fleet.model_aliases)
    result = run_simulation(
        requests,
        horizon_us=_horizon(sc, stream),
        scenario=info,
        sessions=sessions,
        fleet=fleet,
        cluster=sc.cluster,
        seed=sc.seed,
        model_name=deployment.model.name,
        setups=setups,
        pd_kv_bytes_per_token=_transfer_bytes_per_token(sc, deployment, setups),
        progress=progress,
        check_invariants=sc.check_invariants,
        max_in_flight=sc.trace.max_in_flight if sc.trace is not None else None,
        options=options if options is not None else EngineOptions(reference=reference),
        end_checks=end_checks,
    )
    result.scenario_file = given
    if sc.cluster.trace.path is not None and result.decisions is not None:
        result.decisions.write(sc.cluster.trace.path)
    steady = result.steady_state
    if warn_unsteady and steady is not None and steady.verdict == "empty":
        # Nothing completed: there are no percentiles to qualify, only the requests' fates.
        log.warning(
            "the run is empty: no request completed, so it has no latencies to report "
            "(%d dropped, timed out or failed; %d still unfinished when it ended; see the "
            "Steady State block and the request counts)",
            steady.lost_requests,
            steady.unfinished_at_end,
        )
    elif warn_unsteady and steady is not None and steady.verdict in UNSTEADY_VERDICTS:
        log.warning(
            "the run is %s: %s; its latency percentiles describe this run's length, not a "
            "sustainable load (see the Steady State block)",
            steady.verdict,
            "; ".join(steady.reasons) or "no reason recorded",
        )
    return result


def _transfer_bytes_per_token(
    sc: Scenario, deployment: Deployment, setups: list[InstanceSetup]
) -> float:
    """The KV bytes per token a PD transfer moves: what one GPU of a prefill instance holds
    (`deployment.transfer_bytes_per_token`), from the deployment the prefill instances' setups
    carry (a `role: prefill` deployment's, or the `cluster.pd.prefill` pool's). (Until
    2026-12-07 a `role: prefill` deployment's TP and PP were ignored: the scenario `plan_fleet`
    returns describes its pools by their sizes alone.) `plan_fleet` refuses prefill
    deployments of different sizes unless `cluster.pd.kv_bytes_per_token` overrides them."""
    if not sc.cluster.pd.enabled:
        return kv_bytes_per_token(deployment.model)
    prefill = next(s.deployment for s in setups if s.role == "prefill")
    return transfer_bytes_per_token(prefill)


def replay(
    trace_header: str | Path | None,
    trace_data: str | Path,
    scenario: Scenario | dict | str | Path | None = None,
    max_in_flight: int | str = "auto",
    session_mode: str = "fixed",
    think_time: str | None = None,
    **overrides: Any,
) -> Result:
    """Simulate exactly the requests of a TraceV2 pair (arrival times and token counts).

    `max_in_flight`: "auto" replays as the recorded client behaved (`recorded_client`: at the
    send times, or, for a client that fell behind a saturated server, at the scheduled times
    with its cap on outstanding requests); "off" at the send times; a number sends at the
    scheduled times with at most that many requests outstanding. `session_mode`
    "closed-loop" sends each session's later rounds when the earlier finished, after
    `think_time` (BLIS syntax, e.g. "constant:value=500ms"; None = the trace's own);
    docs/workloads.md, "Closed-loop load". Fields that neither `scenario` sets nor
    `overrides` give follow the server that recorded the trace (`recorded_settings`, applied
    by `simulate`)."""
    new_run_warnings()
    require_path("trace_header", trace_header, optional=True)
    require_path("trace_data", trace_data)
    sc = as_scenario(scenario) if scenario is not None else Scenario()
    # The scenario's traffic gives way to the trace, but its workload's SLO targets are the
    # run's targets still (a v2 spec's goodput_slo_targets, as `simulate` reads them).
    slo = slo_with_workload_targets(sc)
    sc = sc.model_copy(update={"workload": None, "workload_spec": None})
    if slo is not None:
        sc = apply_overrides(sc, {"slo": slo})
    header = Path(trace_header) if trace_header is not None else None
    closed = session_mode == "closed-loop"
    client = client_replay("off" if closed else max_in_flight, trace_data)
    try:
        sc.trace = TraceSpec(
            header=header,
            data=Path(trace_data),
            timing="schedule" if client.at_schedule else "sends",
            max_in_flight=client.max_in_flight,
            session_mode=session_mode,
            think_time=think_time,
        )
    except ValidationError as exc:
        raise ConfigError(format_spec_error(exc, "replay")) from None
    result = simulate(sc, **overrides)
    result.scenario_file = scenario_file(scenario)  # simulate was given the Scenario
    return result


def slo_with_workload_targets(sc: Scenario) -> dict[str, Any] | None:
    """The scenario's `slo` section with its v2 workload's goodput_slo_targets (inline or
    its workload_spec file) filled in, as `simulate` reads them; None without such targets.
    A replay replaces the scenario's traffic by the trace, not the run's SLO targets."""
    from .workload.spec import WorkloadSpec, load_workload_spec

    if sc.workload_spec is not None:
        targets = load_workload_spec(sc.workload_spec).goodput_slo_targets
    elif isinstance(sc.workload, WorkloadSpec):
        targets = sc.workload.goodput_slo_targets
    else:
        targets = None
    return merged_slo(sc.slo.model_dump(mode="json"), targets) if targets else None


def _recorded_server(scenario: Scenario, given: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """What the recording says of its server (dotted paths), where neither the scenario nor
    `given` chose, when the run replays a trace (the one `given` sets, else the scenario's):
    a replay simulates the recorded server where nobody chose (`recorded_settings`). With
    it, the name an error about one of those values gives their source: the files read."""
    trace = given.get("trace", scenario.trace)
    if trace is not None and not isinstance(trace, dict):
        trace = trace.model_dump()
    if not trace or trace.get("data") is None:  # none, or one the schema will refuse
        return {}, ""
    from .workload.server_settings import recorded_settings

    recorded, server, _ = recorded_settings(scenario, given, trace.get("header"), trace["data"])
    # The files read (a vLLM default the recording implies is no file to look at).
    places = sorted(
        {w for w in (server.sources.get(p, "") for p in recorded) if w and "default" not in w}
    )
    header = trace.get("header")
    named = [
        f"trace header {str(header)!r}" if p == "trace header" and header else p for p in places
    ]
    return recorded, f"the recorded server ({', '.join(named) or 'the trace'})"


def client_replay(max_in_flight: int | str | None, trace_data: str | Path) -> ClientReplay:
    """The client of a replay from a `max_in_flight` choice: "auto" (what the recorded client
    did), "off" (the send times) or a positive number (the scheduled times, that cap)."""
    from .workload.trace import ClientReplay, recorded_client

    if max_in_flight is None or max_in_flight == "off":
        return ClientReplay(False, None, "--max-in-flight off")
    if max_in_flight == "auto":
        return recorded_client(trace_data)
    value = max_in_flight
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REQUESTS:
        raise ConfigError(
            f"max_in_flight: invalid value {excerpt(max_in_flight)}; must be auto, off or a "
            f"whole number from 1 to {MAX_REQUESTS:,}"
        )
    return ClientReplay(True, value, "--max-in-flight")


# The `source` `simulate`'s keyword overrides carry (FLAGS_SOURCE: the command line's).
KEYWORDS_SOURCE = "keyword arguments"


def keyword_overrides(scenario: Scenario, overrides: dict[str, Any]) -> Scenario:
    """`simulate`'s keyword overrides (dotted with `__`) applied as the command line and a
    sweep's grid apply theirs (`with_overrides`): coefficients without a model choose the
    model that reads them (alpha/beta: blackbox; a coefficients file: physics), as the
    command line's flags do; `workload__rate` and
    `workload__num_requests` also set a v2 workload's aggregate_rate and num_requests, and
    `seed` replaces a v2 workload's own seed too."""
    # A NumPy scalar is the plain value it holds, as in a sweep's grid.
    dotted = {key.replace("__", "."): plain_scalar(value) for key, value in overrides.items()}
    if "latency.model" not in dotted:
        # As the command line's --alpha-coeffs/--beta-coeffs and --latency-coeffs: the
        # coefficients name the model that reads them.
        if "latency.alpha_coeffs" in dotted or "latency.beta_coeffs" in dotted:
            dotted["latency.model"] = "blackbox"
        elif "latency.coeffs_file" in dotted:
            dotted["latency.model"] = "physics"
    workload = {key: dotted.pop(key) for key in list(dotted) if key in V2_EQUIVALENTS}
    return with_overrides(scenario, dotted, workload, source=KEYWORDS_SOURCE)


def with_overrides(
    scenario: Scenario,
    overrides: dict[str, Any],
    workload_overrides: dict[str, Any] | None = None,
    source: str = FLAGS_SOURCE,
) -> Scenario:
    """Apply flag overrides (dotted scenario paths) the way BLIS's CLI does, with one
    departure: on a v2 spec `--rate` replaces its aggregate_rate, where both BLIS releases
    ignore it (a flag given is never dropped; a warning says so when the rates differ).

    `workload_overrides` are synthetic-workload fields (`workload.rate`, ...). On a v2 workload
    (inline or `workload_spec` file) only rate and num_requests apply (as aggregate_rate and
    num_requests); the others are an error. An explicit seed also replaces a v2 spec's own seed.
    A trace replay's fields that neither the scenario nor `overrides` set follow the recorded
    server (`recorded_settings`).
    """
    recorded, label = _recorded_server(scenario, overrides)
    if recorded:
        # Applied on their own, so that a bad recorded value is blamed on the trace.
        scenario = apply_overrides(scenario, recorded, source=label)
    sc = apply_overrides(scenario, overrides, source=source) if overrides else scenario
    workload_overrides = workload_overrides or {}
    v2 = sc.workload_spec is not None or isinstance(sc.workload, V2WorkloadSpec)
    if sc.trace is not None and workload_overrides:
        flags = ", ".join(sorted(workload_overrides))
        raise ConfigError(f"{flags}: workload flags do not apply to a trace replay")
    seed_given = "seed" in overrides
    if not v2:
        return apply_overrides(sc, workload_overrides, source=source) if workload_overrides else sc
    if not workload_overrides and not seed_given:
        return sc
    given_spec = workload_spec_of(sc)
    spec = given_spec.model_dump(exclude_none=True)
    for key, value in workload_overrides.items():
        if key == "workload.timeout_us":
            # BLIS --timeout on a spec: every client's deadline, sessions' included (0 = none).
            for member in (*spec.get("clients", ()), *spec.get("cohorts", ())):
                member["timeout"] = value
            continue
        if key not in V2_EQUIVALENTS:
            raise ConfigError(
                f"{key}: does not apply to a v2 workload spec; only --rate (aggregate_rate), "
                "--num-requests and the deadline (--timeout, --timeout-us) do"
            )
        field = V2_EQUIVALENTS[key]
        # Only a rate the user typed (a flag, `simulate`'s keyword) departs from BLIS; a
        # sweep's grid or a plan's probe sets a v2 spec's aggregate_rate by design
        # (docs/sweeps.md), and validating then running each point would say it twice.
        given_as = {FLAGS_SOURCE: "--rate", KEYWORDS_SOURCE: "workload__rate"}.get(source)
        if given_as and field == "aggregate_rate" and given_spec.absolute_rate_mode:
            # An aggregate rate would make every trace_rate (req/s) a weight of it: the same
            # spec would send other traffic, silently. Refused rather than reinterpreted.
            raise ConfigError(
                f"{given_as}: invalid value {value:g}; the workload spec gives absolute rates "
                "(no aggregate_rate: each window's or spike's trace_rate is its own req/s), and "
                "an aggregate rate would turn those req/s into weights of it; leave out "
                f"{given_as}, or change the trace_rates in the spec (docs/workloads.md, "
                "Time-varying windows and absolute rates)"
            )
        if given_as and field == "aggregate_rate" and spec.get(field) not in (None, value):
            log.warning(
                "%s %g replaces the workload spec's aggregate_rate %g (BLIS ignores --rate "
                "when a workload spec is given)",
                given_as,
                value,
                spec[field],
            )
        spec[field] = value
    if seed_given and spec.get("seed") is not None:
        spec["seed"] = overrides["seed"]
    base_dir = _workload_base_dir(sc)
    updated = apply_overrides(sc, {"workload_spec": None, "workload": spec}, source=source)
    updated._base_dir = base_dir  # noqa: SLF001
    return updated
