"""Step-time models by name.

Every backend is a `StepTimeModel` subclass with a unique `name` and a classmethod

    from_deployment(model, gpu, tp, alpha=None, beta=None, vllm_version=None) -> instance

that turns one deployment (model, GPU type, tensor parallelism, optional fitted coefficients)
into a ready model, raising ConfigError for anything it cannot price. Registering such a
class with `register_latency_model` makes it selectable by name everywhere (scenario files,
CLI), and unknown names are rejected with the list of registered ones. A backend that prices
layouts beyond tensor parallelism lists the dimensions in `parallelism_dimensions` and also
takes `parallelism=` (a `Parallelism`); the others are refused such a layout by name.

The shipped backends are imported when a run first names one (`latency_model_class`), so a run
loads the one it prices with and not the others (docs/performance.md, "Start-up"); their
classes are still attributes of this package.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import invalid, unknown
from simulator.latency.base import StepBatch, StepTimeModel
from simulator.latency.parallel import Parallelism

_ModelClass = TypeVar("_ModelClass", bound=type[StepTimeModel])

# The registered backends; a shipped one joins when first looked up (`latency_model_class`).
LATENCY_MODELS: dict[str, type[StepTimeModel]] = {}
# The shipped backends: name -> (module, class).
SHIPPED_LATENCY_MODELS: dict[str, tuple[str, str]] = {
    "roofline": ("simulator.latency.roofline", "RooflineModel"),
    "blackbox": ("simulator.latency.blackbox", "BlackboxModel"),
    "crossmodel": ("simulator.latency.crossmodel", "CrossModel"),
    "trained-roofline": ("simulator.latency.trained_roofline", "TrainedRoofline"),
    "physics": ("simulator.latency.physics", "PhysicsModel"),
    "trained-physics": ("simulator.latency.trained_physics", "TrainedPhysics"),
}
# The shipped classes as attributes of this package (`simulator.latency.PhysicsModel`).
_CLASS_ATTRIBUTES = {attribute: name for name, (_, attribute) in SHIPPED_LATENCY_MODELS.items()}


def register_latency_model(cls: _ModelClass) -> _ModelClass:
    """Add a backend to LATENCY_MODELS under `cls.name`; usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, StepTimeModel)):
        raise TypeError(f"{cls!r} is not a StepTimeModel subclass")
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`; set a class attribute name = '...'")
    if not callable(getattr(cls, "from_deployment", None)):
        raise TypeError(f"{cls.__name__} must define classmethod from_deployment(...)")
    existing = LATENCY_MODELS.get(cls.name)
    shipped = SHIPPED_LATENCY_MODELS.get(cls.name)
    if existing is None and shipped is not None and shipped != (cls.__module__, cls.__qualname__):
        existing = latency_model_class(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"latency model name {cls.name!r} is already taken by {existing.__name__}")
    LATENCY_MODELS[cls.name] = cls
    return cls


def latency_model_class(name: str) -> type[StepTimeModel]:
    """The backend registered as `name` (a shipped one is imported the first time)."""
    cls = LATENCY_MODELS.get(name)
    if cls is None:
        if name not in SHIPPED_LATENCY_MODELS:
            raise unknown("latency model", name, latency_model_names())
        module, attribute = SHIPPED_LATENCY_MODELS[name]
        cls = register_latency_model(getattr(importlib.import_module(module), attribute))
    return cls


def latency_model_names() -> list[str]:
    """Every backend's name, shipped or registered."""
    return sorted({*SHIPPED_LATENCY_MODELS, *LATENCY_MODELS})


def _every_latency_model() -> dict[str, type[StepTimeModel]]:
    """name -> class of every backend (importing the shipped ones): for messages that list
    which backends can do something."""
    return {name: latency_model_class(name) for name in latency_model_names()}


def __getattr__(attribute: str) -> type[StepTimeModel]:
    name = _CLASS_ATTRIBUTES.get(attribute)
    if name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    return latency_model_class(name)


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
    cls = latency_model_class(name)
    extra: dict[str, Any] = {}
    if parallelism is not None and not parallelism.is_trivial:
        _check_dimensions(cls, parallelism)
        extra["parallelism"] = parallelism
    if coeffs_file is None:
        return cls.from_deployment(  # type: ignore[attr-defined]
            model, gpu, tp, alpha=alpha, beta=beta, vllm_version=vllm_version, **extra
        )
    if not cls.accepts_coeffs_file:
        takes = sorted(n for n, c in _every_latency_model().items() if c.accepts_coeffs_file)
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
                n
                for n, c in _every_latency_model().items()
                if dimension in c.parallelism_dimensions
            )
            raise invalid(
                dimension,
                value,
                f"latency model {cls.name!r} does not price {_DIMENSION_NAMES[dimension]} "
                f"parallelism; use latency model {' or '.join(takes)}",
            )


__all__ = [
    "LATENCY_MODELS",
    "SHIPPED_LATENCY_MODELS",
    "BlackboxModel",
    "Parallelism",
    "PhysicsModel",
    "RooflineModel",
    "StepBatch",
    "StepTimeModel",
    "TrainedPhysics",
    "build_step_time_model",
    "latency_model_class",
    "latency_model_names",
    "register_latency_model",
]
