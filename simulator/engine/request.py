"""The Request record: what a client asked for and what happened to it.

A request is a passive record; the engine mutates it. Tokens are counters, never lists: the
prompt's *content* is described by segments so prefix-cache hashes can be derived without
materialising token IDs (two requests share a block iff they share every token up to it).
"""

from __future__ import annotations

from enum import StrEnum

# A prompt is a sequence of (content_key, length) segments. Two segments with the same key hold
# the same tokens, so a shared system prompt is one key reused by many requests.
Segment = tuple[object, int]


class RequestState(StrEnum):
    CREATED = "created"  # not yet at an instance (in flight through the pipeline)
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    TIMED_OUT = "timed_out"
    DROPPED = "dropped_unservable"
    REJECTED = "rejected"
    DROPPED_ON_DRAIN = "dropped_on_drain"  # its instance was drained with policy immediate
    FAILED = "failed"  # its instance's node failed and the router does not retry


class Request:
    """One inference request and its lifecycle timestamps (integer µs, absolute)."""

    __slots__ = (
        "request_id",
        "index",
        "arrival_us",
        "input_tokens",
        "output_tokens",
        "max_output_tokens",
        "deadline_us",
        "segments",
        "output_key",
        "slo_class",
        "tenant_id",
        "model",
        "client_id",
        "session_id",
        "round_index",
        "prefix_group",
        "streaming",
        "text_tokens",
        "image_tokens",
        "audio_tokens",
        "video_tokens",
        "reason_ratio",
        # the LoRA adapter the request asks for ("" = the base model)
        "adapter",
        "priority",
        "state",
        "instance_id",
        # progress
        "computed_tokens",
        "prefill_target",
        "generated_tokens",
        "num_new_tokens",
        "in_prefill",
        "block_ids",
        "_block_hashes",
        # prefix caching: where this request's own content starts (see KVCache) and how far
        # its hashing is deferred
        "private_from_token",
        "deferred_hash_blocks",
        # the prefix-affinity scorer's runs holding this content's private blocks by count
        "prefix_index_runs",
        # timestamps (absolute µs; -1 = not reached)
        "enqueue_us",
        "schedule_us",
        "first_schedule_us",
        "first_token_us",
        "last_token_us",
        "completion_us",
        "preemptions",
        "cached_tokens",
        "length_capped",
        "step_tokens_us",
        # where this request's tokens came from in its engine's step log, so that the gaps of
        # a request that does not complete can leave the pooled ITL (engine/itl_pool.py): the
        # step-log row of its first token, and one (last token's step end, row of the next
        # token, gap) per time it missed a step
        "first_token_row",
        "itl_breaks",
        # prefill/decode disaggregation: sub-requests point at their parent, and a parent
        # records where and when its phases ran
        "pd_role",
        "parent",
        "prefill_sub",
        "decode_sub",
        "decode_instance_index",
        "transfer_start_us",
        "transfer_end_us",
        "dropped_at_decode_kv",
        # tiered KV: a prefix reload from the CPU tier this request waits for
        "reload_pending",
        "reload_ticket",
        "kv_reload_us",
        # fleet changes: times this request was re-routed after a redirect or a failure
        "reroutes",
        # a capped client (a trace replayed with max_in_flight) sent it this long after its
        # scheduled time; arrival_us is the send
        "client_wait_us",
        # the engine's decode fast path (see VLLMEngine): a "steady" decoder's progress
        # counters are brought up to date lazily, from the step they were last exact at
        "steady",
        "sync_step",
        "wake_step",
        # what the wake needs when it is no more than KV work a steady request does without
        # leaving the group (accelerator.WAKE_BLOCK, WAKE_HASH, or both as bits); 0 otherwise
        "wake_for_block",
        "run_seq",
    )

    def __init__(
        self,
        request_id: str,
        arrival_us: int,
        input_tokens: int,
        output_tokens: int,
        *,
        index: int = 0,
        deadline_us: int = 0,
        segments: list[Segment] | None = None,
        slo_class: str = "",
        tenant_id: str = "",
        model: str = "",
        client_id: str = "",
        max_output_tokens: int | None = None,
        session_id: str = "",
        round_index: int = 0,
        prefix_group: str = "",
        streaming: bool = False,
        text_tokens: int = 0,
        image_tokens: int = 0,
        audio_tokens: int = 0,
        video_tokens: int = 0,
        reason_ratio: float = 0.0,
        adapter: str = "",
    ) -> None:
        self.request_id = request_id
        self.index = index
        self.arrival_us = arrival_us
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.max_output_tokens = output_tokens if max_output_tokens is None else max_output_tokens
        self.deadline_us = deadline_us
        # Default content: tokens unique to this request.
        self.segments = segments if segments is not None else [(("req", request_id), input_tokens)]
        # Names the content of this request's output tokens, so a later round of a session whose
        # prompt contains them can share their KV blocks.
        self.output_key: object = ("out", request_id)
        self.slo_class = slo_class
        self.tenant_id = tenant_id
        self.model = model
        self.client_id = client_id
        self.session_id = session_id
        self.round_index = round_index
        self.prefix_group = prefix_group
        self.streaming = streaming
        # Multimodal breakdown of input_tokens (0 for text-only workloads) and reasoning share.
        self.text_tokens = text_tokens
        self.image_tokens = image_tokens
        self.audio_tokens = audio_tokens
        self.video_tokens = video_tokens
        self.reason_ratio = reason_ratio
        self.adapter = adapter
        self.priority = 0.0
        self.state = RequestState.CREATED
        self.instance_id = ""
        self.computed_tokens = 0
        self.prefill_target = input_tokens
        self.generated_tokens = 0
        self.num_new_tokens = 0
        self.in_prefill = True
        self.block_ids: list[int] = []
        self._block_hashes: list[int] | None = None
        # From this token on, no other request can hold the same content, so no other request
        # can ever hit its KV blocks; -1: unknown, maybe shared. Set by the workload generator.
        self.private_from_token = -1
        self.deferred_hash_blocks = 0
        # Per prefix-affinity scorer that routed this content with private blocks: the
        # (index, run, blocks) holding them by count, or [] once routed with plain hashes.
        self.prefix_index_runs: dict | None = None
        self.enqueue_us = -1
        self.schedule_us = -1
        self.first_schedule_us = -1
        self.first_token_us = -1
        self.last_token_us = -1
        self.completion_us = -1
        self.preemptions = 0
        self.cached_tokens = 0
        self.length_capped = False
        self.step_tokens_us = 0
        self.first_token_row = -1
        self.itl_breaks: list[tuple[float, int, float]] | None = None
        self.pd_role = ""  # "", "prefill" or "decode" (sub-requests only)
        self.parent: Request | None = None
        self.prefill_sub: Request | None = None
        self.decode_sub: Request | None = None
        self.decode_instance_index = -1
        self.transfer_start_us = -1
        self.transfer_end_us = -1
        self.dropped_at_decode_kv = False
        self.reload_pending = False
        self.reload_ticket = 0
        self.kv_reload_us = 0
        self.reroutes = 0
        self.client_wait_us = 0
        self.steady = False
        self.sync_step = 0
        self.wake_step = 0
        self.wake_for_block = 0
        self.run_seq = 0

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, arrival_us={self.arrival_us}, "
            f"in={self.input_tokens}, out={self.output_tokens}, state={self.state.value})"
        )

    @property
    def is_finished(self) -> bool:
        return self.state in _FINAL_STATES

    @property
    def disaggregated(self) -> bool:
        return self.prefill_sub is not None

    @property
    def kv_resident(self) -> bool:
        """A decode sub-request waiting with its prompt's KV already transferred in."""
        return not self.in_prefill and bool(self.block_ids)

    def restart(self) -> None:
        """Back to the state of a request that has just arrived, keeping its arrival time, so
        another instance can serve it from scratch (a redirect, or a retry after a failure:
        the client sees the new attempt's tokens, so TTFT counts from the original arrival)."""
        self.state = RequestState.CREATED
        self.instance_id = ""
        self.computed_tokens = 0
        self.prefill_target = self.input_tokens
        self.generated_tokens = 0
        self.num_new_tokens = 0
        self.in_prefill = True
        self.block_ids = []
        self.enqueue_us = -1
        self.schedule_us = -1
        self.first_schedule_us = -1
        self.first_token_us = -1
        self.last_token_us = -1
        self.completion_us = -1
        self.first_token_row = -1
        self.itl_breaks = None
        self.cached_tokens = 0
        self.length_capped = False
        self.reload_pending = False
        self.reroutes += 1

    def sub_request(self, role: str) -> Request:
        """The prefill (prompt only, no output) or decode sub-request of this parent."""
        sub = Request(
            f"{self.request_id}_{role}",
            self.arrival_us,
            self.input_tokens,
            self.output_tokens if role == "decode" else 0,
            index=self.index,
            deadline_us=self.deadline_us,
            segments=self.segments,
            slo_class=self.slo_class,
            tenant_id=self.tenant_id,
            model=self.model,
            client_id=self.client_id,
            session_id=self.session_id,
            round_index=self.round_index,
            prefix_group=self.prefix_group,
            streaming=self.streaming,
            adapter=self.adapter,
        )
        sub.output_key = self.output_key
        sub.pd_role = role
        sub.parent = self
        return sub

    def content_segments(self, total_tokens: int) -> list[Segment]:
        """Segments covering the first `total_tokens` of prompt followed by generated output."""
        segs: list[Segment] = []
        remaining = total_tokens
        for key, length in self.segments:
            if remaining <= 0:
                break
            take = min(length, remaining)
            segs.append((key, take))
            remaining -= take
        if remaining > 0:
            segs.append((self.output_key, remaining))
        return segs

    def forget_block_hashes(self) -> None:
        """Drop the cached block hashes of a request that is done with the KV cache: they are
        most of a finished request's memory, and are recomputed if ever asked for again."""
        self._block_hashes = None

    def block_hashes(self, full_blocks: int, block_size: int) -> list[int]:
        """Chained hashes of the first `full_blocks` full blocks of this request's content.

        Hash i depends on every token of blocks 0..i, as in vLLM and BLIS (docs/behaviour.md §2.2);
        the content of a block is named by (segment key, offset range) pieces instead of token IDs.
        """
        if self.parent is not None:
            # A PD sub-request has its parent's content: share one hash list.
            return self.parent.block_hashes(full_blocks, block_size)
        hashes = self._block_hashes
        if hashes is None:
            hashes = self._block_hashes = []
        done = len(hashes)
        if done >= full_blocks:
            return hashes
        # Extend in place, walking the segments once from the first block not yet hashed. A
        # block spanning segments is hash((previous hash, its pieces)). The whole blocks of a
        # segment that follow one another (nearly all blocks) form a run: the run's base is
        # hash((hash before the run, key hash)) // 2, and a block's hash is the base plus
        # _OFFSET_STRIDE times its start offset in the segment, so a run is one C-level range
        # instead of a tuple hash per block. Equal hashes still mean equal content, up to
        # chance collisions as rare as before: the base names everything before the run, the
        # offset the tokens since; two runs share a value only if their bases differ by one of
        # their few offset differences times the stride. The values stay below 2**63 (a base
        # below 2**62, offsets below 2**62 / stride), where `range` counts in C integers.
        lo = done * block_size
        end = full_blocks * block_size
        # A LoRA adapter changes every layer's K and V: its blocks are another content than
        # the base model's or another adapter's, as vLLM V1 puts the LoRA in the block hash.
        prev = hashes[-1] if done else (hash(("lora", self.adapter)) // 2 if self.adapter else 0)
        pieces: list[tuple[int, int, int]] = []
        seg_start = 0
        for key, length in (*self.segments, (self.output_key, end)):
            if length <= 0:
                if pieces:  # an empty segment inside a block is part of its name
                    pieces.append((hash(key), 0, 0))
                continue
            seg_end = seg_start + length
            if lo < seg_end and lo < end:
                key_hash = hash(key)
                if pieces:
                    # Finish the block that started in an earlier segment.
                    hi = lo + block_size
                    if hi > seg_end:
                        pieces.append((key_hash, 0, length))
                        seg_start = seg_end
                        continue
                    pieces.append((key_hash, 0, hi - seg_start))
                    prev = hash((prev, tuple(pieces)))
                    hashes.append(prev)
                    pieces.clear()
                    lo = hi
                # Whole blocks inside this segment: a run, hashed (run base) + (start offset).
                whole = (min(seg_end, end) - lo) // block_size
                offset = lo - seg_start
                if whole:
                    if offset >= block_size:
                        # Resuming inside a run: its previous block started at offset - bs.
                        run_base = prev - (offset - block_size) * _OFFSET_STRIDE
                    else:
                        run_base = hash((prev, key_hash)) >> 1
                    stop = offset + whole * block_size
                    hashes.extend(
                        range(
                            run_base + offset * _OFFSET_STRIDE,
                            run_base + stop * _OFFSET_STRIDE,
                            block_size * _OFFSET_STRIDE,
                        )
                    )
                    prev = run_base + (stop - block_size) * _OFFSET_STRIDE
                lo += whole * block_size
                offset += whole * block_size
                if lo < seg_end and lo < end:
                    # The block continues into the next segment.
                    pieces.append((key_hash, offset, length))
            if lo >= end:
                break
            seg_start = seg_end
        return hashes


# Step between the hashes of a run's consecutive token offsets (an odd prime, so that the
# values of different runs interleave rather than line up).
_OFFSET_STRIDE = 1_000_003

_FINAL_STATES = frozenset(
    {
        RequestState.COMPLETED,
        RequestState.TIMED_OUT,
        RequestState.DROPPED,
        RequestState.REJECTED,
        RequestState.DROPPED_ON_DRAIN,
        RequestState.FAILED,
    }
)


def prefix_key(group: str) -> tuple[str, str]:
    """Segment key of a prefix group's shared tokens: the workload generator and trace
    readers give a group's prefix this key, and `write_trace` recognises it."""
    return ("prefix", group)


def group_prefix_tokens(req: Request) -> int:
    """Length of the request's shared group prefix, 0 if its segments do not start with it."""
    stored = getattr(req, "group_prefix_tokens", None)  # a finished request's compact row
    if stored is not None:
        return stored
    if not req.prefix_group or not req.segments:
        return 0
    key, length = req.segments[0]
    if key != prefix_key(req.prefix_group) or length > req.input_tokens:
        return 0
    return length
