"""Shared pieces of the fuzz tests: budgets, a wall-clock guard, input mutators and the one
outcome every parser must have — it accepts the input, or raises a ServesimError whose
message is one line.

Textual damage works on bytes (`mutated_bytes`): invalid UTF-8, NUL bytes, BOMs, CR line
ends and very long lines are inputs like any other.

Budgets: the "ci" hypothesis profile (the default, tests/conftest.py) gives each fuzz test
`ci_examples`; `make fuzz` (HYPOTHESIS_PROFILE=fuzz) gives each FUZZ_EXAMPLES.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from simulator.errors import ServesimError

FUZZ_EXAMPLES = int(os.environ.get("SERVESIM_FUZZ_EXAMPLES", "2000"))
# One parse must not take longer than this: a parser that loops on odd input is a bug.
PARSE_LIMIT_S = 30


def fuzz_settings(ci_examples: int, long_cap: int | None = None) -> settings:
    """`ci_examples` in the suite; FUZZ_EXAMPLES (at most `long_cap`, for tests that run
    whole simulations) under `make fuzz`."""
    long_budget = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
    long_examples = min(FUZZ_EXAMPLES, long_cap) if long_cap else FUZZ_EXAMPLES
    return settings(
        max_examples=long_examples if long_budget else ci_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@contextlib.contextmanager
def finishes_within(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the block runs longer than `seconds`."""
    if sys.platform == "win32":
        yield
        return

    def too_slow(_signum, _frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def accepted_or_one_line_error(parse: Callable[..., Any], *args: Any) -> Any:
    """Call `parse`; bad input may only surface as a one-line ServesimError. Returns the
    parse result, or None when the input was rejected. Any other exception fails the test."""
    with finishes_within(PARSE_LIMIT_S):
        try:
            return parse(*args)
        except ServesimError as exc:
            assert_one_line_error(exc, parse.__name__)
            return None


# A message quotes excerpts of values, never a whole file; the longest legitimate ones list
# the valid choices of a catalog (about 700 characters).
MAX_MESSAGE_CHARS = 2000


def assert_one_line_error(exc: ServesimError, source: str = "") -> None:
    """The message is one short line as the parser wrote it: ServesimError's own folding of
    line breaks is a safety net, not an excuse, so the raw text is checked."""
    raw = str(exc.args[0]) if exc.args else ""
    assert raw.strip(), f"empty error message from {source}"
    assert raw.splitlines() == [raw], f"multi-line error from {source}: {raw[:500]!r}"
    assert len(raw) <= MAX_MESSAGE_CHARS, f"{len(raw)}-character error from {source}: {raw[:300]!r}"
    assert "\n" not in str(exc)


# --- values and mutations -------------------------------------------------------------------

WEIRD_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**15), 10**15),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "nan", "inf", "-1", "1e400", "0x10", "true", "~", "H100", "fcfs"]),
)
WEIRD_VALUES = st.one_of(
    WEIRD_SCALARS,
    st.lists(WEIRD_SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=6), WEIRD_SCALARS, max_size=2),
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a node of a nested dict/list document (the root excluded)."""
    out: list[tuple] = []
    if isinstance(doc, dict):
        items = list(doc.items())
    elif isinstance(doc, list):
        items = list(enumerate(doc))
    else:
        return out
    for key, value in items:
        out.append((*prefix, key))
        out.extend(_paths(value, (*prefix, key)))
    return out


@st.composite
def perturbed(draw, doc: Any, max_edits: int = 3) -> Any:
    """`doc` with 1..max_edits structural edits: a node replaced by an odd value (type
    confusion, out-of-range numbers, NaN), a key deleted, or an unknown key added."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, max_edits))):
        paths = _paths(doc)
        if not paths:
            return draw(WEIRD_VALUES)
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        edit = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
        if edit == "replace":
            parent[path[-1]] = draw(WEIRD_VALUES)
        elif edit == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(WEIRD_VALUES)
        else:
            parent.append(draw(WEIRD_VALUES))
    return doc


# Byte sequences a damaged or foreign file holds: invalid UTF-8 (a stray continuation byte,
# a cut multi-byte character, an overlong encoding, bytes UTF-8 never uses), the UTF-8
# encoding of a lone surrogate, NUL and other control bytes, byte-order marks (UTF-8 and
# UTF-16), and valid but unusual characters (a non-breaking space, U+2028, an emoji).
ODD_BYTES = [
    b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xff", b"\xfe",
    b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\x00", b"\x00\x00\x00", b"\x01", b"\x1b[31m", b"\x7f",
    b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\xc2\xa0", b"\xe2\x80\xa8", b"\xf0\x9f\x98\x80",
    b"\r", b"\r\n", b"\x0b", b"\x0c", b"\x85",
]  # fmt: skip
# Long lines: past csv's field limit (128 KiB) and past servesim's CSV line cap (1 MiB).
LONG_LINE_BYTES = [300, 2**17 + 1, 2**20 + 1]


@st.composite
def mutated_bytes(draw, text: str | bytes, max_edits: int = 4) -> bytes:
    """`text` as bytes with byte-level damage: lines dropped, duplicated or cut short (also in
    the middle of a multi-byte character), characters inserted or deleted, numbers replaced,
    odd bytes inserted (`ODD_BYTES`: invalid UTF-8, NUL, BOMs, ...), every line end turned
    into a lone CR, a very long line, the file truncated."""
    data = text.encode() if isinstance(text, str) else text
    lines = data.splitlines(keepends=True) or [b""]
    for _ in range(draw(st.integers(1, max_edits))):
        if not lines:
            lines = [b""]
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        edit = draw(
            st.sampled_from(
                ["drop", "dup", "cut", "insert", "delete", "number", "truncate"] * 2
                + ["bytes", "bytes", "bom", "cr", "long"]
            )
        )
        if edit == "drop":
            del lines[i]
        elif edit == "dup":
            lines.insert(i, line)
        elif edit == "cut":
            lines[i] = line[: draw(st.integers(0, len(line)))]
        elif edit == "insert":
            at = draw(st.integers(0, len(line)))
            junk = draw(st.text(alphabet=st.sampled_from(list(":,-{}[]\"'#&*!|>%@ \t\n0aZ.")),
                                min_size=1, max_size=4))  # fmt: skip
            lines[i] = line[:at] + junk.encode() + line[at:]
        elif edit == "delete" and line:
            at = draw(st.integers(0, len(line) - 1))
            lines[i] = line[:at] + line[at + 1 :]
        elif edit == "number":
            digits = [j for j, c in enumerate(line) if chr(c).isdigit()]
            if digits:
                at = draw(st.sampled_from(digits))
                value = draw(
                    st.sampled_from([b"-1", b"0", b"1e309", b"nan", b"9" * 20, b"9" * 5000])
                )
                lines[i] = line[:at] + value + line[at + 1 :]
        elif edit == "bytes":
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + draw(st.sampled_from(ODD_BYTES)) + line[at:]
        elif edit == "bom":
            lines[0] = draw(st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"])) + lines[0]
        elif edit == "cr":
            lines = [ln.rstrip(b"\r\n") + b"\r" if ln.endswith(b"\n") else ln for ln in lines]
        elif edit == "long":
            size = draw(st.sampled_from(LONG_LINE_BYTES))
            filler = draw(st.sampled_from([b"x", b"1", b"a,", b'"', b" "]))
            lines.insert(i, (filler * size)[:size] + b"\n")
        elif edit == "truncate":
            lines = lines[: i + 1]
    return b"".join(lines)
