"""Step-time models by name.

Every backend is a `StepTimeModel` subclass with a unique `name` and a classmethod

    from_deployment(model, gpu, tp, alpha=None, beta=None, vllm_version=None) -> instance

that turns one deployment (model, GPU type, tensor parallelism, optional fitted coefficients)
into a ready model, raising ConfigError for anything it cannot price. Registering such a
class with `register_latency_model` makes it selectable by name everywhere (scenario files,
CLI), and unknown names are rejected with the list of registered ones. A backend that prices
layouts beyond tensor parallelism lists the dimensions in `parallelism_dimensions` and also
takes `parallelism=` (a `Parallelism`); the others are refused such a layout by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import invalid, unknown
from simulator.latency.base import StepBatch, StepTimeModel
from simulator.latency.blackbox import BlackboxModel
from simulator.latency.crossmodel import CrossModel
from simulator.latency.parallel import Parallelism
from simulator.latency.physics import PhysicsModel
from simulator.latency.roofline import RooflineModel
from simulator.latency.trained_physics import TrainedPhysics
from simulator.latency.trained_roofline import TrainedRoofline

_ModelClass = TypeVar("_ModelClass", bound=type[StepTimeModel])

LATENCY_MODELS: dict[str, type[StepTimeModel]] = {}


def register_latency_model(cls: _ModelClass) -> _ModelClass:
    """Add a backend to LATENCY_MODELS under `cls.name`; usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, StepTimeModel)):
        raise TypeError(f"{cls!r} is not a StepTimeModel subclass")
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`; set a class attribute name = '...'")
    if not callable(getattr(cls, "from_deployment", None)):
        raise TypeError(f"{cls.__name__} must define classmethod from_deployment(...)")
    existing = LATENCY_MODELS.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"latency model name {cls.name!r} is already taken by {existing.__name__}")
    LATENCY_MODELS[cls.name] = cls
    return cls


register_latency_model(RooflineModel)
register_latency_model(BlackboxModel)
register_latency_model(CrossModel)
register_latency_model(TrainedRoofline)
register_latency_model(PhysicsModel)
register_latency_model(TrainedPhysics)


def build_step_time_model(
    name: str,
    model: ModelConfig,
    gpu: GPUSpec,
    tp: int,
    alpha: Sequence[float] | None = None,
    beta: Sequence[float] | None = None,
    vllm_version: str | None = None,
    coeffs_file: str | Path | None = None,
    parallelism: Parallelism | None = None,
) -> StepTimeModel:
    """Build the backend called `name` for one deployment.

    roofline: alpha/beta must be None (BLIS rejects coefficients with explicit roofline).
    blackbox: explicit alpha+beta win; else the defaults.yaml row for
        (model.name, gpu.name, tp, vllm_version); none found -> ConfigError listing the
        GPU/TP combinations that do have coefficients for the model.
    coeffs_file: a fitted-coefficients YAML, only for backends with `accepts_coeffs_file`.
    parallelism: the instance's layout beyond TP (pipeline stages, DP ranks, expert
        sharding); a backend that does not price a dimension in use refuses it.
    """
    cls = LATENCY_MODELS.get(name)
    if cls is None:
        raise unknown("latency model", name, LATENCY_MODELS)
    extra: dict[str, Any] = {}
    if parallelism is not None and not parallelism.is_trivial:
        _check_dimensions(cls, parallelism)
        extra["parallelism"] = parallelism
    if coeffs_file is None:
        return cls.from_deployment(  # type: ignore[attr-defined]
            model, gpu, tp, alpha=alpha, beta=beta, vllm_version=vllm_version, **extra
        )
    if not cls.accepts_coeffs_file:
        takes = sorted(n for n, c in LATENCY_MODELS.items() if c.accepts_coeffs_file)
        raise invalid(
            "latency.coeffs_file",
            str(coeffs_file),
            f"only latency model {', '.join(takes)} reads one",
        )
    return cls.from_deployment(  # type: ignore[attr-defined]
        model,
        gpu,
        tp,
        alpha=alpha,
        beta=beta,
        vllm_version=vllm_version,
        coeffs_file=coeffs_file,
        **extra,
    )


_DIMENSION_NAMES = {"pp": "pipeline", "dp": "data", "ep": "expert"}


def _check_dimensions(cls: type[StepTimeModel], layout: Parallelism) -> None:
    for dimension in ("pp", "dp", "ep"):
        value = getattr(layout, dimension)
        if value > 1 and dimension not in cls.parallelism_dimensions:
            takes = sorted(
                n for n, c in LATENCY_MODELS.items() if dimension in c.parallelism_dimensions
            )
            raise invalid(
                dimension,
                value,
                f"latency model {cls.name!r} does not price {_DIMENSION_NAMES[dimension]} "
                f"parallelism; use latency model {' or '.join(takes)}",
            )


__all__ = [
    "LATENCY_MODELS",
    "BlackboxModel",
    "Parallelism",
    "PhysicsModel",
    "RooflineModel",
    "StepBatch",
    "StepTimeModel",
    "TrainedPhysics",
    "build_step_time_model",
    "register_latency_model",
]
