"""One writer for every output: a reader never sees half a file, and a special file is never
replaced by a regular one.

Every file servesim writes (results, traces, decision logs, sweep tables, saved results) goes
to a temporary name in the same folder and is renamed over the target with `os.replace`, which
is atomic on POSIX and Windows within one file system. An exception or an interrupt
(KeyboardInterrupt) while writing removes the temporary file and leaves any previous target
untouched. Temporary names start with "." and end in ".tmp", so a crash that kills the process
outright (SIGKILL, power loss) leaves at most a hidden `.NAME.*.tmp` beside the target.

What may be written (`check_output`). The rename would swap whatever is at the target for a
regular file, so the target must be a new file or an existing regular file:

- a directory, a character or block device, a FIFO or a socket is refused (run as root, a
  rename once replaced the machine's /dev/full with a JSON file);
- a path on a pseudo file system (proc, sysfs, devtmpfs, cgroup, debugfs, ...) is refused:
  /proc files stat as regular files, so the file type cannot tell. The file system comes from
  /proc/self/mountinfo (the deepest mount holding the resolved path, and any proc or sysfs
  mount above it, since cgroup v1 mounts a tmpfs under /sys). Without mountinfo (not Linux),
  paths under /proc, /sys and /dev are refused;
- a symbolic link to an existing regular file is followed: the file it points to is replaced
  atomically in its own folder and the link is kept, so a link keeps working after every
  run. A dangling link is refused rather than followed (it would create a file wherever the
  link happens to point), as is a link to anything but a regular file, or a loop;
- a new file's folder is created if needed; the nearest existing folder must be a writable
  folder (on a read-only file system it is not).

Every writer here runs the check when it writes, so Python callers (Result.save's plots,
sweeps, traces) are protected; the CLI also runs it for every output flag before it simulates,
so a bad target costs no run. A refused target or an OSError while writing or renaming
(ENOSPC, EIO, EACCES, EROFS, a folder that cannot be created) raises `OutputError`, one line:
"cannot write 'PATH': No space left on device"; the temporary file is removed.

Standard output is an output too: `guard_stdout()` (the CLI's entry point installs it) turns a
failed write to stdout (a full disk, /dev/full) into one `OutputError`, and a reader that went
away (EPIPE, `servesim run | head -1`) into silence: the rest of the output is dropped, the
command finishes its files, and the caller exits with 141 (128 + SIGPIPE, the status a shell
shows for a program stopped by a closed pipe).
"""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError, OutputError, ServesimError

# Kernel interfaces mounted as file systems: writing a "file" there talks to the kernel.
PSEUDO_FILE_SYSTEMS = frozenset(
    {
        "autofs",
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "nsfs",
        "proc",
        "pstore",
        "rpc_pipefs",
        "securityfs",
        "selinuxfs",
        "sysfs",
        "tracefs",
    }
)
# A mount below one of these is kernel territory too, whatever its own type.
_KERNEL_TREES = frozenset({"proc", "sysfs"})
_FALLBACK_KERNEL_PATHS = ("/proc", "/sys", "/dev")
MOUNTINFO = "/proc/self/mountinfo"

_EXPECTED = "expected a new file, an existing regular file or a symbolic link to one"
_EXPECTED_FOLDER = "expected a new or existing folder"


def require_output_path(name: str, value: object) -> None:
    """A public writer's output argument `name` is a path (errors.require_path) and not the
    empty string, which Path() reads as the current folder: `save_result(r, "")` replaced the
    working folder itself, `write_plots(r, "")` wrote into it. The CLI refuses an empty
    --out or --report the same way."""
    from .errors import require_path

    require_path(name, value)
    if os.fspath(value) == "":  # type: ignore[arg-type]
        raise ConfigError(
            f"{name}: invalid path ''; give a path (an empty path names no file or folder, "
            "and would mean the current folder)"
        )


def _refuse_empty(target: str | os.PathLike[str], flag: str | None) -> None:
    # Path("") is Path("."): an empty value would silently mean the current folder.
    if isinstance(target, str | os.PathLike) and os.fspath(target) == "":
        where = f"{flag}: invalid value ''" if flag is not None else "cannot write ''"
        raise ConfigError(
            f"{where}; give a path (an empty value names no file or folder, and would mean "
            "the current folder)"
        )


def check_output(target: str | os.PathLike[str], flag: str | None = None) -> Path:
    """The regular file that writing `target` replaces or creates: `target` itself, or the
    file a symbolic link points to. Raise OutputError (ConfigError for a NUL byte) naming
    `flag` when given ("--results-path: invalid value '/dev/full'; it is a character
    device; ...") and the path otherwise ("cannot write '/dev/full': it is ...")."""
    _refuse_empty(target, flag)
    path = Path(target)
    _refuse_nul(path, flag)
    info = _lstat(path, flag)
    real = path
    if info is not None and stat.S_ISLNK(info.st_mode):
        real = _follow_link(path, flag)
    elif info is not None and not stat.S_ISREG(info.st_mode):
        raise _refused(path, flag, f"it is {_kind(info.st_mode)}; {_EXPECTED}")
    _check_file_system(path, real, flag)
    _check_folder(path, real.parent, flag)
    return real


def check_output_folder(target: str | os.PathLike[str], flag: str | None = None) -> Path:
    """The folder that outputs named under `target` go into (a symbolic link to a folder is
    followed); raise OutputError unless it is a folder, or can be created, on an ordinary
    file system."""
    _refuse_empty(target, flag)
    path = Path(target)
    _refuse_nul(path, flag)
    info = _lstat(path, flag)
    real = path
    if info is not None:
        try:
            info = os.stat(path)
        except OSError as exc:
            link = f"it is a symbolic link to {_readlink(path)!r}"
            reason = "which does not exist" if _missing(exc) else _strerror(exc)
            raise _refused(path, flag, f"{link}, {reason}; {_EXPECTED_FOLDER}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise _refused(path, flag, f"it is {_kind(info.st_mode)}; {_EXPECTED_FOLDER}")
        real = Path(os.path.realpath(path))
        _check_file_system(path, real, flag)
        if not os.access(real, os.W_OK):
            raise _refused(path, flag, "the folder is not writable")
    else:
        _check_file_system(path, real, flag)
        _check_folder(path, path.parent, flag)
    return real


def temporary_sibling(target: Path, named: str | os.PathLike[str] | None = None) -> Path:
    """A fresh, empty temporary file beside `target` (same folder, so the rename is atomic).
    A failure (a folder that cannot be created, a full disk) is an OutputError naming
    `named` (the path the user gave, when `target` is the file a link points to)."""
    tmp = _temporary_name(target)
    _create(tmp, named if named is not None else target)
    return tmp


def _temporary_name(target: Path) -> Path:
    # Named before it exists, so that an interrupt arriving just after the file is created
    # (before any variable holds a name mkstemp would have returned) can still remove it.
    return target.parent / f".{target.name}.{os.getpid()}.{os.urandom(8).hex()}.tmp"


def _create(tmp: Path, named: str | os.PathLike[str]) -> None:
    """Create `tmp` empty (and its folders). Mode 0o666 less the umask: the usual
    permissions of a new file, not mkstemp's private 0o600."""
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        os.close(os.open(tmp, flags, 0o666))
    except OSError as exc:
        raise write_failed(named, exc) from exc


def write_failed(target: str | os.PathLike[str], exc: OSError) -> OutputError:
    """The one-line error for an OSError met while writing `target`."""
    return OutputError(f"cannot write {str(target)!r}: {_strerror(exc)}")


@contextlib.contextmanager
def replacing(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write; on a clean exit it replaces `target` (for a symbolic
    link, the file it points to), otherwise it is deleted. For writers that want a path
    (Parquet, pandas). An OSError inside the block becomes OutputError naming `target`."""
    real = check_output(target)
    tmp = _temporary_name(real)
    try:
        _create(tmp, target)
        yield tmp
        os.replace(tmp, real)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, ServesimError):
            raise write_failed(target, exc) from exc
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


# ------------------------------------------------------------------------- the checks


def _refused(path: Path, flag: str | None, reason: str) -> OutputError:
    if flag is not None:
        return OutputError(f"{flag}: invalid value {str(path)!r}; {reason}")
    return OutputError(f"cannot write {str(path)!r}: {reason}")


def _refuse_nul(path: Path, flag: str | None) -> None:
    # The OS would reject it with ValueError from deep inside open(); say so up front.
    if "\x00" in str(path):
        where = f"{flag}: invalid value" if flag is not None else "cannot write"
        raise ConfigError(f"{where} {str(path)!r}; a path cannot contain a NUL byte")


def _lstat(path: Path, flag: str | None) -> os.stat_result | None:
    """`path`'s own status (a link is not followed), or None when nothing is there yet."""
    try:
        return os.lstat(path)
    except OSError as exc:
        if _missing(exc):
            return None  # a missing folder on the way is created; one that is a file is not
        raise _refused(path, flag, _strerror(exc)) from None


def _follow_link(path: Path, flag: str | None) -> Path:
    link = f"it is a symbolic link to {_readlink(path)!r}"
    try:
        info = os.stat(path)
    except OSError as exc:
        if _missing(exc):
            raise _refused(path, flag, f"{link}, which does not exist; {_EXPECTED}") from None
        raise _refused(path, flag, f"{link}: {_strerror(exc)}; {_EXPECTED}") from None
    if not stat.S_ISREG(info.st_mode):
        raise _refused(path, flag, f"{link}, {_kind(info.st_mode)}; {_EXPECTED}")
    return Path(os.path.realpath(path))


def _check_folder(path: Path, folder: Path, flag: str | None) -> None:
    """The nearest existing folder on the way to `folder` must be a writable folder (the
    missing ones are created when writing)."""
    for candidate in (folder, *folder.parents):
        try:
            info = os.stat(candidate)
        except OSError as exc:
            if _missing(exc):
                continue
            raise _refused(path, flag, f"folder {str(candidate)!r}: {_strerror(exc)}") from None
        if not stat.S_ISDIR(info.st_mode):
            reason = (
                f"{str(candidate)!r} is {_kind(info.st_mode)}, not a folder; expected a path "
                "in a folder (missing folders are created)"
            )
            raise _refused(path, flag, reason)
        if not os.access(candidate, os.W_OK):
            missing = "" if candidate == folder else f" (to create {str(folder)!r} in)"
            raise _refused(path, flag, f"folder {str(candidate)!r} is not writable{missing}")
        return


def _check_file_system(path: Path, real: Path, flag: str | None) -> None:
    where = os.path.realpath(real)
    found = pseudo_file_system(where)
    if found is not None:
        fs_type, mount_point = found
        reason = (
            f"it is on a {fs_type} file system ({mount_point}), which holds kernel "
            "interfaces, not files; expected a path on an ordinary file system"
        )
        raise _refused(path, flag, reason)


def pseudo_file_system(resolved: str) -> tuple[str, str] | None:
    """(type, mount point) of the pseudo file system holding the absolute, resolved path
    `resolved`, or None when it is on an ordinary one."""
    mounts = _mounts()
    if mounts is None:
        if os.name != "posix":
            return None
        for top in _FALLBACK_KERNEL_PATHS:
            if _inside(resolved, top):
                return top.strip("/"), top
        return None
    holding = [(point, fs) for point, fs in mounts if _inside(resolved, point)]
    if not holding:
        return None
    # Mount order: a later mount on the same point hides the earlier one.
    deepest = max(range(len(holding)), key=lambda i: (len(holding[i][0]), i))
    point, fs_type = holding[deepest]
    if fs_type in PSEUDO_FILE_SYSTEMS:
        return fs_type, point
    for above, above_type in holding:
        if above_type in _KERNEL_TREES and len(above) < len(point):
            return above_type, above
    return None


def _mounts() -> list[tuple[str, str]] | None:
    """(mount point, file system type) per line of /proc/self/mountinfo, in mount order."""
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as handle:
            text = handle.read()
    except OSError:
        return None
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        # id parent major:minor root MOUNT_POINT options [optional...] - TYPE source super
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if len(fields) > separator + 1 and len(fields) > 4:
            mounts.append((_unescape(fields[4]), fields[separator + 1]))
    return mounts


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in octal (\040).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _inside(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISREG, "a regular file"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _missing(exc: OSError) -> bool:
    return isinstance(exc, FileNotFoundError | NotADirectoryError)


def _strerror(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


# ---------------------------------------------------------------------- standard output


class _StdoutFile(io.FileIO):
    """File descriptor 1, whose write failures are told apart: a reader that went away
    (EPIPE) is not an error, anything else is reported once. Either way the descriptor is
    then pointed at the null device, so that the rest of the output, and the flush at
    interpreter exit, neither fail again nor print "Exception ignored ... BrokenPipeError"."""

    reader_gone = False

    def write(self, data: Any) -> int:
        try:
            return super().write(data)
        except BrokenPipeError:
            self.reader_gone = True
            self._to_null()
            return memoryview(data).nbytes
        except OSError as exc:
            self._to_null()
            raise OutputError(f"cannot write to standard output: {_strerror(exc)}") from exc

    def _to_null(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, self.fileno())
        finally:
            os.close(null)


class StdoutGuard:
    """What `guard_stdout` installed; `reader_gone` once a write met a closed pipe."""

    def __init__(self, raw: _StdoutFile | None) -> None:
        self._raw = raw

    @property
    def reader_gone(self) -> bool:
        return self._raw is not None and self._raw.reader_gone


class _ClosedStdout(io.RawIOBase):
    """Standard output of a process started with it closed (`>&-`, where Python sets
    `sys.stdout` to None): the first write is the same error as any other failure to write
    there; what follows is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self._told = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if not self._told:
            self._told = True
            raise OutputError("cannot write to standard output: it is closed")
        return memoryview(data).nbytes


def guard_stdout() -> StdoutGuard:
    """Replace `sys.stdout` by a text stream on the same descriptor whose failures are told
    apart (see `_StdoutFile`). For a program's entry point: the stream stays for the process.
    A stdout without a file descriptor (a test's capture) is left alone; a closed one (None)
    becomes `_ClosedStdout`."""
    if sys.stdout is None:
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(_ClosedStdout()), encoding="utf-8")
        return StdoutGuard(None)
    current = sys.stdout
    try:
        fd = current.fileno()
        current.flush()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return StdoutGuard(None)
    raw = _StdoutFile(fd, "w", closefd=False)
    # A locale whose encoding lacks "µ" or "…" (LC_ALL=C without Python's UTF-8 mode) gets
    # them escaped, as stderr does, rather than an encoding error halfway through the output.
    utf = codecs.lookup(current.encoding).name.startswith("utf")
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=current.encoding,
        errors=current.errors if utf else "backslashreplace",
        line_buffering=current.line_buffering,
    )
    return StdoutGuard(raw)
