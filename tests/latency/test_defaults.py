"""The bundled defaults.yaml accessors (docs/behaviour.md §3.6)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.catalog import defaults
from simulator.catalog.defaults import (
    crossmodel_defaults,
    load_defaults_file,
    lookup_coefficients,
    model_defaults,
    normalize_vllm_version,
    trained_roofline_defaults,
    workload_presets,
)
from simulator.errors import ConfigError

BUNDLED = Path(defaults.__file__).parent / "data" / "defaults.yaml"


def test_bundled_file_is_parsed_once() -> None:
    assert defaults.bundled_defaults() is defaults.bundled_defaults()
    assert len(defaults.bundled_defaults().coefficients) == 111
    assert defaults.bundled_defaults().version == "0.0.1"


def test_the_run_path_reads_the_same_tables_as_the_whole_file() -> None:
    # model_defaults() and workload_presets() parse only their blocks of the file (start-up);
    # each must be the whole file's table, entry for entry, in file order.
    block_only = defaults._bundled_model_defaults()
    whole = defaults.bundled_defaults().model_defaults
    assert list(block_only.items()) == list(whole.items())
    assert len(block_only) == len(yaml.safe_load(BUNDLED.read_text())["defaults"]) > 20
    presets = defaults._bundled_workloads()
    assert list(presets.items()) == list(defaults.bundled_defaults().workloads.items())
    assert len(presets) == 4


def test_a_models_rows_read_alone_are_the_whole_files_rows() -> None:
    # coefficient_entries() parses only the asked model's entries of the `models:` list
    # (start-up); for every id in the file, in every spelling a query may use, the rows must be
    # the whole file's, in file order, with the same values and types.
    every = defaults.bundled_defaults().coefficients
    ids = sorted({e.model_id for e in every})
    assert len(defaults._bundled_entry_texts()) == len(every) == 111
    for model_id in ids:
        for query in (model_id, model_id.upper(), model_id.rsplit("/", 1)[-1]):
            whole = [e for e in every if defaults._id_matches(query, e.model_id)]
            assert defaults.coefficient_entries(query) == whole, query
    assert defaults.coefficient_entries("no/such-model") == []


def test_model_defaults() -> None:
    spec = model_defaults("meta-llama/llama-3.1-8b-instruct")
    assert spec == {
        "GPU": "H100",
        "tensor_parallelism": 1,
        "vllm_version": "vllm/vllm-openai:v0.11.0",
        "hf_repo": "meta-llama/Llama-3.1-8B-Instruct",
    }
    assert model_defaults("Meta-Llama/Llama-3.1-8B-Instruct") == spec
    assert model_defaults("llama-3.1-8b-instruct") == spec  # bundled folder name
    assert model_defaults("acme/nothing") is None
    # gpt-oss has no hf_repo in the file.
    assert model_defaults("openai/gpt-oss-20b") == {
        "GPU": "H100",
        "tensor_parallelism": 1,
        "vllm_version": "vllm/vllm-openai:v0.10.1.1",
    }


def test_accessors_return_copies() -> None:
    model_defaults("meta-llama/llama-3.1-8b-instruct")["GPU"] = "L40S"  # type: ignore[index]
    assert model_defaults("meta-llama/llama-3.1-8b-instruct")["GPU"] == "H100"  # type: ignore[index]
    workload_presets()["chatbot"]["prompt_tokens"] = 1
    assert workload_presets()["chatbot"]["prompt_tokens"] == 256
    crossmodel_defaults()["beta_coeffs"].append(1.0)
    assert len(crossmodel_defaults()["beta_coeffs"]) == 4


def test_workload_presets() -> None:
    presets = workload_presets()
    assert set(presets) == {"chatbot", "contentgen", "summarization", "multidoc"}
    assert presets["chatbot"] == {
        "prefix_tokens": 0,
        "prompt_tokens": 256,
        "prompt_tokens_stdev": 100,
        "prompt_tokens_min": 2,
        "prompt_tokens_max": 800,
        "output_tokens": 256,
        "output_tokens_stdev": 100,
        "output_tokens_min": 1,
        "output_tokens_max": 1024,
    }
    assert "prefix_tokens" not in presets["multidoc"]
    assert presets["multidoc"]["prompt_tokens"] == 10240


def test_global_coefficients() -> None:
    assert crossmodel_defaults() == {
        "beta_coeffs": [116.110, 1226.868, 19.943, 9445.157],
        "alpha_coeffs": [13732.0, 0.0, 860.6],
    }
    trained = trained_roofline_defaults()
    assert len(trained["beta_coeffs"]) == 7 and len(trained["alpha_coeffs"]) == 3
    assert trained["beta_coeffs"][0] == pytest.approx(0.77265, abs=1e-5)
    assert trained["alpha_coeffs"] == pytest.approx([9315.34, 1849.59, 1.70794], abs=1e-2)


def test_lookup_spec_example_llama_h100_tp2() -> None:
    entry = lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "H100", 2)
    assert entry is not None
    assert entry.alpha == (1601.350510688092, 3.512476196805965, 1805.5430360826988)
    assert entry.beta == (6910.420479880494, 17.67057489844186, 2.8377471109943855)
    assert entry.total_kv_blocks == 132139
    assert entry.vllm_version == "vllm/vllm-openai:v0.8.4"
    assert entry.gpu == "H100" and entry.tp == 2


@pytest.mark.parametrize("version", ["v0.8.4", "vllm/vllm-openai:v0.8.4", "0.8.4"])
def test_lookup_version_forms(version: str) -> None:
    entry = lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "H100", 2, version)
    assert entry is not None and entry.beta[0] == 6910.420479880494


def test_lookup_version_is_exact_when_given() -> None:
    # H100 TP1 for llama-3.1-8b exists only for v0.11.0.
    assert lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "H100", 1, "v0.8.4") is None
    v11 = lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "H100", 1, "v0.11.0")
    assert v11 is not None and v11.alpha == (10326.268121600151, 0.0, 0.0)
    assert lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "H100", 1) == v11


def test_lookup_model_case_and_gpu_tp_exact() -> None:
    upper = lookup_coefficients("META-LLAMA/Llama-3.1-8B-Instruct", "H100", 2)
    assert upper == lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "H100", 2)
    assert lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "h100", 2) is None
    assert lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "H100", 3) is None
    assert lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "L40S", 1) is None
    assert lookup_coefficients("acme/nothing", "H100", 1) is None


def test_lookup_a100_aliases() -> None:
    via_80 = lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "A100-80", 1)
    via_sxm = lookup_coefficients("meta-llama/llama-3.1-8b-instruct", "A100-SXM", 1)
    assert via_80 is not None and via_80 == via_sxm
    assert via_80.gpu == "A100-80"


def test_lookup_first_match_wins_on_duplicates() -> None:
    raw = yaml.safe_load(BUNDLED.read_text())
    rows = [
        r
        for r in raw["models"]
        if r["id"] == "redhatai/phi-4-fp8-dynamic"
        and r["GPU"] == "H100"
        and r["tensor_parallelism"] == 1
    ]
    assert len(rows) >= 2 and rows[0]["beta_coeffs"] != rows[1]["beta_coeffs"]
    entry = lookup_coefficients("redhatai/phi-4-fp8-dynamic", "H100", 1)
    assert entry is not None
    assert list(entry.beta) == rows[0]["beta_coeffs"]


def test_normalize_vllm_version() -> None:
    assert normalize_vllm_version("vllm/vllm-openai:v0.10.1.1") == "0.10.1.1"
    assert normalize_vllm_version("v0.8.4") == "0.8.4"
    assert normalize_vllm_version(" 0.8.4 ") == "0.8.4"


def test_strict_parsing_rejects_unknown_keys(tmp_path: Path) -> None:
    raw = yaml.safe_load(BUNDLED.read_text())
    assert load_defaults_file(BUNDLED).coefficients == defaults.bundled_defaults().coefficients

    raw["models"][0]["gamma_coeffs"] = [1, 2, 3]
    bad = tmp_path / "defaults.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"models\[0\].*gamma_coeffs"):
        load_defaults_file(bad)

    raw = yaml.safe_load(BUNDLED.read_text())
    raw["extra_section"] = {}
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="extra_section"):
        load_defaults_file(bad)

    raw = yaml.safe_load(BUNDLED.read_text())
    raw["models"][3]["alpha_coeffs"] = [1.0, 2.0]
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"models\[3\]\.alpha_coeffs"):
        load_defaults_file(bad)

    with pytest.raises(ConfigError, match="cannot read"):
        load_defaults_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize("key", ["\r", "a\nb", "", "x.y", "tab\there"])
def test_a_section_key_that_would_break_the_message_is_quoted(tmp_path: Path, key: str) -> None:
    """A model or preset name is a step of the field path the error names: written as is when
    it is a plain name, quoted when a line break, a control character or a separator in it
    would split the one-line message or misread as a path (found by `make fuzz`: a "\\r" key
    gave a two-line error)."""
    raw = yaml.safe_load(BUNDLED.read_text())
    raw["defaults"][key] = None
    raw["workloads"][key] = 5
    bad = tmp_path / "defaults.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as caught:
        load_defaults_file(bad)
    message = str(caught.value)
    assert message.splitlines() == [message]
    assert f"defaults.{key!r}: invalid value None; must be a mapping" in message


def test_a_plain_section_key_is_written_as_is(tmp_path: Path) -> None:
    raw = yaml.safe_load(BUNDLED.read_text())
    raw["workloads"]["my-preset_2"] = 5
    bad = tmp_path / "defaults.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"workloads\.my-preset_2: invalid value 5; must be"):
        load_defaults_file(bad)


# --------------------------------------------------- when a measured block count is used


def _blocks(**scenario: object) -> tuple[int, str]:
    from simulator.api import resolve_deployment

    base = {"model": "meta-llama/llama-3.1-8b-instruct", "hardware": "H100", "tp": 1}
    deployment = resolve_deployment(base | scenario)
    return deployment.engine.total_kv_blocks, deployment.describe()["kv_blocks_source"]


def test_a_measured_block_count_describes_a_stock_server_only() -> None:
    """defaults.yaml's 29,205 blocks for Llama-3.1-8B on one H100 are what a stock vLLM
    server allocated (utilisation 0.9, 16-token blocks, the model's own dtypes, TP GPUs
    alone). Under physics (the `vllm` rule) another such setting is computed instead: until
    2026-12-07 an FP8 cache, utilisation 0.5, 32-token blocks or PP 2 all kept 29,205."""
    assert _blocks() == (29_205, "defaults.yaml")
    fp8, source = _blocks(engine={"kv_cache_dtype": "fp8"})
    assert source == "auto" and fp8 == 57_589  # about twice: one byte per element, not two
    assert _blocks(engine={"gpu_memory_utilization": 0.5}) == (12_410, "auto")
    assert _blocks(engine={"block_size_tokens": 32}) == (14_397, "auto")  # half, at 32 tokens
    assert _blocks(pp=2) == (64_409, "auto")  # two GPUs' memory
    # BLIS-Mar took its row whatever else was set; under BLIS's backends (the `blis` rule) a
    # setting that changes the count is now computed with BLIS's formula, as BLIS-current
    # does (26,312 blocks of 16 tokens at stock settings: 13,156 of 32), the row kept at
    # stock settings ...
    assert _blocks(latency={"model": "roofline"}) == (29_205, "defaults.yaml")
    assert _blocks(latency={"model": "roofline"}, engine={"block_size_tokens": 32}) == (
        13_156,
        "auto",
    )
    # ... and BLIS-current's trained-physics, whose defaults.yaml has no block counts,
    # always computes them: 2,802 at utilisation 0.5 for Qwen3-14B, BLIS-current's own figure.
    assert _blocks(latency={"model": "trained-physics"}) == (26_312, "auto")
    qwen = {"model": "qwen/qwen3-14b", "latency": {"model": "trained-physics"}}
    assert _blocks(**qwen, engine={"gpu_memory_utilization": 0.5}) == (2_802, "auto")


def test_a_row_larger_than_the_gpus_memory_is_not_used() -> None:
    """gpt-oss-20b on one H100: the row's 302,690 blocks x 16 tokens x 49,152 B per token
    (24 layers x 2 x 64 dims x 8 KV heads x 2 bytes) = 238,036,623,360 B = 221.7 GiB of KV
    on an 80 GiB GPU: not a vLLM count, so the `vllm` rule computes it."""
    blocks, source = _blocks(model="openai/gpt-oss-20b")
    assert source == "auto" and blocks == 80_486
    assert blocks * 16 * 49_152 < 80 * 2**30
