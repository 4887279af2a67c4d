"""Speculative decoding, as vLLM V1 runs it (docs/speculative.md).

Each step, every decoding request carries `k` proposed tokens (drafts) besides the token it
last sampled; the target model verifies all `k + 1` in one forward pass and keeps the drafts up
to the first rejected one, plus one token of its own (the correction, or the bonus token when
every draft was accepted): between 1 and k + 1 tokens per request per step.

This module holds the rules as plain objects, testable without SimPy or an engine:

* `AcceptanceModel`: per-position acceptance α_j (the chance the j-th draft is accepted given
  the ones before it were); the number accepted is drawn from one seeded uniform per
  verification.
* Drafters (`DRAFTERS`, by vLLM's method name): what proposing `k` tokens for a batch costs.
  `draft_model` prices a separate model by its own step-time model, `eagle` and `mtp` price
  their few layers as that share of the target's decode step, `ngram` is a prompt lookup on
  the CPU (a fixed cost per step, 0 by default).
* `SpeculativeConfig`: what an engine needs; `SpecStats`: what it reports.

`VLLMEngine` (batching.py) applies them: KV for the proposals, the token budget, the pricing
of the verification as a chunk of k + 1 query tokens per request, the accepted tokens.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, invalid, unknown
from ..rng import subsystem_rng

# A drafting pass of the draft model (or head) over `n` requests whose contexts sum to
# `context_sum`: its duration, µs.
DecodePrice = Callable[[int, int], int]

_UNIFORMS_PER_DRAW = 4096  # uniforms drawn from the stream at a time (the values do not change)


class AcceptanceModel:
    """Per-position acceptance: draft j (1-based) is accepted with probability α_j given that
    drafts 1..j-1 were; the first rejection ends the run. `rates` lists α_1, α_2, ...; the last
    one repeats for positions beyond the list (one number: the same α everywhere)."""

    __slots__ = ("rates", "_survival")

    def __init__(self, rates: float | Sequence[float]) -> None:
        values = (rates,) if isinstance(rates, int | float) else tuple(rates)
        if not values:
            raise ValueError("acceptance rates: give at least one")
        for i, a in enumerate(values):
            if isinstance(a, bool) or not isinstance(a, int | float) or not 0.0 <= a <= 1.0:
                raise ValueError(f"acceptance rate {i + 1}: {a!r} must be a number in [0, 1]")
        self.rates = tuple(float(a) for a in values)
        self._survival: dict[int, tuple[float, ...]] = {}

    def rate(self, position: int) -> float:
        """α of draft `position` (1-based)."""
        return self.rates[min(position, len(self.rates)) - 1]

    def survival(self, k: int) -> tuple[float, ...]:
        """P(at least j drafts accepted) for j = 1..k: α_1·…·α_j."""
        cached = self._survival.get(k)
        if cached is None:
            out = []
            p = 1.0
            for j in range(1, k + 1):
                p *= self.rate(j)
                out.append(p)
            cached = self._survival[k] = tuple(out)
        return cached

    def expected_tokens(self, k: int) -> float:
        """Tokens a verification of `k` drafts yields on average: 1 + Σ_j P(≥ j accepted).
        With one α: (1 − α^(k+1)) / (1 − α), k + 1 at α = 1."""
        return 1.0 + sum(self.survival(k))

    def accepted(self, u: float, k: int) -> int:
        """Drafts accepted out of `k` for a uniform draw `u` in [0, 1): the largest j with
        u < P(≥ j accepted) (inverse transform: one draw per verification)."""
        a = 0
        for p in self.survival(k):
            if u < p:
                a += 1
            else:
                break
        return a


class Drafter:
    """How a method proposes drafts and what that costs. Subclasses set `name`."""

    name = ""
    # vLLM reserves KV for the next step's drafts (`num_lookahead_tokens`) for methods whose
    # drafter writes KV in the shared block table (EAGLE, MTP, a draft model), not for n-gram.
    reserves_lookahead = True

    def draft_us(self, requests: int, context_sum: int, k: int) -> int:
        """Time to propose `k` drafts for each of `requests` requests whose contexts (tokens
        already in KV) sum to `context_sum`."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"method": self.name}


class NgramDrafter(Drafter):
    """Prompt lookup (vLLM `ngram`): the drafts are copied from an earlier occurrence of the
    last tokens in the context, found on the CPU. No forward pass; `overhead_us` per step."""

    name = "ngram"
    reserves_lookahead = False

    def __init__(self, overhead_us: int = 0) -> None:
        self.overhead_us = overhead_us

    def draft_us(self, requests: int, context_sum: int, k: int) -> int:
        return self.overhead_us if requests and k else 0


class SequentialDrafter(Drafter):
    """A drafter that runs `k` passes one after another, each a decode step of the draft over
    the batch, contexts growing by one token per pass (vLLM's EAGLE and draft-model proposers
    loop this way). `pass_us(n, context_sum)` prices one pass."""

    def __init__(self, pass_us: DecodePrice, overhead_us: int = 0, detail: dict | None = None):
        self.pass_us = pass_us
        self.overhead_us = overhead_us
        self.detail = detail or {}

    def draft_us(self, requests: int, context_sum: int, k: int) -> int:
        if not requests or not k:
            return 0
        total = self.overhead_us
        for j in range(k):
            total += self.pass_us(requests, context_sum + j * requests)
        return total

    def describe(self) -> dict:
        return {"method": self.name, **self.detail}


class DraftModelDrafter(SequentialDrafter):
    """A separate, smaller model (vLLM `draft_model`), priced by its own step-time model."""

    name = "draft_model"


class EagleDrafter(SequentialDrafter):
    """An EAGLE head (vLLM `eagle`, `eagle3`): one or a few decoder layers on the target's
    hidden states, priced as that share of the target's decode step."""

    name = "eagle"


class MTPDrafter(SequentialDrafter):
    """Multi-token-prediction layers of the target model itself (DeepSeek-V3's, vLLM `mtp`),
    priced as that share of the target's decode step."""

    name = "mtp"


DRAFTERS: dict[str, type[Drafter]] = {
    cls.name: cls for cls in (DraftModelDrafter, EagleDrafter, NgramDrafter, MTPDrafter)
}


def layer_share_price(decode_price: DecodePrice, layers: int, target_layers: int) -> DecodePrice:
    """One pass of `layers` layers of the target's shape: the target's decode step for the
    same batch, scaled by layers / target_layers, truncated to whole µs (at least 1)."""
    share = layers / target_layers

    def price(n: int, context_sum: int) -> int:
        return max(1, int(decode_price(n, context_sum) * share))

    return price


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding for one instance."""

    drafter: Drafter
    num_speculative_tokens: int
    acceptance: AcceptanceModel
    # Per client id (workload client or trace client), an acceptance model of its own.
    acceptance_by_client: dict[str, AcceptanceModel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise invalid("speculative.num_speculative_tokens", k, "must be an integer >= 1")

    @property
    def lookahead_tokens(self) -> int:
        """KV slots reserved beyond the verified tokens for the drafter's next proposals."""
        return self.num_speculative_tokens if self.drafter.reserves_lookahead else 0

    def acceptance_for(self, client_id: str) -> AcceptanceModel:
        return self.acceptance_by_client.get(client_id, self.acceptance)

    def describe(self) -> dict:
        """What the run's provenance records about speculation."""
        k = self.num_speculative_tokens
        return {
            **self.drafter.describe(),
            "num_speculative_tokens": k,
            "acceptance_rate": list(self.acceptance.rates),
            "expected_tokens_per_verification": round(self.acceptance.expected_tokens(k), 4),
            "lookahead_tokens": self.lookahead_tokens,
        }


class SpecStats:
    """What speculation did on one instance: verifications, drafts proposed and accepted,
    the accepted-length histogram, and the time spent drafting."""

    __slots__ = (
        "verifications",
        "proposed",
        "accepted",
        "accepted_histogram",
        "draft_us",
        "burst_gaps",
    )

    def __init__(self, k: int) -> None:
        self.verifications = 0  # (request, step) pairs that verified at least one draft
        self.proposed = 0
        self.accepted = 0
        # accepted_histogram[a]: verifications that accepted exactly a drafts
        self.accepted_histogram = [0] * (k + 1)
        self.draft_us = 0
        # Inter-token gaps inside a burst (the 2nd..last token of one verification): each is
        # the per-token output overhead (0 for most step-time models).
        self.burst_gaps = 0

    def record(self, k: int, a: int) -> None:
        self.verifications += 1
        self.proposed += k
        self.accepted += a
        self.accepted_histogram[a] += 1


class Speculation:
    """An engine's speculative-decoding state: the config, its seeded draws, its stats."""

    __slots__ = ("config", "k", "lookahead", "stats", "_rng", "_uniforms", "_next", "_models")

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.k = config.num_speculative_tokens
        self.lookahead = config.lookahead_tokens
        self.stats = SpecStats(self.k)
        # A run seeds each instance's own stream (`seed`); this default serves a lone engine.
        self._rng: np.random.Generator = subsystem_rng(0, "speculative")
        self._uniforms = array("d")
        self._next = 0
        self._models: dict[str, AcceptanceModel] = {}

    def seed(self, rng: np.random.Generator) -> None:
        """The stream acceptance draws come from (rng.subsystem_rng, one per instance)."""
        self._rng = rng
        self._uniforms = array("d")
        self._next = 0

    def proposals(self, budget: int, computed: int, max_model_len: int) -> int:
        """Drafts verified this step by a decoding request with `computed` tokens in KV and
        `budget` tokens left in the step: k, cut to what the budget holds beside the sampled
        token and to the context limit (vLLM trims the drafts to the scheduled tokens)."""
        k = self.k
        if budget - 1 < k:
            k = budget - 1
        if max_model_len > 0 and max_model_len - 2 - computed < k:
            k = max_model_len - 2 - computed
        return k if k > 0 else 0

    def draw_accepted(self, client_id: str, k: int) -> int:
        """Drafts accepted out of `k` for a request of `client_id`, recorded in the stats."""
        u = self._uniform()
        model = self._models.get(client_id)
        if model is None:
            model = self._models[client_id] = self.config.acceptance_for(client_id)
        a = model.accepted(u, k)
        self.stats.record(k, a)
        return a

    def draft_us(self, requests: int, context_sum: int) -> int:
        return self.config.drafter.draft_us(requests, context_sum, self.k)

    def _uniform(self) -> float:
        if self._next >= len(self._uniforms):
            self._uniforms = array("d", self._rng.random(_UNIFORMS_PER_DRAW).tolist())
            self._next = 0
        u = self._uniforms[self._next]
        self._next += 1
        return u


def summary_fields(stats: Sequence[SpecStats], step_us_total: int) -> dict:
    """The summary's speculative-decoding fields over `stats` (one per engine) and the total
    step time of those engines."""
    verifications = sum(s.verifications for s in stats)
    proposed = sum(s.proposed for s in stats)
    accepted = sum(s.accepted for s in stats)
    draft_us = sum(s.draft_us for s in stats)
    k = max((len(s.accepted_histogram) for s in stats), default=1)
    histogram = [0] * k
    for s in stats:
        for a, count in enumerate(s.accepted_histogram):
            histogram[a] += count
    return {
        "spec_verifications": verifications,
        "spec_proposed_tokens": proposed,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / proposed if proposed else None,
        # Tokens per verification, the drafts accepted plus the target's own token.
        "spec_mean_acceptance_length": 1 + accepted / verifications if verifications else None,
        "spec_draft_time_share": draft_us / step_us_total if step_us_total else None,
        "spec_verify_time_share": 1 - draft_us / step_us_total if step_us_total else None,
        "spec_accepted_length_histogram": histogram,
        # vLLM's per-position rate: verifications whose draft j was accepted, per verification.
        "spec_per_position_acceptance": [
            sum(histogram[j:]) / verifications if verifications else None for j in range(1, k)
        ],
    }


def parse_acceptance(field_name: str, value: object) -> AcceptanceModel:
    """An acceptance model from a number or a list of numbers, or a ConfigError naming the
    field."""
    try:
        return AcceptanceModel(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise invalid(
            field_name, value, f"must be a number in [0, 1] or a list of them ({exc})"
        ) from None


def make_drafter(name: str, **kwargs) -> Drafter:
    cls = DRAFTERS.get(name)
    if cls is None:
        raise unknown("speculative method", name, DRAFTERS)
    return cls(**kwargs)


def reserve_kv_blocks(
    blocks: int, pool_bytes: float, reserved_bytes: float, extra_kv_share: float, what: str
) -> int:
    """KV blocks left when `reserved_bytes` of the KV pool (`pool_bytes`, all GPUs) hold
    something else (weights of a drafter, LoRA adapters) and every block also stores
    `extra_kv_share` times its bytes for extra layers (a drafter's own KV)."""
    if pool_bytes <= 0:
        return blocks
    left = int(blocks * (pool_bytes - reserved_bytes) / pool_bytes / (1.0 + extra_kv_share))
    if left <= 0:
        raise ConfigError(
            f"{what}: needs {reserved_bytes / 2**30:.2f} GiB of the KV cache's "
            f"{pool_bytes / 2**30:.2f} GiB, leaving no KV block; use more GPUs per instance"
        )
    return left
