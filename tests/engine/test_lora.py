"""Multi-LoRA serving (docs/lora.md): the adapter caches, the costs by hand, the engine's
admission rule and activations, the KV capacity the adapter buffers take, per-adapter metrics
and lora-affinity routing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import simulator
from simulator.catalog.models import load_model
from simulator.cli import app
from simulator.cluster.routing import make_scorer
from simulator.cluster.snapshot import InstanceSnapshot
from simulator.engine.batching import EngineConfig, VLLMEngine
from simulator.engine.lora import Adapter, LoRAConfig, LoRACost, LRUSet, ModuleShapes
from simulator.engine.request import Request, RequestState
from simulator.errors import ConfigError
from simulator.lora_setup import module_shapes, parse_lora_flag

ROOT = Path(__file__).resolve().parents[2]

# Costs chosen for hand arithmetic: a toy model of one layer with one 10+10-wide module, 1 byte
# per parameter; 1 µs per 1,000 FLOPs, 1 µs per 100 bytes read, loads 1 µs per byte (+100 µs)
# from the CPU cache and 2 µs per byte (+1,000 µs) more from disk.
SHAPES = ModuleShapes({"q_proj": (10, 10)}, 1)
COST = LoRACost(
    flop_us=1e-3,
    byte_us=1e-2,
    load_byte_us=1.0,
    disk_byte_us=2.0,
    load_base_us=100,
    disk_base_us=1000,
    bytes_per_param=1.0,
)


def _lora(max_loras=2, max_cpu_loras=None, ranks=None) -> LoRAConfig:
    ranks = ranks or {"a": 4, "b": 4, "c": 4, "d": 4}
    adapters = {n: Adapter(n, r, ("q_proj",)) for n, r in ranks.items()}
    return LoRAConfig(
        adapters,
        max_loras,
        max_cpu_loras or max_loras,
        max(ranks.values()),
        SHAPES,
        COST,
        {n: SHAPES.widths(("q_proj",)) for n in adapters},
    )


def _run(engine: VLLMEngine, requests, step_us=lambda b: 10, arrive_at=None):
    arrive_at = arrive_at or {}
    now = 0
    pending = sorted(requests, key=lambda r: arrive_at.get(r.request_id, 0))
    durations = []
    while pending or engine.has_work:
        while pending and arrive_at.get(pending[0].request_id, 0) <= now:
            engine.enqueue(pending.pop(0), now)
        if not engine.has_work:
            now = arrive_at[pending[0].request_id]
            continue
        batch = engine.plan_step(now)
        engine.dropped_while_planning.clear()
        duration = step_us(batch) + batch.extra_us
        durations.append(batch.extra_us)
        engine.finish_step(duration)
        now += duration
        engine.check_invariants()
    return durations


# ---------------------------------------------------------------- plain objects


def test_lru_set_evicts_the_least_recent_name_not_kept():
    lru = LRUSet(2)
    assert lru.add("a") is None and lru.add("b") is None
    lru.touch("a")  # order: b, a
    assert lru.add("c") == "b"
    assert lru.names() == ["a", "c"]
    assert lru.add("d", keep={"a"}) == "c"  # a is in use: the next least recent goes
    assert lru.remove("a") and not lru.remove("zz")


def test_costs_by_hand():
    # A rank-4 adapter on the toy module: 4 × 20 = 80 parameters, 80 bytes.
    cfg = _lora()
    assert cfg.size_bytes("a") == 80
    assert COST.load_us(80, from_disk=False) == 100 + 80
    assert COST.load_us(80, from_disk=True) == 100 + 80 + 1000 + 160
    # 50 tokens of one rank-4 adapter: 2 × 50 × 4 × 20 = 8,000 FLOPs = 8 µs; reading its 80
    # bytes 0.8 µs: compute wins.
    assert COST.step_us(50 * 4 * 20, 4 * 20) == 8
    # vLLM's buffers: 2 slots × rank 4 × 20 × 1 byte.
    assert cfg.reserved_bytes() == 160


def test_llama_8b_adapter_size_by_hand():
    # Llama-3.1-8B: hidden 4,096, 32 heads of 128, 8 KV heads (1,024 wide), MLP 14,336, 32
    # layers. Σ(in + out) per layer: q 8,192 + k 5,120 + v 5,120 + o 8,192 + 3 × 18,432.
    shapes = module_shapes(load_model("meta-llama/llama-3.1-8b-instruct"))
    per_layer = 8192 + 5120 + 5120 + 8192 + 3 * 18432
    assert shapes.widths(shapes.shapes) == 32 * per_layer == 2_621_440
    # A rank-16 adapter in BF16: 16 × 2,621,440 × 2 bytes = 80 MiB.
    assert 16 * 2_621_440 * 2 == 80 * 2**20


# ---------------------------------------------------------------- the engine


def test_a_batch_holds_at_most_max_loras_adapters_and_others_are_not_blocked():
    # max_loras 2: a and b run; c waits (skipped, not blocking); the base request runs.
    engine = VLLMEngine(EngineConfig(lora=_lora(max_loras=2)))
    a, b = Request("a", 0, 10, 3, adapter="a"), Request("b", 0, 10, 3, adapter="b")
    c, base = Request("c", 0, 10, 3, adapter="c"), Request("base", 0, 10, 3)
    for r in (a, b, c, base):
        engine.enqueue(r, 0)
    engine.plan_step(0)
    assert engine.running == [a, b, base]
    assert list(engine.waiting) == [c]
    _run(engine, [])
    assert all(r.state is RequestState.COMPLETED for r in (a, b, c, base))
    assert c.first_schedule_us > a.first_schedule_us


def test_loads_and_kernels_are_added_to_the_step():
    engine = VLLMEngine(EngineConfig(lora=_lora(max_loras=2)))
    a, b = Request("a", 0, 50, 2, adapter="a"), Request("b", 0, 30, 2, adapter="b")
    for r in (a, b):
        engine.enqueue(r, 0)
    batch = engine.plan_step(0)
    # Two loads from disk: 2 × (100 + 80 + 1,000 + 160) = 2,680 µs; kernels for 80 tokens of
    # rank 4: 2 × 80 × 4 × 20 = 12,800 FLOPs = 12 µs (µs truncated); reading 160 bytes 1.6 µs.
    assert batch.extra_us == 2680 + 12
    engine.finish_step(10 + batch.extra_us)
    batch = engine.plan_step(10 + 2692)
    # Both resident now: only the kernels, 2 tokens: 2 × 2 × 4 × 20 = 320 FLOPs = 0.32 µs,
    # below the 1.6 µs of reading both adapters: 1 µs.
    assert batch.extra_us == 1
    stats = engine.lora.stats
    assert (stats["a"].gpu_loads, stats["a"].disk_loads, stats["a"].evictions) == (1, 1, 0)


def test_eviction_and_the_cpu_cache_by_hand():
    # One GPU slot, two CPU slots. Requests one after another: a, b, a, c, a.
    #   a: disk load.  b: disk load, evicts a from the GPU.  a: from the CPU cache, evicts b.
    #   c: disk load, evicts a from the GPU and b from the CPU cache.  a: from the CPU cache.
    engine = VLLMEngine(EngineConfig(lora=_lora(max_loras=1, max_cpu_loras=2)))
    names = ["a", "b", "a", "c", "a"]
    reqs = [Request(f"r{i}", 0, 10, 1, adapter=n) for i, n in enumerate(names)]
    _run(engine, reqs, arrive_at={r.request_id: 100_000 * i for i, r in enumerate(reqs)})
    s = engine.lora.stats
    assert (s["a"].gpu_loads, s["a"].disk_loads, s["a"].evictions) == (3, 1, 2)
    assert (s["b"].gpu_loads, s["b"].disk_loads, s["b"].evictions) == (1, 1, 1)
    assert (s["c"].gpu_loads, s["c"].disk_loads, s["c"].evictions) == (1, 1, 1)
    assert engine.lora.cpu_evictions == 1
    assert [s[n].completed for n in "abc"] == [3, 1, 1]


def test_an_adapter_used_on_the_gpu_stays_fresh_in_the_host_cache():
    # Two GPU slots, two CPU slots. Requests one after another: a, b, a, c, a.
    #   a: disk load.  b: disk load.  a: already in a GPU slot; vLLM's worker re-adds it,
    #   which refreshes it in the host cache too (least recent there is now b).
    #   c: disk load; the host cache drops b (not a), and b leaves its GPU slot with it.
    #   a: still in its GPU slot, nothing to load.
    # Refreshing only the GPU slot would drop a instead and read it from disk a second time.
    engine = VLLMEngine(EngineConfig(lora=_lora(max_loras=2, max_cpu_loras=2)))
    names = ["a", "b", "a", "c", "a"]
    reqs = [Request(f"r{i}", 0, 10, 1, adapter=n) for i, n in enumerate(names)]
    _run(engine, reqs, arrive_at={r.request_id: 100_000 * i for i, r in enumerate(reqs)})
    s = engine.lora.stats
    assert (s["a"].gpu_loads, s["a"].disk_loads, s["a"].evictions) == (1, 1, 0)
    assert (s["b"].gpu_loads, s["b"].disk_loads, s["b"].evictions) == (1, 1, 1)
    assert (s["c"].gpu_loads, s["c"].disk_loads, s["c"].evictions) == (1, 1, 0)
    assert engine.lora.cpu_evictions == 1


def test_unknown_adapters_are_dropped():
    engine = VLLMEngine(EngineConfig(lora=_lora()))
    r = Request("x", 0, 10, 3, adapter="nope")
    engine.enqueue(r, 0)
    assert r.state is RequestState.DROPPED and engine.dropped_unservable == 1


@settings(max_examples=50, deadline=None)
@given(
    adapters=st.lists(st.sampled_from(["", "a", "b", "c", "d"]), min_size=1, max_size=12),
    max_loras=st.integers(1, 4),
    extra_cpu=st.integers(0, 3),
    spare_blocks=st.integers(0, 30),
)
def test_laws_with_lora(adapters, max_loras, extra_cpu, spare_blocks):
    """Every request completes with its output; no batch ever holds more than max_loras
    adapters (check_invariants, every step); KV conserved; every adapter a request used was
    loaded at least once, and evictions never exceed loads."""
    # Room for the largest request alone (5 + 3i prompt, 4 + i output, 4-token blocks).
    blocks = -(-(9 + 4 * (len(adapters) - 1)) // 4) + spare_blocks
    engine = VLLMEngine(
        EngineConfig(
            total_kv_blocks=blocks,
            block_size=4,
            lora=_lora(max_loras=max_loras, max_cpu_loras=max_loras + extra_cpu),
        )
    )
    reqs = [Request(f"r{i}", 0, 5 + 3 * i, 4 + i, adapter=a) for i, a in enumerate(adapters)]
    _run(engine, reqs)
    assert all(r.state is RequestState.COMPLETED for r in reqs)
    assert all(r.generated_tokens == r.output_tokens for r in reqs)
    assert engine.kv.used_blocks == 0
    stats = engine.lora.stats
    for name in {a for a in adapters if a}:
        assert stats[name].gpu_loads >= 1
        assert stats[name].completed == adapters.count(name)
    assert sum(s.evictions for s in stats.values()) <= sum(s.gpu_loads for s in stats.values())


# ---------------------------------------------------------------- scenarios and routing


def _lora_scenario(routing: dict, adapters: int = 50, requests: int = 1200) -> dict:
    clients = [
        {
            "id": f"c{i}",
            "adapter": f"ft-{i}",
            "rate_fraction": 1.0 / (i + 1),
            "arrival": {"process": "poisson"},
            "input_distribution": {
                "type": "gaussian",
                "params": {"mean": 512, "std_dev": 128, "min": 16, "max": 2048},
            },
            "output_distribution": {
                "type": "gaussian",
                "params": {"mean": 128, "std_dev": 32, "min": 1, "max": 512},
            },
        }
        for i in range(adapters)
    ]
    return {
        "model": "meta-llama/llama-3.1-8b-instruct",
        "hardware": "H100",
        "seed": 3,
        "lora": {
            "adapters": [{"name": "ft", "rank": 16, "count": adapters}],
            "max_loras": 8,
            "max_cpu_loras": 16,
        },
        "cluster": {"num_instances": 4, "routing": routing},
        "workload": {
            "version": "2",
            "aggregate_rate": 40,
            "num_requests": requests,
            "clients": clients,
        },
    }


def test_fifty_adapters_over_eight_slots_show_loads_evictions_and_lost_capacity():
    result = simulator.simulate(_lora_scenario({"policy": "round-robin"}), warn_unsteady=False)
    s = result.summary
    assert s["completed_requests"] == 1200
    assert s["lora_cold_loads"] > 50  # more loads than adapters: evicted ones come back
    assert s["lora_evictions"] > 0 and s["lora_disk_loads"] > 0
    assert 0 < s["lora_load_time_share"] < 1
    # The buffers: 8 slots × rank 16 × 2,621,440 × 2 bytes = 0.625 GiB per instance.
    resolved = result.scenario["resolved"]
    assert resolved["lora"]["reserved_gib"] == 0.625
    assert resolved["lora"]["reserved_kv_blocks"] > 0
    plain = simulator.resolve_deployment(simulator.Scenario(model=resolved["model"]))
    assert resolved["total_kv_blocks"] == (
        plain.engine.total_kv_blocks - resolved["lora"]["reserved_kv_blocks"]
    )
    assert s["lora_reserved_kv_blocks"] == 4 * resolved["lora"]["reserved_kv_blocks"]
    per_adapter = result.adapter_metrics
    assert len(per_adapter) == 50
    assert sum(a["completed_requests"] for a in per_adapter.values()) == 1200
    assert sum(a["load_count"] for a in per_adapter.values()) == s["lora_cold_loads"]
    assert "=== Per-Adapter Metrics ===" in result.report_text()
    assert result.results_document()["adapters"] == per_adapter


def test_lora_affinity_routing_reduces_cold_loads():
    rr = simulator.simulate(_lora_scenario({"policy": "round-robin"}), warn_unsteady=False)
    affinity = simulator.simulate(
        _lora_scenario({"policy": "weighted", "scorers": "lora-affinity:2,queue-depth:1"}),
        warn_unsteady=False,
    )
    assert affinity.summary["completed_requests"] == rr.summary["completed_requests"]
    assert affinity.summary["lora_cold_loads"] < rr.summary["lora_cold_loads"] / 2


def test_lora_affinity_scores():
    scorer = make_scorer("lora-affinity")
    a = InstanceSnapshot("i0", 0, adapters=frozenset({"x"}))
    b = InstanceSnapshot("i1", 1, adapters=frozenset({"y"}))
    assert scorer.score_list(Request("r", 0, 1, 1, adapter="x"), [a, b]) == [1.0, 0.0]
    assert scorer.score_list(Request("r", 0, 1, 1, adapter="z"), [a, b]) == [1.0, 1.0]
    assert scorer.score_list(Request("r", 0, 1, 1), [a, b]) == [1.0, 1.0]


def test_accelerated_and_reference_runs_are_identical():
    sc = _lora_scenario({"policy": "round-robin"}, adapters=12, requests=300)
    fast = simulator.simulate(sc, warn_unsteady=False)
    slow = simulator.simulate(sc, warn_unsteady=False, reference=True)
    assert fast.summary == slow.summary
    assert fast.blis_request_records() == slow.blis_request_records()


def test_summary_fields_only_with_lora_and_adapters_ignored_without_it():
    sc = _lora_scenario({"policy": "round-robin"}, adapters=5, requests=100)
    on = simulator.simulate(sc, warn_unsteady=False)
    off = simulator.simulate({**sc, "lora": None}, warn_unsteady=False)
    assert not any(k.startswith("lora_") for k in off.summary)
    assert off.adapter_metrics is None
    assert off.summary["completed_requests"] == on.summary["completed_requests"] == 100
    assert {k for k in on.summary if k.startswith("lora_")} == {
        "lora_cold_loads",
        "lora_disk_loads",
        "lora_evictions",
        "lora_load_time_share",
        "lora_compute_time_share",
        "lora_reserved_kv_blocks",
    }


def test_trace_rows_carry_their_adapter(tmp_path):
    from simulator.workload.trace import load_requests_file

    rows = [
        "request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,"
        "streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,"
        "video_tokens,reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,"
        "send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,"
        "finish_reason,adapter",
        "r0,c,,,,0,,false,10,5,10,0,0,0,0,,0,0,0,0,0,0,0,ok,,,ft-1",
    ]
    data = tmp_path / "t.csv"
    data.write_text("\n".join(rows) + "\n")
    (req,) = load_requests_file(data)
    assert req.adapter == "ft-1"


def test_the_shipped_scenario_runs():
    result = simulator.simulate(ROOT / "scenarios" / "lora_adapters.yaml", warn_unsteady=False)
    assert result.summary["lora_cold_loads"] > 0


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"adapters": [{"name": "a", "rank": 8}], "max_loras": 4, "max_cpu_loras": 2},
         "max_cpu_loras"),
        ({"adapters": [{"name": "a", "rank": 32}], "max_lora_rank": 16}, "exceeds max_lora_rank"),
        ({"adapters": [{"name": "a", "rank": 8}, {"name": "a", "rank": 8}]}, "used twice"),
        ({"adapters": [{"name": "a", "rank": 0}]}, r"lora\.adapters\[0\]\.rank"),
        ({"adapters": []}, "lora.adapters"),
    ],
)  # fmt: skip
def test_bad_lora_sections_name_the_field(lora, message):
    with pytest.raises(ConfigError, match=message):
        simulator.simulate("scenarios/quickstart.yaml", lora=lora)


def test_lora_flags():
    assert parse_lora_flag("ft:16:3,sql:8") == [
        {"name": "ft", "rank": 16, "count": 3},
        {"name": "sql", "rank": 8},
    ]
    with pytest.raises(ConfigError, match="--lora"):
        parse_lora_flag("ft")
    runner = CliRunner()
    bad = runner.invoke(app, ["run", "scenarios/quickstart.yaml", "--lora", "x:y"])
    assert bad.exit_code == 2 and "--lora" in bad.output
    ok = runner.invoke(
        app,
        ["run", "scenarios/quickstart.yaml", "--num-requests", "20", "--lora", "ft:16:3",
         "--max-loras", "2", "--max-cpu-loras", "3", "--max-lora-rank", "32"],
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert '"lora_reserved_kv_blocks"' in ok.output


def _one_adapter_run(**extra) -> simulator.Result:
    client = {
        "id": "a",
        "adapter": "ft",
        "rate_fraction": 1,
        "arrival": {"process": "poisson"},
        "input_distribution": {"type": "constant", "params": {"value": 200}},
        "output_distribution": {"type": "constant", "params": {"value": 50}},
    }
    return simulator.simulate(
        {
            "model": "meta-llama/llama-3.1-8b-instruct",
            "hardware": "H100",
            "lora": {"adapters": [{"name": "ft", "rank": 8}]},
            "workload": {
                "version": "2",
                "aggregate_rate": 20,
                "num_requests": 60,
                "clients": [client],
            },  # fmt: skip
            **extra,
        },
        warn_unsteady=False,
        check_invariants=True,
    )


@pytest.mark.parametrize(
    "extra",
    [
        # PD: each request is a prefill and a decode sub-request on two instances.
        {
            "cluster": {
                "num_instances": 2,
                "pd": {"prefill_instances": 1, "decode_instances": 1, "decider": "always"},
            }
        },  # fmt: skip
        # A redirecting drain enqueues some requests twice, on two instances.
        {
            "engine": {"max_num_running_reqs": 2},
            "deployments": [{"name": "llama", "num_instances": 2}],
            "instance_lifecycle": {"initial_instances_loaded": True},
            "events": [
                {
                    "at_s": 1,
                    "action": "drain_instance",
                    "target": "instance_0",
                    "drain_policy": "redirect",
                }
            ],  # fmt: skip
        },
    ],
    ids=["pd", "redirect"],
)
def test_per_adapter_figures_count_each_request_once(extra):
    # With one adapter, its figures are the run's: each user-facing request counts once,
    # whatever sub-requests or attempts served it.
    run = _one_adapter_run(**extra)
    ft, s = run.adapter_metrics["ft"], run.summary
    assert ft["requests"] == s["offered_requests"] == 60
    assert ft["completed_requests"] == s["completed_requests"]
    assert ft["e2e_mean_ms"] == pytest.approx(s["e2e_mean_ms"])


def test_prefix_cache_blocks_are_per_adapter():
    """QA: two adapters (and the base model) sharing a 256-token system prompt reused each
    other's KV (256 cached tokens each), where vLLM's block hash includes the LoRA and an
    adapter changes every K and V. Law: a request's cached tokens come only from requests of
    its own adapter; the same adapter still hits (floor(288 / 16) = 18 full blocks, of which
    the 16 of the shared 256-token prefix are cached)."""
    import simulator

    def client(i: int, adapter: str | None) -> dict:
        return {
            "id": f"c{i}", "rate_fraction": 1, **({"adapter": adapter} if adapter else {}),
            "prefix_group": "sys", "prefix_length": 256, "arrival": {"process": "constant"},
            "input_distribution": {"type": "constant", "params": {"value": 32}},
            "output_distribution": {"type": "constant", "params": {"value": 8}},
        }  # fmt: skip

    def cached(adapters: list) -> list[int]:
        scenario = {
            "latency": {"model": "roofline"},
            "lora": {"adapters": [{"name": "ft", "rank": 16, "count": 2}], "max_loras": 2},
            "workload": {"version": "2", "aggregate_rate": 2, "num_requests": len(adapters),
                         "seed": 1,
                         "clients": [client(i, a) for i, a in enumerate(adapters)]},
        }  # fmt: skip
        run = simulator.simulate(scenario, warn_unsteady=False, check_invariants=True)
        return run.requests.sort_values("arrival_us")["cached_tokens"].tolist()

    # The clients' first requests arrive together and are admitted one after another in one
    # step, each looking up after the one before hashed its prompt: 256 cached tokens each
    # for the second and third before, none now; two clients of one adapter still share.
    assert cached(["ft-0", "ft-1", None]) == [0, 0, 0]
    assert cached(["ft-0", "ft-0", "ft-1"]) == [0, 256, 0]
