"""QA: a flag's refused value names the flag beside the field it sets (docs/cli.md, exit
status 2), for every flag: the workload flags (`--num-requests (workload.num_requests): ...`
was `workload.num_requests: ...`) and the flags whose value the command line turns into the
field's (`--spec-acceptance-rate`, `--lora`, `--speculative-config`, ...), which
`flag_for_field` did not know."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.cli.blis import (
    closed_loop_flags,
    closed_loop_overrides,
    goodput_flags,
    goodput_overrides,
)
from simulator.cli.flags import (
    RENAMED_FLAGS,
    SCENARIO_FIELDS,
    WORKLOAD_FIELDS,
    common_flags,
    common_overrides,
    naming_flag,
    trace_output_flag,
    workload_flags,
    workload_overrides,
)

runner = CliRunner()

QUICKSTART = "scenarios/quickstart.yaml"
V2_SPEC = "scenarios/bursty_gamma.yaml"  # an inline v2 workload spec, one client
LORA = "scenarios/lora_adapters.yaml"  # adapter 'ft' of rank 16
SPEC = ["--speculative-method", "ngram", "--num-speculative-tokens", "2"]
PD = ["--num-instances", "2", "--prefill-instances", "1", "--decode-instances", "1"]
CPU = ["--kv-cpu-blocks", "100"]

# (scenario, flags, what the one line tells): the flag, then the field it sets, then `:`.
CASES = [
    # Workload flags (WORKLOAD_FIELDS), never named before.
    (QUICKSTART, ["--num-requests", "0"], "--num-requests (workload.num_requests): must be"),
    (QUICKSTART, ["--rate", "-1"], "--rate (workload.rate): must be"),
    (QUICKSTART, ["--arrival", "foo"], "--arrival (workload.arrival): Input should be"),
    (QUICKSTART, ["--prompt-tokens", "-5"], "--prompt-tokens (workload.prompt_tokens.mean):"),
    (
        None,
        ["--prompt-tokens-stdev", "-1"],
        "--prompt-tokens-stdev (workload.prompt_tokens.std",
    ),
    (None, ["--prompt-tokens-min", "-1"], "--prompt-tokens-min (workload.prompt_tokens.min):"),
    (None, ["--prompt-tokens-max", "0"], "--prompt-tokens-max (workload.prompt_tokens.max):"),
    (None, ["--output-tokens", "-5"], "--output-tokens (workload.output_tokens.mean):"),
    (
        None,
        ["--output-tokens-stdev", "-1"],
        "--output-tokens-stdev (workload.output_tokens.std",
    ),
    (None, ["--output-tokens-min", "-1"], "--output-tokens-min (workload.output_tokens.min):"),
    (None, ["--output-tokens-max", "0"], "--output-tokens-max (workload.output_tokens.max):"),
    (None, ["--timeout-us", "-4"], "--timeout-us (workload.timeout_us): must be from 0"),
    # A simulate-time check: the message has no "command-line flags" source.
    (None, ["--workload", "foo"], "--workload (workload.preset): unknown workload preset 'foo'"),
    (None, ["--prefix-tokens", "-1"], "--prefix-tokens (workload.prefix_tokens): must be"),
    # On a v2 spec --rate sets aggregate_rate, the deadline each client's.
    (V2_SPEC, ["--rate", "-1"], "--rate (workload.aggregate_rate): must be"),
    (V2_SPEC, ["--timeout-us", "-5"], "--timeout-us (workload.clients[0].timeout): must be"),
    (V2_SPEC, ["--prompt-tokens", "5"], "--prompt-tokens (workload.prompt_tokens.mean): does "),
    # blis's closed-loop and goodput flags.
    (None, ["--concurrency", "999999999999"], "--concurrency (workload.concurrency): must be"),
    (
        None,
        ["--concurrency", "2", "--think-time-ms", "99999999999999"],
        "--think-time-ms (workload.think_time_us): must be from 0",
    ),
    (None, ["--slo-ttft", "a=99999999999h"], "--slo-ttft (slo.classes.a.ttft_ms): must be"),
    (None, ["--slo-itl", "a=99999999999h"], "--slo-itl (slo.classes.a.itl_ms): must be"),
    (None, ["--slo-e2e", "a=99999999999h"], "--slo-e2e (slo.classes.a.e2e_ms): must be"),
    # Speculative decoding: set outside SCENARIO_FIELDS.
    (
        QUICKSTART,
        [*SPEC, "--spec-acceptance-rate", "1.5"],
        "--spec-acceptance-rate (speculative.acceptance_rate): 1.5: an acceptance rate is",
    ),
    (
        # Refused when the deployment resolves (speculative_setup), after the scenario's check.
        QUICKSTART,
        [*SPEC, "--spec-acceptance-rate", "0.5,0.4,0.3"],
        "--spec-acceptance-rate (speculative.acceptance_rate): invalid value [0.5, 0.4, 0.3]; "
        "3 per-position rates",
    ),
    (
        None,
        ["--speculative-config", '{"method": "bogus", "num_speculative_tokens": 2}'],
        "--speculative-config (speculative.method): Input should be",
    ),
    (
        None,
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 0}'],
        "--speculative-config (speculative.num_speculative_tokens): must be from 1",
    ),
    (None, [*SPEC[:2], "--num-speculative-tokens", "0"], "--num-speculative-tokens ("),
    (None, ["--speculative-method", "bogus"], "--speculative-method (speculative.method):"),
    # LoRA: --lora's adapters are set outside SCENARIO_FIELDS, and LoRASpec's own checks tell
    # the section (`lora: adapter 'a': ...`).
    (
        QUICKSTART,
        ["--lora", "a:16", "--max-lora-rank", "8"],
        "--lora (lora.adapters): adapter 'a': rank 16 exceeds max_lora_rank 8",
    ),
    (None, ["--lora", "a:0"], "--lora (lora.adapters[0].rank): must be from 1"),
    (None, ["--lora", "a:16,a:8"], "--lora (lora.adapters): name 'a' is used twice"),
    (
        LORA,
        ["--max-lora-rank", "1"],
        "--max-lora-rank (lora.max_lora_rank): adapter 'ft': rank 16 exceeds max_lora_rank 1",
    ),
    (
        None,
        ["--lora", "a:16", "--max-loras", "4", "--max-cpu-loras", "3"],
        "--max-cpu-loras (lora.max_cpu_loras): max_cpu_loras (3) must be >= max_loras (4)",
    ),
    (None, ["--lora", "a:16", "--max-loras", "0"], "--max-loras (lora.max_loras): must be"),
    # Blackbox coefficients: checked when the latency model is built.
    (
        None,
        ["--alpha-coeffs", "1,2", "--beta-coeffs", "1,2,3"],
        "--alpha-coeffs (latency.alpha_coeffs): invalid value [1.0, 2.0]; must have exactly 3",
    ),
    (
        None,
        ["--alpha-coeffs", "1,2,3", "--beta-coeffs", "1,2"],
        "--beta-coeffs (latency.beta_coeffs): invalid value [1.0, 2.0]; must have exactly 3",
    ),
    # CPU tier.
    (None, ["--kv-cpu-blocks", "-1"], "--kv-cpu-blocks (engine.kv_cpu_blocks): must be"),
    (None, [*CPU, "--kv-offload-policy", "bogus"], "--kv-offload-policy (engine.kv_offload_"),
    (None, [*CPU, "--kv-transfer-bandwidth", "-1"], "--kv-transfer-bandwidth (engine.kv_tra"),
    (None, [*CPU, "--kv-transfer-base-latency", "-1"], "--kv-transfer-base-latency (engine."),
    # Prefill/decode disaggregation.
    (None, ["--prefill-instances", "-1"], "--prefill-instances (cluster.pd.prefill_instances):"),
    (None, [*PD, "--pd-decider", "bogus"], "--pd-decider (cluster.pd.decider): unknown"),
    (None, [*PD, "--pd-transfer-bandwidth", "-1"], "--pd-transfer-bandwidth (cluster.pd.trans"),
    (None, [*PD, "--pd-transfer-slots", "-1"], "--pd-transfer-slots (cluster.pd.transfer_slots)"),
    (None, [*PD, "--pd-kv-bytes-per-token", "-1"], "--pd-kv-bytes-per-token (cluster.pd.kv_by"),
    (None, [*PD, "--prefill-tp", "0"], "--prefill-tp (cluster.pd.prefill.tp): must be"),
    (None, [*PD, "--decode-dp", "0"], "--decode-dp (cluster.pd.decode.dp): must be"),
    (
        # The pool's deployment check names the field as the pool's `latency.model`.
        None,
        [*PD, "--decode-latency-model", "bogus"],
        "--decode-latency-model (cluster.pd.decode.latency_model): unknown latency model",
    ),
    (
        None,
        [*PD, "--prefill-latency-model", "bogus"],
        "--prefill-latency-model (cluster.pd.prefill.latency_model): unknown latency model",
    ),
    # SCENARIO_FIELDS flags, named before too: the rewrite keeps them.
    (None, ["--tp", "0"], "--tp (tp): must be from 1"),
    (None, ["--max-num-seqs", "0"], "--max-num-seqs (engine.max_num_running_reqs): must be"),
    (None, ["--scheduler", "bogus"], "--scheduler (engine.scheduler): unknown scheduler"),
    (None, ["--loading-delay", "-1"], "--loading-delay-s (instance_lifecycle.loading_delay."),
    (None, ["--summarize-trace", "--trace-level", "none"], "--trace-level (cluster.trace.level)"),
]


def _case_id(case: tuple[str | None, list[str], str]) -> str:
    scenario, args, _ = case
    where = f"{scenario.split('/')[-1]} " if scenario else ""
    return where + " ".join(args)


def _refused(scenario: str | None, args: list[str]) -> str:
    """The one stderr line of a refused `run`: exit 2, nothing on stdout."""
    argv = ["run", *([scenario] if scenario else []), *args, "-q", "--log", "error"]
    if scenario is None:
        argv += ["--num-requests", "2"]
    res = runner.invoke(app, argv)
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    assert res.stdout == ""
    (line,) = res.stderr.splitlines()
    assert line.startswith("error: "), line
    return line


@pytest.mark.parametrize(("scenario", "args", "told"), CASES, ids=[_case_id(c) for c in CASES])
def test_a_refused_flag_value_names_the_flag_beside_its_field(scenario, args, told):
    line = _refused(scenario, args)
    assert told in line, line
    # Told where the check's field was: after the message's source, or first.
    at = line.index(told)
    assert line[:at] in ("error: ", "error: command-line flags: ") or line[at - 2 : at] == "; "


def test_every_flag_that_sets_a_field_is_named_by_it():
    """The law behind CASES: each flag of `run` that sets scenario fields sets one whose
    refusal names that flag, whether it is in SCENARIO_FIELDS/WORKLOAD_FIELDS or set by hand;
    a flag added later without a name fails here."""
    samples = {
        # Flags whose value the command line turns into the field's.
        "speculative_config": '{"method": "ngram"}',
        "spec_acceptance_rate": "0.5",
        "lora": "a:8",
        "alpha_coeffs": "1,2,3",
        "beta_coeffs": "1,2,3",
        "pd_transfer_contention": "on",
        "autoscaler": False,
        "concurrency": 2,
        "think_time_ms": 5,
        "slo_ttft": "a=1ms",
        "slo_itl": "a=1ms",
        "slo_e2e": "a=1ms",
    }
    # Given with another flag they need.
    partners = {"alpha_coeffs": {"beta_coeffs": "1,2,3"}, "beta_coeffs": {"alpha_coeffs": "1"}}
    # Flags that set no scenario field (outputs, files read whole, run's own handling), and
    # --timeout, refused in its own seconds before it becomes workload.timeout_us.
    fieldless = {
        "defaults_filepath",
        "lazy_generation",
        "policy_config",
        "timeline_path",
        "results_path",
        "metrics_path",
        "log",
        "quiet",
        "report",
        "trace_output",
        "workload_spec",
        "timeout",
    }
    templates = (common_flags, workload_flags, closed_loop_flags, goodput_flags, trace_output_flag)
    # Each parameter's flag names, from its `Annotated[type, Option(...)]` (typer reads a
    # first argument that starts with "-" as a name, not the default).
    options = {
        name: param.annotation.__metadata__[0]
        for template in templates
        for name, param in inspect.signature(template).parameters.items()
    }
    params = {
        name: {
            n
            for decl in (option.default, *option.param_decls)
            if isinstance(decl, str) and decl.startswith("-")
            for n in decl.split("/")
        }
        for name, option in options.items()
    }
    current = {old: new_flag for old, (_, _, new_flag) in RENAMED_FLAGS.items()}
    unnamed = []
    for name, names in params.items():
        if name in fieldless:
            continue
        flags: dict[str, Any] = {name: samples.get(name, 1), **partners.get(name, {})}
        keys = {
            *common_overrides(flags),
            *goodput_overrides(flags),
            *closed_loop_overrides(flags, workload_overrides(flags)),
        }
        assert keys, f"--{name}: sets no field; list it as fieldless"
        typed = names | ({current[name]} if name in current else set())
        if not any(naming_flag(key) in typed for key in keys):
            unnamed.append((name, sorted(keys)))
    assert not unnamed
    # Fields a flag sets as they are: the flag is `run`'s option of that name.
    for param, path in {**SCENARIO_FIELDS, **WORKLOAD_FIELDS}.items():
        flag = naming_flag(path)
        assert flag is not None and flag in {*params[param], current.get(param)}, path


def test_a_scenario_files_own_value_keeps_its_field_name(tmp_path):
    """Only a flag given is named: the same refusal from the scenario file is its field."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {num_requests: 0}\n")
    line = _refused(str(bad), ["--rate", "5"])
    assert "workload.num_requests: must be from 1" in line, line
    assert "--num-requests" not in line and "--rate" not in line, line


def test_timeout_in_seconds_is_refused_as_itself_not_as_timeout_us():
    """--timeout and --timeout-us set the same field; the seconds are checked before they
    become µs, so a refusal never names the flag the user did not type. 2^53 µs // 10^6 =
    9,007,199,254 s is the longest deadline the clock holds."""
    line = _refused(None, ["--timeout", "9007199255"])
    assert line.startswith("error: --timeout: invalid value 9007199255; ")
    assert "from 1 to 9,007,199,254" in line and "--timeout-us" not in line
    assert _refused(None, ["--timeout", "0"]).startswith("error: --timeout: invalid value 0;")
    res = runner.invoke(app, ["run", "--num-requests", "2", "-q", "--timeout", "3600"])
    assert res.exit_code == 0, res.stderr


def test_a_defaults_files_preset_length_is_the_files_not_a_flags(tmp_path):
    """--defaults-filepath's preset lengths join the flags' workload overrides: its refused
    value is told as the file's, not as --prompt-tokens."""
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text("workloads:\n  chatbot:\n    prompt_tokens: -5\n")
    line = _refused(None, ["--workload", "chatbot", "--defaults-filepath", str(defaults)])
    assert line.startswith(
        "error: --defaults-filepath: workloads.chatbot: workload.prompt_tokens.mean: must be"
    ), line
    assert not re.search(r"--prompt-tokens(?![\w-])", line), line
