"""benchmarks/parity_fuzz.py: random parity cases against BLIS-Mar's binary. The binary is not
needed here: these tests check that the cases stay inside the region where servesim and BLIS
mean the same thing (the tool's docstring lists it), and that servesim runs each case."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from simulator import simulate

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("parity_fuzz", BENCH / "parity_fuzz.py")
pf = importlib.util.module_from_spec(_spec)
sys.modules["parity_fuzz"] = pf  # its dataclass looks its module up by name
_spec.loader.exec_module(pf)

SEEDS = range(1, 201)


def _flag(case, name: str) -> str | None:
    return case.flags[case.flags.index(name) + 1] if name in case.flags else None


def test_a_seed_always_gives_the_same_case():
    assert pf.make_case(7) == pf.make_case(7)
    assert len({pf.make_case(s).flags for s in SEEDS}) > 150  # and seeds vary the case


def test_the_current_build_gets_shared_prefixes():
    shared = [s for s in SEEDS if "prefix_group" in str(pf.make_case(s, pf.CURRENT).spec)]
    assert len(shared) > 30


@pytest.mark.parametrize("build", [pf.MAR, pf.CURRENT])
@pytest.mark.parametrize("seed", SEEDS)
def test_every_case_stays_where_the_two_simulators_agree(seed, build):
    case = pf.make_case(seed, build)
    assert case.build == build
    backend = _flag(case, "--latency-model")
    assert backend in pf.BACKENDS[build]
    dense = {m: d for m, _tps, d in pf.MODELS}[case.model]
    # BLIS-Mar's roofline leaves MoE expert weights unpriced (behaviour §A5).
    assert dense or build != pf.MAR or backend != "roofline"
    # Every flag is one the build has; servesim gets the current BLIS's priority explicitly.
    assert build == pf.MAR or "--priority-policy" not in case.flags
    extra = case.servesim_flags[len(case.flags) :]
    assert case.servesim_flags[: len(case.flags)] == case.flags
    assert extra == (() if build == pf.MAR else ("--priority-policy", "slo-class"))
    # Load-aware routing breaks ties with each program's own random generator.
    assert _flag(case, "--routing-policy") in (None, "round-robin")
    assert int(_flag(case, "--total-kv-blocks")) == pf.KV_BLOCKS
    # A burst with at least two output tokens each: no arrival meets a step that finishes
    # every running request (BLIS would overlap a second step there).
    assert case.spec["aggregate_rate"] == pf.BURST_RATE
    assert 1 <= len(case.spec["clients"]) <= 3
    for client in case.spec["clients"]:
        assert client["arrival"] == {"process": "constant"}
        assert client["output_distribution"]["params"]["min"] >= 2
        assert client["slo_class"] in pf.SLO_CLASSES
    # Shared prefixes only where the replay can share them and both price them alike.
    grouped = [c for c in case.spec["clients"] if "prefix_group" in c]
    assert not grouped or (build, backend) == (pf.CURRENT, "trained-physics")
    lengths = {c["prefix_group"]: set() for c in grouped}
    for c in grouped:
        lengths[c["prefix_group"]].add(c["prefix_length"])
    assert all(len(each) == 1 for each in lengths.values())  # one length per group
    blackbox = backend == "blackbox"
    assert ("--alpha-coeffs" in case.flags) == blackbox == ("--beta-coeffs" in case.flags)
    assert _flag(case, "--hardware") in pf.GPUS
    (model_tps,) = [tps for model, tps, _dense in pf.MODELS if model == case.model]
    assert int(_flag(case, "--tp")) in model_tps


@pytest.mark.parametrize(
    ("seed", "build"),
    # roofline, crossmodel, trained-roofline and blackbox for BLIS-Mar, trained-physics with
    # shared prefixes for the current BLIS
    [(1, pf.MAR), (3, pf.MAR), (4, pf.MAR), (11, pf.MAR), (5, pf.CURRENT)],
)
def test_servesim_runs_a_case(tmp_path, seed, build):
    """The case's workload spec and flags are a valid servesim run (as a scenario)."""
    import yaml

    case = pf.make_case(seed, build)
    spec = tmp_path / "spec.yaml"
    case.spec["num_requests"] = 10
    spec.write_text(yaml.safe_dump(case.spec))
    latency = {"model": _flag(case, "--latency-model")}
    for flag, key in (("--alpha-coeffs", "alpha_coeffs"), ("--beta-coeffs", "beta_coeffs")):
        if flag in case.flags:
            latency[key] = [float(v) for v in _flag(case, flag).split(",")]
    result = simulate(
        {
            "model": case.model,
            "hardware": _flag(case, "--hardware"),
            "tp": int(_flag(case, "--tp")),
            "latency": latency,
            "engine": {"total_kv_blocks": pf.KV_BLOCKS},
            "workload_spec": str(spec),
        }
    )
    assert result.summary["completed_requests"] + result.summary["dropped_unservable"] == 10


def test_the_tool_names_no_path_to_a_blis_binary():
    text = (BENCH / "parity_fuzz.py").read_text()
    assert "/work/" not in text and "../shared" not in text and "peers" not in text
