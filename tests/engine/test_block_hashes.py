"""Block hashes name content: two requests' block i hashes alike exactly when the tokens of
blocks 0..i are the same (docs/behaviour.md §2.2), however the hashes are computed (in one call or
extended piece by piece, across segment boundaries, empty segments and output tokens)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.request import Request

KEYS = ["a", "b", ("req", "x"), ("prefix", "sys")]


def content_names(req: Request, blocks: int, block_size: int) -> list[tuple]:
    """The reference: block i named by every (key, offset range) piece of blocks 0..i."""
    pieces_by_block: list[list] = [[] for _ in range(blocks)]
    start = 0
    segments = [*req.segments, (req.output_key, blocks * block_size)]
    for key, length in segments:
        end = start + length
        for b in range(blocks):
            lo, hi = b * block_size, (b + 1) * block_size
            if length == 0 and lo < start < hi:
                pieces_by_block[b].append((key, 0, 0))
            elif length and start < hi and end > lo:
                pieces_by_block[b].append((key, max(lo, start) - start, min(hi, end) - start))
        start = end
        if start >= blocks * block_size:
            break
    names, prefix = [], ()
    for pieces in pieces_by_block:
        prefix = (*prefix, tuple(pieces))
        names.append(prefix)
    return names


segments = st.lists(
    st.tuples(st.sampled_from(KEYS), st.sampled_from([0, 1, 3, 5, 8, 16, 17, 33])), max_size=4
)


@settings(max_examples=400, deadline=None)
@given(
    segments,
    segments,
    st.sampled_from([1, 4, 16]),
    st.integers(0, 10),
    st.booleans(),
    st.lists(st.integers(0, 10), max_size=3),
)
def test_equal_hashes_iff_equal_content(seg_a, seg_b, block_size, blocks, same_id, steps):
    a = Request("r1", 0, sum(n for _, n in seg_a), 5, segments=list(seg_a))
    b = Request("r1" if same_id else "r2", 0, sum(n for _, n in seg_b), 5, segments=list(seg_b))
    for k in sorted(steps):  # extend a's hashes in steps; b's in one call
        a.block_hashes(k, block_size)
    ha = a.block_hashes(blocks, block_size)[:blocks]
    hb = b.block_hashes(blocks, block_size)[:blocks]
    na, nb = content_names(a, blocks, block_size), content_names(b, blocks, block_size)
    assert len(ha) == len(hb) == blocks
    for i in range(blocks):
        assert (ha[i] == hb[i]) == (na[i] == nb[i]), i


def test_a_shared_prefix_hashes_alike_until_the_contents_differ():
    shared = (("prefix", "sys"), 40)
    a = Request("a", 0, 60, 1, segments=[shared, (("req", "a"), 20)])
    b = Request("b", 0, 60, 1, segments=[shared, (("req", "b"), 20)])
    ha, hb = a.block_hashes(3, 16), b.block_hashes(3, 16)
    assert ha[:2] == hb[:2]  # tokens 0..31: the shared prompt
    assert ha[2] != hb[2]  # tokens 32..47 mix the prefix with each request's own tokens


def test_whole_blocks_inside_a_segment_are_a_run_base_plus_offsets():
    """The values themselves, not only their equalities. A one-segment prompt's whole blocks
    are one run: base = hash((0, hash(key))) // 2 (0: nothing before the run), block i =
    base + 1,000,003 x (8 i) (the stride times its start offset). A prompt that continues
    the segment after a spanning block starts a new run from that block's hash."""
    stride = 1_000_003
    key = ("in", "k", 0)
    req = Request("r", 0, 40, 5, segments=[(key, 40)])
    base = hash((0, hash(key))) >> 1
    assert req.block_hashes(5, 8) == [base + stride * start for start in (0, 8, 16, 24, 32)]
    assert all(-(2**63) <= h < 2**63 for h in req.block_hashes(5, 8))  # C-sized: fast range
    # Extended one block at a time: the same values (the run resumes from its last block).
    stepwise = Request("r", 0, 40, 5, segments=[(key, 40)])
    for k in range(1, 6):
        stepwise.block_hashes(k, 8)
    assert stepwise.block_hashes(5, 8) == req.block_hashes(5, 8)
    # [(a, 4), (key, 20)], blocks of 8: block 0 spans both segments, blocks 1 and 2 are the
    # run of `key` from offset 4.
    mixed = Request("m", 0, 24, 5, segments=[("a", 4), (key, 20)])
    h0 = hash((0, ((hash("a"), 0, 4), (hash(key), 0, 4))))
    run = hash((h0, hash(key))) >> 1
    assert mixed.block_hashes(3, 8) == [h0, run + 4 * stride, run + 12 * stride]
