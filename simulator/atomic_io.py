"""Writing output files so that a reader never sees half of one.

Every file servesim writes (results, traces, decision logs, sweep tables, saved results) goes
to a temporary name in the same folder and is renamed over the target with `os.replace`, which
is atomic on POSIX and Windows within one file system. An exception or an interrupt
(KeyboardInterrupt) while writing removes the temporary file and leaves any previous target
untouched. Temporary names start with "." and end in ".tmp", so a crash that kills the process
outright (SIGKILL, power loss) leaves at most a hidden `.NAME.*.tmp` beside the target.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


def temporary_sibling(target: Path) -> Path:
    """A fresh, empty temporary file beside `target` (same folder, so the rename is atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file private (0600); a result file gets the usual permissions.
        if hasattr(os, "fchmod"):  # POSIX; Windows files have no mode bits to fix
            os.fchmod(fd, 0o666 & ~_umask())
    finally:
        os.close(fd)
    return Path(tmp)


def _umask() -> int:
    current = os.umask(0)  # the only way to read it is to set it
    os.umask(current)
    return current


@contextlib.contextmanager
def replacing(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write; on a clean exit it replaces `target`, otherwise it is
    deleted. For writers that want a path (Parquet, pandas)."""
    target = Path(target)
    tmp = temporary_sibling(target)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_open(target: str | Path, newline: str | None = None) -> Iterator[IO[str]]:
    """A text handle on a temporary file that becomes `target` when the block ends cleanly.
    The data is fsynced before the rename, so a crash right after never shows an empty file."""
    with replacing(target) as tmp, open(tmp, "w", newline=newline, encoding="utf-8") as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


def write_text_atomically(target: str | Path, text: str) -> Path:
    with atomic_open(target) as handle:
        handle.write(text)
    return Path(target)


def write_json_atomically(target: str | Path, document: Any, **dump_options: Any) -> Path:
    """`document` as JSON (indent 2 unless `dump_options` say otherwise), newline-terminated."""
    dump_options.setdefault("indent", 2)
    with atomic_open(target) as handle:
        json.dump(document, handle, **dump_options)
        handle.write("\n")
    return Path(target)


def write_with(target: str | Path, writer: Callable[[Path], None]) -> Path:
    """Call `writer(tmp_path)` and rename the file it wrote onto `target`."""
    with replacing(target) as tmp:
        writer(tmp)
    return Path(target)
