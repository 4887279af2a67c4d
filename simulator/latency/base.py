"""The step-time model interface and its registry.

A step-time model answers "how long does one engine iteration take for this batch?" plus the
three per-request overheads BLIS attaches to a latency model (docs/behaviour.md §3): the queueing
delay between arrival and enqueue, the per-output-token processing time, and a post-decode overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class StepBatch:
    """Composition of one engine step, as the step-time models see it (docs/behaviour.md §3).

    prefill_chunks: one (context_tokens, new_tokens) pair per request in prefill this step,
        context = progress index at step start.
    decode_count: requests decoding one token this step.
    decode_context_sum: sum of the progress indices (at step start) of those decode requests.
    prefill_prompt_tokens: the full prompt length of each prefill request, parallel to
        prefill_chunks (trained-roofline prices attention with it); empty when unknown.

    A speculative verification (docs/speculative.md) is a chunk too: a decoding request
    checking k drafts runs k + 1 query tokens over its context, the kernel a prefill chunk
    runs, so it is `(context, k + 1)` in prefill_chunks (with `context + k + 1` as its length)
    and every model prices it without knowing about speculation.
    """

    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    decode_count: int = 0
    decode_context_sum: int = 0
    prefill_prompt_tokens: list[int] = field(default_factory=list)
    # Time the step spends beyond the forward pass: blocking KV reloads from the CPU tier, a
    # speculative drafter's passes, LoRA adapter loads and kernels.
    extra_us: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.prefill_chunks) + self.decode_count

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill_chunks)


class StepTimeModel:
    """Base class. Subclasses set `name` and implement `step_time_us`."""

    name: str = ""
    # True for backends whose from_deployment takes `coeffs_file` (a fitted-coefficients YAML).
    accepts_coeffs_file: bool = False
    # Layout dimensions beyond tensor parallelism the backend prices ("pp", "dp", "ep"); its
    # from_deployment then takes `parallelism` (docs/parallelism.md).
    parallelism_dimensions: frozenset[str] = frozenset()
    # Where the coefficients come from, as results report it (set by each backend).
    coefficients_source: str = "analytical: no fitted coefficients"
    # An unset `engine.max_model_len` comes from the model's config (docs/behaviour.md §2.5,
    # "Context limit"): BLIS derives it for every backend that reads the config (roofline,
    # crossmodel, trained-roofline, trained-physics) and not for blackbox, which prices from
    # fitted coefficients alone.
    derives_context_limit: bool = True

    def provenance(self) -> dict:
        """Which model produced a result, and from which coefficients (every summary says)."""
        return {"latency_model": self.name, "coefficients": self.coefficients_source}

    def step_time_us(self, batch: StepBatch) -> int:
        raise NotImplementedError

    def decode_step_time_us(self, decode_count: int, decode_context_sum: int) -> int:
        """`step_time_us` of a step that only decodes. A model may price it more directly;
        it must give the same value."""
        return self.step_time_us(StepBatch([], decode_count, decode_context_sum, [], 0))

    def queueing_time_us(self, input_tokens: int) -> int:
        """Arrival-to-enqueue delay at the instance (alpha0 + alpha1 * input tokens)."""
        return 0

    def output_token_processing_us(self) -> int:
        """Per-token output overhead (alpha2): see docs/behaviour.md §A3 for how it is charged."""
        return 0

    def scheduling_lag_steps(self) -> float:
        """How many planned steps a request reaching the engine while a step runs misses (a
        whole number): vLLM V1's async scheduling plans step N+1 while step N runs, so a
        request arriving during step N misses N+1 and joins the plan made when N+1 ends. 0
        (BLIS's models): a request joins the next step."""
        return 0.0

    def post_decode_overhead_us(self) -> int:
        return 0


def coefficients_or_defaults(
    alpha: Sequence[float] | None, beta: Sequence[float] | None, defaults: dict[str, list[float]]
) -> tuple[Sequence[float], Sequence[float]]:
    """Explicit alpha / beta win, each on its own; otherwise defaults.yaml's pair."""
    return (
        alpha if alpha is not None else defaults["alpha_coeffs"],
        beta if beta is not None else defaults["beta_coeffs"],
    )


class TrainedAlphaOverheads(StepTimeModel):
    """BLIS's trained models' three α, each a constant: α0 µs from arrival to the engine, α1
    µs after the last token (in E2E only), α2 µs per output token (docs/latency-models.md).
    Subclasses set `alpha`."""

    alpha: Sequence[float]

    def queueing_time_us(self, input_tokens: int) -> int:
        return int(self.alpha[0])

    def output_token_processing_us(self) -> int:
        return int(self.alpha[2])

    def post_decode_overhead_us(self) -> int:
        return int(self.alpha[1])


def trained_prefill_attention(
    batch: StepBatch, heads_per_gpu: float, head_dim: float
) -> tuple[float, float]:
    """BLIS's trained models' prefill terms: the prefill tokens T_pf and the attention FLOPs
    4·h·t·(s + t/2)·d_h summed over the chunks (t new tokens, s the prompt length, or the
    chunk's end without one)."""
    prompts = batch.prefill_prompt_tokens
    t_pf = 0.0
    attn = 0.0
    for i, (context, n) in enumerate(batch.prefill_chunks):
        t = float(n)
        s = float(prompts[i]) if prompts else float(context + n)
        t_pf += t
        attn += 4 * heads_per_gpu * t * (s + t / 2) * head_dim
    return t_pf, attn
