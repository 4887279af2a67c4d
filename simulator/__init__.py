"""servesim: a discrete-event simulator of LLM inference serving.

import simulator
result = simulator.simulate("scenarios/quickstart.yaml")
result.summary["ttft_p99_ms"], result.requests.head()
"""

from .api import Deployment, replay, resolve_deployment, simulate
from .errors import ConfigError, ServesimError
from .metrics.persistence import load_result
from .metrics.results import Result
from .scenario import Scenario, load_scenario
from .sweeps import sweep

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
