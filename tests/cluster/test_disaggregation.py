"""PD deciders (docs/behaviour.md §7.1, §7.3): each rule by hand, the global index, decode-cache
mode."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.cluster.disaggregation import (
    PD_DECIDERS,
    AlwaysDecider,
    DecisionContext,
    NeverDecider,
    PDDecider,
    PrefixThresholdDecider,
    PromptLengthDecider,
    decider_options,
    make_decider,
    register_decider,
)
from simulator.engine.request import Request
from simulator.errors import ConfigError

CTX = DecisionContext()


def shared(rid: str, n: int, group: str = "g", prefix: int = 64, out: int = 10) -> Request:
    """A request of n prompt tokens whose first `prefix` tokens are the group's shared prefix."""
    segments = [(("prefix", group), min(prefix, n))]
    if n > prefix:
        segments.append((("req", rid), n - prefix))
    return Request(rid, 0, n, out, segments=segments)


def test_never_and_always():
    req = shared("r", 100)
    assert make_decider("never").decide(req, CTX) == (False, "never")
    assert make_decider("always").decide(req, CTX) == (True, "always")
    assert isinstance(make_decider("never"), NeverDecider)
    assert isinstance(make_decider("always"), AlwaysDecider)


def test_prompt_length():
    d = make_decider("prompt-length")
    assert isinstance(d, PromptLengthDecider) and d.threshold_tokens == 256
    assert d.decide(shared("a", 255), CTX)[0] is False
    assert d.decide(shared("b", 256), CTX)[0] is True  # >= threshold
    d = make_decider("prompt-length", prompt_length_threshold=100)
    assert d.decide(shared("c", 99), CTX) == (False, "input_tokens 99 < 100")
    assert d.decide(shared("d", 100), CTX) == (True, "input_tokens 100 >= 100")


def test_prefix_threshold_global_rule():
    # Block size 16, threshold 16 non-cached tokens; every prompt starts with the same 64-token
    # (4-block) prefix followed by its own tokens.
    d = make_decider("prefix-threshold", prefix_threshold=16, block_size=16)
    first = shared("r1", 100)
    assert d.decide(first, CTX) == (True, "non-cached tokens 100 > 16 (global)")
    d.observe(first, True, CTX)
    # 4 prefix blocks are known: block 4 (tokens 64..79) holds r2's own tokens, so no more match.
    assert d.decide(shared("r2", 100), CTX) == (True, "non-cached tokens 36 > 16 (global)")
    assert d.decide(shared("r3", 80), CTX) == (False, "non-cached tokens 16 <= 16 (global)")
    assert d.decide(shared("r4", 81), CTX)[0] is True  # 17 > 16
    assert d.decide(shared("r5", 72), CTX)[0] is False  # 8 non-cached
    # A prompt that is exactly cached: nothing left to prefill remotely.
    assert d.decide(shared("r6", 64), CTX) == (False, "non-cached tokens 0 <= 16 (global)")


def test_prefix_threshold_repeat_prompt_matches_fully():
    d = make_decider("prefix-threshold", prefix_threshold=16)
    a = shared("a", 200)
    d.observe(a, False, CTX)  # recorded whatever the decision was
    # Same request content again: 12 full blocks (192 tokens) cached, 8 tokens left.
    again = Request("a2", 5, 200, 10, segments=list(a.segments))
    assert d.decide(again, CTX) == (False, "non-cached tokens 8 <= 16 (global)")


def test_prefix_threshold_empty_prompt():
    d = make_decider("prefix-threshold", prefix_threshold=0)
    assert d.decide(Request("e", 0, 0, 10), CTX) == (False, "empty prompt")
    d.observe(Request("e", 0, 0, 10), False, CTX)  # nothing to record, no error
    assert len(d.index) == 0
    # Threshold 0: any uncached token disaggregates, even a sub-block prompt.
    assert d.decide(Request("s", 0, 3, 10), CTX)[0] is True


def test_decide_does_not_learn():
    d = make_decider("prefix-threshold")
    req = shared("r", 100)
    d.decide(req, CTX)
    assert len(d.index) == 0
    assert d.decide(shared("r2", 100), CTX)[0] is True


def test_global_index_is_an_lru_of_block_hashes():
    d = PrefixThresholdDecider(threshold_tokens=0, block_size=16, capacity_blocks=4)
    a = shared("a", 64, group="A")  # blocks A0..A3
    d.observe(a, True, CTX)
    assert len(d.index) == 4
    assert d.index.matched_blocks(a.block_hashes(4, 16)) == 4
    # A 32-token request with the same prefix refreshes A0, A1: order is now A2, A3, A0, A1.
    d.observe(shared("a_short", 32, group="A"), True, CTX)
    # Two new blocks evict the least recently recorded ones, A2 and A3.
    d.observe(shared("b", 32, group="B"), True, CTX)
    assert len(d.index) == 4
    hashes = a.block_hashes(4, 16)
    assert d.index.matched_blocks(hashes) == 2
    assert hashes[2] not in d.index and hashes[3] not in d.index
    assert d.decide(shared("a2", 64, group="A"), CTX) == (True, "non-cached tokens 32 > 0 (global)")
    # Without the refresh, A0 would have gone first and nothing would match (leading blocks).
    d = PrefixThresholdDecider(threshold_tokens=0, block_size=16, capacity_blocks=4)
    d.observe(a, True, CTX)
    d.observe(shared("b", 32, group="B"), True, CTX)
    assert d.index.matched_blocks(hashes) == 0


def test_global_index_default_capacity_is_blis_10000():
    assert make_decider("prefix-threshold").index.capacity_blocks == 10_000


def test_decode_cache_mode_uses_chosen_instance():
    held = {0: 0, 1: 4, 2: 12}  # leading full blocks each decode instance really holds
    calls: list[tuple[int, str]] = []

    def probe(index: int, req: Request) -> int:
        calls.append((index, req.request_id))
        return held[index]

    d = make_decider("prefix-threshold", prefix_mode="decode-cache", prefix_threshold=16)
    req = shared("r", 200)
    ctx = lambda i: DecisionContext(decode_index=i, kv_probe=probe, block_size=16)  # noqa: E731
    assert d.decide(req, ctx(0)) == (True, "non-cached tokens 200 > 16 (decode-cache)")
    assert d.decide(req, ctx(1)) == (True, "non-cached tokens 136 > 16 (decode-cache)")
    assert d.decide(req, ctx(2)) == (False, "non-cached tokens 8 <= 16 (decode-cache)")
    assert calls == [(0, "r"), (1, "r"), (2, "r")]
    # Stateless: observing changes nothing.
    d.observe(req, True, ctx(0))
    assert len(d.index) == 0
    assert d.decide(req, ctx(0))[0] is True


def test_decode_cache_needs_probe_and_decode_choice():
    d = make_decider("prefix-threshold", prefix_mode="decode-cache")
    with pytest.raises(ConfigError, match="pd.prefix_mode"):
        d.decide(shared("r", 100), DecisionContext())
    with pytest.raises(ConfigError, match="pd.prefix_mode"):
        d.decide(shared("r", 100), DecisionContext(decode_index=None, kv_probe=lambda i, r: 0))


@given(n=st.integers(0, 600), out_a=st.integers(1, 5000), out_b=st.integers(1, 5000))
def test_deciders_never_read_output_length(n, out_a, out_b):
    for name in PD_DECIDERS:
        d = make_decider(name)
        a = shared("r", n, out=out_a)
        b = shared("r", n, out=out_b)
        assert d.decide(a, CTX) == d.decide(b, CTX)


def test_unknown_decider():
    with pytest.raises(ConfigError, match="unknown PD decider 'sometimes'; valid: always, never"):
        make_decider("sometimes")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prefix_threshold": -1}, "pd.prefix_threshold"),
        ({"prefix_threshold": 1.5}, "pd.prefix_threshold"),
        ({"prefix_threshold": True}, "pd.prefix_threshold"),
        ({"prompt_length_threshold": -3}, "pd.prompt_length_threshold"),
        ({"prompt_length_threshold": "256"}, "pd.prompt_length_threshold"),
        ({"prefix_mode": "local"}, "pd.prefix_mode"),
        ({"block_size": 0}, "block_size"),
    ],
)
@pytest.mark.parametrize("name", ["never", "prefix-threshold", "prompt-length"])
def test_bad_options(name, kwargs, field):
    with pytest.raises(ConfigError, match=field):
        make_decider(name, **kwargs)


def test_none_thresholds_mean_defaults():
    d = make_decider("prefix-threshold", prefix_threshold=None, prompt_length_threshold=None)
    assert d.threshold_tokens == 16
    d = make_decider("prompt-length", prompt_length_threshold=None)
    assert d.threshold_tokens == 256


def test_user_defined_stateful_decider():
    @register_decider
    class EveryOther(PDDecider):
        """Disaggregates every second request it has seen routed."""

        name = "every-other"

        def __init__(self) -> None:
            self.seen = 0

        def decide(self, req, ctx):
            return self.seen % 2 == 1, f"seen {self.seen}"

        def observe(self, req, disaggregated, ctx):
            self.seen += 1

    try:
        d = make_decider("every-other")
        decisions = []
        for i in range(4):
            req = shared(f"r{i}", 100)
            yes, _ = d.decide(req, CTX)
            d.observe(req, yes, CTX)
            decisions.append(yes)
        assert decisions == [False, True, False, True]
        with pytest.raises(ConfigError, match="every-other"):
            make_decider("nope")
    finally:
        del PD_DECIDERS["every-other"]


def test_a_threshold_is_called_ignored_only_by_a_decider_that_does_not_read_it(caplog):
    """pd.md's own example: a decider whose `build` takes prompt_length_threshold reads it,
    and the run used it; the warning said it was ignored (it named the built-in decider)."""
    import logging

    import simulator

    @register_decider
    class LongPrompts(PDDecider):
        name = "long-prompts"

        def __init__(self, threshold_tokens: int) -> None:
            self.threshold_tokens = threshold_tokens

        @classmethod
        def build(cls, *, prompt_length_threshold: int, **_: object) -> PDDecider:
            return cls(prompt_length_threshold)

        def decide(self, req, ctx):
            return req.input_tokens > self.threshold_tokens, "long"

    try:
        assert decider_options("long-prompts") == {"prompt_length_threshold"}
        assert decider_options("always") == set()
        for decider, warned in (("long-prompts", False), ("always", True)):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="servesim"):
                result = simulator.simulate(
                    "scenarios/pd_2p2d.yaml",
                    workload__num_requests=40,
                    cluster__pd__decider=decider,
                    cluster__pd__prompt_length_threshold=2000,
                )
            said = "pd.prompt_length_threshold is set but the decider" in caplog.text
            assert said is warned, (decider, caplog.text)
            if not warned:
                long = result.requests.input_tokens > 2000
                assert (result.requests.disaggregated == long).all()
    finally:
        del PD_DECIDERS["long-prompts"]
