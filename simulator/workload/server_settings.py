"""What the recorded server did, for the replay of a recorded run: prefix caching on or off.

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
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, excerpt
from ..input_files import read_json, read_yaml

SERVER_CONFIG = "server_config.json"
EXP_CONFIG = "exp-config.yaml"
CONFIG_NAMES = (SERVER_CONFIG, EXP_CONFIG)
REQUESTS_SUFFIX = ".requests.csv"
# vLLM V1 (0.8 onwards, the default engine of both datasets) caches prefixes unless told not to.
VLLM_DEFAULT = True
_ON_KEYS = ("enable_prefix_caching", "enable-prefix-caching")
_OFF_KEYS = ("no_enable_prefix_caching", "no-enable-prefix-caching")


@dataclass(frozen=True)
class PrefixCaching:
    """Whether the recorded server cached prefixes, and where that was read."""

    enabled: bool
    source: str

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
        return PrefixCaching(VLLM_DEFAULT, f"vLLM's default; {unique} records no setting")
    return PrefixCaching(VLLM_DEFAULT, "vLLM's default; no server configuration found")


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
