"""Presets and distribution mode (docs/behaviour.md §9.1), compose (§12.2) and YAML round trips."""

from __future__ import annotations

import pytest
import yaml

from simulator.errors import ConfigError
from simulator.workload.presets import (
    PRESETS,
    compose_specs,
    distribution_spec,
    preset_spec,
    spec_to_yaml,
    with_absolute_files,
)
from simulator.workload.spec import workload_spec_from_dict

# docs/behaviour.md §9.1: prefix, prompt mean/sd/min/max, output mean/sd/min/max
TABLE = {
    "chatbot": (0, (256, 100, 2, 800), (256, 100, 1, 1024)),
    "contentgen": (0, (1024, 150, 10, 2048), (1024, 200, 10, 2048)),
    "summarization": (0, (4096, 500, 100, 8192), (512, 150, 10, 2048)),
    "multidoc": (0, (10240, 1200, 500, 20480), (1536, 300, 50, 4096)),
}


def _params(dist) -> tuple:
    p = dist.params
    return (p["mean"], p["std_dev"], p["min"], p["max"])


@pytest.mark.parametrize("name", sorted(TABLE))
def test_presets_match_spec_table(name: str) -> None:
    prefix, prompt, output = TABLE[name]
    spec = preset_spec(name, rate=4.0, num_requests=50)
    assert spec.aggregate_rate == 4.0 and spec.num_requests == 50
    [client] = spec.clients
    assert client.id == f"preset-{name}"
    assert client.arrival.process == "poisson"
    assert client.input_distribution.type == "gaussian"
    assert _params(client.input_distribution) == prompt
    assert _params(client.output_distribution) == output
    assert client.prefix_group == "" and PRESETS[name]["prefix_tokens"] == prefix


def test_preset_constant_arrival_like_blis_mar() -> None:
    assert preset_spec("chatbot", 1.0, 10, arrival="constant").clients[0].arrival.process == (
        "constant"
    )


def test_unknown_preset_lists_names() -> None:
    with pytest.raises(ConfigError, match="unknown workload preset 'chat'.*chatbot.*multidoc"):
        preset_spec("chat", 1.0, 10)


def test_distribution_defaults_and_prefix() -> None:
    spec = distribution_spec(2.0, 100)
    [c] = spec.clients
    assert c.id == "distribution"
    assert _params(c.input_distribution) == (512, 256, 2, 7000)
    assert _params(c.output_distribution) == (512, 256, 2, 7000)
    assert c.prefix_group == ""
    shared = distribution_spec(2.0, 100, prefix_tokens=64).clients[0]
    assert (shared.prefix_group, shared.prefix_length) == ("shared", 64)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rate": 0}, "rate"),
        ({"num_requests": -1}, "num_requests"),
        ({"prompt_tokens_min": 0}, "prompt_tokens_min"),
        ({"output_tokens_max": 1}, "output_tokens_max"),
        ({"prompt_tokens_stdev": -3}, "prompt_tokens_stdev"),
        ({"prefix_tokens": -1}, "prefix_tokens"),
        ({"arrival": "bursty"}, "arrival process"),
    ],
)
def test_distribution_bad_input(kwargs: dict, field: str) -> None:
    args = {"rate": 1.0, "num_requests": 10, **kwargs}
    with pytest.raises(ConfigError, match=field):
        distribution_spec(**args)


def test_distribution_spec_is_runs_traffic_from_the_length_flags() -> None:
    """docs/workloads.md: `distribution_spec` builds `run`'s length-flag traffic as a v2 spec.
    Its client was named c0, which seeds other random streams: other requests."""
    import simulator

    common = {"latency": {"model": "roofline"}, "seed": 3}
    spec = distribution_spec(20.0, 50, prompt_tokens=512, output_tokens=64)
    via_spec = simulator.simulate({**common, "workload": spec.model_dump(exclude_none=True)})
    gaussian = {"distribution": "gaussian", "stdev": 256, "min": 2, "max": 7000}
    flags = {"rate": 20, "num_requests": 50, "prompt_tokens": {**gaussian, "mean": 512},
             "output_tokens": {**gaussian, "mean": 64}}  # fmt: skip
    via_flags = simulator.simulate({**common, "workload": flags})
    columns = ["arrival_us", "input_tokens", "output_tokens"]
    assert via_spec.requests[columns].equals(via_flags.requests[columns])


def test_compose_rates_add_up() -> None:
    a = preset_spec("chatbot", 10.0, 100)
    b = distribution_spec(5.0, 50, prefix_tokens=8)
    merged = compose_specs([a, b])
    assert merged.aggregate_rate == 15.0
    assert merged.num_requests == 150
    rates = {c.id: merged.aggregate_rate * c.rate_fraction for c in merged.clients}
    assert rates == pytest.approx({"preset-chatbot": 10.0, "distribution": 5.0})


def test_compose_normalises_fractions_within_each_spec_and_renames_collisions() -> None:
    def two_clients(rate: float) -> dict:
        client = preset_spec("chatbot", 1.0, 1).clients[0].model_dump()
        return {
            "version": "2",
            "aggregate_rate": rate,
            "clients": [
                {**client, "id": "x", "rate_fraction": 3.0},
                {**client, "id": "y", "rate_fraction": 1.0},
            ],
        }

    a = workload_spec_from_dict(two_clients(8.0))
    b = workload_spec_from_dict(two_clients(2.0))
    merged = compose_specs([a, b])
    ids = [c.id for c in merged.clients]
    assert ids == ["x", "y", "x-1", "y-1"]
    assert len(set(ids)) == 4
    absolute = [merged.aggregate_rate * c.rate_fraction for c in merged.clients]
    assert absolute == pytest.approx([6.0, 2.0, 1.5, 0.5])
    assert sum(c.rate_fraction for c in merged.clients) == pytest.approx(1.0)


def test_compose_keeps_each_specs_prompts_when_prefix_groups_collide() -> None:
    """Two specs made with --prefix-tokens both name their group "shared". Merged under one
    name, the second spec's clients took the first's 128-token prefix (its length is set by
    the first client of a group) and their prompts grew; renamed, each spec's traffic is
    what it was alone: the sum law of compose."""
    from simulator.workload.generator import WorkloadStream

    a = distribution_spec(30.0, 400, prefix_tokens=128)
    b = distribution_spec(10.0, 400, prefix_tokens=16)
    merged = compose_specs([a, b, distribution_spec(5.0, 100, prefix_tokens=16)])
    assert [c.prefix_group for c in merged.clients] == ["shared", "shared-1", "shared-2"]
    requests = list(WorkloadStream(merged, seed=1))
    alone = {
        cid: list(WorkloadStream(spec, seed=1))
        for cid, spec in (("distribution", a), ("distribution-1", b))
    }
    for cid, own in alone.items():
        mine = [r for r in requests if r.client_id == cid]
        prefix = own[0].segments[0][1]
        assert prefix == {"distribution": 128, "distribution-1": 16}[cid]
        assert all(r.segments[0][1] == prefix for r in mine)
        assert min(r.input_tokens for r in mine) >= prefix
    # Within one spec, clients of one group still share it.
    shared_within = compose_specs([workload_spec_from_dict(_two_in_one_group())])
    assert {c.prefix_group for c in shared_within.clients} == {"g"}


def _two_in_one_group() -> dict:
    client = preset_spec("chatbot", 1.0, 1).clients[0].model_dump()
    return {
        "version": "2",
        "aggregate_rate": 2.0,
        "clients": [
            {**client, "id": "x", "prefix_group": "g", "prefix_length": 32},
            {**client, "id": "y", "prefix_group": "g"},
        ],
    }


def test_compose_expands_cohorts() -> None:
    base = (
        preset_spec("chatbot", 1.0, 1)
        .clients[0]
        .model_dump(exclude={"lifecycle", "concurrency", "think_time_us"})
    )
    with_cohort = workload_spec_from_dict(
        {
            "version": "2",
            "aggregate_rate": 4.0,
            "cohorts": [{**base, "id": "co", "population": 4, "rate_fraction": 1.0}],
        }
    )
    merged = compose_specs([with_cohort, distribution_spec(4.0, 10)])
    assert [c.id for c in merged.clients] == ["co-0", "co-1", "co-2", "co-3", "distribution"]
    assert merged.cohorts == []
    assert sum(c.rate_fraction for c in merged.clients[:4]) == pytest.approx(0.5)


def _absolute(client_id: str, rate: float, start_s: int, end_s: int) -> dict:
    """A spec in absolute-rate mode (as `convert servegen` writes): no aggregate_rate; the
    client's one window sends `rate` req/s."""
    window = {"start_us": start_s * 10**6, "end_us": end_s * 10**6, "trace_rate": rate}
    return {
        "version": "2",
        "clients": [{
            "id": client_id, "rate_fraction": 1.0, "arrival": {"process": "poisson"},
            "input_distribution": {"type": "constant", "params": {"value": 100}},
            "output_distribution": {"type": "constant", "params": {"value": 10}},
            "lifecycle": {"windows": [window]},
        }],
    }  # fmt: skip


def test_compose_adds_absolute_rate_specs_side_by_side() -> None:
    """Two absolute-rate specs: each client keeps its window's own req/s (their sum is the
    traffic); composing one with itself doubles it. (It was refused: 'composed rate 0'.)"""
    a = workload_spec_from_dict(_absolute("x", 2.0, 0, 10))
    b = workload_spec_from_dict(_absolute("y", 3.0, 5, 15))
    merged = compose_specs([a, b])
    assert merged.aggregate_rate is None and merged.absolute_rates
    assert [(c.id, c.lifecycle.windows[0].trace_rate) for c in merged.clients] == [
        ("x", 2.0),
        ("y", 3.0),
    ]
    assert [c.id for c in compose_specs([a, a]).clients] == ["x", "x-1"]


def test_compose_refuses_to_mix_absolute_and_shared_rates() -> None:
    absolute = workload_spec_from_dict(_absolute("x", 2.0, 0, 10))
    with pytest.raises(ConfigError, match=r"^compose: spec 1 gives absolute rates .* spec 0 an"):
        compose_specs([distribution_spec(4.0, 10), absolute])


def test_compose_keeps_the_slo_targets_and_refuses_two_for_one_class() -> None:
    def spec(ttft_ms: float) -> dict:
        data = preset_spec("chatbot", 1.0, 5).model_dump(mode="json", exclude_none=True)
        return {**data, "goodput_slo_targets": {"critical": {"ttft_ms": ttft_ms}}}

    merged = compose_specs([workload_spec_from_dict(spec(50)), distribution_spec(2.0, 5)])
    assert merged.goodput_slo_targets["critical"].ttft_ms == 50
    same = compose_specs([workload_spec_from_dict(spec(50))] * 2)
    assert same.goodput_slo_targets["critical"].ttft_ms == 50
    with pytest.raises(ConfigError, match=r"goodput_slo_targets\['critical'\]: spec 1"):
        compose_specs([workload_spec_from_dict(spec(50)), workload_spec_from_dict(spec(80))])


def test_a_composed_spec_reads_its_length_tables_from_anywhere(tmp_path) -> None:
    (tmp_path / "lengths").mkdir()
    (tmp_path / "lengths" / "in.csv").write_text("64,1\n128,1\n")
    data = preset_spec("chatbot", 1.0, 5).model_dump(mode="json", exclude_none=True)
    data["clients"][0]["input_distribution"] = {"type": "empirical", "file": "lengths/in.csv"}
    spec = with_absolute_files(workload_spec_from_dict(data), tmp_path)
    path = spec.clients[0].input_distribution.file
    assert path == str((tmp_path / "lengths" / "in.csv").resolve())
    assert with_absolute_files(spec, tmp_path / "elsewhere") == spec  # absolute stays


def test_compose_needs_specs() -> None:
    with pytest.raises(ConfigError, match="compose"):
        compose_specs([])


@pytest.mark.parametrize("name", sorted(TABLE))
def test_spec_to_yaml_round_trips(name: str) -> None:
    spec = preset_spec(name, 3.5, 20)
    text = spec_to_yaml(spec)
    assert "null" not in text
    assert workload_spec_from_dict(yaml.safe_load(text)) == spec


def test_spec_to_yaml_round_trips_rich_spec() -> None:
    base = (
        preset_spec("chatbot", 1.0, 1)
        .clients[0]
        .model_dump(exclude={"lifecycle", "concurrency", "think_time_us"})
    )
    data = {
        "version": "2",
        "seed": 9,
        "aggregate_rate": 7.0,
        "horizon": 10_000_000,
        "clients": [
            {
                **base,
                "id": "a",
                "arrival": {"process": "gamma", "cv": 2.5},
                "slo_class": "critical",
                "timeout": 0,
                "lifecycle": {"windows": [{"start_us": 0, "end_us": 5}]},
                "reasoning": {"multi_turn": {"max_rounds": 3, "think_time_us": 10}},
            },
        ],
        "cohorts": [
            {**base, "id": "co", "population": 3, "spike": {"start_time_us": 1, "duration_us": 2}}
        ],
    }
    spec = workload_spec_from_dict(data)
    text = spec_to_yaml(spec)
    assert "null" not in text
    loaded = workload_spec_from_dict(yaml.safe_load(text))
    assert loaded == spec
    # Explicit zero timeout (no deadline) survives; it differs from "absent" for sessions.
    assert loaded.clients[0].timeout == 0


def test_a_length_field_beside_a_preset_replaces_that_field_alone() -> None:
    """`--workload chatbot --prompt-tokens-max 600` caps chatbot's prompts (256, 100, 2, 800
    in §9.1's table) at 600; the fields not given stay the preset's, not the defaults'
    512 / 256 / 2 / 7000 (QA: it drew N(512, 256) clamped to [2, 600])."""
    from simulator.scenario import SyntheticWorkload
    from simulator.workload.synthetic import synthetic_to_spec

    def law(workload: dict) -> tuple:
        spec = synthetic_to_spec(SyntheticWorkload(**workload))
        return _params(spec.clients[0].input_distribution)

    assert law({"preset": "chatbot"}) == TABLE["chatbot"][1]
    assert law({"preset": "chatbot", "prompt_tokens": {"max": 600}}) == (256, 100, 2, 600)
    assert law({"preset": "chatbot", "prompt_tokens": {"mean": 100}}) == (100, 100, 2, 800)
    # Without a preset the defaults fill in, as before.
    assert law({"prompt_tokens": {"max": 600}}) == (512, 256, 2, 600)
    # The merged law is checked: chatbot's min 2 above a given max of 1.
    with pytest.raises(ConfigError, match=r"^workload\.prompt_tokens\.max: invalid value 1; min"):
        law({"preset": "chatbot", "prompt_tokens": {"max": 1}})


@pytest.mark.parametrize(
    ("length", "message"),
    [
        ({"value": 10}, "value: invalid value 10; it applies to distribution constant"),
        ({"distribution": "gaussian", "value": 10}, "value: invalid value 10"),
        ({"distribution": "constant", "value": 10, "mean": 5}, "mean: invalid value 5"),
        ({"distribution": "constant", "value": 10, "max": 50}, "max: invalid value 50"),
    ],
)
def test_a_length_field_of_the_other_law_is_refused(length: dict, message: str) -> None:
    """`{value: 10}` ran as N(512, 256) without a word (QA): a field the law ignores is
    refused, naming it."""
    import simulator

    with pytest.raises(ConfigError, match=rf"workload\.output_tokens\.{message}"):
        simulator.simulate({"workload": {"num_requests": 5, "output_tokens": length}})


def test_an_unknown_preset_in_a_scenario_names_its_field() -> None:
    import simulator

    with pytest.raises(ConfigError, match=r"^workload\.preset: unknown workload preset 'chatbott'"):
        simulator.simulate({"workload": {"preset": "chatbott", "num_requests": 5}})


def test_a_constant_law_dumped_with_the_former_defaults_reads_back() -> None:
    """Results saved before 2026-12-07 carry a constant law with the gaussian defaults filled
    in (mean 512, stdev 256, min 2, max 7000); `simulate(result.scenario)` must still run it.
    A gaussian field that is not a former default is still refused."""
    import simulator

    dumped = {"distribution": "constant", "mean": 512.0, "stdev": 256.0, "min": 2, "max": 7000}
    scenario = simulator.Scenario(
        workload={"num_requests": 5, "output_tokens": {**dumped, "value": 7}}
    )
    assert scenario.workload.output_tokens.mean is None
    assert scenario.workload.output_tokens.value == 7
    with pytest.raises(ConfigError, match=r"workload\.output_tokens\.mean: invalid value 500"):
        simulator.simulate(
            {"workload": {"num_requests": 5, "output_tokens": {**dumped, "mean": 500, "value": 7}}}
        )
