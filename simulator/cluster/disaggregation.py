"""Prefill/decode disaggregation deciders (docs/behaviour.md §7.1, §7.3).

A decider answers one question per admitted request: split it into a prefill phase on the
prefill pool and a decode phase on the decode pool, or serve it whole? It sees the request's
prompt (never its output length, INV-9) and a `DecisionContext`. Routing is decode-first (as
llm-d): the decode instance is chosen before the decider runs, so a decider can look at what
that instance really holds.

After every routing decision the router calls `observe(req, disaggregated, ctx)`, the observer
hook that stateful deciders (the global prefix index) learn from.

Adding a decider: subclass `PDDecider`, set `name`, implement `decide` (and `observe` if it keeps
state), override `build` if it takes options, and register it with `@register_decider`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ..engine.request import Request
from ..errors import ConfigError, invalid, unknown
from .prefix_index import PrefixIndex
from .routing import PREFIX_INDEX_CAPACITY_BLOCKS

PREFIX_THRESHOLD_FIELD = "pd.prefix_threshold"
PREFIX_MODE_FIELD = "pd.prefix_mode"
PROMPT_LENGTH_THRESHOLD_FIELD = "pd.prompt_length_threshold"

# BLIS defaults: prefix threshold 16 non-cached tokens (llm-d parity, May), direct-decode 256.
DEFAULT_PREFIX_THRESHOLD = 16
DEFAULT_PROMPT_LENGTH_THRESHOLD = 256
PREFIX_MODES = ("global", "decode-cache")

# kv_probe(instance index, request) -> leading full prompt blocks present in that engine's cache.
KVProbe = Callable[[int, Request], int]


@dataclass(frozen=True)
class DecisionContext:
    """What the router knows when it asks a decider."""

    # The decode instance already chosen for the request (decode-first routing), if any.
    decode_index: int | None = None
    # Leading full prompt blocks present in instance `index`'s real KV cache.
    kv_probe: KVProbe | None = None
    block_size: int = 16


class PDDecider:
    """Base class: decides whether to disaggregate a request; may learn from routing."""

    name: ClassVar[str] = ""

    @classmethod
    def build(
        cls,
        *,
        prefix_threshold: int,
        prefix_mode: str,
        prompt_length_threshold: int,
        block_size: int,
    ) -> PDDecider:
        """Construct from the scenario's `pd` options (each decider takes what it needs)."""
        return cls()

    def decide(self, req: Request, ctx: DecisionContext) -> tuple[bool, str]:
        """(disaggregate?, short human-readable reason for the decision trace)."""
        raise NotImplementedError

    def observe(self, req: Request, disaggregated: bool, ctx: DecisionContext) -> None:
        """Called by the router after it routed `req` (whatever the decision was)."""
        return None


PD_DECIDERS: dict[str, type[PDDecider]] = {}


def decider_options(name: str) -> frozenset[str]:
    """The `pd` options the registered decider `name` reads: the keywords its own `build`
    names (the base class's reads none; `**_` collects what a decider ignores)."""
    cls = PD_DECIDERS.get(name)
    if cls is None or cls.build.__func__ is PDDecider.build.__func__:
        return frozenset()
    parameters = inspect.signature(cls.build).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def register_decider(cls: type[PDDecider]) -> type[PDDecider]:
    """Class decorator: make `cls` constructible by name from a scenario."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    PD_DECIDERS[cls.name] = cls
    return cls


def _check_threshold(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(field, value, "must be an integer >= 0 (tokens)")
    return value


def _check_block_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise invalid("block_size", value, "must be an integer > 0 (tokens)")
    return value


@register_decider
class NeverDecider(PDDecider):
    """BLIS's default: every request is served whole."""

    name = "never"

    def decide(self, req: Request, ctx: DecisionContext) -> tuple[bool, str]:
        return False, "never"


@register_decider
class AlwaysDecider(PDDecider):
    name = "always"

    def decide(self, req: Request, ctx: DecisionContext) -> tuple[bool, str]:
        return True, "always"


@register_decider
class PromptLengthDecider(PDDecider):
    """BLIS's Mar-25 `direct-to-decode`: disaggregate iff the prompt has >= threshold tokens
    (short prompts go straight to decode)."""

    name = "prompt-length"

    def __init__(self, threshold_tokens: int = DEFAULT_PROMPT_LENGTH_THRESHOLD) -> None:
        self.threshold_tokens = _check_threshold(PROMPT_LENGTH_THRESHOLD_FIELD, threshold_tokens)

    @classmethod
    def build(cls, *, prompt_length_threshold: int, **_: object) -> PDDecider:
        return cls(prompt_length_threshold)

    def decide(self, req: Request, ctx: DecisionContext) -> tuple[bool, str]:
        n, t = req.input_tokens, self.threshold_tokens
        if n >= t:
            return True, f"input_tokens {n} >= {t}"
        return False, f"input_tokens {n} < {t}"


@register_decider
class PrefixThresholdDecider(PDDecider):
    """Disaggregate iff the prompt's non-cached tokens exceed a threshold (docs/behaviour.md §7.3).

    non-cached = input_tokens - matched leading full blocks * block size; an empty prompt is
    never disaggregated. "Matched" depends on the mode:

    * `global` (BLIS-Mar): one router-side LRU index of block hashes shared by the whole
      cluster, fed by `observe` with every routed prompt. It knows nothing per instance.
    * `decode-cache` (BLIS later, llm-d `PrefixBasedPDDecider`): the blocks the pre-selected
      decode instance really holds, via `ctx.kv_probe`. Stateless.
    """

    name = "prefix-threshold"

    def __init__(
        self,
        threshold_tokens: int = DEFAULT_PREFIX_THRESHOLD,
        mode: str = "global",
        block_size: int = 16,
        capacity_blocks: int = PREFIX_INDEX_CAPACITY_BLOCKS,
    ) -> None:
        self.threshold_tokens = _check_threshold(PREFIX_THRESHOLD_FIELD, threshold_tokens)
        if mode not in PREFIX_MODES:
            raise invalid(PREFIX_MODE_FIELD, mode, f"valid: {', '.join(PREFIX_MODES)}")
        self.mode = mode
        self.block_size = _check_block_size(block_size)
        if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int):
            raise invalid("prefix index capacity", capacity_blocks, "must be an integer > 0")
        if capacity_blocks <= 0:
            raise invalid("prefix index capacity", capacity_blocks, "must be an integer > 0")
        self.index = PrefixIndex(capacity_blocks)

    @classmethod
    def build(
        cls, *, prefix_threshold: int, prefix_mode: str, block_size: int, **_: object
    ) -> PDDecider:
        return cls(prefix_threshold, prefix_mode, block_size)

    def _hashes(self, req: Request) -> list[int]:
        n = req.input_tokens // self.block_size
        if n < 1:
            return []
        return req.block_hashes(n, self.block_size)[:n]

    def matched_tokens(self, req: Request, ctx: DecisionContext) -> int:
        if self.mode == "global":
            return self.index.matched_blocks(self._hashes(req)) * self.block_size
        if ctx.kv_probe is None or ctx.decode_index is None:
            raise ConfigError(
                f"{PREFIX_MODE_FIELD}: 'decode-cache' needs the router to choose the decode "
                "instance first and to pass a kv_probe; use 'global' otherwise"
            )
        # The probed cache's block size, which is the context's (the decode pool's).
        return ctx.kv_probe(ctx.decode_index, req) * ctx.block_size

    def decide(self, req: Request, ctx: DecisionContext) -> tuple[bool, str]:
        if req.input_tokens <= 0:
            return False, "empty prompt"
        non_cached = max(0, req.input_tokens - self.matched_tokens(req, ctx))
        t = self.threshold_tokens
        if non_cached > t:
            return True, f"non-cached tokens {non_cached} > {t} ({self.mode})"
        return False, f"non-cached tokens {non_cached} <= {t} ({self.mode})"

    def observe(self, req: Request, disaggregated: bool, ctx: DecisionContext) -> None:
        if self.mode == "global":
            self.index.record(self._hashes(req))


def make_decider(
    name: str,
    *,
    prefix_threshold: int | None = DEFAULT_PREFIX_THRESHOLD,
    prefix_mode: str = "global",
    prompt_length_threshold: int | None = DEFAULT_PROMPT_LENGTH_THRESHOLD,
    block_size: int = 16,
) -> PDDecider:
    """Build a decider by registry name; None thresholds mean the defaults (16 and 256)."""
    if name not in PD_DECIDERS:
        raise unknown("PD decider", name, PD_DECIDERS)
    if prefix_threshold is None:
        prefix_threshold = DEFAULT_PREFIX_THRESHOLD
    if prompt_length_threshold is None:
        prompt_length_threshold = DEFAULT_PROMPT_LENGTH_THRESHOLD
    # Validate every option, even ones this decider ignores, so a typo never passes silently.
    _check_threshold(PREFIX_THRESHOLD_FIELD, prefix_threshold)
    _check_threshold(PROMPT_LENGTH_THRESHOLD_FIELD, prompt_length_threshold)
    if prefix_mode not in PREFIX_MODES:
        raise invalid(PREFIX_MODE_FIELD, prefix_mode, f"valid: {', '.join(PREFIX_MODES)}")
    _check_block_size(block_size)
    return PD_DECIDERS[name].build(
        prefix_threshold=prefix_threshold,
        prefix_mode=prefix_mode,
        prompt_length_threshold=prompt_length_threshold,
        block_size=block_size,
    )
