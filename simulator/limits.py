"""The largest values servesim can represent, and the checks that enforce them at parse time.

Every count, size, time, rate and bandwidth a user can give is bounded here, so that a value
the simulator cannot represent is refused with a one-line error naming the field, before any
simulation starts (docs/robustness.md, "Bounds"). The bounds follow from the representation,
not from what is plausible:

- **Time.** The clock is an integer number of microseconds, and times also pass through
  float64 arithmetic (percentiles, the step log's time columns), which is exact for integers
  up to 2^53. So every time is at most 2^53 µs (about 285 years), and every duration given in
  seconds or milliseconds is at most the whole seconds (milliseconds) below that, so that its
  conversion to µs stays on the clock.
- **Tokens.** Tokens are counters, but a request's KV blocks and prefix hashes are lists with
  one entry per block, so a prompt's size is memory. 10^8 tokens per request (100 times the
  longest context windows served today) keeps one request's lists under a few GB at block
  size 1. Token budgets, thresholds and context limits share the bound: none needs to exceed
  the largest request.
- **KV blocks.** Blocks are materialised when first used, so the bound is the same as a
  request's: 10^8 blocks per instance (GPU and CPU tier alike); a block holds at most 2^20
  tokens.
- **Instances.** An idle instance costs about 13 KB (its engine, queues, step log and SimPy
  processes; measured with 4,000 instances), so 100,000 instances take about 1.3 GB before the
  first request. The bound applies to the whole fleet, counting every slot an autoscaler or an
  `add_instance` event may fill. Nodes share it (a fleet never needs more nodes than
  instances), and a node keeps one slot per GPU, so at most 1,024 GPUs per node (100,000
  nodes then hold 10^8 slots, about 0.8 GB); tensor parallelism shares that bound, since a
  TP group fits on one node.
- **Requests.** A finished request is kept as a compact row (about 0.3–1 KB with its share of
  the step log: 1,000,000 requests peak near 1 GB), so 10^8 requests is the most one run can
  hold; split larger studies into several runs. Batch sizes, session rounds, warm-up counts
  and autoscaler thresholds (queue depths, requests in flight) are counts of requests too.
- **Rates and bandwidths.** A rate's mean gap must fit the clock: a rate is at least 10^-9 per
  second (a mean gap of 10^15 µs, about 32 years) and at most 10^9 per second (many requests
  then share a microsecond; rate fractions, being weights of such rates, share that ceiling).
  Bandwidths lie in [10^-6, 10^6] GB/s (1 KB/s to 1 PB/s). A duration computed at run time
  from them is checked against the clock as well (`duration_us`, `check_time_us`).

The annotated types at the end carry these bounds into the pydantic schemas (the scenario,
the fleet and the v2 workload spec), so each bound is stated once. They also refuse a string
or a boolean where a number is expected, and anything but true/false for a flag (pydantic's
lax mode would read "10" as 10 and "yes" as true); an integer is fine where a float is
expected, and a float with no fractional part where an integer is.
"""

from __future__ import annotations

import inspect
import math
import operator
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

from .errors import ConfigError

MAX_TIME_US = 2**53
# Whole seconds / milliseconds, so that s·10^6 and ms·10^3 are exact and stay <= MAX_TIME_US.
MAX_TIME_S = MAX_TIME_US // 10**6
MAX_TIME_MS = MAX_TIME_US // 10**3
MAX_TOKENS = 10**8
MAX_KV_BLOCKS = 10**8
MAX_BLOCK_SIZE_TOKENS = 2**20
MAX_INSTANCES = 100_000
MAX_NODES = MAX_INSTANCES
MAX_GPUS_PER_NODE = 1024
MAX_REQUESTS = 10**8
MIN_RATE_PER_S = 1e-9
MAX_RATE_PER_S = 1e9
MIN_BANDWIDTH_GB_PER_S = 1e-6
MAX_BANDWIDTH_GB_PER_S = 1e6
# Seeds feed numpy's SeedSequence, which takes any non-negative integer; 2^63 - 1 keeps them
# within a signed 64-bit field of every file format servesim writes.
MAX_SEED = 2**63 - 1
# Bytes per token of KV (a model's whole KV for one token across layers): 10^9 is far above
# any model's (Llama-3.1-405B in FP32 is under 10^7).
MAX_BYTES_PER_TOKEN = 10**9
# A token bucket is a float64 counter, exact for whole tokens up to 2^53; a refill rate that
# fills the largest bucket within one µs is indistinguishable from an unlimited one.
MAX_TOKEN_BUCKET_TOKENS = 2**53
MAX_TOKEN_RATE_PER_S = MAX_TOKEN_BUCKET_TOKENS * 1e6
# A gap's coefficient of variation: every process treats a cv above 10.4 alike (gamma falls
# back to Poisson above 10, weibull refuses it), so 1,000 loses nothing; below 10^-6 the spread
# of a gap under a second is below the clock's 1 µs tick, and gamma's shape 1/cv² stays finite.
MIN_CV = 1e-6
MAX_CV = 1e3
# Diurnal peak-to-trough ratio: beyond 3.6·10^9 (µs in an hour) the trough hour's window is
# already at its 1 µs floor, so a larger ratio changes nothing.
MAX_PEAK_TO_TROUGH = 3.6e9
# Autoscaler period: the clock ticks in whole µs; a shorter interval rounds to 0 and the
# autoscaler would tick forever without time moving.
MIN_INTERVAL_S = 1e-6
# Warm-up TTFT factor: a cold request a million times slower than a warm one; any step that
# takes under 285 years / 10^6 (about 100 days) keeps the slowed step on the clock.
MAX_WARM_UP_FACTOR = 1e6
# A sweep's runs (grid points x seeds): each is a whole simulation, so 100,000 is weeks of a
# laptop's time already; above it the grid is a mistake, and listing its points alone would
# exhaust memory.
MAX_SWEEP_RUNS = 100_000
# GPU memory: its byte count (GiB · 2^30) stays an exact integer in float64 (<= 2^53 bytes).
MAX_GPU_MEMORY_GIB = 2**23
# Node price per hour: a million dollars, thousands of times any GPU node's, keeps a fleet's
# cost over the whole clock range finite and printable.
MAX_COST_PER_HOUR = 1e6
# Latency-model coefficients are µs, or µs per token / request: one of them alone may take the
# whole clock range, no more.
MAX_COEFFICIENT = float(MAX_TIME_US)
# inference-perf shared-prefix clients (prompts × users), as `expand_inference_perf` caps them.
MAX_INFERENCE_PERF_CLIENTS = 1_000_000

CLOCK_RANGE = f"at most {MAX_TIME_US:,} µs, about 285 years"


def duration_us(value: float, what: str) -> int:
    """A duration computed at run time (µs, rounded up), refused when the clock cannot hold
    it: `what` names the quantity and the inputs that produced it."""
    if not math.isfinite(value) or value > MAX_TIME_US:
        raise ConfigError(
            f"{what}: takes {value:.4g} µs, beyond the simulator's clock range ({CLOCK_RANGE})"
        )
    return math.ceil(value)


def check_time_us(value: int, what: str) -> int:
    """A point in time (µs) that a run reaches: refused beyond the clock's range."""
    if value > MAX_TIME_US:
        raise ConfigError(
            f"{what}: {value} µs is beyond the simulator's clock range ({CLOCK_RANGE})"
        )
    return value


# --------------------------------------------------------------------------- schema types

_WHY_TIME = "the clock counts whole µs and times pass through float64, exact up to 2^53 µs"
_WHY = {
    "instances": "an instance takes about 13 KB of memory before its first request, so "
    "100,000 take about 1.3 GB",
    "nodes": "a fleet never needs more nodes than instances (at most 100,000)",
    "gpus": "a node keeps one slot per GPU (100,000 nodes of 1,024 GPUs hold about 0.8 GB of "
    "slots), and a TP group fits on one node",
    "requests": "a run keeps every finished request (about 0.3-1 KB each); split larger "
    "studies into several runs",
    "tokens": "a request keeps one KV block and one prefix hash per block, so 10^8 tokens (100 "
    "times today's longest contexts) already take GBs",
    "blocks": "KV blocks are materialised when used, bounded like a request's lists",
    "block size": "a block's token count is bounded like a request's lists",
    "time": _WHY_TIME,
    "rate": "the mean gap (10^6 / rate µs) must fit the clock (2^53 µs), and above 10^9/s many "
    "requests already share a microsecond",
    "rate fraction": "a fraction weighs a rate, which is at most 10^9 per second",
    "bandwidth": "every transfer time (bytes / bandwidth) must be computable on the µs clock",
    "seed": "seeds are written as signed 64-bit integers",
    "bytes per token": "10^9 bytes is 100 times any model's KV per token",
}


def _show(bound: float) -> str:
    if isinstance(bound, int) or (bound.is_integer() and abs(bound) < 1e16):
        return f"{int(bound):,}"
    return f"{bound:g}"


# What YAML 1.1 leaves as text though it looks like a number: an exponent without a dot
# before it or without a sign (1e3, 1e-3, 1.0e3; YAML 1.1 reads only 1.0e+3 as a float).
_YAML_TEXT_NUMBER = re.compile(r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$")


def _what(value: Any) -> str:
    """A value's kind as an error message says it ("a string", "a boolean", ...)."""
    if isinstance(value, bool) or _is_numpy_bool(value):
        return "a boolean"
    if isinstance(value, str):
        if _YAML_TEXT_NUMBER.match(value.strip()):
            shown = value.strip()
            return (
                f"a string (YAML reads {shown} as text: write the number without an exponent, "
                "or with a dot and a signed one, as in 1.0e+3)"
            )
        return "a string"
    if isinstance(value, bytes):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, float):
        return f"the fraction {value!r}" if math.isfinite(value) else f"the number {value!r}"
    if isinstance(value, int):
        return "an integer"
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _is_numpy_bool(value: Any) -> bool:
    # Without importing numpy: numpy.bool_ is no subclass of bool, and pydantic reads it as 1.
    return type(value).__name__ == "bool_" and type(value).__module__ == "numpy"


def _range_text(lo: float, hi: float, unit: str, lo_open: bool, zero_off: bool) -> str:
    unit = f" {unit}" if unit else ""
    if zero_off:
        return f"must be 0 (off) or from {_show(lo)} to {_show(hi)}{unit}"
    if lo_open:
        return f"must be > {_show(lo)} and at most {_show(hi)}{unit}"
    return f"must be from {_show(lo)} to {_show(hi)}{unit}"


# pydantic asks each validator's signature (does it take a ValidationInfo?) when it builds a
# schema, and the scenario's first validation builds about 250 of the closures below into it;
# `inspect` derives a signature from the function's code unless the function carries one,
# as these do (docs/performance.md, "Start-up: each schema generated once").
_VALUE_ONLY = inspect.Signature(
    [inspect.Parameter("value", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
)


def integer(lo: int, hi: int, unit: str, why: str) -> Any:
    """An int field in [lo, hi]: refuses strings, booleans and fractions; the error states the
    range, the unit and why the bound is what it is."""
    # Why the bound is what it is explains the upper bound; a value below the range gets the
    # range alone.
    below = _range_text(lo, hi, unit, False, False)
    above = f"{below}: {why}"

    def check(value: Any) -> int:
        if isinstance(value, bool | str | bytes) or _is_numpy_bool(value):
            raise ValueError(f"expected an integer, not {_what(value)}")
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"expected an integer, not {_what(value)}")
            value = int(value)
        elif not isinstance(value, int):
            try:
                value = operator.index(value)  # numpy integers
            except TypeError:
                raise ValueError(f"expected an integer, not {_what(value)}") from None
        if value < lo:
            raise ValueError(below)
        if value > hi:
            raise ValueError(above)
        return value

    check.__signature__ = _VALUE_ONLY  # type: ignore[attr-defined]
    return Annotated[int, BeforeValidator(check)]


def number(
    lo: float,
    hi: float,
    unit: str,
    why: str,
    *,
    lo_open: bool = False,
    zero_off: bool = False,
    zero_passes: bool = False,
) -> Any:
    """A float field in [lo, hi] ((lo, hi] with `lo_open`; also exactly 0 with `zero_off`):
    refuses strings, booleans, NaN and infinities; integers are welcome. `zero_passes` lets
    exactly 0 through unannounced (the range says what else is allowed), for a check of the
    model holding the field that says what a 0 needs there."""
    below = _range_text(lo, hi, unit, lo_open, zero_off)
    above = f"{below}: {why}"

    def check(value: Any) -> float:
        if isinstance(value, bool | str | bytes) or _is_numpy_bool(value):
            raise ValueError(f"expected a number, not {_what(value)}")
        try:
            value = float(value)
        except OverflowError:  # an int beyond float64
            raise ValueError(above) from None
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, not {_what(value)}") from None
        if (zero_off or zero_passes) and value == 0:
            return value
        if value > hi:
            raise ValueError(above)
        inside = lo < value <= hi if lo_open else lo <= value <= hi
        if not inside:  # NaN included
            raise ValueError(below)
        return value

    check.__signature__ = _VALUE_ONLY  # type: ignore[attr-defined]
    return Annotated[float, BeforeValidator(check)]


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if _is_numpy_bool(value):
        return bool(value)
    raise ValueError(f"expected true or false, not {_what(value)}")


_flag.__signature__ = _VALUE_ONLY  # type: ignore[attr-defined]
Flag = Annotated[bool, BeforeValidator(_flag)]


def empty_list() -> list:
    """`Field(default_factory=empty_list)`, not `list`: pydantic asks a factory's signature,
    and a builtin's is parsed from its text, which compiles `tokenize`'s patterns the first
    time (docs/performance.md, "Start-up: each schema generated once")."""
    return []


Instances = integer(0, MAX_INSTANCES, "instances", _WHY["instances"])
PositiveInstances = integer(1, MAX_INSTANCES, "instances", _WHY["instances"])
Nodes = integer(0, MAX_NODES, "nodes", _WHY["nodes"])
Gpus = integer(1, MAX_GPUS_PER_NODE, "GPUs", _WHY["gpus"])
Requests = integer(0, MAX_REQUESTS, "requests", _WHY["requests"])
PositiveRequests = integer(1, MAX_REQUESTS, "requests", _WHY["requests"])
Tokens = integer(0, MAX_TOKENS, "tokens", _WHY["tokens"])
PositiveTokens = integer(1, MAX_TOKENS, "tokens", _WHY["tokens"])
TokenAmount = number(0, MAX_TOKENS, "tokens", _WHY["tokens"])  # a length law's mean or spread
Blocks = integer(0, MAX_KV_BLOCKS, "blocks", _WHY["blocks"])
PositiveBlocks = integer(1, MAX_KV_BLOCKS, "blocks", _WHY["blocks"])
BlockSize = integer(1, MAX_BLOCK_SIZE_TOKENS, "tokens per block", _WHY["block size"])
TimeUs = integer(0, MAX_TIME_US, "µs", _WHY["time"])
PositiveTimeUs = integer(1, MAX_TIME_US, "µs", _WHY["time"])
WholeSeconds = integer(0, MAX_TIME_S, "s", _WHY["time"])
PositiveWholeSeconds = integer(1, MAX_TIME_S, "s", _WHY["time"])
Milliseconds = number(0, MAX_TIME_MS, "ms", _WHY["time"])
# A latency target: 0 ms would be a target no request meets (a workload spec's
# goodput_slo_targets reads 0 as "none"); no target is the field left out.
SloTargetMs = number(
    0, MAX_TIME_MS, "ms", f"{_WHY['time']}; for no target leave the field out", lo_open=True
)
Seconds = number(0, MAX_TIME_S, "s", _WHY["time"])
IntervalSeconds = number(
    MIN_INTERVAL_S, MAX_TIME_S, "s", f"{_WHY['time']}; a shorter period rounds to 0 µs"
)
Rate = number(MIN_RATE_PER_S, MAX_RATE_PER_S, "requests per second", _WHY["rate"])
RateFraction = number(0, MAX_RATE_PER_S, "", _WHY["rate fraction"], lo_open=True)
Bandwidth = number(MIN_BANDWIDTH_GB_PER_S, MAX_BANDWIDTH_GB_PER_S, "GB/s", _WHY["bandwidth"])
BandwidthOrOff = number(
    MIN_BANDWIDTH_GB_PER_S, MAX_BANDWIDTH_GB_PER_S, "GB/s", _WHY["bandwidth"], zero_off=True
)
Seed = integer(0, MAX_SEED, "", _WHY["seed"])
BytesPerToken = integer(1, MAX_BYTES_PER_TOKEN, "bytes", _WHY["bytes per token"])
TransferSlots = integer(1, MAX_REQUESTS, "transfers", "a run has at most 10^8 requests")
TokenBucketTokens = number(
    0,
    MAX_TOKEN_BUCKET_TOKENS,
    "tokens",
    "the bucket is a float64 counter, exact up to 2^53",
    lo_open=True,
)
TokenRate = number(
    0,
    MAX_TOKEN_RATE_PER_S,
    "tokens per second",
    "a faster refill fills the largest bucket within 1 µs, the same as no limit",
    lo_open=True,
)
# Autoscaler thresholds compare with a KV utilisation (a fraction) or a count of requests.
Threshold = number(0, MAX_REQUESTS, "", "signals are fractions or counts of requests")
PositiveThreshold = number(
    0, MAX_REQUESTS, "", "signals are fractions or counts of requests", lo_open=True
)
Coefficient = number(
    -MAX_COEFFICIENT, MAX_COEFFICIENT, "µs (per unit)", "one term may take the clock's range"
)
CV = number(
    MIN_CV,
    MAX_CV,
    "",
    "every process treats a cv above 10.4 alike; below 10^-6 the spread is under the clock's "
    "1 µs tick",
)
