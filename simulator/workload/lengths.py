"""Token-length distributions, registered by name. Samples are whole tokens, at least 1."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, unknown


class LengthDistribution:
    name = ""

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        raise NotImplementedError


class ConstantLength(LengthDistribution):
    name = "constant"

    def __init__(self, value: int) -> None:
        if value < 0:
            raise ConfigError(f"constant length: invalid value {value!r}; must be >= 0")
        self.value = int(value)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.full(count, self.value, dtype=np.int64)


class GaussianLength(LengthDistribution):
    """round(N(mean, stdev)) clamped to [min, max] (BLIS's Gaussian; min == max is constant)."""

    name = "gaussian"

    def __init__(self, mean: float, stdev: float, min: int = 1, max: int = 1 << 30) -> None:  # noqa: A002
        if stdev < 0:
            raise ConfigError(f"gaussian stdev: invalid value {stdev!r}; must be >= 0")
        if min > max:
            raise ConfigError(f"gaussian min/max: invalid range [{min}, {max}]; need min <= max")
        if min < 1:
            raise ConfigError(f"gaussian min: invalid value {min!r}; must be >= 1")
        self.mean, self.stdev, self.lo, self.hi = float(mean), float(stdev), int(min), int(max)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if self.stdev == 0 or self.lo == self.hi:
            values = np.full(count, round(self.mean), dtype=np.int64)
        else:
            values = np.rint(rng.normal(self.mean, self.stdev, count)).astype(np.int64)
        return np.clip(values, self.lo, self.hi)


LENGTH_DISTRIBUTIONS: dict[str, type[LengthDistribution]] = {
    cls.name: cls for cls in (ConstantLength, GaussianLength)
}


def make_length(name: str, **params) -> LengthDistribution:
    if name not in LENGTH_DISTRIBUTIONS:
        raise unknown("length distribution", name, LENGTH_DISTRIBUTIONS)
    return LENGTH_DISTRIBUTIONS[name](**params)
