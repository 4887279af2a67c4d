"""Admission policies: the first gate a request meets at the cluster (docs/behaviour.md §6.3).

A policy sees the request, the clock and the routable instances' snapshots, and answers
(admitted, reason). A rejected request never reaches an instance; the cluster counts it.
Policies never read the request's output length (INV-9): only `input_tokens` is used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..engine.request import Request
from ..errors import invalid, is_finite_positive, unknown
from ..limits import MAX_TOKEN_BUCKET_TOKENS, MAX_TOKEN_RATE_PER_S
from .snapshot import InstanceSnapshot

# BLIS's flag defaults (--token-bucket-capacity, --token-bucket-refill-rate).
DEFAULT_TOKEN_BUCKET_CAPACITY = 10_000.0
DEFAULT_TOKEN_BUCKET_REFILL_RATE = 1_000.0
# The bucket's parameters as a scenario names them (errors are told with these).
CAPACITY_FIELD = "cluster.admission.token_bucket_capacity (--token-bucket-capacity)"
REFILL_RATE_FIELD = "cluster.admission.token_bucket_refill_rate (--token-bucket-refill-rate)"


class AdmissionPolicy:
    """Base class: decide whether a request enters the cluster."""

    name = ""
    # Whether admit() reads instance snapshots; the router skips building them otherwise.
    uses_snapshots = False

    def admit(
        self, req: Request, now_us: int, snapshots: Sequence[InstanceSnapshot]
    ) -> tuple[bool, str]:
        raise NotImplementedError


class AlwaysAdmit(AdmissionPolicy):
    name = "always-admit"

    def admit(
        self, req: Request, now_us: int, snapshots: Sequence[InstanceSnapshot]
    ) -> tuple[bool, str]:
        return True, "always-admit"


class TokenBucket(AdmissionPolicy):
    """Rate-limits prompt tokens: a bucket of `capacity` tokens refilled at `refill_rate`/s.

    The bucket starts full with its last refill at t = 0, so the first decision refills from
    0 (capped): a burst of up to `capacity` prompt tokens is admitted at once.
    """

    name = "token-bucket"

    def __init__(self, capacity_tokens: float, refill_rate_tokens_per_s: float) -> None:
        _check_positive("token_bucket_capacity", capacity_tokens, MAX_TOKEN_BUCKET_TOKENS)
        _check_positive("token_bucket_refill_rate", refill_rate_tokens_per_s, MAX_TOKEN_RATE_PER_S)
        self.capacity_tokens = float(capacity_tokens)
        self.refill_rate_tokens_per_s = float(refill_rate_tokens_per_s)
        self.tokens = self.capacity_tokens
        self.last_refill_us = 0

    def admit(
        self, req: Request, now_us: int, snapshots: Sequence[InstanceSnapshot]
    ) -> tuple[bool, str]:
        elapsed_us = now_us - self.last_refill_us
        if elapsed_us > 0:
            refill = elapsed_us * self.refill_rate_tokens_per_s / 1e6
            self.tokens = min(self.capacity_tokens, self.tokens + refill)
            self.last_refill_us = now_us
        cost = req.input_tokens
        if self.tokens >= cost:
            self.tokens -= cost
            return True, "token-bucket"
        # Rounded down: 99.9985 tokens shown as "100.0 < 100" read as a contradiction.
        shown = math.floor(self.tokens * 10) / 10
        return False, f"token-bucket: insufficient tokens ({shown:.1f} < {cost})"


class RejectAll(AdmissionPolicy):
    """Pathological: rejects everything (exercises the rejection accounting)."""

    name = "reject-all"

    def admit(
        self, req: Request, now_us: int, snapshots: Sequence[InstanceSnapshot]
    ) -> tuple[bool, str]:
        return False, "reject-all"


ADMISSION_POLICIES: dict[str, type[AdmissionPolicy]] = {
    cls.name: cls for cls in (AlwaysAdmit, TokenBucket, RejectAll)
}


def make_admission_policy(
    name: str,
    token_bucket_capacity: float | None = None,
    token_bucket_refill_rate: float | None = None,
) -> AdmissionPolicy:
    """Build the policy `name`; the bucket parameters are used by `token-bucket` only. Errors
    name the parameters by their scenario paths, where they come from."""
    if name not in ADMISSION_POLICIES:
        raise unknown("admission policy", name, ADMISSION_POLICIES)
    if name == TokenBucket.name:
        for field, value, most in (
            (CAPACITY_FIELD, token_bucket_capacity, MAX_TOKEN_BUCKET_TOKENS),
            (REFILL_RATE_FIELD, token_bucket_refill_rate, MAX_TOKEN_RATE_PER_S),
        ):
            # Unlike BLIS (10,000 tokens, 1,000 tokens/s by default), the bucket must be sized
            # explicitly: its behaviour is entirely in these two numbers.
            if value is None:
                raise invalid(
                    field,
                    value,
                    "token-bucket admission needs it; BLIS's defaults are "
                    f"{DEFAULT_TOKEN_BUCKET_CAPACITY:g} tokens and "
                    f"{DEFAULT_TOKEN_BUCKET_REFILL_RATE:g} tokens/s",
                )
            _check_positive(field, value, most)
        return TokenBucket(token_bucket_capacity, token_bucket_refill_rate)
    return ADMISSION_POLICIES[name]()


def _check_positive(field: str, value: float, most: float) -> None:
    # The scenario schema bounds both already; this guards calls from Python.
    if not (is_finite_positive(value) and value <= most):
        raise invalid(field, value, f"must be a finite number > 0 and at most {most:g}")
