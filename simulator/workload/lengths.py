"""Token-length distributions, registered by name. Samples are whole tokens, at least 1.

The v2 workload schema names a distribution with a `DistSpec {type, params, file}`;
`from_dist_spec` turns one into a sampler and checks its parameters, naming the field of the
workload file in every error. Parameter names are BLIS's (docs/behaviour.md §9.2):

* gaussian {mean, std_dev, min, max}: N(mean, std_dev) clamped to [min, max], rounded;
  min == max (or std_dev 0) gives a constant.
* exponential {mean[, min, max]}: Exp(mean), clamped to [min, max] when given, rounded.
* lognormal {mu, sigma[, min, max]}: exp(mu + sigma·Z), clamped, rounded (current BLIS).
* pareto_lognormal {alpha, xm, mu, sigma, mix_weight}: with probability mix_weight a Pareto
  draw xm / U^(1/alpha), otherwise a lognormal exp(mu + sigma·Z); rounded.
* constant {value}.
* empirical: a probability table {tokens: probability}, inline in `params` (keys are the token
  counts written as strings) or in `file` (YAML/JSON mapping, or CSV `tokens,probability`
  with an optional header). Probabilities are normalised; zero-probability rows are ignored.

Every sampler floors its results at `floor` (1 for token lengths; 0 for counts such as the
number of images in a multimodal prompt) and caps them at MAX_TOKENS (10^8, simulator/limits.py):
the bound of a request's size that the schema and the trace reader enforce, so that a far-tail
draw of an unbounded law (exponential or lognormal without `max`, a Pareto) is that bound, not
a request that no trace can hold. A value the user writes beyond it (a constant, a table's
token count) is refused instead.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError, excerpt, unknown
from ..input_files import check_path, csv_records, load_json, load_yaml, read_text
from ..limits import MAX_TOKENS

if TYPE_CHECKING:
    from .spec import DistSpec


class LengthDistribution:
    name = ""
    floor = 1

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """`count` whole-token samples (int64), each from `floor` to MAX_TOKENS."""
        return np.clip(self._draw(rng, count), self.floor, MAX_TOKENS)

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        raise NotImplementedError

    @property
    def mean(self) -> float:
        """Mean of the law before rounding and flooring (for docs and sanity checks)."""
        raise NotImplementedError


def _round(values: np.ndarray) -> np.ndarray:
    # Half away from zero like Go's math.Round; values here are never negative in practice,
    # and np.rint's banker's rounding would bias x.5 draws downwards.
    return np.floor(values + 0.5).astype(np.int64)


def _need(condition: bool, field: str, value: object, allowed: str) -> None:
    if not condition:
        raise ConfigError(f"{field}: invalid value {excerpt(value)}; {allowed}")


class ConstantLength(LengthDistribution):
    name = "constant"

    def __init__(self, value: int, *, floor: int = 1, where: str = "constant length") -> None:
        _need(
            0 <= value <= MAX_TOKENS,
            f"{where}.value",
            value,
            f"must be from 0 to {MAX_TOKENS:,} tokens, the bound of a request's size",
        )
        self.value = int(value)
        self.floor = floor

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.full(count, self.value, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(max(self.value, self.floor))


class GaussianLength(LengthDistribution):
    """round(N(mean, stdev)) clamped to [min, max] (BLIS's Gaussian; min == max is constant)."""

    name = "gaussian"

    def __init__(
        self,
        mean: float,
        stdev: float,
        min: int = 1,  # noqa: A002
        max: int = MAX_TOKENS,  # noqa: A002
        *,
        floor: int = 1,
        where: str = "gaussian",
    ) -> None:
        _need(stdev >= 0, f"{where}.std_dev", stdev, "must be >= 0")
        _need(min >= 0, f"{where}.min", min, "must be >= 0")
        _need(min <= max, f"{where}.min", min, f"must be <= max ({max})")
        self.mean_tokens, self.stdev = float(mean), float(stdev)
        self.lo, self.hi = int(min), int(max)
        self.floor = floor

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if self.lo == self.hi:
            return np.full(count, self.lo, dtype=np.int64)
        if self.stdev == 0:
            values = np.full(count, self.mean_tokens)
        else:
            values = rng.normal(self.mean_tokens, self.stdev, count)
        return _round(np.clip(values, self.lo, self.hi))

    @property
    def mean(self) -> float:
        return self.mean_tokens


def _clamps(lo: float | None, hi: float | None, where: str) -> tuple[float | None, float | None]:
    """Optional whole-token bounds [min, max] of a drawn length."""
    for name, value in (("min", lo), ("max", hi)):
        if value is not None:
            _need(float(value).is_integer(), f"{where}.{name}", value, "must be a whole number")
            _need(value >= 0, f"{where}.{name}", value, "must be >= 0")
    if lo is not None and hi is not None:
        _need(lo <= hi, f"{where}.min", lo, f"must be <= max ({hi:g})")
    return lo, hi


def _clamped(values: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    if lo is None and hi is None:
        return values
    return np.clip(values, lo, hi)


class ExponentialLength(LengthDistribution):
    """round(Exp(mean)), clamped to [min, max] when given."""

    name = "exponential"

    def __init__(
        self,
        mean: float,
        min: float | None = None,  # noqa: A002
        max: float | None = None,  # noqa: A002
        *,
        floor: int = 1,
        where: str = "exponential",
    ) -> None:
        _need(mean > 0, f"{where}.mean", mean, "must be > 0")
        self.mean_tokens = float(mean)
        self.lo, self.hi = _clamps(min, max, where)
        self.floor = floor

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        # `sample` caps at MAX_TOKENS; an exponential of a schema-bounded mean cannot reach
        # int64's limit before it, as a lognormal or Pareto tail can.
        return _round(_clamped(rng.exponential(self.mean_tokens, count), self.lo, self.hi))

    @property
    def mean(self) -> float:
        return self.mean_tokens


class LognormalLength(LengthDistribution):
    """round(exp(mu + sigma·Z)), clamped to [min, max] when given (BLIS's `lognormal`, which its
    ServeGen conversion fits to each chunk's length table)."""

    name = "lognormal"

    def __init__(
        self,
        mu: float,
        sigma: float,
        min: float | None = None,  # noqa: A002
        max: float | None = None,  # noqa: A002
        *,
        floor: int = 1,
        where: str = "lognormal",
    ) -> None:
        _need(sigma >= 0, f"{where}.sigma", sigma, "must be >= 0")
        # exp(mu), the law's median, beyond a request's bound is no prompt length (most draws
        # would be the cap); the bound also keeps exp finite.
        _need(
            mu <= math.log(MAX_TOKENS),
            f"{where}.mu",
            mu,
            f"must be <= ln({MAX_TOKENS:,}) = {math.log(MAX_TOKENS):.4f}: e^mu is the law's "
            "median, and a request has at most that many tokens",
        )
        self.mu, self.sigma = float(mu), float(sigma)
        self.lo, self.hi = _clamps(min, max, where)
        self.floor = floor

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        values = np.exp(self.mu + self.sigma * rng.standard_normal(count))
        # Capped before rounding: a wide sigma's draw would overflow int64 (`sample` caps too).
        return _round(np.minimum(_clamped(values, self.lo, self.hi), float(MAX_TOKENS)))

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)


class ParetoLognormalLength(LengthDistribution):
    """Mixture: Pareto(alpha, xm) with probability mix_weight, else LogNormal(mu, sigma)."""

    name = "pareto_lognormal"

    def __init__(
        self,
        alpha: float,
        xm: float,
        mu: float,
        sigma: float,
        mix_weight: float,
        *,
        floor: int = 1,
        where: str = "pareto_lognormal",
    ) -> None:
        _need(alpha > 0, f"{where}.alpha", alpha, "must be > 0")
        _need(xm > 0, f"{where}.xm", xm, "must be > 0")
        _need(sigma >= 0, f"{where}.sigma", sigma, "must be >= 0")
        _need(0 <= mix_weight <= 1, f"{where}.mix_weight", mix_weight, "must be in [0, 1]")
        self.alpha, self.xm = float(alpha), float(xm)
        self.mu, self.sigma, self.mix_weight = float(mu), float(sigma), float(mix_weight)
        self.floor = floor

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        pick_pareto = rng.random(count) < self.mix_weight
        # 1 - U lies in (0, 1], so the Pareto draw is finite (BLIS guards U == 0 the same way).
        u = 1.0 - rng.random(count)
        pareto = self.xm / u ** (1.0 / self.alpha)
        lognormal = np.exp(self.mu + self.sigma * rng.standard_normal(count))
        values = np.where(pick_pareto, pareto, lognormal)
        # Capped before rounding: a heavy Pareto tail would overflow int64 (`sample` caps too).
        return _round(np.minimum(values, float(MAX_TOKENS)))

    @property
    def mean(self) -> float:
        pareto = math.inf if self.alpha <= 1 else self.alpha * self.xm / (self.alpha - 1)
        lognormal = math.exp(self.mu + self.sigma**2 / 2)
        return self.mix_weight * pareto + (1 - self.mix_weight) * lognormal


class EmpiricalLength(LengthDistribution):
    """Inverse-CDF sampling from a {tokens: probability} table (normalised)."""

    name = "empirical"

    def __init__(
        self, pdf: Mapping[int, float], *, floor: int = 1, where: str = "empirical"
    ) -> None:
        for tokens, prob in pdf.items():
            _need(
                0 <= tokens <= MAX_TOKENS,
                f"{where}.params",
                tokens,
                f"token counts must be from 0 to {MAX_TOKENS:,}, the bound of a request's size",
            )
            _need(
                math.isfinite(prob) and prob >= 0,
                f"{where}.params[{tokens}]",
                prob,
                "probabilities must be finite and >= 0",
            )
        kept = sorted((t, p) for t, p in pdf.items() if p > 0)
        total = sum(p for _, p in kept)
        _need(total > 0, f"{where}.params", dict(pdf), "probabilities must sum to > 0")
        self.values = np.array([t for t, _ in kept], dtype=np.int64)
        self.cdf = np.cumsum([p / total for _, p in kept])
        self.cdf[-1] = 1.0  # guard against rounding leaving the top bin unreachable
        self.probabilities = np.array([p / total for _, p in kept])
        self.floor = floor

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        # First bin whose CDF is >= u, as BLIS's sort.SearchFloat64s.
        idx = np.searchsorted(self.cdf, rng.random(count), side="left")
        return self.values[np.minimum(idx, len(self.values) - 1)]

    @property
    def mean(self) -> float:
        return float(np.dot(self.values, self.probabilities))


LENGTH_DISTRIBUTIONS: dict[str, type[LengthDistribution]] = {
    cls.name: cls
    for cls in (
        ConstantLength,
        GaussianLength,
        ExponentialLength,
        ParetoLognormalLength,
        EmpiricalLength,
        LognormalLength,
    )
}


def make_length(name: str, **params) -> LengthDistribution:
    if name not in LENGTH_DISTRIBUTIONS:
        raise unknown("length distribution", name, LENGTH_DISTRIBUTIONS)
    return LENGTH_DISTRIBUTIONS[name](**params)


# --- empirical tables -------------------------------------------------------------------------


def _parse_table(raw: Mapping, where: str) -> dict[int, float]:
    pdf: dict[int, float] = {}
    for key, prob in raw.items():
        try:
            tokens_f = float(key)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(
                f"{where}: invalid token count {excerpt(key)}; keys must be whole numbers"
            ) from None
        if not tokens_f.is_integer():
            raise ConfigError(
                f"{where}: invalid token count {excerpt(key)}; keys must be whole numbers"
            )
        try:
            prob_f = float(prob)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(
                f"{where}[{excerpt(key, 40)}]: invalid probability {excerpt(prob)}; "
                "must be a number"
            ) from None
        tokens = int(tokens_f)
        pdf[tokens] = pdf.get(tokens, 0.0) + prob_f
    if not pdf:
        raise ConfigError(f"{where}: empty probability table; give at least one tokens: prob")
    return pdf


def _read_csv_table(path: Path, where: str) -> dict[int, float]:
    rows = []
    with contextlib.closing(csv_records(path, where)) as records:
        for lineno, row in records:
            cells = [c.strip() for c in row]
            if not cells or all(not c for c in cells) or cells[0].startswith("#"):
                continue
            if len(cells) < 2:
                raise ConfigError(
                    f"{where}: {str(path)!r} line {lineno}: need two columns tokens,probability"
                )
            if lineno == 1 and not _is_number(cells[0]):
                continue  # header row
            rows.append((cells[0], cells[1]))
    pdf: dict[int, float] = {}
    for tokens, prob in rows:
        for k, v in _parse_table({tokens: prob}, where).items():
            pdf[k] = pdf.get(k, 0.0) + v
    if not pdf:
        raise ConfigError(f"{where}: {str(path)!r} has no rows tokens,probability")
    return pdf


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_empirical_table(path: Path, where: str = "empirical.file") -> dict[int, float]:
    """Read a {tokens: probability} table from YAML/JSON (a mapping) or CSV (two columns)."""
    path = check_path(path, where)
    if path.suffix.lower() == ".csv":
        return _read_csv_table(path, where)
    text = read_text(path, where)
    if path.suffix.lower() == ".json":
        data = load_json(text, where, path)
    else:
        data = load_yaml(text, where, path)
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{where}: {str(path)!r} must hold a mapping tokens: probability "
            f"(got {type(data).__name__})"
        )
    return _parse_table(data, where)


# --- DistSpec -> sampler ----------------------------------------------------------------------


def _gaussian_from_params(params: Mapping[str, float], floor: int, where: str) -> GaussianLength:
    lo, hi = params["min"], params["max"]
    _need(float(lo).is_integer(), f"{where}.params.min", lo, "must be a whole number")
    _need(float(hi).is_integer(), f"{where}.params.max", hi, "must be a whole number")
    _need(params["mean"] >= 0, f"{where}.params.mean", params["mean"], "must be >= 0")
    return GaussianLength(
        params["mean"], params["std_dev"], int(lo), int(hi), floor=floor, where=f"{where}.params"
    )


def from_dist_spec(
    dist: DistSpec, base_dir: Path | None = None, *, minimum: int = 1, where: str = ""
) -> LengthDistribution:
    """The sampler a workload `DistSpec` describes; samples are whole tokens >= `minimum`.

    `base_dir` resolves a relative empirical `file` (the folder of the workload file);
    `where` names the field in errors, e.g. "clients[0].input_distribution".
    """
    where = where or f"{dist.type} distribution"
    p = dist.params
    inner = f"{where}.params"
    if dist.type == "gaussian":
        return _gaussian_from_params(p, minimum, where)
    if dist.type == "exponential":
        return ExponentialLength(p["mean"], p.get("min"), p.get("max"), floor=minimum, where=inner)
    if dist.type == "lognormal":
        return LognormalLength(
            p["mu"], p["sigma"], p.get("min"), p.get("max"), floor=minimum, where=inner
        )
    if dist.type == "pareto_lognormal":
        return ParetoLognormalLength(
            p["alpha"], p["xm"], p["mu"], p["sigma"], p["mix_weight"], floor=minimum, where=inner
        )
    if dist.type == "constant":
        value = p["value"]
        _need(float(value).is_integer(), f"{inner}.value", value, "must be a whole number")
        return ConstantLength(int(value), floor=minimum, where=inner)
    if dist.type == "empirical":
        return EmpiricalLength(_empirical_pdf(dist, base_dir, where), floor=minimum, where=where)
    raise unknown("length distribution", dist.type, LENGTH_DISTRIBUTIONS)


def _empirical_pdf(dist: DistSpec, base_dir: Path | None, where: str) -> dict[int, float]:
    if dist.file:
        if dist.params:
            raise ConfigError(f"{where}: give either `params` or `file` for empirical, not both")
        path = Path(dist.file)
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        return load_empirical_table(path, f"{where}.file")
    return _parse_table(dist.params, f"{where}.params")


class RatioDistribution:
    """Fractions in [0, 1] drawn from a DistSpec whose values are percentages (BLIS).

    BLIS samples a reason ratio as a token-length law read in percent (`value: 50` means
    50 %) and divides by 100. Here the percentage is not rounded to a whole percent and 0 % is
    allowed (BLIS's length floor of 1 turns 0 into 1 %).
    """

    def __init__(self, draw) -> None:
        self._draw = draw

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.clip(self._draw(rng, count) / 100.0, 0.0, 1.0)


def ratio_from_dist_spec(
    dist: DistSpec, base_dir: Path | None = None, *, where: str = ""
) -> RatioDistribution:
    """The `reason_ratio_distribution` sampler: float fractions clamped to [0, 1]."""
    where = where or f"{dist.type} distribution"
    p = dist.params
    inner = f"{where}.params"
    if dist.type == "constant":
        value = float(p["value"])
        return RatioDistribution(lambda rng, n: np.full(n, value))
    if dist.type == "gaussian":
        _need(p["std_dev"] >= 0, f"{inner}.std_dev", p["std_dev"], "must be >= 0")
        _need(p["min"] <= p["max"], f"{inner}.min", p["min"], f"must be <= max ({p['max']})")
        mean, sd, lo, hi = p["mean"], p["std_dev"], p["min"], p["max"]
        return RatioDistribution(lambda rng, n: np.clip(rng.normal(mean, sd, n), lo, hi))
    if dist.type == "exponential":
        _need(p["mean"] > 0, f"{inner}.mean", p["mean"], "must be > 0")
        mean = p["mean"]
        lo, hi = _clamps(p.get("min"), p.get("max"), inner)
        return RatioDistribution(lambda rng, n: _clamped(rng.exponential(mean, n), lo, hi))
    if dist.type == "lognormal":
        law = LognormalLength(p["mu"], p["sigma"], p.get("min"), p.get("max"), where=inner)
        return RatioDistribution(
            lambda rng, n: _clamped(
                np.exp(law.mu + law.sigma * rng.standard_normal(n)), law.lo, law.hi
            )
        )
    if dist.type == "pareto_lognormal":
        law = ParetoLognormalLength(
            p["alpha"], p["xm"], p["mu"], p["sigma"], p["mix_weight"], floor=0, where=inner
        )

        def draw(rng: np.random.Generator, n: int) -> np.ndarray:
            pick = rng.random(n) < law.mix_weight
            pareto = law.xm / (1.0 - rng.random(n)) ** (1.0 / law.alpha)
            lognormal = np.exp(law.mu + law.sigma * rng.standard_normal(n))
            return np.where(pick, pareto, lognormal)

        return RatioDistribution(draw)
    if dist.type == "empirical":
        table = EmpiricalLength(_empirical_pdf(dist, base_dir, where), floor=0, where=where)
        return RatioDistribution(lambda rng, n: table.sample(rng, n).astype(float))
    raise unknown("ratio distribution", dist.type, LENGTH_DISTRIBUTIONS)
