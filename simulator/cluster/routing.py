"""Routing policies and weighted scorers (docs/behaviour.md §6.4).

A policy picks one instance from the routable candidates' snapshots. Policies and scorers read
snapshots (and, for `precise-prefix-cache`, a probe of the engines' prefix caches) but never a
request's output length (INV-9). Everything here is plain Python, driven by the router process.

After the router commits a decision it calls `policy.observe(req, chosen)`, which lets stateful
scorers (the prefix-affinity index) learn where the request went.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..engine.kv_cache import KVCache
from ..engine.request import Request
from ..errors import ConfigError, invalid, unknown
from .prefix_index import PrefixIndex, leading_matches
from .snapshot import InstanceSnapshot

# BLIS-Mar's default profile for `weighted` (BLIS later moved to precise-prefix-cache:2,
# queue-depth:1, kv-utilization:1).
DEFAULT_SCORERS = "prefix-affinity:3,queue-depth:2,kv-utilization:2"
# Router-side prefix index capacity per instance, in block hashes (BLIS's value).
PREFIX_INDEX_CAPACITY_BLOCKS = 10_000
SCORERS_FIELD = "routing.scorers (--routing-scorers)"

# kv_probe(instance index, request) -> leading full prompt blocks present in that engine's cache.
KVProbe = Callable[[int, Request], int]


@dataclass(frozen=True)
class RoutingDecision:
    """Where a request goes: `target` is the chosen candidate's `InstanceSnapshot.index`."""

    target: int
    reason: str
    # Per-instance scores if the policy computes them (weighted), keyed by instance id.
    scores: dict[str, float] | None = None


# --------------------------------------------------------------------------- scorers


class Scorer:
    """Scores every candidate in [0, 1] (higher = better); the weighted policy combines them.

    A scorer implements `score`, a dict keyed by instance id. The weighted policy combines
    scores in candidate order (`score_list`); the built-in scorers compute that list directly
    (`_ListScorer`), as the router asks every scorer for every request and a list is cheaper
    than a dict built and then looked up per candidate.
    """

    name = ""

    @classmethod
    def build(cls, *, block_size: int, kv_probe: KVProbe | None) -> Scorer:
        return cls()

    def score(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> dict[str, float]:
        raise NotImplementedError

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        """The scores in candidate order; a candidate missing from `score` scores 0."""
        scores = self.score(req, candidates)
        return [scores.get(c.instance_id, 0.0) for c in candidates]

    def observe(self, req: Request, chosen: InstanceSnapshot) -> None:
        """Called once the request is routed to `chosen`."""
        return None


class _ListScorer(Scorer):
    """A scorer that computes `score_list`; its `score` is that list keyed by instance id."""

    def score(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> dict[str, float]:
        ids = [c.instance_id for c in candidates]
        return dict(zip(ids, self.score_list(req, candidates), strict=True))

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        raise NotImplementedError


class QueueDepthScorer(_ListScorer):
    """Min-max normalised effective load: the least loaded scores 1, the most loaded 0."""

    name = "queue-depth"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        # effective_load, without a property call per candidate.
        loads = [c.queue_depth + c.batch_size + c.in_flight for c in candidates]
        lo, hi = min(loads), max(loads)
        if hi == lo:
            return [1.0] * len(loads)
        span = hi - lo
        return [(hi - load) / span for load in loads]


class KVUtilizationScorer(_ListScorer):
    name = "kv-utilization"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        return [1.0 - c.kv_utilization for c in candidates]


class LoadBalanceScorer(_ListScorer):
    name = "load-balance"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        return [1.0 / (1.0 + c.effective_load) for c in candidates]


# Off: the prefix-affinity scorer hashes and stores every block (tests compare both ways).
PRIVATE_BLOCKS_BY_COUNT = True


def _full_prompt_blocks(req: Request, block_size: int) -> int:
    return req.input_tokens // block_size


class PrefixAffinityScorer(_ListScorer):
    """Router-side approximation of each instance's prefix cache (docs/behaviour.md §6.4).

    Per instance, an LRU of the block hashes of prompts routed there. It never queries the
    engines, so it can believe a block is cached after the engine evicted it (and vice versa).
    Scoring only reads the index; recording a routed prompt refreshes or inserts all its full
    block hashes and evicts from the least recently recorded end.
    """

    name = "prefix-affinity"

    def __init__(
        self, block_size: int = 16, capacity_blocks: int = PREFIX_INDEX_CAPACITY_BLOCKS
    ) -> None:
        if block_size <= 0:
            raise invalid("block_size", block_size, "must be > 0")
        if capacity_blocks <= 0:
            raise invalid("prefix index capacity", capacity_blocks, "must be > 0")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._index: dict[str, PrefixIndex] = {}

    @classmethod
    def build(cls, *, block_size: int, kv_probe: KVProbe | None) -> Scorer:
        return cls(block_size)

    def cached_blocks(self, instance_id: str, hashes: Sequence[int]) -> int:
        """Consecutive leading hashes recorded for `instance_id` (does not touch recency)."""
        index = self._index.get(instance_id)
        return index.matched_blocks(hashes) if index is not None else 0

    # A prompt's private blocks (`Request.private_from_token`: content no other request has)
    # can be in none of this scorer's indexes until this scorer routes the same content a
    # second time (a re-route; a PD decode sub-request): they are recorded by count only,
    # and before that second time (`_materialize`) handed to the index as hashes. So a first
    # routing matches and hashes only the shared blocks, and for a prompt of private content
    # alone, none. The owner keeps, per scorer, the runs holding its blocks by count, or []
    # once this scorer routes it with plain hashes.

    def _private_block(self, owner: Request, n: int) -> int:
        """The first block this routing may treat as private (n: none)."""
        if not PRIVATE_BLOCKS_BY_COUNT:
            return n
        routed = owner.prefix_index_runs
        if routed is not None and self in routed:
            if routed[self]:
                self._materialize(owner, routed[self])
                routed[self] = []
            return n
        private_from = owner.private_from_token
        if private_from < 0:
            return n
        first = private_from // self.block_size
        return first if first < n else n

    def _materialize(self, owner: Request, runs: list) -> None:
        for index, run, n in runs:
            hashes = owner.block_hashes(n, self.block_size)
            index.materialize(run, hashes[n - run.private : n])

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        n = _full_prompt_blocks(req, self.block_size)
        if n < 1:
            return [0.0] * len(candidates)
        shared = self._private_block(req.parent or req, n)
        if shared == 0:
            return [0.0] * len(candidates)
        hashes = req.block_hashes(shared, self.block_size)[:shared]
        get = self._index.get
        matches = leading_matches([get(c.instance_id) for c in candidates], hashes)
        return [k / n for k in matches]

    def observe(self, req: Request, chosen: InstanceSnapshot) -> None:
        n = _full_prompt_blocks(req, self.block_size)
        if n < 1:
            return
        index = self._index.get(chosen.instance_id)
        if index is None:
            index = self._index[chosen.instance_id] = PrefixIndex(self.capacity_blocks)
        owner = req.parent or req
        shared = self._private_block(owner, n)
        hashes = req.block_hashes(shared, self.block_size)[:shared] if shared else []
        run = index.record(hashes, n - shared)
        if shared < n:
            if owner.prefix_index_runs is None:
                owner.prefix_index_runs = {}
            owner.prefix_index_runs[self] = [(index, run, n)]

    def index_size(self, instance_id: str) -> int:
        return len(self._index.get(instance_id, ()))


class PrecisePrefixCacheScorer(_ListScorer):
    """Scores by the prompt blocks actually present in each engine's prefix cache.

    Unlike `prefix-affinity` this is exact at the moment of the decision (it reads the engines
    directly, like llm-d's precise prefix-cache scorer), so it bypasses snapshot staleness.
    """

    name = "precise-prefix-cache"

    def __init__(self, block_size: int, kv_probe: KVProbe) -> None:
        if block_size <= 0:
            raise invalid("block_size", block_size, "must be > 0")
        self.block_size = block_size
        self.kv_probe = kv_probe

    @classmethod
    def build(cls, *, block_size: int, kv_probe: KVProbe | None) -> Scorer:
        if kv_probe is None:
            raise ConfigError(
                "scorer 'precise-prefix-cache' needs a probe of the instances' KV caches "
                "(kv_probe); it cannot be used where engine caches are not visible"
            )
        return cls(block_size, kv_probe)

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        n = _full_prompt_blocks(req, self.block_size)
        if n < 1:
            return [0.0] * len(candidates)
        return [min(self.kv_probe(c.index, req), n) / n for c in candidates]


_BUILT_IN_SCORERS = (
    QueueDepthScorer,
    KVUtilizationScorer,
    LoadBalanceScorer,
    PrefixAffinityScorer,
    PrecisePrefixCacheScorer,
)
SCORERS: dict[str, type[Scorer]] = {cls.name: cls for cls in _BUILT_IN_SCORERS}


def make_scorer(name: str, *, block_size: int = 16, kv_probe: KVProbe | None = None) -> Scorer:
    if name not in SCORERS:
        raise unknown("scorer", name, SCORERS)
    return SCORERS[name].build(block_size=block_size, kv_probe=kv_probe)


def kv_probe_from_caches(get_cache: Callable[[int], KVCache | None]) -> KVProbe:
    """A `kv_probe` for `precise-prefix-cache` that reads instance `index`'s engine cache."""

    def probe(index: int, req: Request) -> int:
        cache = get_cache(index)
        if cache is None:
            return 0
        # max_tokens = the whole prompt: every full prompt block may match.
        return len(cache.cached_prefix_blocks(req, req.input_tokens))

    return probe


# --------------------------------------------------------------------------- scorer syntax


def _valid_names() -> str:
    return ", ".join(sorted(SCORERS))


def _check_scorer(
    name: str, weight: float, piece: str, field: str, seen: set[str]
) -> tuple[str, float]:
    if name not in SCORERS:
        raise ConfigError(f"{field}: unknown scorer {name!r} in {piece!r}; valid: {_valid_names()}")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise invalid(field, piece, "the weight must be a number")
    if not math.isfinite(weight) or weight <= 0:
        raise invalid(field, piece, "the weight must be a finite number > 0")
    if name in seen:
        raise invalid(field, piece, f"scorer {name!r} is listed twice")
    seen.add(name)
    return name, float(weight)


def parse_scorers(text: str, field: str = SCORERS_FIELD) -> list[tuple[str, float]]:
    """Parse BLIS's "name:weight,name:weight" scorer list (weights not yet normalised)."""
    if not isinstance(text, str) or not text.strip():
        raise invalid(
            field,
            text,
            f"give name:weight pairs, e.g. {DEFAULT_SCORERS!r}; valid: {_valid_names()}",
        )
    out: list[tuple[str, float]] = []
    seen: set[str] = set()
    for raw in text.split(","):
        piece = raw.strip()
        parts = piece.split(":")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise invalid(
                field,
                piece,
                f"expected name:weight, e.g. {DEFAULT_SCORERS!r}; valid: {_valid_names()}",
            )
        name, weight_text = parts[0].strip(), parts[1].strip()
        try:
            weight = float(weight_text)
        except ValueError:
            raise invalid(field, piece, "the weight must be a number") from None
        out.append(_check_scorer(name, weight, piece, field, seen))
    return out


def check_scorers(
    scorers: Sequence[tuple[str, float]], field: str = SCORERS_FIELD
) -> list[tuple[str, float]]:
    """Validate an already split scorer list with the same rules as `parse_scorers`."""
    if not scorers:
        raise invalid(field, list(scorers), f"give at least one scorer; valid: {_valid_names()}")
    seen: set[str] = set()
    return [_check_scorer(n, w, f"{n}:{w}", field, seen) for n, w in scorers]


# --------------------------------------------------------------------------- policies


class RoutingPolicy:
    """Base class: choose one of `candidates` (non-empty) for `req`."""

    name = ""

    @classmethod
    def build(
        cls,
        *,
        scorers: list[tuple[str, float]],
        rng: np.random.Generator,
        block_size: int,
        kv_probe: KVProbe | None,
    ) -> RoutingPolicy:
        return cls()

    def route(
        self, req: Request, candidates: Sequence[InstanceSnapshot], now_us: int
    ) -> RoutingDecision:
        raise NotImplementedError

    def observe(self, req: Request, chosen: InstanceSnapshot) -> None:
        return None


def _require(candidates: Sequence[InstanceSnapshot]) -> None:
    if not candidates:
        raise ValueError("route() needs at least one candidate instance")


class RoundRobin(RoutingPolicy):
    name = "round-robin"

    def __init__(self) -> None:
        self.counter = 0

    def route(
        self, req: Request, candidates: Sequence[InstanceSnapshot], now_us: int
    ) -> RoutingDecision:
        _require(candidates)
        pos = self.counter % len(candidates)
        self.counter += 1
        return RoutingDecision(candidates[pos].index, f"round-robin[{pos}]")


class LeastLoaded(RoutingPolicy):
    """Minimum effective load; ties broken uniformly at random with the router's generator."""

    name = "least-loaded"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    @classmethod
    def build(cls, *, scorers, rng, block_size, kv_probe) -> RoutingPolicy:
        return cls(rng)

    def route(
        self, req: Request, candidates: Sequence[InstanceSnapshot], now_us: int
    ) -> RoutingDecision:
        _require(candidates)
        best = min(c.effective_load for c in candidates)
        tied = [c for c in candidates if c.effective_load == best]
        # Draw only on a tie, so untied decisions do not consume the router's stream.
        chosen = tied[int(self.rng.integers(len(tied)))] if len(tied) > 1 else tied[0]
        return RoutingDecision(chosen.index, f"least-loaded (load={best})")


class Weighted(RoutingPolicy):
    """composite = Σ w_i·clamp01(score_i) with weights normalised to sum 1; argmax, random ties."""

    name = "weighted"

    def __init__(self, scorers: Sequence[tuple[Scorer, float]], rng: np.random.Generator) -> None:
        if not scorers:
            raise ConfigError("weighted routing needs at least one scorer")
        total = sum(w for _, w in scorers)
        self.scorers = [(s, w / total) for s, w in scorers]
        # How each scorer's scores are read in candidate order: a built-in scorer computes
        # the list; any other (a user's scorer, or a subclass that may override `score`) is
        # read through its `score` dict.
        self._score_lists = [
            s.score_list if type(s) in _BUILT_IN_SCORERS else partial(Scorer.score_list, s)
            for s, _ in self.scorers
        ]
        self.rng = rng

    @classmethod
    def build(cls, *, scorers, rng, block_size, kv_probe) -> RoutingPolicy:
        built = [
            (make_scorer(name, block_size=block_size, kv_probe=kv_probe), weight)
            for name, weight in scorers
        ]
        return cls(built, rng)

    def route(
        self, req: Request, candidates: Sequence[InstanceSnapshot], now_us: int
    ) -> RoutingDecision:
        _require(candidates)
        # Composite scores in candidate order (instance ids are unique among candidates).
        composite = [0.0] * len(candidates)
        for (_, weight), score_list in zip(self.scorers, self._score_lists, strict=True):
            composite = [
                total + weight * (0.0 if s < 0.0 else 1.0 if s > 1.0 else s)
                for total, s in zip(composite, score_list(req, candidates), strict=True)
            ]
        best = max(composite)
        tied = [c for c, total in zip(candidates, composite, strict=True) if total == best]
        chosen = tied[int(self.rng.integers(len(tied)))] if len(tied) > 1 else tied[0]
        scores = dict(zip([c.instance_id for c in candidates], composite, strict=True))
        return RoutingDecision(chosen.index, f"weighted (score={best:.4f})", scores)

    def observe(self, req: Request, chosen: InstanceSnapshot) -> None:
        for scorer, _ in self.scorers:
            scorer.observe(req, chosen)


class AlwaysBusiest(RoutingPolicy):
    """Pathological: the most loaded instance, first in candidate order on ties."""

    name = "always-busiest"

    def route(
        self, req: Request, candidates: Sequence[InstanceSnapshot], now_us: int
    ) -> RoutingDecision:
        _require(candidates)
        chosen = candidates[0]
        for c in candidates[1:]:
            if c.effective_load > chosen.effective_load:
                chosen = c
        return RoutingDecision(chosen.index, f"always-busiest (load={chosen.effective_load})")


ROUTING_POLICIES: dict[str, type[RoutingPolicy]] = {
    cls.name: cls for cls in (RoundRobin, LeastLoaded, Weighted, AlwaysBusiest)
}


def make_routing_policy(
    name: str,
    *,
    scorers: str | Sequence[tuple[str, float]] | None = None,
    rng: np.random.Generator,
    block_size: int = 16,
    kv_probe: KVProbe | None = None,
    scorers_field: str = SCORERS_FIELD,
) -> RoutingPolicy:
    """Build routing policy `name`. `scorers` (weighted only) defaults to DEFAULT_SCORERS;
    it is validated for every policy so that a typo is reported even where it is unused."""
    if name not in ROUTING_POLICIES:
        raise unknown("routing policy", name, ROUTING_POLICIES)
    if scorers is None or (isinstance(scorers, str) and not scorers.strip()):
        parsed = parse_scorers(DEFAULT_SCORERS, scorers_field)
    elif isinstance(scorers, str):
        parsed = parse_scorers(scorers, scorers_field)
    else:
        parsed = check_scorers(scorers, scorers_field)
    return ROUTING_POLICIES[name].build(
        scorers=parsed, rng=rng, block_size=block_size, kv_probe=kv_probe
    )
