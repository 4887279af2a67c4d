"""Parameter sweeps: a grid of scenario overrides × seeds, run in parallel, summarised with CIs.

Local backend only (a `concurrent.futures.ProcessPoolExecutor`); a Ray backend comes later.

    result = sweep("scenario.yaml", {"cluster.num_instances": [1, 2]}, seeds=[1, 2, 3])
    result.runs     # one row per (point, seed): parameters, seed, numeric summary metrics
    result.points   # one row per point: <metric>_mean and <metric>_ci95 across seeds

Every grid path and value is validated before anything runs. With `out`, each finished run is
written atomically to `out/runs.d/<key>.json`, and a re-run skips runs already there.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .atomic_io import check_output_folder, write_text_atomically, write_with
from .errors import ConfigError, excerpt, plain_scalar, require_callable, require_path
from .input_files import (
    SCENARIO_INPUT_FIELDS,
    read_json,
    read_yaml_mapping,
    scenario_input_files,
)
from .interruption import ignore_interrupts_in_worker
from .limits import MAX_SEED, MAX_SWEEP_RUNS
from .metrics.study import TEXT_COLUMNS, SweepTables, summarize_points
from .scenario import Scenario, TraceSpec, authored_fields, not_a_section, scenario_from_dict
from .version import package_version
from .workload.spec import format_spec_error, model_classes
from .workload.synthetic import V2_EQUIVALENTS

RUNS_DIR = "runs.d"
# The counts `metrics.summary.compute_summary` leaves out of a run's summary when they are 0
# (BLIS prints kv_allocation_failures only when non-zero; a fixed fleet's summary keeps BLIS's
# field list): in a sweep row a missing one is 0, not unknown, or a point's mean and CI would
# skip its seeds that lost nothing. tests/test_sweep.py checks this list against
# compute_summary, so a new such field cannot be missed. (The spec_* and lora_* fields are
# absent when the run does not speculate or serve adapters: not applicable, so NaN.)
ZERO_WHEN_ABSENT = ("kv_allocation_failures", "dropped_on_drain", "failed_requests")

Progress = Callable[[int, int, dict[str, Any]], None]


@dataclass(repr=False)
class SweepResult(SweepTables):
    """What `sweep` returns: the sweep's tables (`runs`, `points`, their figures), and its
    HTML report."""

    # The files the sweep read, as (what, path): its base scenario's file and those the base
    # names, which no report may be written over (the --out folder's own files neither).
    input_files: list[tuple[str, Any]] = field(default_factory=list)

    def report(self, path: str | Path) -> Path:
        """Write this sweep's HTML report, one self-contained page (docs/report.md)."""
        from .atomic_io import require_output_path
        from .input_files import refuse_writing_inputs
        from .report import write_report

        require_output_path("report: path", path)  # a ConfigError for 5, None or ""
        outputs_folder = [("the sweep's output folder", self.out)]
        refuse_writing_inputs([("report", path)], [*self.input_files, *outputs_folder], (".html",))
        return write_report(self, path)


# --- validation -----------------------------------------------------------------------------


def _same_number(value: Any) -> Any:
    """`value` with an integral float as the int it equals (5.0 as 5), inside mappings and
    lists too, for comparing grid values and keying their runs; anything else as it is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _same_number(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_same_number(v) for v in value]
    return value


def check_path(base: Scenario, path: str) -> None:
    """Raise ConfigError unless `path` names a field of the scenario schema.

    Checked against the schema, not the dumped dict: `apply_overrides` would create a missing
    key, and the resulting error would not name the grid path."""
    unknown = ConfigError(f"grid: unknown scenario field {excerpt(path)}")
    from .scenario import SyntheticWorkload

    v2_workload = base.workload_spec is not None or (
        base.workload is not None and not isinstance(base.workload, SyntheticWorkload)
    )
    if path in V2_EQUIVALENTS and v2_workload:
        return  # a v2 spec's aggregate_rate / num_requests (`_point_scenario`)
    keys = path.split(".")
    if (
        v2_workload
        and keys[0] == "workload"
        and len(keys) > 1
        and keys[1] in SyntheticWorkload.model_fields
        and (base.workload_spec is not None or keys[1] not in type(base.workload).model_fields)
    ):
        # A synthetic workload's field on a v2 spec: not unknown, but not applicable.
        raise ConfigError(
            f"grid: {excerpt(path)} does not apply: the base's traffic is a v2 workload spec, "
            f"where only {' and '.join(V2_EQUIVALENTS)} (its aggregate_rate and num_requests) "
            "and the spec's own fields (workload.aggregate_rate, workload.clients, ...) do"
        )
    node: Any = base
    classes: list[type[BaseModel]] = [type(base)]
    for i, key in enumerate(keys):
        owners = [c for c in classes if key in c.model_fields]
        if not owners:
            raise unknown
        if i == len(keys) - 1:
            return
        node = getattr(node, key, None) if isinstance(node, BaseModel) else None
        if isinstance(node, BaseModel):
            classes = [type(node)]
        elif isinstance(node, dict):
            return  # a free-form mapping: its keys are checked when the value is validated
        elif node is None:  # an unset section: any model its annotation allows
            classes = [c for o in owners for c in model_classes(o.model_fields[key].annotation)]
        else:
            classes = []
        if isinstance(node, list):
            # A known field holding a list (`autoscaler.0.max_instances`): no typo, so say
            # what `simulate`'s keyword overrides say of it (scenario.apply_overrides).
            shown = [v.model_dump() if isinstance(v, BaseModel) else v for v in node]
            raise not_a_section(f"grid: {excerpt(path)}", ".".join(keys[: i + 1]), shown)
        if not classes:
            raise unknown


def _point_scenario(
    base: Scenario, params: dict[str, Any], seed: int, source: str = "grid"
) -> Scenario:
    """The base with one point's overrides and the seed (workload.rate / num_requests also
    apply to a v2 workload, as its aggregate_rate / num_requests, as on the command line)."""
    from .api import with_overrides

    unset = [k for k, v in params.items() if v is None]
    if unset:
        base = _unset_fields(base, unset, source)
    overrides = {k: v for k, v in params.items() if v is not None and k not in V2_EQUIVALENTS}
    workload = {k: v for k, v in params.items() if v is not None and k in V2_EQUIVALENTS}
    overrides["seed"] = seed
    return with_overrides(base, overrides, workload, source=source)


def _unset_fields(base: Scenario, paths: list[str], source: str) -> Scenario:
    """The base with each dotted path removed, so the schema's default applies: a grid value
    `null` means "unset" (`cluster.pd: [null, {...}]` compares no PD with a PD setup), not
    the value None, which most fields refuse. A path under an unset section is a no-op.
    Only what the base's author set is carried over, as `apply_overrides` does: re-validating
    every default as if given would refuse a constant length's defaulted gaussian bounds and
    take a preset's lengths for given ones."""
    data = authored_fields(base)
    for dotted in paths:
        *parents, leaf = dotted.split(".")
        node: Any = data
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    updated = scenario_from_dict(data, source=source)
    updated._base_dir = base._base_dir  # noqa: SLF001
    return updated


def _validate(
    base: Scenario, grid: dict[str, list[Any]], points: list[dict[str, Any]], seed: int
) -> None:
    """Every path, then every combination (values are checked together: PD pool sizes, for
    one, are only valid in pairs). The error names the point's paths and values."""
    from .deployment import resolve_deployment
    from .fleet_plan import plan_fleet

    for path in grid:
        if path == "seed":
            raise ConfigError("grid: 'seed' cannot be a grid field; use seeds")
        check_path(base, path)
    for params in points:
        label = "grid: " + (", ".join(f"{k} = {v!r}" for k, v in params.items()) or "(base)")
        try:
            scenario = _point_scenario(base, params, seed, source=label)
            # The fleet plan checks what the deployment does not: event targets (an unknown
            # instance or node), pools, deployments' roles.
            plan_fleet(scenario, resolve_deployment(scenario))
        except (TypeError, AttributeError) as exc:  # e.g. a value below a leaf
            raise ConfigError(f"{label}: {exc}") from None
        except ConfigError as exc:
            text = str(exc)
            raise ConfigError(text if text.startswith(label) else f"{label}: {text}") from None


# --- running --------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _inputs_digest(base: Scenario, grid: dict[str, list[Any]]) -> dict[str, str]:
    """What the files the sweep's runs read hold (sha256 per file), and servesim's version:
    a run key names its inputs by path, and a coefficients file or trace edited between two
    sweeps into the same `out` must not bring the old runs back."""
    from .input_files import scenario_input_files

    paths = [Path(p) for _what, p in scenario_input_files(base.model_dump()) if p is not None]
    folder = base._base_dir or Path.cwd()  # noqa: SLF001 - where a grid's relative path points
    for path, values in grid.items():
        if path in SCENARIO_INPUT_FIELDS:
            paths += [folder / v for v in values if isinstance(v, str | os.PathLike)]
    digest = {"servesim": package_version()}
    for path in paths:
        try:
            digest[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        except (OSError, ValueError):
            digest[str(path)] = "unreadable"  # the run reports it
    return digest


def _run_key(base_json: str, params: dict[str, Any], seed: int, as_given: bool = False) -> str:
    """The run's file name in runs.d: a hash of the base, the point and the seed. 10 and 10.0
    are one value to the scenario, so one run: an integral float is hashed as its int, which
    leaves the keys of integer grids as they were. `as_given` hashes the values as written,
    as sweeps did until 2026-12-07, so that their folders of float grids still resume."""
    point = params if as_given else {k: _same_number(v) for k, v in params.items()}
    doc = json.dumps(
        {"base": base_json, "params": point, "seed": seed}, sort_keys=True, default=str
    )
    return hashlib.sha256(doc.encode()).hexdigest()[:24]


def check_workers(workers: Any, name: str = "workers") -> int | None:
    """`workers` (None = one per CPU) as a count of processes >= 1; anything else is a
    ConfigError naming it `name` (a command line passes its flag)."""
    workers = plain_scalar(workers)
    if workers is not None and (
        not isinstance(workers, int) or isinstance(workers, bool) or workers < 1
    ):
        raise ConfigError(f"{name}: invalid value {excerpt(workers)}; must be an integer >= 1")
    return workers


def latency_entries(provenance: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The step-time models that price a run, read from its `=== Latency Model ===` block
    (`Result.latency_provenance`): one per named deployment (`by_deployment`) or per PD
    pool role (`by_role`) when the block has them (they are there only when they differ
    from the top level, and then they, not the top level, run every instance of theirs),
    else the top level alone, under the label ""."""
    for key in ("by_deployment", "by_role"):
        entries = provenance.get(key)
        if isinstance(entries, Mapping) and entries:
            return dict(entries)
    return {"": provenance}


def per_entry_text(
    entries: Mapping[str, Mapping[str, Any]],
    key: str | Callable[[Mapping[str, Any]], str],
    label_sep: str = " ",
    sep: str = ", ",
) -> str:
    """One field of `latency_entries` in words: the value when every entry agrees
    ("physics"), else each labelled ("prefill roofline, decode physics"). `key` is the
    provenance field or a function of the provenance."""
    values = {
        label: str(key(p) if callable(key) else p.get(key, "")) for label, p in entries.items()
    }
    if len(set(values.values())) <= 1:
        return next(iter(values.values()), "")
    return sep.join(f"{label}{label_sep}{value}" for label, value in values.items())


def _simulate_row(scenario: Scenario) -> dict[str, Any]:
    """Simulate one scenario; its numeric summary metrics (a statistic of no samples as NaN,
    bools and other strings dropped) and its steady-state verdict."""
    from .api import simulate

    result = simulate(scenario, warn_unsteady=False)
    # What priced the steps, as the run's Latency Model block says: PD pools or named
    # deployments that differ from the top level price every step of theirs (until
    # 2026-12-07 a PD sweep whose pools ran physics under a roofline top level read
    # "roofline").
    entries = latency_entries(result.latency_provenance)
    summary = {
        **result.summary,
        "latency_model": per_entry_text(entries, "latency_model", ": ", "; "),
        "latency_coefficients": per_entry_text(entries, "coefficients", ": ", "; "),
    }
    row = {
        k: math.nan if v is None else v
        for k, v in summary.items()
        if v is None or (isinstance(v, int | float) and not isinstance(v, bool))
    }
    for name in TEXT_COLUMNS:
        if name in summary:
            row[name] = summary[name]
    for name in ZERO_WHEN_ABSENT:
        row.setdefault(name, 0)
    return row


BACKENDS = ("local", "ray")


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "backend: 'ray' needs Ray, which is not installed; install the optional extra: "
            "pip install 'servesim[ray]'"
        ) from None
    return ray


def _run_on_ray(ray, address: str | None, sc: Scenario, todo: list, finish) -> None:
    """One Ray task per (point, seed); results are collected as they complete."""
    if not ray.is_initialized():
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
        )
    remote_task = ray.remote(_task)
    refs = {remote_task.remote(_point_scenario(sc, t[3], t[4])): t for t in todo}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            finish(refs[ref], ray.get(ref))


def _abandon(pool: ProcessPoolExecutor) -> None:
    """Stop a pool at once: cancel queued tasks and terminate the workers still running one.
    The executor has no public call for the latter, hence its `_processes` map."""
    workers = list((pool._processes or {}).values())  # noqa: SLF001
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.terminate()
    for process in workers:
        process.join()


def _task(scenario: Scenario) -> dict[str, Any]:
    # Module-level so a process pool can pickle it; looks `_simulate_row` up at call time.
    return _simulate_row(scenario)


def _load_done(runs_dir: Path) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    if not runs_dir.is_dir():
        return done
    for f in runs_dir.glob("*.json"):
        try:
            doc = read_json(f, "sweep run")
            done[doc["key"]] = doc["metrics"]
        except (ConfigError, KeyError, TypeError):
            continue  # unreadable leftovers are re-run
    return done


def _seeds(seeds: Sequence[int]) -> list[int]:
    if isinstance(seeds, str | bytes) or not hasattr(seeds, "__iter__"):
        raise ConfigError(f"seeds: expected a list of integers; got {excerpt(seeds)}")
    out = list(seeds)
    if not out:
        raise ConfigError("seeds: needs at least one seed")
    out = [plain_scalar(s) for s in out]
    for s in out:
        if not isinstance(s, int) or isinstance(s, bool):
            raise ConfigError(f"seeds: invalid value {excerpt(s)}; seeds are integers")
        if not 0 <= s <= MAX_SEED:
            raise ConfigError(
                f"seeds: invalid value {excerpt(s)}; a seed is from 0 to {MAX_SEED:,} (seeds "
                "are written as signed 64-bit integers)"
            )
    if len(set(out)) != len(out):
        raise ConfigError(f"seeds: duplicate seeds in {excerpt(out)}; each seed once")
    return out


def sweep(
    base: Scenario | dict | str | Path,
    grid: dict[str, list[Any]],
    seeds: Sequence[int] = (42,),
    workers: int | None = None,
    out: Path | str | None = None,
    progress: Progress | None = None,
    backend: str = "local",
    ray_address: str | None = None,
) -> SweepResult:
    """Simulate every grid point (Cartesian product of `grid`'s value lists) for every seed.

    `grid` maps dotted scenario paths to value lists. `workers` defaults to os.cpu_count();
    1 runs in this process. With `out`, finished runs are kept in `out/runs.d/` (one file per
    run, written atomically) and skipped on a re-run; at the end `out/runs.parquet`,
    `out/runs.csv` and `out/points.csv` are written atomically. `progress(done, total, row)` is
    called after each simulated run.

    `backend="ray"` runs the same tasks on a Ray cluster (`ray_address`; default a local Ray
    started on the spot; Ray is the optional extra `ray`). Rows are identical to the local
    backend's: each task is a whole simulation with its own seed."""
    from .api import as_scenario, scenario_file

    if backend not in BACKENDS:
        raise ConfigError(f"backend: invalid value {backend!r}; valid: {', '.join(BACKENDS)}")
    if ray_address is not None and backend != "ray":
        raise ConfigError(
            f"ray_address: invalid value {excerpt(ray_address)}; a Ray cluster's address "
            "means something only with backend 'ray' (--backend ray)"
        )
    ray = _import_ray() if backend == "ray" else None

    require_path("out", out, optional=True)
    if out is not None:
        check_output_folder(out, "out")  # a file there is one clear error, before any run
    require_callable("progress", progress)
    sc = as_scenario(base)
    if not isinstance(grid, dict):
        raise ConfigError(
            f"grid: must be a mapping of scenario paths to value lists, not {excerpt(grid)}"
        )
    seed_list = _seeds(seeds)
    workers = check_workers(workers)
    params = list(grid)
    for path in params:  # unknown paths first, so a typo is reported as such
        if not isinstance(path, str):
            raise ConfigError(f"grid: keys are dotted scenario paths (text); got {excerpt(path)}")
        check_path(sc, path)
    for path, values in grid.items():  # before the product, which needs iterables
        if not isinstance(values, list) or not values:
            raise ConfigError(
                f"grid: {excerpt(path)} needs a non-empty list of values, got {excerpt(values)}"
            )
    # A NumPy scalar is the number it holds: the same column type and run key as a plain one.
    grid = {path: [plain_scalar(v) for v in values] for path, values in grid.items()}
    for path, values in grid.items():  # as with seeds: a repeated value is a repeated run
        # 5 and 5.0 are one value to the scenario's field, so one run.
        shown = [json.dumps(_same_number(v), sort_keys=True, default=str) for v in values]
        if len(set(shown)) != len(shown):
            raise ConfigError(
                f"grid: {path}: duplicate values in {excerpt(values)}; each value once"
            )
    runs = math.prod(len(values) for values in grid.values()) * len(seed_list)
    if runs > MAX_SWEEP_RUNS:
        sizes = " x ".join(str(len(v)) for v in grid.values()) or "1"
        raise ConfigError(
            f"grid: {sizes} point(s) x {len(seed_list):,} seed(s) = {runs:,} runs; a sweep is "
            f"at most {MAX_SWEEP_RUNS:,} runs (each is a whole simulation)"
        )
    points = [dict(zip(params, combo, strict=True)) for combo in product(*grid.values())]
    _validate(sc, grid, points, seed_list[0])

    base_json = json.dumps(
        {"scenario": sc.model_dump(mode="json"), "inputs": _inputs_digest(sc, grid)},
        sort_keys=True,
    )
    tasks: list[tuple[int, int, str, dict[str, Any], int]] = []  # point, seed index, key, ...
    for p, point in enumerate(points):
        for si, seed in enumerate(seed_list):
            tasks.append((p, si, _run_key(base_json, point, seed), point, seed))

    out_dir = Path(out) if out is not None else None
    runs_dir = out_dir / RUNS_DIR if out_dir is not None else None
    done: dict[str, dict[str, Any]] = {}
    if runs_dir is not None:
        runs_dir.mkdir(parents=True, exist_ok=True)
        done = _load_done(runs_dir)
    metrics_by_key = {t[2]: done[t[2]] for t in tasks if t[2] in done}
    for _p, _si, key, point, seed in tasks if done else ():
        # A run written under its values' old key (an integral float hashed as written).
        legacy = _run_key(base_json, point, seed, as_given=True)
        if key not in metrics_by_key and legacy in done:
            metrics_by_key[key] = done[legacy]
    todo = [t for t in tasks if t[2] not in metrics_by_key]
    skipped = len(tasks) - len(todo)

    def finish(task: tuple[int, int, str, dict[str, Any], int], metrics: dict[str, Any]) -> None:
        _, _, key, point, seed = task
        metrics_by_key[key] = metrics
        if runs_dir is not None:
            doc = {"key": key, "params": point, "seed": seed, "metrics": metrics}
            write_text_atomically(runs_dir / f"{key}.json", json.dumps(doc, default=str))
        if progress is not None:
            row = {**{k: _jsonable(v) for k, v in point.items()}, "seed": seed, **metrics}
            progress(len(metrics_by_key) - skipped, len(todo), row)

    n_workers = workers if workers is not None else (os.cpu_count() or 1)
    if ray is not None and todo:
        _run_on_ray(ray, ray_address, sc, todo, finish)
    elif n_workers == 1 or len(todo) <= 1:
        for t in todo:
            finish(t, _simulate_row(_point_scenario(sc, t[3], t[4])))
    elif todo:
        pool = ProcessPoolExecutor(
            max_workers=min(n_workers, len(todo)), initializer=ignore_interrupts_in_worker
        )
        try:
            futures = {pool.submit(_task, _point_scenario(sc, t[3], t[4])): t for t in todo}
            for fut in as_completed(futures):
                finish(futures[fut], fut.result())
        except BaseException:
            # Finished runs are already saved; the queued and running ones are abandoned
            # rather than waited for (an interrupt should stop the sweep now).
            _abandon(pool)
            raise
        pool.shutdown(wait=True)

    rows = []
    for p, _si, key, point, seed in tasks:  # tasks are already in (point, seed) order
        row: dict[str, Any] = {"point": p}
        row.update({k: _jsonable(v) for k, v in point.items()})
        row["seed"] = seed
        row.update(metrics_by_key[key])
        for name in ZERO_WHEN_ABSENT:  # a resumed run may predate a field's listing here
            row.setdefault(name, 0)
        rows.append(row)
    runs = pd.DataFrame(rows)
    metric_names = [c for c in runs.columns if c not in {"point", "seed", *params, *TEXT_COLUMNS}]
    points_frame, ci_method = summarize_points(runs, params, metric_names)
    result = SweepResult(
        runs=runs,
        points=points_frame,
        params=params,
        metrics=metric_names,
        ci_method=ci_method,
        simulated=len(todo),
        skipped=skipped,
        out=out_dir,
        seeds=seed_list,
        input_files=scenario_input_files(sc.model_dump(), scenario_file(base)),
    )
    if out_dir is not None:
        write_outputs(result, out_dir)
    return result


def write_outputs(result: SweepResult, out_dir: Path) -> None:
    """runs.parquet, runs.csv and points.csv, each written to a temp file and renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_with(out_dir / "runs.parquet", lambda tmp: result.runs.to_parquet(tmp, index=False))
    write_text_atomically(out_dir / "runs.csv", result.runs.to_csv(index=False))
    write_text_atomically(out_dir / "points.csv", result.points.to_csv(index=False))


# --- sweep files ----------------------------------------------------------------------------


class SweepFile(BaseModel):
    """`sweep.yaml`: base scenario (path relative to the sweep file, or inline), grid, seeds."""

    model_config = ConfigDict(extra="forbid")

    base: str | dict[str, Any]
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [42], min_length=1)
    workers: int | None = Field(None, gt=0)


@dataclass
class SweepSpec:
    base: Scenario
    grid: dict[str, list[Any]]
    seeds: list[int]
    workers: int | None
    # The base scenario's file, when the sweep file names one rather than holding it inline.
    base_path: Path | None = None


def load_sweep_file(path: str | Path) -> SweepSpec:
    """Read and validate a sweep YAML file (strict: unknown keys are errors)."""
    from .scenario import load_scenario

    p = Path(path)
    data = read_yaml_mapping(p, "sweep")
    try:
        spec = SweepFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_spec_error(exc, f"sweep {str(p)!r}", SweepFile)) from None
    folder = p.parent
    base_path = None
    if isinstance(spec.base, str):
        base_path = Path(spec.base)
        base_path = base_path if base_path.is_absolute() else folder / base_path
        base = load_scenario(base_path)
    else:
        base = _inline_scenario(spec.base, folder, str(p))
    return SweepSpec(
        base=base, grid=spec.grid, seeds=spec.seeds, workers=spec.workers, base_path=base_path
    )


def _inline_scenario(data: dict[str, Any], folder: Path, source: str) -> Scenario:
    """An inline base scenario; its relative paths resolve from the sweep file's folder."""

    def resolve(q: Path) -> Path:
        return q if q.is_absolute() else folder / q

    sc = scenario_from_dict(data, source=f"{source}: base")
    if sc.trace is not None:
        header = sc.trace.header
        sc.trace = TraceSpec(
            header=resolve(header) if header is not None else None, data=resolve(sc.trace.data)
        )
    if sc.hardware_file is not None:
        sc.hardware_file = resolve(sc.hardware_file)
    if sc.latency.coeffs_file is not None:
        sc.latency.coeffs_file = resolve(sc.latency.coeffs_file)
    if sc.workload_spec is not None:
        sc.workload_spec = resolve(sc.workload_spec)
    sc._base_dir = folder  # noqa: SLF001
    return sc
