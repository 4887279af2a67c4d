"""Synthetic open-loop traffic from a WorkloadSpec: arrivals plus prompt/output lengths."""

from __future__ import annotations

from ..engine.request import Request
from ..rng import subsystem_rng
from ..scenario import LengthSpec, WorkloadSpec
from .arrivals import make_arrivals
from .lengths import LengthDistribution, make_length


def length_distribution(spec: LengthSpec) -> LengthDistribution:
    if spec.distribution == "constant":
        return make_length("constant", value=spec.value)
    return make_length("gaussian", mean=spec.mean, stdev=spec.stdev, min=spec.min, max=spec.max)


def generate_requests(spec: WorkloadSpec, seed: int) -> list[Request]:
    """`num_requests` requests, IDs `request_<i>` in arrival order.

    Arrivals, prompt lengths and output lengths come from separate seeded streams, so changing
    one law leaves the draws of the others untouched.
    """
    n = spec.num_requests
    arrivals = make_arrivals(spec.arrival, spec.rate).arrival_times_us(
        subsystem_rng(seed, "workload.arrivals"), n
    )
    prompts = length_distribution(spec.prompt_tokens).sample(
        subsystem_rng(seed, "workload.prompt_tokens"), n
    )
    outputs = length_distribution(spec.output_tokens).sample(
        subsystem_rng(seed, "workload.output_tokens"), n
    )
    timeout = spec.timeout_us
    requests = []
    for i in range(n):
        arrival = int(arrivals[i])
        requests.append(
            Request(
                f"request_{i}",
                arrival,
                int(prompts[i]),
                int(outputs[i]),
                index=i,
                deadline_us=arrival + timeout if timeout else 0,
            )
        )
    return requests
