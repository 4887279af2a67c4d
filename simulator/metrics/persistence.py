"""Save a run to a folder and load it back.

A saved result is a folder holding `summary.json` (the summary and every dict-valued metric)
and one Parquet file per non-empty DataFrame (`requests`, `steps`, `instances`, `transfers`).
Parquet keeps the column dtypes, nullable Int64 timestamps included. `load_result` returns a
`SavedResult` whose attributes have the same names as a live `Result`'s, so code (and the
plots) work on either.
"""

from __future__ import annotations

import json
import math
import shutil
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, ServesimError, excerpt, one_line, require_path, shorten
from ..input_files import check_path, open_binary, read_json
from .steady import SteadyState
from .summary import format_summary

if TYPE_CHECKING:
    from .plots import PlotAccessor

SUMMARY_FILE = "summary.json"
FORMAT_NAME = "servesim-result"
FORMAT_VERSION = 1
FRAME_NAMES = (
    "requests", "steps", "instances", "transfers", "timeline", "fleet_instances", "nodes",
    "per_model",
)  # fmt: skip
# The names a saved result may have in its folder; saving again replaces these and keeps the
# rest.
OWN_FILES = frozenset({SUMMARY_FILE, *(f"{name}.parquet" for name in FRAME_NAMES)})
DICT_NAMES = (
    "per_slo", "kv_metrics", "anomalies", "pd_metrics", "session_counts", "scenario",
    "fleet_metrics", "session_metrics", "slo",
)  # fmt: skip


@dataclass
class SavedResult:
    """A result loaded from disk: the same attribute names as a live `Result`."""

    summary: dict[str, Any]
    requests: pd.DataFrame = field(repr=False)
    steps: pd.DataFrame = field(repr=False)
    instances: pd.DataFrame = field(repr=False)
    transfers: pd.DataFrame = field(repr=False)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    fleet_instances: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    nodes: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    per_model: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    per_slo: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    kv_metrics: dict[str, float] = field(default_factory=dict, repr=False)
    anomalies: dict[str, int] = field(default_factory=dict, repr=False)
    pd_metrics: dict[str, Any] | None = field(default=None, repr=False)
    session_counts: dict[str, int] = field(default_factory=dict, repr=False)
    session_metrics: dict[str, Any] | None = field(default=None, repr=False)
    fleet_metrics: dict[str, Any] | None = field(default=None, repr=False)
    scenario: dict[str, Any] = field(default_factory=dict, repr=False)
    # SLO attainment and goodput, and the steady-state verdict with its reasons, as the run
    # had them (empty and None in a result saved before 2026-12-07).
    slo: dict[str, Any] = field(default_factory=dict, repr=False)
    steady_state: SteadyState | None = field(default=None, repr=False)
    horizon_us: int | None = None
    not_arrived: int = 0
    path: Path | None = None

    @property
    def plot(self) -> PlotAccessor:
        from .plots import PlotAccessor

        return PlotAccessor(self)

    def summary_text(self) -> str:
        return format_summary(self.summary)

    @property
    def latency_provenance(self) -> dict[str, Any]:
        """Which latency model produced these numbers (from the saved scenario)."""
        from .views.text import latency_provenance

        return latency_provenance(self.scenario)


def _json_safe(value: Any) -> Any:
    """Plain JSON types only: numpy scalars unwrapped, non-finite floats as None."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _write_folder(result: Any, folder: Path) -> None:
    empty: dict[str, dict[str, str]] = {}
    types: dict[str, dict[str, str]] = {}
    for name in FRAME_NAMES:
        frame: pd.DataFrame = getattr(result, name)
        # Columns and their types: a frame of no rows loads back typed as it was, and a
        # table changed after saving is caught when loaded (`_check_frame`).
        types[name] = {str(c): str(t) for c, t in frame.dtypes.items()}
        if len(frame) == 0:
            empty[name] = types[name]
            continue
        frame.to_parquet(folder / f"{name}.parquet", engine="pyarrow", index=False)
    document: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "summary": result.summary,
    }
    for name in DICT_NAMES:
        document[name] = getattr(result, name)
    steady = result.steady_state
    document["steady_state"] = steady.document() if steady is not None else None
    document["horizon_us"] = result.horizon_us
    document["not_arrived"] = result.not_arrived
    document["empty_frames"] = empty
    document["frame_types"] = types
    with open(folder / SUMMARY_FILE, "w", encoding="utf-8") as handle:
        json.dump(_json_safe(document), handle, indent=2)
        handle.write("\n")


def save_result(result: Any, directory: str | Path) -> Path:
    """Write `result` (live or loaded) into the folder `directory`; return that path as given
    (whether the folder was new or replaced).

    Everything is written to a temporary sibling folder first, then renamed into place: a
    crash never leaves a half-written result, and an existing saved result at `directory` is
    replaced only once the new one is complete. Files in it that are not part of a saved
    result (`servesim report`'s report.html, `servesim plot`'s PNGs, the user's own) are
    kept. A folder that exists but is not a saved result (no summary.json, not empty) is
    refused rather than replaced.
    """
    from ..atomic_io import check_output_folder, require_output_path, write_failed

    require_output_path("save_result: directory", directory)
    if not all(hasattr(result, name) for name in ("summary", *FRAME_NAMES)):
        raise ConfigError(f"save_result: expected a Result or a SavedResult; got {excerpt(result)}")
    given = Path(directory)
    # The same checks as every output (no pseudo file system, a symbolic link to a folder is
    # followed); an OSError while writing is one line naming the folder.
    target = check_output_folder(given)
    _refuse_working_folder(given, target)
    try:
        _replace_folder(result, target)
    except OSError as exc:
        if isinstance(exc, ServesimError):
            raise
        raise write_failed(given, exc) from exc
    return given


def _refuse_working_folder(given: Path, target: Path) -> None:
    """Saving replaces the folder by renaming it away: for the current working folder (`.`)
    or one holding it, the process would be left in a deleted folder, every relative path
    after it failing."""
    import os

    try:
        cwd = Path(os.path.realpath(Path.cwd()))
    except OSError:  # the working folder is already gone: nothing to protect
        return
    real = Path(os.path.realpath(target))
    if real == cwd or real in cwd.parents:
        raise ConfigError(
            f"save_result: directory: invalid path {str(given)!r}; it is the current working "
            "folder or holds it, which saving would replace; give a folder inside it"
        )


def _replace_folder(result: Any, target: Path) -> None:
    if target.exists():
        if not target.is_dir():
            raise ConfigError(f"save_result: {str(target)!r} exists and is not a folder")
        if not (target / SUMMARY_FILE).is_file() and any(target.iterdir()):
            raise ConfigError(
                f"save_result: {str(target)!r} is a non-empty folder without {SUMMARY_FILE}; "
                "refusing to replace it"
            )
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    # A plain mkdir (not mkdtemp) so the folder gets the usual umask permissions, not 0700.
    tmp = parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    tmp.mkdir()
    try:
        _write_folder(result, tmp)
        if target.exists():
            _carry_over(target, tmp)
            old = parent / f".{target.name}.{uuid.uuid4().hex}.old"
            target.rename(old)
            try:
                tmp.rename(target)
            except BaseException:
                old.rename(target)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _carry_over(old: Path, new: Path) -> None:
    """Put into the new result's folder everything of the old one that is not the old
    result's: a report or plots written into the folder, or the user's own files, which
    saving again used to delete with the old result.

    The old result's own files are never carried, even those the new result does not write
    (an empty frame gets no file): load_result would read a stale table as this run's. The
    entries are hard-linked (copied where the file system cannot link) rather than moved, so
    until the new folder is renamed into place the old one is complete, whatever happens."""
    for entry in old.iterdir():
        if entry.name in OWN_FILES:
            continue
        destination = new / entry.name
        if entry.is_symlink():
            destination.symlink_to(entry.readlink())
        elif entry.is_dir():
            shutil.copytree(entry, destination, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, destination)


def _link_or_copy(source: Any, destination: Any) -> None:
    try:
        Path(destination).hardlink_to(source)
    except OSError:
        shutil.copy2(source, destination)


def load_result(directory: str | Path) -> SavedResult:
    """Read a folder written by `save_result`; a folder without summary.json is an error."""
    require_path("load_result", directory)
    folder = check_path(directory, "load_result")
    summary_path = folder / SUMMARY_FILE
    if not folder.exists():
        raise ConfigError(f"load_result: {str(folder)!r}: no such folder")
    if not summary_path.exists():
        raise ConfigError(f"load_result: {str(folder)!r} is not a saved result (no {SUMMARY_FILE})")
    document = read_json(summary_path, "load_result")
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        raise ConfigError(f"load_result: {str(summary_path)!r} is not a servesim result summary")
    empty = document.get("empty_frames", {})
    if not isinstance(empty, dict):
        empty = {}
    types = document.get("frame_types")
    frames: dict[str, pd.DataFrame] = {}
    for name in FRAME_NAMES:
        path = folder / f"{name}.parquet"
        if path.exists():
            frames[name] = _read_frame(path)
            if isinstance(types, dict) and isinstance(types.get(name), dict):
                _check_frame(path, frames[name], types[name])
        elif isinstance(types, dict) and name not in empty:
            raise ConfigError(
                f"load_result: {str(path)!r} is missing: the run saved rows there; the folder "
                "was changed after saving"
            )
        else:
            frames[name] = _empty_frame(empty.get(name))
    _check_document(summary_path, document)
    dicts = {name: document.get(name) for name in DICT_NAMES}
    return SavedResult(
        summary=document.get("summary", {}),
        requests=frames["requests"],
        steps=frames["steps"],
        instances=frames["instances"],
        transfers=frames["transfers"],
        timeline=frames["timeline"],
        fleet_instances=frames["fleet_instances"],
        nodes=frames["nodes"],
        per_model=frames["per_model"],
        fleet_metrics=dicts["fleet_metrics"],
        per_slo=dicts["per_slo"] or {},
        kv_metrics=dicts["kv_metrics"] or {},
        anomalies=dicts["anomalies"] or {},
        pd_metrics=dicts["pd_metrics"],
        session_counts=dicts["session_counts"] or {},
        session_metrics=dicts["session_metrics"],
        scenario=dicts["scenario"] or {},
        slo=dicts["slo"] or {},
        steady_state=_steady_state(summary_path, document.get("steady_state")),
        horizon_us=_optional_count(summary_path, document, "horizon_us"),
        not_arrived=_optional_count(summary_path, document, "not_arrived") or 0,
        path=folder,
    )


def _steady_state(path: Path, saved: Any) -> SteadyState | None:
    """The verdict as saved (None in a result saved before verdicts were)."""
    if saved is None:
        return None
    known = {f.name for f in fields(SteadyState)}
    if not isinstance(saved, dict) or "verdict" not in saved or not set(saved) <= known:
        raise ConfigError(
            f"load_result: {str(path)!r}: 'steady_state' is not a verdict as save_result "
            "writes it; the file was changed after saving"
        )
    return SteadyState(**saved)


def _optional_count(path: Path, document: dict[str, Any], name: str) -> int | None:
    value = document.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ConfigError(
            f"load_result: {str(path)!r}: {name!r} must be a whole number >= 0 or null, not "
            f"{excerpt(value)}"
        )
    return value


# The nested entries of summary.json that the readers of a saved result (the report, the
# plots, latency_provenance, engine_policies) look into, and the kind each must be. A shape is
# one of: MAPPING (a mapping, its contents not looked into), a dict (a mapping whose named
# entries have those shapes), ("each", shape) (a mapping whose every value has the shape),
# ("list", shape) (a list whose every item has it), TEXT, COUNT (a whole number >= 0). An
# absent or null entry is always fine: every reader treats it as "the run did not say".
MAPPING = "mapping"
TEXT = "text"
COUNT = "count"
_LATENCY_SHAPE = {"layout": MAPPING, "precision": MAPPING}
_SCENARIO_SHAPE = {
    "resolved": {
        "latency": _LATENCY_SHAPE,
        "latency_by_role": ("each", _LATENCY_SHAPE),
        "latency_by_deployment": ("each", _LATENCY_SHAPE),
        "roles": ("list", TEXT),
        "models": ("list", TEXT),
        "total_kv_blocks": COUNT,
    },
    "cluster": {
        "pd": {"prefill": MAPPING, "decode": MAPPING},
        "routing": MAPPING,
        "admission": MAPPING,
    },
    "engine": MAPPING,
    "slo": MAPPING,
    "trace": MAPPING,
    "node_pools": ("list", MAPPING),
    "deployments": ("list", MAPPING),
}
DOCUMENT_SHAPE: dict[str, Any] = {
    "summary": MAPPING,
    "per_slo": ("each", MAPPING),
    "kv_metrics": MAPPING,
    "anomalies": MAPPING,
    "pd_metrics": MAPPING,
    "session_counts": MAPPING,
    "scenario": _SCENARIO_SHAPE,
    "fleet_metrics": MAPPING,
    "session_metrics": MAPPING,
    # Its entries (targets, per-class blocks) are checked by the report that draws them
    # (report.run_source.slo_problem), with the numbers in them.
    "slo": MAPPING,
}
_SHAPE_NAMES = {
    MAPPING: "a mapping",
    TEXT: "a string",
    COUNT: "a whole number >= 0",
    "each": "a mapping",
    "list": "a list",
}


def _shape_problem(where: str, value: Any, shape: Any) -> tuple[str, Any, str] | None:
    """The first entry under `value` (named `where`) not of `shape`, as (where, value, what
    it must be); None when every entry is."""
    if value is None:
        return None
    kind = shape if isinstance(shape, str) else "each" if isinstance(shape, dict) else shape[0]
    ok = {
        MAPPING: isinstance(value, dict),
        "each": isinstance(value, dict),
        "list": isinstance(value, list),
        TEXT: isinstance(value, str),
        COUNT: isinstance(value, int) and not isinstance(value, bool) and value >= 0,
    }[kind]
    if not ok:
        return where, value, _SHAPE_NAMES[kind]
    if isinstance(shape, dict):
        for name, inner in shape.items():
            found = _shape_problem(f"{where}.{name}", value.get(name), inner)
            if found is not None:
                return found
    elif kind == "each":
        for name, item in value.items():
            found = _shape_problem(f"{where}.{name}", item, shape[1])
            if found is not None:
                return found
    elif kind == "list":
        for i, item in enumerate(value):
            found = _shape_problem(f"{where}[{i}]", item, shape[1])
            if found is not None:
                return found
    return None


def _check_document(path: Path, document: dict[str, Any]) -> None:
    """A summary.json edited or damaged after saving: each entry of the wrong kind, at any
    depth the readers look into (DOCUMENT_SHAPE), is one ConfigError naming it (the report and
    plots would fail on it deep inside, with a traceback)."""
    if not isinstance(document.get("summary"), dict):
        value = document.get("summary")
        raise ConfigError(
            f"load_result: {str(path)!r}: 'summary' must be a mapping (as save_result writes "
            f"it), not {type(value).__name__}"
        )
    for name, shape in DOCUMENT_SHAPE.items():
        found = _shape_problem(name, document.get(name), shape)
        if found is not None:
            where, value, allowed = found
            raise ConfigError(
                f"load_result: {str(path)!r}: {where!r} must be {allowed} (as save_result "
                f"writes it), not {shorten(repr(value))}; the file was changed after saving"
            )


def _check_frame(path: Path, frame: pd.DataFrame, saved_types: dict[str, Any]) -> None:
    """The table has the columns, with the types, it was saved with."""
    found = {str(c): str(t) for c, t in frame.dtypes.items()}
    missing = [c for c in saved_types if c not in found]
    if missing:
        raise ConfigError(
            f"load_result: {str(path)!r} lacks the column(s) {', '.join(missing)} it was saved "
            "with; the folder was changed after saving"
        )
    changed = [f"{c} ({found[c]}, saved as {t})" for c, t in saved_types.items() if found[c] != t]
    if changed:
        raise ConfigError(
            f"load_result: {str(path)!r}: column type changed since saving: {', '.join(changed)}"
        )


def _empty_frame(columns: Any) -> pd.DataFrame:
    """A saved frame of no rows: {column: type} (a list of names from before 2026-12-07, or
    a type pandas does not know, gives untyped columns)."""
    if isinstance(columns, list):
        return pd.DataFrame(columns=[str(c) for c in columns])
    if not isinstance(columns, dict):
        return pd.DataFrame()
    series = {}
    for column, kind in columns.items():
        try:
            series[str(column)] = pd.Series(dtype=kind)
        except (TypeError, ValueError):
            series[str(column)] = pd.Series(dtype=object)
    return pd.DataFrame(series)


def _read_frame(path: Path) -> pd.DataFrame:
    """A saved table; a damaged or foreign file is a one-line ConfigError."""
    # Through the reader's checks first: a FIFO or device under the name must not block.
    import pyarrow

    with open_binary(path, "load_result") as handle:
        try:
            return pd.read_parquet(handle, engine="pyarrow")
        except (pyarrow.ArrowException, ValueError, TypeError, KeyError, IndexError) as exc:
            raise ConfigError(
                f"load_result: {str(path)!r} is not a readable Parquet table: "
                f"{shorten(one_line(str(exc)) or type(exc).__name__)}"
            ) from None
