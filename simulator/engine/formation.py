"""Batch formation policies: which requests get how many tokens in a step (docs/engine.md
"Batch formation"), registered by name.

Every policy shares the engine's mechanics: the token budget (`max_num_scheduled_tokens`),
the batch cap (`max_num_running_reqs`), KV allocation with preemption on failure, the wait
queue's order (scheduler and priorities), prefix caching and head-of-line blocking. What a
policy decides is the shape of a step:

* `chunked` (default; vLLM V1, Sarathi-Serve): running requests first — a decode token each,
  a chunk for a prompt still in prefill — then new prompts from the wait queue, the last one
  chunked to whatever budget is left. The engine runs it inline (`VLLMEngine.plan_general_step`),
  with its decode fast path.
* `whole-prompt` (Orca-style iteration-level batching without chunking): the same mixed steps,
  but a waiting prompt joins only if its whole remaining prompt fits the budget left.
* `prefill-first` (vLLM V0's default scheduler, no chunked prefill): a step that can admit
  waiting prompts computes only their whole prompts — the running requests get no token in it
  (V0's decode stall); otherwise the step decodes the running requests and admits nothing.

A prompt longer than a step can ever give it (the whole budget, or the long-prefill threshold)
can never be admitted whole. Rather than refuse it, as vLLM V0 does, both whole-prompt policies
admit it into an empty batch only (head-of-line blocking drains the batch first) and prefill it
in chunks over consecutive steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import unknown

if TYPE_CHECKING:
    from .batching import VLLMEngine


class BatchFormation:
    """How a step is formed. The engine serves the running requests first, then admits from
    the wait queue (vLLM's two phases), unless `running_first` is False: then `plan` forms the
    whole step."""

    name = ""
    # Phase 2 may give a waiting prompt part of its prompt (the budget's remainder). When
    # False, a prompt is admitted only whole, except one that no step could hold whole,
    # admitted into an empty batch (see the module docstring).
    chunks_prompts = True
    # The engine serves running requests before the queue. False: `plan` forms the step.
    running_first = True
    # The engine's decode fast path (steady decoders handled as a group) is exact only when a
    # step serves every running request before admitting anyone: a policy that lets running
    # requests wait must turn it off.
    supports_decode_fast_path = True
    # Step coalescing (accelerator.finish_quiet_steps) needs no flag: it runs steps ahead only
    # while nothing waits, and with an empty wait queue a step of every policy here serves the
    # running requests alone, decided by the engine's state (no admission, no drop), so a
    # quiet step is the same with or without its own event. tests/engine/test_formation.py
    # compares each policy with the reference path.

    def plan(self, engine: VLLMEngine, budget: int, now_us: int) -> int:
        """Give this step's tokens (`num_new_tokens`, all 0 on entry) to `engine.running` and
        to requests admitted from `engine.waiting`, within `budget` tokens. Returns time to
        add to the step (a blocking CPU-tier reload), in µs. Called only when
        `running_first` is False, on the engine's per-request path."""
        raise NotImplementedError


class ChunkedPrefill(BatchFormation):
    """vLLM V1 / Sarathi-Serve: decodes and prefill chunks first, then new prompts chunked to
    the budget left. Runs inline in the engine; this class only names it."""

    name = "chunked"


class WholePrompt(BatchFormation):
    """Orca-style: mixed steps as `chunked`, but a new prompt joins only whole."""

    name = "whole-prompt"
    chunks_prompts = False
    # Phase 1 is `chunked`'s unchanged and the fast path runs only there (it requires an empty
    # wait queue or hands Phase 2 the budget it leaves), so it stays exact: the equality of
    # both paths is tested in tests/engine/test_formation.py.


class PrefillFirst(BatchFormation):
    """vLLM V0 without chunked prefill: prompt-only steps while prompts can be admitted,
    decode-only steps otherwise, never both."""

    name = "prefill-first"
    chunks_prompts = False
    running_first = False
    supports_decode_fast_path = False

    def plan(self, engine: VLLMEngine, budget: int, now_us: int) -> int:
        running = engine.running
        if any(r.in_prefill and not r.reload_pending for r in running):
            # A prompt prefilled in chunks (too long for one step) or one whose prefix just
            # came back from the CPU tier: prompts go on, decoders wait, and whole prompts
            # may fill the budget the chunks leave.
            budget, preempted = engine._schedule_running(running, budget, prefills_only=True)
            return 0 if preempted else engine._admit_waiting(running, budget, now_us)
        if engine.waiting:
            admitted_from = len(running)
            extra_us = engine._admit_waiting(running, budget, now_us)
            # A request admitted to await a CPU-tier reload computes nothing: if that is all,
            # the step is the running requests' after all.
            if any(r.num_new_tokens for r in running[admitted_from:]):
                return extra_us
        engine._schedule_running(running, budget)
        return 0


BATCH_FORMATIONS: dict[str, type[BatchFormation]] = {
    cls.name: cls for cls in (ChunkedPrefill, WholePrompt, PrefillFirst)
}


def make_batch_formation(name: str) -> BatchFormation:
    if name not in BATCH_FORMATIONS:
        raise unknown("batch formation", name, BATCH_FORMATIONS)
    return BATCH_FORMATIONS[name]()
