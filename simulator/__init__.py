"""servesim: a discrete-event simulator of LLM inference serving.

import simulator
result = simulator.simulate("scenarios/quickstart.yaml")
result.summary["ttft_p99_ms"], result.requests.head()

The public names load on first use, so `import simulator.cli` (the console script) does not
pay for the simulator, pandas and SimPy before it has installed its signal handlers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

_EXPORTS = {
    "ConfigError": ".errors",
    "ServesimError": ".errors",
    "Deployment": ".api",
    "replay": ".api",
    "resolve_deployment": ".api",
    "simulate": ".api",
    "Result": ".metrics.results",
    "load_result": ".metrics.persistence",
    "Scenario": ".scenario",
    "load_scenario": ".scenario",
    "sweep": ".sweeps",
}

__all__ = [
    "ConfigError",
    "Deployment",
    "Result",
    "Scenario",
    "ServesimError",
    "load_result",
    "load_scenario",
    "replay",
    "resolve_deployment",
    "simulate",
    "sweep",
]

if TYPE_CHECKING:
    from .api import Deployment, replay, resolve_deployment, simulate
    from .errors import ConfigError, ServesimError
    from .metrics.persistence import load_result
    from .metrics.results import Result
    from .scenario import Scenario, load_scenario
    from .sweeps import sweep


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
