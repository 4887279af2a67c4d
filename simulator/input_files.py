"""Reading the files users hand to servesim: every byte problem becomes a one-line error.

Every user-supplied file (scenario, workload spec, trace header and CSV, ground truth, GPU
tables, coefficient files, policy bundles, sweep files, length tables, HF configs, saved
results) is read here, so that a bad file is refused with one `ConfigError` line naming the
file, the place (line and column) and what is allowed, instead of a traceback:

- the path: no NUL byte; a regular file (a FIFO, a device, a directory or a file under /proc
  or /sys is refused, so that reading never blocks or runs forever);
- the bytes: UTF-8 (a leading byte-order mark is skipped), no NUL byte; YAML and JSON files
  of at most `MAX_DOCUMENT_BYTES`, CSV lines of at most `MAX_CSV_LINE_BYTES` (a CSV is
  streamed, its total size is not bounded);
- YAML: a key twice in one mapping is an error (PyYAML keeps the last silently); values
  YAML cannot build (`2024-13-45`, `!!int x`) and aliases that expand the document by more
  than `MAX_ALIAS_NODES` nodes (or into itself) are errors; syntax errors name line and
  column;
- JSON: a key twice in one object is an error, syntax errors name line and column.

Bundled package data (simulator/catalog/data) may be read directly.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import yaml

from .errors import ConfigError, excerpt, shorten

# The largest files servesim has to read whole are a few hundred KB (defaults.yaml, HF
# configs); 64 MiB is far above any real one and still quick to refuse or parse.
MAX_DOCUMENT_BYTES = 64 * 2**20
# A trace or ground-truth row is about 100 bytes; a 1 MiB line is not a row but a file
# without line ends (binary data, a wrong file) that would otherwise be held whole.
MAX_CSV_LINE_BYTES = 2**20
# Aliases let a small YAML file expand into billions of nodes ("billion laughs"); every
# consumer then walks the expansion. A real file never needs a million nodes from aliases.
MAX_ALIAS_NODES = 1_000_000

_SIZE_TEXT = {MAX_DOCUMENT_BYTES: "64 MiB", MAX_CSV_LINE_BYTES: "1 MiB"}
# Kernel file systems whose files claim size 0 and may never end or block on read.
_PSEUDO_ROOTS = ("/proc", "/sys")
# A CR alone ends a line too (text mode with newline="" splits the same way).
_LONE_CR = re.compile(rb"\r(?!\n)")
_BOM = "\ufeff"


def _size(limit: int) -> str:
    return _SIZE_TEXT.get(limit, f"{limit} bytes")


def shown(path: str | os.PathLike[str]) -> str:
    """A path as error messages quote it."""
    return repr(str(path))


# ------------------------------------------------------------------------------------ paths


def check_path(path: str | os.PathLike[str], what: str) -> Path:
    """`path` as a Path; a path the OS cannot take (a NUL byte, not text) is a ConfigError."""
    try:
        text = os.fspath(path)
    except TypeError:
        raise ConfigError(
            f"{what}: invalid path {excerpt(path)}; give a file path (a string)"
        ) from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\x00" in text:
        raise ConfigError(
            f"{what}: invalid path {excerpt(text, keep_end=True)}; a file path must not "
            "contain a NUL byte"
        )
    if not text:
        raise ConfigError(f"{what}: invalid path ''; give a file path")
    return Path(text)


def _kind(mode: int) -> str | None:
    """What a non-regular file is, for the error message; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _under_pseudo_fs(p: Path) -> bool:
    try:
        real = os.path.realpath(p)
    except (OSError, ValueError):
        return False
    return any(real == root or real.startswith(root + "/") for root in _PSEUDO_ROOTS)


@contextlib.contextmanager
def open_binary(path: str | os.PathLike[str], what: str) -> Iterator[IO[bytes]]:
    """A regular file opened for reading (binary); anything else is a one-line ConfigError.

    The file is opened without blocking and checked on the open descriptor, so a FIFO
    without a writer cannot hang the open, and the check and the read see the same file."""
    p = check_path(path, what)
    if _under_pseudo_fs(p):
        raise ConfigError(
            f"{what}: cannot read {shown(p)}: it is under "
            f"{' or '.join(_PSEUDO_ROOTS)}; give a regular file"
        )
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {shown(p)}: {exc.strerror}") from None
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise ConfigError(f"{what}: cannot read {shown(p)}: it is {kind}; give a regular file")
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        try:
            yield handle
        except OSError as exc:
            raise ConfigError(f"{what}: cannot read {shown(p)}: {exc.strerror}") from None


# ------------------------------------------------------------------------------------- text


def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of byte `offset`; CR, LF and CRLF end lines."""
    head = data[:offset]
    line_start = max(head.rfind(b"\n"), head.rfind(b"\r")) + 1
    line = head.count(b"\n") + len(_LONE_CR.findall(head)) + 1
    column = len(head[line_start:].decode("utf-8", "replace")) + 1
    return line, column


def _decode_failure(data: bytes, exc: UnicodeDecodeError) -> str:
    bad = data[exc.start : min(exc.end, exc.start + 4)]
    line, column = _line_col(data, exc.start)
    return (
        f"line {line}, column {column}: invalid UTF-8 byte(s) "
        f"{' '.join(f'0x{b:02x}' for b in bad)}; the file must be UTF-8 text"
    )


def _nul_failure(data: bytes) -> str:
    line, column = _line_col(data, data.index(b"\x00"))
    return f"line {line}, column {column}: NUL byte; a text file must not contain NUL bytes"


def decode_text(data: bytes, what: str, path: str | os.PathLike[str]) -> str:
    """UTF-8 `data` as text (a leading byte-order mark dropped); invalid bytes or a NUL byte
    are a ConfigError naming the line and column."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what}: {shown(path)} {_decode_failure(data, exc)}") from None
    if "\x00" in text:
        raise ConfigError(f"{what}: {shown(path)} {_nul_failure(data)}")
    return text.removeprefix(_BOM)


def read_bytes(path: str | os.PathLike[str], what: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The whole regular file at `path`, at most `limit` bytes (ConfigError beyond)."""
    with open_binary(path, what) as handle:
        # The size on disk refuses a huge file at once; the read cap still holds if it grows.
        too_big = os.fstat(handle.fileno()).st_size > limit
        data = b"" if too_big else handle.read(limit + 1)
    if too_big or len(data) > limit:
        raise ConfigError(
            f"{what}: {shown(path)} is larger than {_size(limit)}; servesim reads such "
            f"files of at most {_size(limit)} (is it the right file?)"
        )
    return data


def read_text(path: str | os.PathLike[str], what: str, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; one-line errors."""
    return decode_text(read_bytes(path, what, limit), what, path)


# -------------------------------------------------------------------------------------- CSV


def _byte_lines(handle: IO[bytes], limit: int) -> Iterator[bytes]:
    """Lines of a binary file ending in LF, CRLF or a lone CR (the last one may have no end),
    like text mode with newline=""; a line longer than `limit` bytes stops at `limit + 1`."""
    rest = b""
    readline = handle.readline
    while True:
        chunk = readline(limit + 1)
        if not chunk:
            if rest:
                yield rest
            return
        data = rest + chunk if rest else chunk
        rest = b""
        # Only a CR that does not end a CRLF splits a line further.
        crs = data.count(b"\r")
        if crs and not (crs == 1 and data.endswith(b"\r\n")):
            start = 0
            for match in _LONE_CR.finditer(data):
                if match.end() == len(data):
                    break  # a CR at the end may be the first half of a CRLF
                yield data[start : match.end()]
                start = match.end()
            data = data[start:]
        if data.endswith(b"\n"):
            yield data
        else:
            rest = data
            if len(rest) > limit:
                yield rest  # the caller refuses it as too long


def _line_failure(raw: bytes, limit: int) -> str:
    """Why a line of a text file is refused (the caller names the file and line)."""
    if len(raw) > limit:
        return (
            f": longer than {_size(limit)}; lines of this file must be at most {_size(limit)} "
            "(is it a text file with line ends?)"
        )
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        column = len(raw[: exc.start].decode("utf-8", "replace")) + 1
        bad = " ".join(f"0x{b:02x}" for b in raw[exc.start : min(exc.end, exc.start + 4)])
        return f", column {column}: invalid UTF-8 byte(s) {bad}; the file must be UTF-8 text"
    return f", column {line.index(chr(0)) + 1}: NUL byte; a text file must not contain NUL bytes"


def text_lines(
    path: str | os.PathLike[str], what: str, limit: int = MAX_CSV_LINE_BYTES
) -> Iterator[str]:
    """The lines of a UTF-8 text file, streamed, line ends kept (for `csv.reader`).

    Errors name the line: invalid UTF-8, a NUL byte, a line longer than `limit` bytes."""
    with open_binary(path, what) as handle:
        for number, raw in enumerate(_byte_lines(handle, limit), start=1):
            try:
                line = raw.decode("utf-8")
                ok = len(raw) <= limit and "\x00" not in line
            except UnicodeDecodeError:
                ok = False
            if not ok:
                raise ConfigError(f"{what}: {shown(path)} line {number}{_line_failure(raw, limit)}")
            yield line.removeprefix(_BOM) if number == 1 else line


def csv_records(path: str | os.PathLike[str], what: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every record of a CSV file, the header and empty lines
    included, streamed. The line is the record's last (a quoted field may span lines).

    Close it (contextlib.closing) when stopping early, so the file is closed at once."""
    lines = text_lines(path, what)
    reader = csv.reader(lines)
    with contextlib.closing(lines):
        try:
            for record in reader:
                yield reader.line_num, record
        except csv.Error as exc:
            raise ConfigError(
                f"{what}: {shown(path)} line {reader.line_num}: malformed CSV: "
                f"{shorten(str(exc), 120)}; fields are comma-separated, a quoted field "
                "must end with a quote"
            ) from None


def csv_header(path: str | os.PathLike[str], what: str) -> list[str]:
    """The first record of a CSV file; an empty file is a ConfigError."""
    with contextlib.closing(csv_records(path, what)) as records:
        first = next(records, None)
    if first is None:
        raise ConfigError(f"{what}: {shown(path)} is empty; expected a CSV header line")
    return first[1]


# ------------------------------------------------------------------------------------- YAML


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _text_position(text: str, index: int) -> tuple[int, int]:
    head = text[:index]
    line_start = max(head.rfind("\n"), head.rfind("\r")) + 1
    return head.count("\n") + len(re.findall(r"\r(?!\n)", head)) + 1, index - line_start + 1


def yaml_problem(exc: yaml.YAMLError, text: str | None = None) -> str:
    """PyYAML's error as one short line: the problem and where (its own text spans lines)."""
    if isinstance(exc, yaml.reader.ReaderError):
        where = ""
        if text is not None and 0 <= exc.position <= len(text):
            line, column = _text_position(text, exc.position)
            where = f" at line {line}, column {column}"
        char = exc.character
        shown_char = f"U+{char:04X}" if isinstance(char, int) else excerpt(char)
        return f"unacceptable character {shown_char}{where}; YAML allows printable text only"
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["invalid YAML"])[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{shorten(_one_line(str(problem)), 160)}{where}"


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


# What a value YAML failed to build must look like, by its tag (implicit or `!!tag`).
_ALLOWED = {
    "int": "an integer has at most 4,300 digits (0x, 0o and 0b prefixes allowed)",
    "float": "a number such as 1.5, 1e-3 or .inf",
    "timestamp": "a date is YYYY-MM-DD with a real month and day, optionally with a time",
    "binary": "base64 text",
    "bool": "true or false",
}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key twice in one mapping, turns values it cannot build into
    YAML errors with a position, and notes whether the document uses aliases."""

    saw_alias = False

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            self.saw_alias = True
        return super().compose_node(parent, index)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except (ValueError, TypeError, OverflowError, ArithmeticError):
            kind = str(node.tag).rsplit(":", 1)[-1]
            value = node.value if isinstance(node, yaml.ScalarNode) else ""
            allowed = _ALLOWED.get(kind, "")
            mark = node.start_mark
            # The place goes before what is allowed, so the problem carries it itself.
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"invalid {kind} value {excerpt(value)} at line {mark.line + 1}, column "
                f"{mark.column + 1}{'; ' + allowed if allowed else ''}",
            ) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges; explicit keys may override it
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable: SafeConstructor says so with its position
                if first is not None:
                    mark = key_node.start_mark
                    raise _DuplicateKey(
                        None,
                        None,
                        f"duplicate key {excerpt(key)} at line {mark.line + 1}, column "
                        f"{mark.column + 1} (first at line {first.start_mark.line + 1}); a key "
                        "may appear once in a mapping",
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_aliases(root: yaml.Node) -> None:
    """Refuse a document whose aliases refer into themselves or add more than
    MAX_ALIAS_NODES nodes to it when expanded."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        if leaving:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(child)] for child in _children(node))
            continue
        if key in size:
            continue
        if key in on_path:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "an alias refers to a node that contains it (recursive)",
                node.start_mark,
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)
    if size[id(root)] - len(size) > MAX_ALIAS_NODES:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"aliases expand the document by more than {MAX_ALIAS_NODES:,} nodes",
            root.start_mark,
        )


def load_yaml(text: str, what: str, path: str | os.PathLike[str] | None = None) -> Any:
    """The document in YAML `text` (strict: duplicate keys are errors); a one-line
    ConfigError naming `what` (and `path`) otherwise."""
    source = f"{what}: {shown(path)}" if path is not None else what
    loader = None
    try:
        # The reader checks the characters as it is built: inside the try.
        loader = _StrictLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        if loader.saw_alias:
            _check_aliases(node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {yaml_problem(exc, text)}") from None
    except RecursionError:
        raise ConfigError(
            f"{source} is not valid YAML: nested too deeply; keep nesting to a few dozen levels"
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml(path: str | os.PathLike[str], what: str) -> Any:
    """The document in the YAML file at `path`; one-line ConfigError otherwise."""
    return load_yaml(read_text(path, what), what, path)


def bundled_yaml(text: str) -> Any:
    """A YAML file servesim ships (no user input): parsed with libyaml's safe loader when the
    installed PyYAML has it, several times faster than the pure-Python one, which matters at
    start-up; the same documents either way."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader


def read_yaml_mapping(
    path: str | os.PathLike[str], what: str, empty_ok: bool = False
) -> dict[str, Any]:
    """The mapping in a YAML file; ConfigError naming `what` and the file otherwise."""
    data = read_yaml(path, what)
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{what}: {shown(path)} must be a YAML mapping (key: value), not {got}")
    return data


# ------------------------------------------------------------------------------------- JSON


class _DuplicateJsonKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateJsonKey(key)
        out[key] = value
    return out


def _json_key_lines(text: str, key: str) -> list[int]:
    """Lines where `"key":` appears (the duplicate's two places, among any others)."""
    pattern = re.compile(re.escape(json.dumps(key)) + r"\s*:")
    return [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]


def load_json(text: str, what: str, path: str | os.PathLike[str] | None = None) -> Any:
    """The document in JSON `text` (strict: duplicate keys are errors); one-line ConfigError."""
    source = f"{what}: {shown(path)}" if path is not None else what
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except _DuplicateJsonKey as exc:
        lines = sorted(set(_json_key_lines(text, exc.key)))
        where = f" (a key on lines {', '.join(map(str, lines[:6]))})" if lines else ""
        raise ConfigError(
            f"{source} is not valid JSON: duplicate key {excerpt(exc.key)} in one object"
            f"{where}; a key may appear once in an object"
        ) from None
    except RecursionError:
        raise ConfigError(
            f"{source} is not valid JSON: nested too deeply; keep nesting to a few dozen levels"
        ) from None
    except ValueError as exc:
        # Python refuses to convert integers of more than 4,300 digits.
        problem = "a number has more than 4,300 digits" if "digits" in str(exc) else str(exc)
        raise ConfigError(f"{source} is not valid JSON: {shorten(problem, 120)}") from None


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The document in the JSON file at `path`; one-line ConfigError otherwise."""
    return load_json(read_text(path, what), what, path)


# The scenario fields (dotted paths) naming a file a run reads, and what each file is.
SCENARIO_INPUT_FIELDS = {
    "workload_spec": "the workload spec",
    "trace.header": "the trace header",
    "trace.data": "the trace data",
    "latency.coeffs_file": "the coefficients file",
    "hardware_file": "the hardware file",
}


def scenario_input_files(
    scenario: dict[str, Any], scenario_path: str | os.PathLike[str] | None = None
) -> list[tuple[str, Any]]:
    """The files a run of `scenario` (a Scenario's dump) reads, as (what, path), None for one
    it does not have."""
    files: list[tuple[str, Any]] = [("the scenario file", scenario_path)]
    for dotted, what in SCENARIO_INPUT_FIELDS.items():
        value: Any = scenario
        for key in dotted.split("."):
            value = (value or {}).get(key)
        files.append((f"{what} ({dotted})", value))
    return files


def refuse_writing_inputs(
    outputs: list[tuple[str, str | os.PathLike[str] | None]],
    inputs: list[tuple[str, str | os.PathLike[str] | None]],
    writable_in_folders: tuple[str, ...] = (),
) -> None:
    """Refuse an output that names a file the run reads: writing it would destroy the input
    (and what is read after the write, such as a trace export's note, would read the output).
    `outputs` are (flag or name, path), `inputs` (what the file is, path); None is skipped.
    An input folder stands for every file already in it (a ground-truth or saved-result
    folder is read whole), except files with a suffix in `writable_in_folders` (a report's
    own earlier .html); a new file in it is fine."""

    def real_path(path: Any) -> str | None:
        # A path with a NUL byte names no file; the reader refuses it with its own message.
        return None if path is None or "\x00" in os.fspath(path) else os.path.realpath(path)

    files: dict[str, str] = {}
    folders: list[tuple[str, str]] = []
    for what, path in inputs:
        real = real_path(path)
        if real is None:
            continue
        if os.path.isdir(real):
            folders.append((real + os.sep, what))
        else:
            files[real] = what
    for flag, path in outputs:
        real = real_path(path)
        if real is None:
            continue
        read = files.get(real)
        if read is None and os.path.isfile(real) and not real.endswith(writable_in_folders):
            read = next((f"in {what}" for folder, what in folders if real.startswith(folder)), None)
        if read is not None:
            raise ConfigError(
                f"{flag}: {str(path)!r} is {read}, which this run reads; writing it would "
                "replace it, so give the output another path"
            )
