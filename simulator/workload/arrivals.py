"""Arrival processes, registered by name: inter-arrival gaps in whole µs (at least 1).

Every process keeps BLIS's parameterisation (docs/behaviour.md §9.2) so a v2 workload file means the
same traffic here: `rate_per_s` fixes the mean gap (1e6 / rate µs) and `cv`, where a process takes
one, fixes the gaps' coefficient of variation. Gaps are truncated to whole µs and floored at 1,
as BLIS does, so a process never emits two arrivals at the same instant.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from ..errors import ConfigError, invalid, unknown
from ..limits import MAX_TIME_US, check_time_us

log = logging.getLogger("servesim")

# BLIS falls back to Poisson below this gamma shape (cv > 10): the gamma's mass piles up at
# zero and the 1 µs floor would distort the rate anyway.
MIN_GAMMA_SHAPE = 0.01
WEIBULL_CV_RANGE = (0.01, 10.4)
# Bisection bracket for the Weibull shape; CV(k) is monotone decreasing on it. BLIS searches
# [0.1, 100], whose smallest CV is 0.0127, so cv 0.01 (allowed by its own validation) cannot be
# met there; the upper end is raised to 200 (CV 0.0064) so the whole allowed range is reachable.
_WEIBULL_K_RANGE = (0.1, 200.0)


# Gaps are capped just beyond the clock's range (MAX_TIME_US, about 285 years): a vanishing
# rate cannot overflow the int64 conversion into a negative gap, and a capped gap still lands
# beyond the clock, where the generator refuses it (no run can use it). 2^53 + 2 is the first
# float64 above 2^53 (2^53 + 1 would round back onto the clock).
MAX_GAP_US = MAX_TIME_US + 2


def _floor_gaps(gaps_us: np.ndarray) -> np.ndarray:
    # Truncate (not round) like BLIS's int64 conversion; 1 µs floor keeps time strictly moving.
    return np.maximum(np.minimum(gaps_us, MAX_GAP_US).astype(np.int64), 1)


class ArrivalProcess:
    name = ""

    def __init__(self, rate_per_s: float, cv: float | None = None) -> None:
        if not (rate_per_s > 0 and np.isfinite(rate_per_s)):
            raise ConfigError(f"rate: invalid value {rate_per_s!r}; must be a finite number > 0")
        if cv is not None and not (cv > 0 and math.isfinite(cv)):
            raise invalid("arrival.cv", cv, "must be a finite number > 0")
        self.rate_per_s = float(rate_per_s)
        self.cv = cv

    @property
    def mean_gap_us(self) -> float:
        return 1e6 / self.rate_per_s

    def gaps_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        raise NotImplementedError

    def arrival_times_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """Absolute arrival times: the first request arrives one gap after t = 0. Refused
        (ConfigError) when the last one lies beyond the simulator's clock."""
        gaps = self.gaps_us(rng, count)
        # Summed in float first: an int64 cumsum of many capped gaps would wrap around.
        if count and float(gaps.sum(dtype=np.float64)) > MAX_TIME_US:
            total = int(gaps.sum(dtype=object))
            check_time_us(total, f"rate {self.rate_per_s:g} requests/s: arrival {count} of {count}")
        return np.cumsum(gaps)


class PoissonArrivals(ArrivalProcess):
    """Exponential gaps (CV 1); `cv` is ignored."""

    name = "poisson"

    def gaps_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return _floor_gaps(rng.exponential(self.mean_gap_us, count))


class ConstantArrivals(ArrivalProcess):
    """Evenly spaced, floor(1/rate) apart (BLIS-Mar's CLI "distribution" mode)."""

    name = "constant"

    def gaps_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        # BLIS's float steps, not 1e6 / rate: the rate per µs first, then its inverse. At 10
        # req/s that is 99,999 µs (1e-05 is a hair above a hundred-thousandth), not 100,000.
        gap_us = 1.0 / (self.rate_per_s / 1e6)
        return np.full(count, max(1, int(min(gap_us, MAX_GAP_US))), dtype=np.int64)


class GammaArrivals(ArrivalProcess):
    """Gamma gaps with shape 1/cv² and scale cv²·mean (cv default 1 = Poisson-like).

    cv > 1 gives bursty traffic (ServeGen's fit for large models). BLIS samples with
    Marsaglia–Tsang; numpy's gamma sampler draws from the same law. A fitted `shape` and
    `scale_us` replace the cv and the rate altogether (`fit_shape_scale`).
    """

    name = "gamma"

    def __init__(
        self,
        rate_per_s: float,
        cv: float | None = None,
        shape: float | None = None,
        scale_us: float | None = None,
    ) -> None:
        super().__init__(rate_per_s, cv)
        cv_eff = 1.0 if cv is None else cv
        self.shape = 1.0 / (cv_eff * cv_eff)
        self.scale_us = self.mean_gap_us * cv_eff * cv_eff
        fitted = fit_shape_scale(self.name, shape, scale_us)
        if fitted:
            self.shape, self.scale_us = float(shape), float(scale_us)
        # The fallback replaces a cv too large to sample; a fitted law is sampled as given
        # (BLIS too: shape 0.005 gives its mean gap shape x scale and a CV near 14).
        self.falls_back_to_poisson = not fitted and self.shape < MIN_GAMMA_SHAPE
        if self.falls_back_to_poisson:
            log.warning(
                "gamma arrival shape %.4f (cv=%.2f) is below %.2f; using Poisson as BLIS does",
                self.shape,
                cv_eff,
                MIN_GAMMA_SHAPE,
            )

    def gaps_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if self.falls_back_to_poisson:
            return _floor_gaps(rng.exponential(self.mean_gap_us, count))
        return _floor_gaps(rng.gamma(self.shape, self.scale_us, count))


def weibull_cv(shape_k: float) -> float:
    """Coefficient of variation of a Weibull law with shape k."""
    g1 = math.gamma(1.0 + 1.0 / shape_k)
    g2 = math.gamma(1.0 + 2.0 / shape_k)
    return math.sqrt(g2 / (g1 * g1) - 1.0)


def weibull_shape_for_cv(target_cv: float) -> float:
    """Shape k whose CV is `target_cv`, by bisection on [0.1, 200] (stops at |ΔCV| < 0.001).

    BLIS stops at a CV tolerance of 0.001 after at most 100 halvings; the same tolerance is
    kept so both simulators pick practically the same k.
    """
    lo, hi = _WEIBULL_K_RANGE
    for _ in range(100):
        mid = (lo + hi) / 2.0
        cv = weibull_cv(mid)
        if abs(cv - target_cv) < 0.001:
            return mid
        if cv > target_cv:  # CV falls as k grows
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


class WeibullArrivals(ArrivalProcess):
    """Weibull gaps: shape k solved so the CV matches, scale = mean / Γ(1 + 1/k)."""

    name = "weibull"

    def __init__(
        self,
        rate_per_s: float,
        cv: float | None = None,
        shape: float | None = None,
        scale_us: float | None = None,
    ) -> None:
        super().__init__(rate_per_s, cv)
        if fit_shape_scale(self.name, shape, scale_us):
            # A fitted law: the cv (and its range check) plays no part, as in BLIS.
            self.shape_k, self.scale_us = float(shape), float(scale_us)
            return
        cv_eff = 1.0 if cv is None else cv
        lo, hi = WEIBULL_CV_RANGE
        if not lo <= cv_eff <= hi:
            raise invalid("arrival.cv", cv_eff, f"weibull cv must be in [{lo}, {hi}]")
        self.shape_k = weibull_shape_for_cv(cv_eff)
        self.scale_us = self.mean_gap_us / math.gamma(1.0 + 1.0 / self.shape_k)

    def gaps_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return _floor_gaps(self.scale_us * rng.weibull(self.shape_k, count))


def fit_shape_scale(process: str, shape: float | None, scale_us: float | None) -> bool:
    """Do a fitted shape and scale (µs) replace the cv/rate law? Only when both are given and
    positive; a given one that is not is warned about and the cv law is used (BLIS)."""
    if shape is None and scale_us is None:
        return False
    if shape is not None and scale_us is not None and shape > 0 and scale_us > 0:
        return True
    log.warning(
        "%s arrival: shape %s and scale %s must both be > 0 to be used; using the cv and "
        "the rate instead",
        process,
        shape,
        scale_us,
    )
    return False


ARRIVAL_PROCESSES: dict[str, type[ArrivalProcess]] = {
    cls.name: cls for cls in (PoissonArrivals, ConstantArrivals, GammaArrivals, WeibullArrivals)
}
# The processes a fitted shape and scale apply to.
SHAPED_PROCESSES = ("gamma", "weibull")


def make_arrivals(
    name: str,
    rate_per_s: float,
    cv: float | None = None,
    shape: float | None = None,
    scale_us: float | None = None,
) -> ArrivalProcess:
    """The arrival process `name` at `rate_per_s` requests/s; `cv` for gamma and weibull, or
    their fitted `shape` and `scale_us` (both > 0), which then fix the gaps on their own."""
    if name not in ARRIVAL_PROCESSES:
        raise unknown("arrival process", name, ARRIVAL_PROCESSES)
    if name in SHAPED_PROCESSES:
        return ARRIVAL_PROCESSES[name](rate_per_s, cv, shape, scale_us)
    return ARRIVAL_PROCESSES[name](rate_per_s, cv)
