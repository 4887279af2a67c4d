"""The autoscaler's decision rule, as a plain object (no SimPy).

Every `interval_s` the infrastructure reads the deployment's signal (a mean per routable
instance, as a metrics scrape would see it `scrape_delay_s` late) and asks `decide`:

- above `scale_up_threshold` continuously for `scale_up_stabilization_s` → one more instance;
- below `scale_down_threshold` continuously for `scale_down_stabilization_s` → one fewer;
- never below `min_instances` nor above `max_instances` (counting instances still coming up).

One instance per decision, and the stabilisation clock restarts after each change, so a
fleet grows at most one instance per interval: Kubernetes' HPA behaves alike with its
default policies, and it keeps a noisy signal from overshooting.
"""

from __future__ import annotations

from .infra_spec import AutoscalerSpec

US_PER_S = 1_000_000


class Autoscaler:
    def __init__(self, spec: AutoscalerSpec, deployment: str) -> None:
        self.spec = spec
        self.deployment = deployment
        self._above_since_us: int | None = None
        self._below_since_us: int | None = None
        self.samples: list[tuple[int, float, int]] = []  # (time µs, signal, live instances)
        self.scale_ups = 0
        self.scale_downs = 0
        self.refused_scale_ups = 0  # asked for once the run could make no more instances
        self.refusing = False  # refused since the fleet last changed
        self.last_step: int | None = None

    def decide(self, now_us: int, value: float, live: int) -> int:
        """+1, −1 or 0 instances for the signal `value` read at `now_us`."""
        spec = self.spec
        if live < spec.min_instances:
            self._reset()
            self.scale_ups += 1
            return 1
        if value > spec.scale_up_threshold:
            self._below_since_us = None
            if self._above_since_us is None:
                self._above_since_us = now_us
            waited_s = (now_us - self._above_since_us) / US_PER_S
            if waited_s >= spec.scale_up_stabilization_s and live < spec.max_instances:
                self._reset()
                self.scale_ups += 1
                return 1
            return 0
        self._above_since_us = None
        if value < spec.scale_down_threshold:
            if self._below_since_us is None:
                self._below_since_us = now_us
            waited_s = (now_us - self._below_since_us) / US_PER_S
            if waited_s >= spec.scale_down_stabilization_s and live > spec.min_instances:
                self._reset()
                self.scale_downs += 1
                return -1
            return 0
        self._below_since_us = None
        return 0

    def _reset(self) -> None:
        self._above_since_us = None
        self._below_since_us = None
