"""Routing policies, weighted scorers and routing profiles (docs/behaviour.md §6.4,
docs/cluster.md).

A policy picks one instance from the routable candidates' snapshots. Policies and scorers read
snapshots (and, for the cache scorers, a probe of the engines' prefix caches, possibly delayed:
`prefix_index.CacheSignalView`) but never a request's output length (INV-9). Everything here is
plain Python, driven by the router process.

After the router commits a decision it calls `policy.observe(req, chosen)`, which lets stateful
scorers (the prefix-affinity index, no-hit-lru's recency list) learn where the request went.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..engine.kv_cache import KVCache
from ..engine.request import Request
from ..errors import ConfigError, invalid, unknown
from .prefix_index import PrefixIndex, leading_matches
from .snapshot import InstanceSnapshot

# BLIS-Mar's default profile for `weighted` (BLIS-current's is the `blis-current` routing
# profile's, below).
DEFAULT_SCORERS = "prefix-affinity:3,queue-depth:2,kv-utilization:2"
# Router-side prefix index capacity per instance, in block hashes (BLIS's value).
PREFIX_INDEX_CAPACITY_BLOCKS = 10_000
# As the scenario names it: an error found while building the cluster is told with this path.
SCORERS_FIELD = "cluster.routing.scorers (--routing-scorers)"

# kv_probe(instance index, request) -> leading full prompt blocks present in that engine's cache.
KVProbe = Callable[[int, Request], int]


@dataclass(frozen=True)
class RoutingDecision:
    """Where a request goes: `target` is the chosen candidate's `InstanceSnapshot.index`."""

    target: int
    reason: str
    # Per-instance scores if the policy computes them (weighted), keyed by instance id, in
    # candidate order: a dict, or (weighted) a `ScoresByInstance` mapping.
    scores: Mapping[str, float] | None = None


class ScoresByInstance(Mapping[str, float]):
    """Scores keyed by instance id, in candidate order, read-only: the candidates and their
    scores, made into a dict when first read. The weighted policy decides once per request
    over every candidate (64 in case (g)) and only the decision trace reads the scores, so
    an untraced run never builds the dict. Equal to that dict, and reads like it."""

    __slots__ = ("_candidates", "_scores", "_dict")

    def __init__(self, candidates: Sequence[InstanceSnapshot], scores: Sequence[float]) -> None:
        self._candidates = tuple(candidates)  # as they are now, should the caller reuse its list
        self._scores = tuple(scores)
        self._dict: dict[str, float] | None = None

    def _by_id(self) -> dict[str, float]:
        if self._dict is None:
            ids = [c.instance_id for c in self._candidates]
            self._dict = dict(zip(ids, self._scores, strict=True))
        return self._dict

    def __getitem__(self, instance_id: str) -> float:
        return self._by_id()[instance_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id())

    def __len__(self) -> int:
        return len(self._by_id())

    def __repr__(self) -> str:
        return repr(self._by_id())


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


def _inverted_min_max(values: Sequence[int]) -> list[float]:
    """(max − x)/(max − min): the smallest scores 1, the largest 0; 1 for all when all equal."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - x) / span for x in values]


class QueueDepthScorer(_ListScorer):
    """Min-max normalised effective load: the least loaded scores 1, the most loaded 0."""

    name = "queue-depth"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        # effective_load, without a property call per candidate.
        return _inverted_min_max([c.queue_depth + c.batch_size + c.in_flight for c in candidates])


class KVUtilizationScorer(_ListScorer):
    name = "kv-utilization"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        return [1.0 - c.kv_utilization for c in candidates]


class LoadBalanceScorer(_ListScorer):
    name = "load-balance"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        return [1.0 / (1.0 + c.effective_load) for c in candidates]


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
        # Off (EngineOptions.private_blocks_by_count, the reference path): every block is
        # hashed and stored.
        self.private_blocks_by_count = True

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
        if not self.private_blocks_by_count:
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
    """Scores by the prompt blocks present in each engine's prefix cache: the fraction of the
    prompt's full blocks cached (servesim's meaning, `precise-prefix-cache@mar`).

    Unlike `prefix-affinity` this reads the engines' caches (like llm-d's precise prefix-cache
    scorer fed by KV-cache events), live or as old as the cache signal delay, never through the
    load snapshots.
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


# ---------------------------------------------------------------------- BLIS-current scorers
#
# BLIS's current release (f90a1e3a) added the scorers below and changed the meaning of two
# names: its `queue-depth` reads the wait queue only, and its `precise-prefix-cache` is min-max
# normalised over the candidates. Those two are registered as `name@current`; the bare names
# keep servesim's meaning (`name@mar`), and the routing profile `blis-current` maps bare names
# to `@current` (see `resolve_scorers`).


class QueueDepthCurrentScorer(_ListScorer):
    """BLIS-current's `queue-depth`: min-max over the wait queue alone (BLIS-Mar's, and
    servesim's bare `queue-depth`, add the running batch and the in-flight count)."""

    name = "queue-depth@current"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        return _inverted_min_max([c.queue_depth for c in candidates])


class ActiveRequestsScorer(_ListScorer):
    """Fewest requests in flight (routed, not yet finished; always live): with m the largest
    in-flight count, (m − in_flight)/m, and 1 for an idle instance or when all are idle."""

    name = "active-requests"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        most = max(c.in_flight for c in candidates)
        if most == 0:
            return [1.0] * len(candidates)
        return [1.0 if c.in_flight == 0 else (most - c.in_flight) / most for c in candidates]


class RunningRequestsScorer(_ListScorer):
    """Smallest running batch: min-max over the batch sizes."""

    name = "running-requests"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        return _inverted_min_max([c.batch_size for c in candidates])


# The wait-queue length at which `load-aware` bottoms out at 0.
LOAD_AWARE_QUEUE_CAP = 128


class LoadAwareScorer(_ListScorer):
    """llm-d's load-aware scorer: 0.5 for an empty wait queue, falling linearly to 0 at
    LOAD_AWARE_QUEUE_CAP waiting requests. It is not normalised over the candidates, so it
    never exceeds 0.5 and (as in BLIS) an empty queue and a queue of one score nearly alike."""

    name = "load-aware"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        cap = LOAD_AWARE_QUEUE_CAP
        return [
            0.5 if c.queue_depth == 0 else 0.5 * (1.0 - min(c.queue_depth, cap) / cap)
            for c in candidates
        ]


class VllmDpScorer(_ListScorer):
    """vLLM's data-parallel balancer: load = 4·waiting + running, min-max over candidates (a
    waiting request weighs four running ones)."""

    name = "vllm-dp"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        return _inverted_min_max([4 * c.queue_depth + c.batch_size for c in candidates])


def _require_probe(name: str, kv_probe: KVProbe | None) -> KVProbe:
    if kv_probe is None:
        raise ConfigError(
            f"scorer {name!r} needs a probe of the instances' KV caches "
            "(kv_probe); it cannot be used where engine caches are not visible"
        )
    return kv_probe


class _CachedBlockCounts(_ListScorer):
    """Base of the scorers that count each candidate's cached leading prompt blocks."""

    def __init__(self, block_size: int, kv_probe: KVProbe) -> None:
        if block_size <= 0:
            raise invalid("block_size", block_size, "must be > 0")
        self.block_size = block_size
        self.kv_probe = kv_probe

    @classmethod
    def build(cls, *, block_size: int, kv_probe: KVProbe | None) -> Scorer:
        return cls(block_size, _require_probe(cls.name, kv_probe))

    def cached_counts(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[int]:
        """Leading full prompt blocks found in each candidate's cache view (none for a prompt
        shorter than a block, without asking the probe)."""
        if _full_prompt_blocks(req, self.block_size) < 1:
            return [0] * len(candidates)
        probe = self.kv_probe
        return [probe(c.index, req) for c in candidates]


class PrecisePrefixCacheCurrentScorer(_CachedBlockCounts):
    """BLIS-current's `precise-prefix-cache`: the cached-block counts c, min-max normalised,
    (c − min)/(max − min); 1 for all when all are equal (including no hit anywhere). A
    candidate with the longest cached prefix scores 1 however short that prefix is."""

    name = "precise-prefix-cache@current"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        counts = self.cached_counts(req, candidates)
        lo, hi = min(counts), max(counts)
        if hi == lo:
            return [1.0] * len(counts)
        span = hi - lo
        return [(c - lo) / span for c in counts]


class NoHitLruScorer(_CachedBlockCounts):
    """Spreads *cold* requests (no candidate caches any of the prompt's leading blocks) over
    the instances least recently given a cold request; says nothing about warm ones.

    Warm request: 0.5 for every candidate, and nothing is learnt. Cold request: a lone
    candidate scores 1; otherwise candidates are ranked 0, 1, 2, … — first those never given a
    cold request (in candidate order), then the others from least to most recently given one —
    and score 1 − rank/(n − 1). Instances that are no longer candidates are forgotten. Once the
    router commits a cold request, its instance becomes the most recent (`observe`).
    """

    name = "no-hit-lru"

    def __init__(self, block_size: int, kv_probe: KVProbe) -> None:
        super().__init__(block_size, kv_probe)
        self._recent: list[str] = []  # instance ids given a cold request, most recent first
        self._cold: Request | None = None  # the last request scored, if it was cold

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        if any(self.cached_counts(req, candidates)):
            self._cold = None
            return [0.5] * len(candidates)
        self._cold = req
        n = len(candidates)
        if n == 1:
            return [1.0]
        ids = {c.instance_id for c in candidates}
        self._recent = [iid for iid in self._recent if iid in ids]
        seen = set(self._recent)
        rank = {iid: r for r, iid in enumerate(reversed(self._recent), n - len(seen))}
        fresh = 0
        scores = []
        for c in candidates:
            r = rank.get(c.instance_id)
            if r is None:
                r, fresh = fresh, fresh + 1
            scores.append(1.0 - r / (n - 1))
        return scores

    def observe(self, req: Request, chosen: InstanceSnapshot) -> None:
        if self._cold is not req:
            return
        self._cold = None
        iid = chosen.instance_id
        if iid in self._recent:
            self._recent.remove(iid)
        self._recent.insert(0, iid)


class LoRAAffinityScorer(_ListScorer):
    """BLIS's `lora-affinity` (docs/lora.md): 1 where the request's adapter is in the
    instance's GPU slots (no load needed), else 0; 1 everywhere for a base-model request or
    when every candidate scores alike (min-max over the candidates)."""

    name = "lora-affinity"

    def score_list(self, req: Request, candidates: Sequence[InstanceSnapshot]) -> list[float]:
        adapter = req.adapter
        if not adapter:
            return [1.0] * len(candidates)
        scores = [1.0 if adapter in c.adapters else 0.0 for c in candidates]
        if min(scores) == max(scores):
            return [1.0] * len(candidates)
        return scores


_BUILT_IN_SCORERS = (
    QueueDepthScorer,
    KVUtilizationScorer,
    LoadBalanceScorer,
    PrefixAffinityScorer,
    PrecisePrefixCacheScorer,
    QueueDepthCurrentScorer,
    PrecisePrefixCacheCurrentScorer,
    ActiveRequestsScorer,
    RunningRequestsScorer,
    LoadAwareScorer,
    VllmDpScorer,
    NoHitLruScorer,
    LoRAAffinityScorer,
)
SCORERS: dict[str, type[Scorer]] = {cls.name: cls for cls in _BUILT_IN_SCORERS}
# The bare names whose meaning changed in BLIS's current release, pinned to servesim's (and
# BLIS-Mar's) meaning; `name@current` pins BLIS-current's.
SCORERS["queue-depth@mar"] = QueueDepthScorer
SCORERS["precise-prefix-cache@mar"] = PrecisePrefixCacheScorer


def check_routing_policy_name(name: str) -> None:
    if name not in ROUTING_POLICIES:
        raise unknown("routing policy", name, ROUTING_POLICIES)


def make_scorer(name: str, *, block_size: int = 16, kv_probe: KVProbe | None = None) -> Scorer:
    if name not in SCORERS:
        raise unknown("scorer", name, SCORERS)
    return SCORERS[name].build(block_size=block_size, kv_probe=kv_probe)


def kv_probe_from_caches(
    get_cache: Callable[[int], KVCache | None],
    reuses_prefixes: Callable[[int], bool] | None = None,
) -> KVProbe:
    """A `kv_probe` (the `precise-prefix-cache` scorer's, PD's decode-cache decider's) that
    reads instance `index`'s engine cache. `reuses_prefixes(index)` says whether that
    instance's engine reuses a cached prefix (`engine.enable_prefix_caching`): when it does
    not, the probe finds 0 blocks, since the engine will compute the whole prompt whatever
    its cache holds (until 2026-12-07 it counted them, and a decider kept requests on a decode
    instance for a cache it never read)."""

    def probe(index: int, req: Request) -> int:
        cache = get_cache(index)
        if cache is None or (reuses_prefixes is not None and not reuses_prefixes(index)):
            return 0
        # max_tokens = the whole prompt: every full prompt block may match.
        return len(cache.cached_prefix_blocks(req, req.input_tokens))

    return probe


# --------------------------------------------------------------------------- routing profiles


@dataclass(frozen=True)
class RoutingProfile:
    """Which BLIS release's routing a run follows: the default scorer list of `weighted`, the
    meaning of the scorer names whose meaning changed (`bare name -> registered name`), and the
    ages of the router's signals when the scenario leaves them unset."""

    name: str
    default_scorers: str
    meanings: dict[str, str]
    snapshot_refresh_interval_us: int
    cache_signal_delay_us: int


# servesim's default: BLIS-Mar's profile, fresh signals (servesim's results before BLIS-current
# support are unchanged under it).
BLIS_MAR = RoutingProfile("blis-mar", DEFAULT_SCORERS, {}, 0, 0)
# BLIS-current (f90a1e3a): its `weighted` default, its meanings of `queue-depth` and
# `precise-prefix-cache`, and its 50 ms old load signals and cache view (llm-d's defaults).
BLIS_CURRENT = RoutingProfile(
    "blis-current",
    "precise-prefix-cache:2,queue-depth:1,kv-utilization:1",
    {"queue-depth": "queue-depth@current", "precise-prefix-cache": "precise-prefix-cache@current"},
    50_000,
    50_000,
)
ROUTING_PROFILES: dict[str, RoutingProfile] = {p.name: p for p in (BLIS_MAR, BLIS_CURRENT)}


def routing_profile(name: str) -> RoutingProfile:
    if name not in ROUTING_PROFILES:
        raise unknown("routing profile", name, ROUTING_PROFILES)
    return ROUTING_PROFILES[name]


def resolve_scorers(scorers: str | None, profile: str, field: str | None = None) -> str | None:
    """The scorer list `profile` means by `scorers`: its default list when None (servesim's
    own profile leaves None alone: the routing module's default is that list), with each bare
    name whose meaning changed replaced by the profile's registered one. Anything malformed is
    left as it is, for the parser to report.

    With `field`, two entries that name the same scorer once resolved are refused here, named
    as given: the parser sees only the resolved list, in which `queue-depth:1` has become
    `queue-depth@current:1`."""
    prof = routing_profile(profile)
    if scorers is None or (isinstance(scorers, str) and not scorers.strip()):
        if prof is BLIS_MAR:
            return scorers
        scorers = prof.default_scorers
    if not isinstance(scorers, str):
        return scorers
    if field is not None:
        _refuse_repeats(scorers, prof, field)
    if not prof.meanings:
        return scorers
    pieces = []
    for piece in scorers.split(","):
        name, sep, rest = piece.partition(":")
        meant = prof.meanings.get(name.strip())
        pieces.append(f"{meant}{sep}{rest}" if meant else piece)
    return ",".join(pieces)


def _refuse_repeats(scorers: str, prof: RoutingProfile, field: str) -> None:
    """Refuse two well-formed entries of `scorers` that mean the same scorer under `prof`."""
    seen: dict[type[Scorer], str] = {}
    for raw in scorers.split(","):
        piece = raw.strip()
        name = piece.partition(":")[0].strip()
        meant = prof.meanings.get(name, name)
        if piece.count(":") != 1 or meant not in SCORERS:
            continue
        cls = SCORERS[meant]
        if cls in seen:
            first = seen[cls]
            renamed = sorted(
                {n.partition(":")[0].strip() for n in (first, piece)} & prof.meanings.keys()
            )
            why = "".join(f" ({prof.name} reads {n!r} as {prof.meanings[n]!r})" for n in renamed)
            raise _repeated(field, cls, first, piece, why)
        seen[cls] = piece


def resolve_routing(
    profile: str,
    *,
    scorers: str | None,
    snapshot_refresh_interval_us: int | None,
    cache_signal_delay_us: int | None,
) -> dict[str, str | int | None]:
    """The routing settings a scenario means under `profile` (unset = the profile's)."""
    prof = routing_profile(profile)
    return {
        # Relative to the routing spec, whose validator calls this (cluster.routing).
        "scorers": resolve_scorers(scorers, profile, field="scorers (--routing-scorers)"),
        "snapshot_refresh_interval_us": prof.snapshot_refresh_interval_us
        if snapshot_refresh_interval_us is None
        else snapshot_refresh_interval_us,
        "cache_signal_delay_us": prof.cache_signal_delay_us
        if cache_signal_delay_us is None
        else cache_signal_delay_us,
    }


# --------------------------------------------------------------------------- scorer syntax


def _valid_names() -> str:
    return ", ".join(sorted(SCORERS))


def _pinned_name(cls: type[Scorer]) -> str:
    """The name that means `cls` under every profile (`queue-depth@mar` for the scorer that a
    bare `queue-depth` means under blis-mar only)."""
    names = [n for n, c in SCORERS.items() if c is cls]
    return next((n for n in names if "@" in n), names[0])


def _repeated(field: str, cls: type[Scorer], first: str, piece: str, why: str = "") -> ConfigError:
    return invalid(
        field,
        piece,
        f"scorer {_pinned_name(cls)!r} is listed twice, as {first!r} and {piece!r}{why}; "
        "list it once",
    )


def _check_scorer(
    name: str, weight: float, piece: str, field: str, seen: dict[type[Scorer], str]
) -> tuple[str, float]:
    if name not in SCORERS:
        raise ConfigError(f"{field}: unknown scorer {name!r} in {piece!r}; valid: {_valid_names()}")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise invalid(field, piece, "the weight must be a number")
    if not math.isfinite(weight) or weight <= 0:
        raise invalid(field, piece, "the weight must be a finite number > 0")
    # By the scorer a name means, not by the name: `queue-depth` and `queue-depth@mar` are one
    # scorer, which would otherwise run twice at double weight.
    cls = SCORERS[name]
    if cls in seen:
        raise _repeated(field, cls, seen[cls], piece)
    seen[cls] = piece
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
    seen: dict[type[Scorer], str] = {}
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
    seen: dict[type[Scorer], str] = {}
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
    """Takes the candidates in turn, one turn counter per served model: the candidates of a
    request are its model's instances, and one counter shared by every model let the
    models' traffic take each other's turns (two models alternating on two instances each
    sent every request of one model to the same instance). A single-model run has one
    counter, as in BLIS."""

    name = "round-robin"

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}

    def route(
        self, req: Request, candidates: Sequence[InstanceSnapshot], now_us: int
    ) -> RoutingDecision:
        _require(candidates)
        pos = self.counters.get(candidates[0].model, 0) % len(candidates)
        return RoutingDecision(candidates[pos].index, f"round-robin[{pos}]")

    def observe(self, req: Request, chosen: InstanceSnapshot) -> None:
        # The turn passes when a choice is committed: PD routing asks the decode pool first
        # and drops the answer when the request goes to the unified pool instead, which gave
        # every disaggregated request of an alternating workload the same decode instance.
        self.counters[chosen.model] = self.counters.get(chosen.model, 0) + 1


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


def _composite(terms: list[tuple[float, Sequence[float]]], n: int) -> list[float]:
    """Composite scores in candidate order: per candidate 0.0 + w₁·clamp01(s₁) + w₂·clamp01(s₂)
    + …, added in the terms' order (`terms`: (weight, scores in candidate order))."""
    if len(terms) == 2:
        # The usual case (the default scorers' two load terms, prefix-affinity's zeros
        # skipped) in one pass instead of two: the same additions in the same order.
        (w1, scores1), (w2, scores2) = terms
        if len(scores1) == n:
            return [
                0.0
                + w1 * (0.0 if s1 < 0.0 else 1.0 if s1 > 1.0 else s1)
                + w2 * (0.0 if s2 < 0.0 else 1.0 if s2 > 1.0 else s2)
                for s1, s2 in zip(scores1, scores2, strict=True)
            ]
    composite = [0.0] * n
    for weight, scores in terms:
        composite = [
            total + weight * (0.0 if s < 0.0 else 1.0 if s > 1.0 else s)
            for total, s in zip(composite, scores, strict=True)
        ]
    return composite


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
        # Whose all-zero score lists `route` may skip: a built-in scorer's (plain Python
        # floats) with a finite weight (w·0.0 is 0.0, or -0.0 for w < 0).
        self._skip_zeros = [
            type(s) in _BUILT_IN_SCORERS and math.isfinite(w) for s, w in self.scorers
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
        terms = []
        for (_, weight), score_list, skip_zeros in zip(
            self.scorers, self._score_lists, self._skip_zeros, strict=True
        ):
            scores = score_list(req, candidates)
            # A built-in scorer's all-zero list (prefix-affinity for a prompt nobody shares)
            # adds nothing: t + 0.0 is t for every total, none being -0.0 (they start at 0.0,
            # and a sum is -0.0 only when both terms are).
            if skip_zeros and not any(scores):
                continue
            terms.append((weight, scores))
        composite = _composite(terms, len(candidates))
        best = max(composite)
        if best == best and composite.count(best) == 1:
            # One best candidate (the usual case), found in C rather than through a tie list;
            # a NaN best (never equal to itself) takes the general path, as before.
            chosen = candidates[composite.index(best)]
        else:
            tied = [c for c, total in zip(candidates, composite, strict=True) if total == best]
            chosen = self.break_tie(req, tied) if len(tied) > 1 else tied[0]
        scores = ScoresByInstance(candidates, composite)
        return RoutingDecision(chosen.index, f"weighted (score={best:.4f})", scores)

    def break_tie(self, req: Request, tied: list[InstanceSnapshot]) -> InstanceSnapshot:
        """One of the equally best candidates (two or more, in candidate order), uniformly at
        random from the router's generator. BLIS draws the same way from a Go generator, so
        its tie-breaks are not reproduced draw for draw."""
        return tied[int(self.rng.integers(len(tied)))]

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
    private_blocks_by_count: bool = True,
) -> RoutingPolicy:
    """Build routing policy `name`. `scorers` (weighted only) defaults to DEFAULT_SCORERS;
    it is validated for every policy so that a typo is reported even where it is unused.
    `private_blocks_by_count` is the accelerated prefix-affinity bookkeeping
    (engine/options.py); off, every block is hashed."""
    check_routing_policy_name(name)
    if scorers is None or (isinstance(scorers, str) and not scorers.strip()):
        parsed = parse_scorers(DEFAULT_SCORERS, scorers_field)
    elif isinstance(scorers, str):
        parsed = parse_scorers(scorers, scorers_field)
    else:
        parsed = check_scorers(scorers, scorers_field)
    policy = ROUTING_POLICIES[name].build(
        scorers=parsed, rng=rng, block_size=block_size, kv_probe=kv_probe
    )
    for scorer, _weight in getattr(policy, "scorers", ()):
        if isinstance(scorer, PrefixAffinityScorer):
            scorer.private_blocks_by_count = private_blocks_by_count
    return policy
