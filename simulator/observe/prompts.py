"""Prompt text of a given token length, built from a request's segments.

A real server needs text, and the workload only says how many tokens each prompt has and which
parts it shares (a prefix group's system prompt, a session's earlier rounds). Each segment
becomes a deterministic run of common English words chosen by the segment's key, so two
requests that share a segment share its text exactly and the server's prefix cache sees the
same sharing the simulator models. Every word is one token with its leading space in the
Llama 3, Qwen 2, Mistral and GPT-4 vocabularies; the server's own count is recorded anyway
(`server_input_tokens`), so a tokenizer that disagrees shows up in the trace.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np

from ..engine.request import Request

WORDS = (
    " the", " of", " and", " to", " in", " is", " was", " for", " that", " with", " as", " on",
    " by", " at", " from", " his", " her", " they", " this", " be", " are", " have", " had",
    " not", " but", " were", " which", " one", " all", " their", " said", " there", " when",
    " who", " will", " more", " no", " if", " out", " so", " up", " what", " about", " time",
    " can", " only", " into", " than", " other", " new", " some", " could", " these", " two",
    " may", " first", " then", " do", " any", " like", " my", " now", " over", " such", " our",
    " man", " me", " even", " most", " made", " after", " also", " did", " many", " before",
    " must", " through", " back", " years", " where", " much", " your", " way", " well", " down",
    " should", " because", " each", " just", " those", " people", " how", " too", " little",
    " state", " good", " very", " make", " world", " still", " own", " see", " men", " work",
    " long", " get", " here", " between", " both", " life", " being", " under", " never", " day",
    " same", " another", " know", " while", " last", " might", " us", " great", " old", " year",
    " off", " come", " since", " against", " go", " came", " right", " used", " take", " three",
)  # fmt: skip


@lru_cache(maxsize=4096)
def segment_text(key_repr: str, tokens: int) -> str:
    """`tokens` words drawn by a generator seeded from the segment key."""
    rng = np.random.default_rng(zlib.crc32(key_repr.encode("utf-8")))
    return "".join(WORDS[i] for i in rng.integers(0, len(WORDS), tokens).tolist())


def prompt_text(req: Request) -> str:
    """The request's prompt: its segments' texts in order (one segment if it has none)."""
    segments = req.segments or [(("in", req.request_id), req.input_tokens)]
    return "".join(segment_text(repr(key), n) for key, n in segments if n > 0)
