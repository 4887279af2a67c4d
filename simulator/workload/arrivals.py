"""Arrival processes, registered by name: inter-arrival gaps in whole µs (at least 1)."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, unknown


class ArrivalProcess:
    name = ""

    def __init__(self, rate_per_s: float) -> None:
        if not (rate_per_s > 0 and np.isfinite(rate_per_s)):
            raise ConfigError(f"rate: invalid value {rate_per_s!r}; must be a finite number > 0")
        self.rate_per_s = float(rate_per_s)

    def gaps_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        raise NotImplementedError

    def arrival_times_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """Absolute arrival times: the first request arrives one gap after t = 0."""
        return np.cumsum(self.gaps_us(rng, count))


class PoissonArrivals(ArrivalProcess):
    name = "poisson"

    def gaps_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        gaps = rng.exponential(1e6 / self.rate_per_s, count).astype(np.int64)
        return np.maximum(gaps, 1)


class ConstantArrivals(ArrivalProcess):
    """Evenly spaced, floor(1/rate) apart (BLIS-Mar's CLI "distribution" mode)."""

    name = "constant"

    def gaps_us(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.full(count, max(1, int(1e6 / self.rate_per_s)), dtype=np.int64)


ARRIVAL_PROCESSES: dict[str, type[ArrivalProcess]] = {
    cls.name: cls for cls in (PoissonArrivals, ConstantArrivals)
}


def make_arrivals(name: str, rate_per_s: float) -> ArrivalProcess:
    if name not in ARRIVAL_PROCESSES:
        raise unknown("arrival process", name, ARRIVAL_PROCESSES)
    return ARRIVAL_PROCESSES[name](rate_per_s)
