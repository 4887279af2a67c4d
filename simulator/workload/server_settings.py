"""What the recorded server did, for the replay of a recorded run: prefix caching on or off,
and the batch limits a server started without them took.

A replay that shares prefixes the real server recomputed, or recomputes what it served from its
prefix cache, prices different work; on a saturated vLLM cell that alone moves TTFT by a
third. `replay`, `validate` and `calibrate` therefore take their default from one place: the
run's own configuration when it records the setting, else vLLM's default, which has been *on*
since the V1 engine (both ground-truth datasets ran V1). A flag still overrides it.

Where the setting is looked up, next to the files of the run (the file itself, its folder and
the folder above, so a cell of a sweep finds the sweep's configuration):

- `server_config.json` (the vllm-0.23.0 dataset: `enable_prefix_caching: true`);
- `exp-config.yaml` (the vllm-0.15.1 runs' server arguments, `runs/<run>/exp-config.yaml`; a
  `requests/<run>.requests.csv` finds its run's file). Those files record no prefix-caching
  argument, so vLLM's default applies.

The keys read are vLLM's argument names: `enable_prefix_caching` (also spelled with dashes) and
`no_enable_prefix_caching`. BLIS's trace header has no such key (its `server` section records
type, model, TP, max_num_seqs, block size, memory utilisation and context length only).

The rest of the recorded deployment (`recorded_server`): a replay of a recorded trace simulates
the server that recorded it, field by field, unless the user chose the field (a flag, a policy
bundle, a defaults file, or a scenario field set explicitly). Read, highest first: the trace
header's `server` section (model, TP, max_num_seqs, block size, context length), then a
`server_config.json` next to the data file or in the folder above (model, TP, the batch
limits, block size, GPU KV blocks, context length, the vLLM version), then, for a ground-truth
request CSV, its run's `meta.json` and `exp-config.yaml` and its dataset folder's name, then,
for a vLLM server whose batch limits none records, vLLM's defaults on the replayed GPU
(above). A trace that BLIS generated records none of it and is replayed exactly as before.
A scenario with `deployments` takes only prefix caching and the vLLM version from the
recording: the rest describes one server and would reach every deployment
(SHARED_BY_DEPLOYMENTS).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, excerpt
from ..input_files import read_json, read_yaml

if TYPE_CHECKING:
    from ..scenario import Scenario

SERVER_CONFIG = "server_config.json"
EXP_CONFIG = "exp-config.yaml"
CONFIG_NAMES = (SERVER_CONFIG, EXP_CONFIG)
REQUESTS_SUFFIX = ".requests.csv"
# vLLM V1 (0.8 onwards, the default engine of both datasets) caches prefixes unless told not to.
VLLM_DEFAULT = True
DEFAULT_SOURCE = "vLLM's default"
_ON_KEYS = ("enable_prefix_caching", "enable-prefix-caching")
_OFF_KEYS = ("no_enable_prefix_caching", "no-enable-prefix-caching")

# vLLM's OpenAI-compatible server, started without --max-num-batched-tokens or --max-num-seqs,
# takes them from the GPU (vllm/engine/arg_utils.py, the batch defaults by usage context): a
# device with at least 70 GiB that is not an A100 (H100, H200, B200, MI300X) gets 8,192 tokens
# and 1,024 sequences; any other GPU 2,048 and 256. The vllm-0.23.0 dataset's server ran with
# no flags and recorded max_num_batched_tokens 8192, which only the first branch gives, so its
# unrecorded max_num_seqs was 1,024 (its saturated cells hold 256 requests because the load
# generator allowed 256 outstanding, not because the server did).
LARGE_GPU_MEMORY_GIB = 70.0
LARGE_GPU_BATCH = (8192, 1024)
OTHER_GPU_BATCH = (2048, 256)


# Dataset folders are named after the server they measured (vllm-0.15.1-h100): nothing else
# in the ground truth's 0.15.1 files records the version.
_VERSION_IN_NAME = re.compile(r"vllm[-_]v?(\d+(?:\.\d+)+)", re.IGNORECASE)


def version_in_name(name: str) -> str | None:
    """The vLLM version a folder name carries (`vllm-0.15.1-h100` -> "0.15.1"), or None."""
    found = _VERSION_IN_NAME.search(name)
    return found.group(1) if found else None


@dataclass(frozen=True)
class PrefixCaching:
    """Whether the recorded server cached prefixes, and where that was read."""

    enabled: bool
    source: str

    @property
    def recorded(self) -> bool:
        """Whether a configuration file said it (else it is vLLM's default)."""
        return not self.source.startswith(DEFAULT_SOURCE)

    def line(self) -> str:
        """`prefix caching: on (server_config.json)`, as the commands print it."""
        return f"prefix caching: {'on' if self.enabled else 'off'} ({self.source})"


def _setting(path: Path) -> bool | None:
    """The prefix-caching setting a run configuration records, None when it records none."""
    reader = read_json if path.suffix == ".json" else read_yaml
    document: Any = reader(path, "server config")
    if not isinstance(document, dict):
        return None
    for keys, meaning in ((_ON_KEYS, True), (_OFF_KEYS, False)):
        for key in keys:
            if key in document:
                value = document[key]
                if not isinstance(value, bool):
                    raise ConfigError(
                        f"server config: {str(path)!r}: {key}: invalid value {excerpt(value)}; "
                        "must be true or false"
                    )
                return value if meaning else not value
    return None


def _candidates(place: Path) -> list[Path]:
    if place.name in CONFIG_NAMES and not place.is_dir():
        return [place]
    folder = place if place.is_dir() else place.parent
    found = [folder / name for name in CONFIG_NAMES]
    found += [folder.parent / name for name in CONFIG_NAMES]
    if place.name.endswith(REQUESTS_SUFFIX):
        run = place.name.removesuffix(REQUESTS_SUFFIX)
        found.append(folder.parent / "runs" / run / EXP_CONFIG)
    return found


def recorded_prefix_caching(*places: str | os.PathLike[str] | None) -> PrefixCaching:
    """Whether the server that recorded a run had prefix caching on.

    `places` are the run's files or folders (a trace header and data, a ground-truth request
    CSV, a run folder, or a configuration file itself), looked through in order; None entries
    are skipped. The first configuration file that records the setting decides; with none,
    vLLM's default (on). A configuration file that cannot be read, or records a value that is
    not a boolean, is a ConfigError naming it."""
    seen: list[Path] = []
    looked: list[str] = []
    for place in _existing(places):
        for path in _candidates(place):
            if path in seen or not path.is_file():
                continue
            seen.append(path)
            value = _setting(path)
            if value is not None:
                return PrefixCaching(value, path.name)
            looked.append(path.name)
    if looked:
        unique = ", ".join(dict.fromkeys(looked))
        return PrefixCaching(VLLM_DEFAULT, f"{DEFAULT_SOURCE}; {unique} records no setting")
    return PrefixCaching(VLLM_DEFAULT, f"{DEFAULT_SOURCE}; no server configuration found")


def _existing(places: Iterable[str | os.PathLike[str] | None]) -> list[Path]:
    found = []
    for place in places:
        if place is None:
            continue
        try:
            if Path(place).exists():
                found.append(Path(place))
        except (OSError, ValueError):
            # A path the OS cannot take is the reader's to report, not this lookup's.
            continue
    return found


def vllm_batch_defaults(gpu_name: str, memory_gib: float) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of a vLLM OpenAI server started without them on
    this GPU (see LARGE_GPU_BATCH)."""
    if memory_gib >= LARGE_GPU_MEMORY_GIB and "a100" not in gpu_name.lower():
        return LARGE_GPU_BATCH
    return OTHER_GPU_BATCH


def vllm_batch_defaults_for(hardware: str) -> tuple[int, int]:
    """`vllm_batch_defaults` of a GPU in servesim's hardware table (by its name there)."""
    from ..catalog.hardware import get_gpu

    return vllm_batch_defaults(hardware, get_gpu(hardware).memory_gib)


# server_config.json key -> scenario path (prefix caching is read by `recorded_prefix_caching`).
# Of two names of one setting the later wins (validate's dataset reader prefers the same ones).
SERVER_CONFIG_FIELDS = {
    "model": "model",
    "tensor_parallelism": "tp",
    "tensor_parallel_size": "tp",
    "max_num_seqs": "engine.max_num_running_reqs",
    "max_num_batched_tokens": "engine.max_num_scheduled_tokens",
    "block_size": "engine.block_size_tokens",
    "kv_blocks_total_gpu": "engine.total_kv_blocks",
    "num_gpu_blocks": "engine.total_kv_blocks",
    "max_seq_len": "engine.max_model_len",
    "max_model_len": "engine.max_model_len",
    "enable_prefix_caching": "engine.enable_prefix_caching",
}
# A TraceV2 header's `server` key -> scenario path.
HEADER_SERVER_FIELDS = {
    "model": "model",
    "tensor_parallel": "tp",
    "max_num_seqs": "engine.max_num_running_reqs",
    "block_size": "engine.block_size_tokens",
    "max_model_len": "engine.max_model_len",
}
BATCH_LIMITS = ("engine.max_num_scheduled_tokens", "engine.max_num_running_reqs")
# What a recording says that holds for every deployment of a scenario with `deployments`. The
# rest (model, TP, limits, block size, KV blocks, context length) describes the one server a
# trace header or server_config.json records: on a multi-model run's export, the first
# deployment's. Set at the top level it would reach every deployment that does not set it
# itself (an A100 qwen running the H100 llama's 1,024 sequences and 131,072-token context), so
# such a replay keeps each deployment's own settings (docs/traces.md).
SHARED_BY_DEPLOYMENTS = frozenset({"engine.enable_prefix_caching", "latency.vllm_version"})


def read_server_config(path: Path) -> tuple[dict[str, Any], str | None]:
    """Scenario settings (dotted paths) and the vLLM version from a `server_config.json`; keys
    it does not map (e.g. `kv_cache_tokens`, which `num_gpu_blocks` already says) are
    ignored. A value of the wrong type is a ConfigError naming the file and the key."""
    data = read_json(path, "server config")
    if not isinstance(data, dict):
        raise ConfigError(f"server config {str(path)!r}: must be a JSON object")
    settings: dict[str, Any] = {}
    for name, key in SERVER_CONFIG_FIELDS.items():
        value = data.get(name)
        if value is None:
            continue
        if name == "model":
            ok = isinstance(value, str) and value.strip() != ""
        elif name == "enable_prefix_caching":
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        if not ok:
            raise ConfigError(
                f"server config {str(path)!r}: {name}: invalid value {excerpt(value)}; wrong "
                "type or range"
            )
        settings[key] = value
    version = data.get("vllm_version")
    if version is not None and not (isinstance(version, str) and 0 < len(version) <= 64):
        raise ConfigError(
            f"server config {str(path)!r}: vllm_version: invalid value {excerpt(version)}; "
            "must be a string"
        )
    return settings, version


def server_config_near(trace_data: str | os.PathLike[str]) -> Path | None:
    """The `server_config.json` of a recorded trace: next to its data file (a sweep's cell),
    else in the folder above (the sweep's own)."""
    folder = Path(trace_data).parent
    for where in (folder, folder.parent):
        if (where / SERVER_CONFIG).is_file():
            return where / SERVER_CONFIG
    return None


@dataclass(frozen=True)
class RecordedServer:
    """The deployment a recorded trace says its server had: scenario settings (dotted paths)
    and, for each, where it was read."""

    settings: dict[str, Any]
    sources: dict[str, str]
    prefix_caching: PrefixCaching
    # The recorded settings a replay of a scenario with `deployments` does not apply
    # (`recorded_settings`, SHARED_BY_DEPLOYMENTS).
    set_aside: tuple[str, ...] = ()

    def line(self, followed: Iterable[str]) -> str:
        """`recorded server: model Qwen/Qwen3-14B (trace header), … ` for the settings a replay
        `followed` (prefix caching has its own line, `PrefixCaching.line`); empty when it
        followed none (a generated trace records no server)."""
        chosen = set(followed) - {"engine.enable_prefix_caching"}
        by_source: dict[str, list[str]] = {}
        for path in self.settings:
            if path in chosen:
                by_source.setdefault(self.sources[path], []).append(
                    f"{path.rsplit('.', 1)[-1]} {_shown(self.settings[path])}"
                )
        shown = [f"{', '.join(items)} ({source})" for source, items in by_source.items()]
        lines = [f"recorded server: {'; '.join(shown)}"] if shown else []
        if self.set_aside:
            aside = ", ".join(
                f"{path.rsplit('.', 1)[-1]} {_shown(self.settings[path])}"
                for path in self.set_aside
            )
            lines.append(
                f"recorded server: {aside} not applied: the scenario's deployments keep their "
                "own settings (a recording describes one server)"
            )
        return "\n".join(lines)

    def replaced_line(self, scenario: Any, given: Iterable[str], followed: Iterable[str]) -> str:
        """The recorded settings the scenario file replaced with values of its own (`--scenario`
        outranks the recording, flags outrank both), e.g. `the scenario's tp 1, block_size_tokens
        16 replace the recorded server's 2, 32`; empty when it replaced none. Said because the
        replay then simulates another server than the one that recorded the trace."""
        from ..scenario import explicitly_set

        skipped = {*given, *followed, *self.set_aside, "engine.enable_prefix_caching"}
        mine, theirs = [], []
        for path, recorded in self.settings.items():
            # Only what the file set: a default (or the stand-in for a recorded model servesim
            # lacks, which has its own note) replaced nothing the user chose.
            if path in skipped or not explicitly_set(scenario, path):
                continue
            value: Any = scenario
            for key in path.split("."):
                value = getattr(value, key, None)
            if value is not None and value != recorded:
                mine.append(f"{path.rsplit('.', 1)[-1]} {_shown(value)}")
                theirs.append(_shown(recorded))
        if not mine:
            return ""
        return (
            f"the scenario's {', '.join(mine)} replace the recorded server's "
            f"{', '.join(theirs)} (give them as flags to simulate the recorded server)"
        )


def _shown(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def header_server(header: dict[str, Any]) -> dict[str, Any]:
    """A trace header's `server` section, without the entries that record nothing (null,
    empty, 0): what a replay, and validate, take from it."""
    server = header.get("server")
    if not isinstance(server, dict):
        return {}
    return {name: value for name, value in server.items() if value not in (None, "", 0)}


def recorded_server(
    trace_header: str | os.PathLike[str] | None,
    trace_data: str | os.PathLike[str],
    hardware: str = "H100",
    memory_gib: float | None = None,
) -> RecordedServer:
    """What the server that recorded a trace ran with (see the module docstring); the batch
    limits it took by default are vLLM's on `hardware` (a GPU of servesim's table, or one
    of `memory_gib` GiB)."""
    from .trace import read_header

    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if trace_header is None:  # a ground-truth request CSV: its run's meta.json, if any
        settings, sources = _request_run_settings(Path(trace_data))
    ground_truth_run = bool(settings)
    config = server_config_near(trace_data)
    if config is not None:
        recorded, version = read_server_config(config)
        recorded.pop("engine.enable_prefix_caching", None)  # recorded_prefix_caching's
        if version is not None:
            recorded["latency.vllm_version"] = version
        settings.update(recorded)
        sources.update(dict.fromkeys(recorded, config.name))
    server = header_server(read_header(trace_header)) if trace_header is not None else {}
    for name, path in HEADER_SERVER_FIELDS.items():
        if name in server:
            settings[path] = server[name]
            sources[path] = "trace header"
    # Only a vLLM server took vLLM's defaults (a trace servesim exported records its own).
    if config is not None or server.get("type") == "vllm" or ground_truth_run:
        batch = (
            vllm_batch_defaults(hardware, memory_gib)
            if memory_gib is not None
            else vllm_batch_defaults_for(hardware)
        )
        defaults = dict(zip(BATCH_LIMITS, batch, strict=True))
        for path, value in defaults.items():
            if path not in settings:
                settings[path] = value
                sources[path] = f"vLLM's default on {hardware}"
    caching = recorded_prefix_caching(trace_header, trace_data)
    settings["engine.enable_prefix_caching"] = caching.enabled
    sources["engine.enable_prefix_caching"] = caching.source
    return RecordedServer(settings, sources, caching)


# A ground-truth run's <run>.meta.json `config` key -> scenario path.
META_CONFIG_FIELDS = {
    "tensor_parallelism": "tp",
    "max_num_seqs": "engine.max_num_running_reqs",
    "max_num_batched_tokens": "engine.max_num_scheduled_tokens",
    "block_size": "engine.block_size_tokens",
    "kv_blocks_total_gpu": "engine.total_kv_blocks",
    "max_model_len": "engine.max_model_len",
}
META_SUFFIX = ".meta.json"


def _request_run_settings(csv_path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """What a ground-truth run (`requests/<run>.requests.csv`) records of its server: its
    `<run>.meta.json` (model_id and config: TP, batch limits, block size, GPU KV blocks), the
    context limit from `runs/<run>/exp-config.yaml` when meta.json lacks it, and the vLLM
    version its dataset folder is named after. Nothing for any other CSV; an entry of the
    wrong type is left to the scenario's own validation, which names it."""
    if not csv_path.name.endswith(REQUESTS_SUFFIX):
        return {}, {}
    run = csv_path.name.removesuffix(REQUESTS_SUFFIX)
    meta_path = csv_path.with_name(run + META_SUFFIX)
    if not meta_path.is_file():
        return {}, {}
    meta = read_json(meta_path, "ground truth")
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if not isinstance(meta, dict):
        return settings, sources
    if isinstance(meta.get("model_id"), str) and meta["model_id"].strip():
        settings["model"], sources["model"] = meta["model_id"], meta_path.name
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    for key, path in META_CONFIG_FIELDS.items():
        if config.get(key) is not None:
            settings[path], sources[path] = config[key], meta_path.name
    exp = csv_path.parent.parent / "runs" / run / EXP_CONFIG
    if "engine.max_model_len" not in settings and exp.is_file():
        args = read_yaml(exp, "ground truth")
        if isinstance(args, dict) and args.get("max_model_len") is not None:
            settings["engine.max_model_len"], sources["engine.max_model_len"] = (
                args["max_model_len"],
                EXP_CONFIG,
            )
    version = version_in_name(csv_path.resolve().parent.parent.name)
    if version is not None:
        settings["latency.vllm_version"] = version
        sources["latency.vllm_version"] = "the dataset folder's name"
    return settings, sources


def recorded_settings(
    scenario: Scenario,
    given: dict[str, Any],
    trace_header: str | os.PathLike[str] | None,
    trace_data: str | os.PathLike[str],
) -> tuple[dict[str, Any], RecordedServer, str | None]:
    """The settings (dotted paths) a replay of the trace takes from the server that recorded
    it (`recorded_server`): each one neither `given` (overrides: flags, a
    policy bundle, keyword arguments) nor set explicitly in `scenario` chooses. A generated
    trace records no server; only its prefix-caching default (vLLM's, on) applies then.
    Third: the recorded model when it is not followed because servesim's catalog lacks it
    and nobody chose another (the scenario's model is simulated), else None."""
    from ..catalog.hardware import get_gpu, load_gpu_file
    from ..scenario import explicitly_set

    hardware = given.get("hardware") or scenario.hardware or "H100"
    hardware_file = given.get("hardware_file") or scenario.hardware_file
    gpu = get_gpu(hardware, load_gpu_file(hardware_file) if hardware_file else None)
    recorded = recorded_server(trace_header, trace_data, gpu.name, gpu.memory_gib)

    def chosen(path: str) -> bool:
        return path in given or explicitly_set(scenario, path)

    recorded_model = recorded.settings.get("model")
    # Not one servesim can simulate: the scenario's model stays.
    unfollowed = (
        recorded_model if not chosen("model") and not _known_model(recorded_model) else None
    )
    # The recorded KV cache belongs to the recorded model, TP and GPU: a deployment the user
    # chose (or the scenario's model standing in) gets its cache sized from its own memory,
    # as any run does (or --total-kv-blocks).
    own_cache = unfollowed is not None or any(chosen(p) for p in ("model", "tp", "hardware"))
    settings = {
        path: value
        for path, value in recorded.settings.items()
        if not chosen(path)
        and not (path == "model" and unfollowed is not None)
        and not (path == "engine.total_kv_blocks" and own_cache)
    }
    if scenario.deployments:
        aside = tuple(path for path in settings if path not in SHARED_BY_DEPLOYMENTS)
        settings = {path: settings[path] for path in settings if path not in aside}
        recorded = dataclasses.replace(recorded, set_aside=aside)
        # The deployments' models are the ones simulated, not the scenario's top-level one.
        unfollowed = None
    return settings, recorded, unfollowed


def _known_model(name: str | None) -> bool:
    """Whether servesim's catalog has the model a recording names (None: none named)."""
    from ..catalog.models import load_model

    if name is None:
        return True
    try:
        load_model(name)
    except ConfigError:
        return False
    return True
