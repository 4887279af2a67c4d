"""A run's exported trace, replayed with what the export says it lacks, is the run again.

A TraceV2 header records the model, TP, sequence limit, block size, memory utilisation and
context limit only. Whatever else a run set (GPU, KV blocks, step-time model, seed, several
instances, PD pools, a token budget) the export lists: `servesim run --trace-output` as the
flags to give `servesim replay`, `Result.write_trace` as a logged warning. The law: a replay
given exactly those flags prints the run's summary byte for byte."""

from __future__ import annotations

import csv
import json
import logging
import re
from pathlib import Path

import pytest
import yaml

import simulator
from simulator.trace_export import export
from tests.test_cli_workloads import invoke

SCENARIOS = "scenarios"
NOTE = re.compile(r"note: --trace-output: .*replay it with (?P<flags>--[^;(]*?)(?:;|$| and \()")


def _replay(prefix, *args):
    """`servesim replay` of the trace pair exported as `prefix`, with `args`."""
    return invoke(
        "replay", "--trace-header", f"{prefix}.yaml", "--trace-data", f"{prefix}.csv", *args
    )


def _suggested_flags(stderr: str) -> list[str]:
    match = NOTE.search(stderr)
    assert match is not None, stderr
    return match.group("flags").split()


@pytest.mark.parametrize(
    "run_args",
    [
        # Another GPU, a KV cache of its own, BLIS's step-time model and a seed.
        ["--hardware", "A100-80", "--total-kv-blocks", 900, "--latency-model", "roofline"]
        + ["--seed", 7],
        # Several instances behind a load-aware router.
        ["--num-instances", 3, "--routing-policy", "least-loaded", "--seed", 11],
        # Prefill and decode pools, the decode pool on another GPU.
        ["--num-instances", 4, "--prefill-instances", 2, "--decode-instances", 2]
        + ["--pd-decider", "always", "--decode-hardware", "H200"],
        # A token budget the replay would not default to.
        ["--max-num-batched-tokens", 2048, "--scheduler", "sjf"],
    ],
    ids=["gpu-kv-roofline-seed", "cluster", "pd", "budget-scheduler"],
)
def test_a_replay_given_the_exports_flags_reproduces_the_run(tmp_path, run_args):
    prefix = tmp_path / "t"
    traffic = ["--workload", "chatbot", "--rate", 20, "--num-requests", 80]
    run = invoke("run", *traffic, *run_args, "--trace-output", prefix)
    assert run.exit_code == 0, run.output
    flags = _suggested_flags(run.stderr)
    # Every setting the run was given is in the note (values as the run took them).
    given = {str(a) for a in run_args if str(a).startswith("--")}
    assert given <= set(flags), (given, flags)
    replay = _replay(prefix, *flags)
    assert replay.exit_code == 0, replay.output
    assert replay.stdout == run.stdout
    # Without them the replay simulates another deployment (which is why the note exists).
    bare = _replay(prefix)
    assert bare.exit_code == 0, bare.output
    assert bare.stdout != run.stdout


def test_a_scenario_files_run_names_the_file_and_its_fields_without_a_flag(tmp_path):
    """quickstart.yaml sets its GPU (a flag); a fleet field without a flag goes as a scenario
    field; the note offers the scenario file itself as the alternative."""
    prefix = tmp_path / "q"
    run = invoke(
        "run", f"{SCENARIOS}/quickstart.yaml", "--num-requests", 40, "--trace-output", prefix
    )
    assert run.exit_code == 0, run.output
    assert "--hardware H100" in run.stderr
    assert f"replay with --scenario {SCENARIOS}/quickstart.yaml" in run.stderr
    replay = _replay(prefix, "--scenario", f"{SCENARIOS}/quickstart.yaml")
    assert replay.exit_code == 0, replay.output
    assert replay.stdout == run.stdout


def test_a_default_run_needs_nothing_besides_its_trace(tmp_path, caplog):
    result = simulator.simulate({"workload": {"num_requests": 30, "rate": 10}})
    with caplog.at_level(logging.WARNING, logger="servesim"):
        _header, _data, settings = export(result, tmp_path / "d")
    assert settings == {}
    assert "a replay of this trace" not in caplog.text


def test_export_warns_with_the_settings_a_replay_needs(tmp_path, caplog):
    result = simulator.simulate(
        {
            "hardware": "A100-80",
            "latency": {"model": "roofline"},
            "cluster": {"num_instances": 2, "routing": {"scorers": "queue-depth:1"}},
            "workload": {"num_requests": 30, "rate": 10},
        }
    )
    with caplog.at_level(logging.WARNING, logger="servesim"):
        header, data, settings = export(result, tmp_path / "w")
    assert settings["hardware"] == "A100-80"
    assert settings["latency.model"] == "roofline"
    assert settings["cluster.num_instances"] == 2
    assert "cluster.routing.scorers" in settings
    assert "hardware='A100-80'" in caplog.text
    # The replay given them as overrides is the run again (the summary, request by request).
    again = simulator.replay(header, data, **{k.replace(".", "__"): v for k, v in settings.items()})
    assert again.summary == result.summary


@pytest.mark.parametrize(
    "outputs",
    [
        ["--results-path", "a.json", "--report", "a.json"],
        ["--results-path", "t.yaml", "--trace-output", "t"],
        ["--timeline-path", "x.csv", "--trace-output", "x"],
        ["--results-path", "r.json", "--decisions-path", "sub/../r.json"],
    ],
    ids=["results-report", "results-trace", "timeline-trace", "results-decisions"],
)
def test_two_outputs_naming_one_file_are_refused_before_any_work(tmp_path, monkeypatch, outputs):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    res = invoke("run", "--num-requests", 5, "--rate", 5, *outputs)
    assert res.exit_code == 2, res.output
    assert "give each output its own path" in res.stderr
    assert "Traceback" not in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]  # nothing written


SPEC_TEXT = (
    'version: "2"\naggregate_rate: 5\nnum_requests: 5\nclients:\n  - id: c\n'
    "    rate_fraction: 1\n    arrival: {process: poisson}\n"
    "    input_distribution: {type: constant, params: {value: 64}}\n"
    "    output_distribution: {type: constant, params: {value: 8}}\n"
)


@pytest.mark.parametrize(
    "outputs, read",
    [
        (["--trace-output", "spec"], "the workload spec"),
        (["--results-path", "spec.yaml"], "the workload spec"),
        (["--report", "./sub/../spec.yaml"], "the workload spec"),
        (["--results-path", "run.yaml"], "the scenario file"),
        (["--timeline-path", "run.yaml"], "the scenario file"),
    ],
)
def test_an_output_naming_a_file_the_run_reads_is_refused(tmp_path, monkeypatch, outputs, read):
    """`--trace-output spec` with `--workload-spec spec.yaml` wrote the trace header over the
    spec, then failed reading it back for the export's note: the run's input was lost."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "spec.yaml").write_text(SPEC_TEXT)
    (tmp_path / "run.yaml").write_text("workload_spec: spec.yaml\n")
    res = invoke("run", "run.yaml", *outputs)
    assert res.exit_code == 2, res.output
    assert f"is {read}" in res.stderr and "which this run reads" in res.stderr
    assert "Traceback" not in res.output
    assert (tmp_path / "spec.yaml").read_text() == SPEC_TEXT
    assert (tmp_path / "run.yaml").read_text() == "workload_spec: spec.yaml\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml", "spec.yaml", "sub"]


def test_a_replay_cannot_export_over_its_own_trace(tmp_path):
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    simulator.simulate({"workload_spec": _spec_file(tmp_path)}).write_trace(tmp_path / "t")
    before = header.read_bytes(), data.read_bytes()
    res = invoke(
        "replay", "--trace-header", header, "--trace-data", data, "--trace-output", tmp_path / "t"
    )
    assert res.exit_code == 2, res.output
    assert "is the trace header (trace.header)" in res.stderr
    assert (header.read_bytes(), data.read_bytes()) == before


def test_write_trace_refuses_to_replace_the_runs_workload_spec(tmp_path):
    spec = _spec_file(tmp_path)
    result = simulator.simulate({"workload_spec": spec})
    with pytest.raises(simulator.ConfigError, match="is the workload spec"):
        result.write_trace(tmp_path / "spec")
    assert (tmp_path / "spec.yaml").read_text() == SPEC_TEXT


def _spec_file(folder: Path) -> str:
    path = folder / "spec.yaml"
    path.write_text(SPEC_TEXT)
    return str(path)


@pytest.mark.parametrize("prefix", ["", "  ", "out/", ".", ".."])
def test_a_trace_prefix_without_a_file_name_is_refused(tmp_path, monkeypatch, prefix):
    """Otherwise the export would write hidden files such as ./.yaml and ./.csv."""
    monkeypatch.chdir(tmp_path)
    res = invoke("run", "--num-requests", 5, "--rate", 5, "--trace-output", prefix)
    assert res.exit_code == 2, res.output
    assert "--trace-output: invalid value" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_replay_cut_by_its_horizon_accounts_for_every_row_of_the_trace(tmp_path):
    """The trace's rows after the horizon are never injected, so no summary count holds them:
    the `=== Horizon ===` block and the results JSON's `horizon` do, and with the arrived
    requests they add up to the trace (r1_fixed512 has 1,000 rows)."""
    data = "tests/data/blis/r1_fixed512.trace"
    out = tmp_path / "r.json"
    res = invoke(
        "replay",
        "--trace-header",
        f"{data}.yaml",
        "--trace-data",
        f"{data}.csv",
        "--horizon",
        1_000_000,
        "--results-path",
        out,
    )
    assert res.exit_code == 0, res.output
    assert "=== Horizon ===" in res.stdout
    horizon = json.loads(out.read_text())["horizon"]
    assert horizon["horizon_us"] == 1_000_000
    assert horizon["arrived_requests"] + horizon["not_arrived_requests"] == 1000
    assert 0 < horizon["arrived_requests"] < 1000
    full = invoke("replay", "--trace-header", f"{data}.yaml", "--trace-data", f"{data}.csv")
    assert "=== Horizon ===" not in full.stdout  # every row arrived


def test_an_exported_trace_keeps_each_requests_lora_adapter(tmp_path):
    """BLIS's optional `adapter` column is written when a request asks for an adapter, so
    the replay loads the same adapters (cold loads and TTFTs as in the run)."""
    prefix = tmp_path / "lora"
    scenario = f"{SCENARIOS}/lora_adapters.yaml"
    run = invoke("run", scenario, "--num-requests", 60, "--trace-output", prefix)
    assert run.exit_code == 0, run.output
    header = (tmp_path / "lora.csv").read_text().splitlines()[0].split(",")
    assert header[-1] == "adapter"
    replay = _replay(prefix, "--scenario", scenario)
    assert replay.exit_code == 0, replay.output
    assert replay.stdout == run.stdout
    assert '"lora_cold_loads": ' in run.stdout  # adapters were loaded, and again in the replay


def _fields_file(stderr: str, path) -> None:
    """The note's scenario fields (`path: json; ...`) written as a scenario file."""
    match = re.search(r"\(in a --scenario file\) (.*?)(?:; or replay|$)", stderr)
    assert match is not None, stderr
    scenario: dict = {}
    for part in match.group(1).split("; "):
        dotted, value = part.split(": ", 1)
        *parents, leaf = dotted.split(".")
        node = scenario
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = json.loads(value)
    path.write_text(yaml.safe_dump(scenario))


def test_following_the_note_literally_replays_a_speculative_run(tmp_path):
    """A section with a field no flag sets (speculative's acceptance rates) goes into the
    scenario file whole, flags for the rest: that file plus those flags replay the run."""
    prefix = tmp_path / "spec"
    run = invoke(
        "run", f"{SCENARIOS}/speculative_decoding.yaml", "--num-requests", 40,
        "--trace-output", prefix,
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    fields = tmp_path / "fields.yaml"
    _fields_file(run.stderr, fields)
    assert "speculative" in yaml.safe_load(fields.read_text())
    replay = _replay(prefix, "--scenario", fields, *_suggested_flags(run.stderr))
    assert replay.exit_code == 0, replay.output
    assert replay.stdout == run.stdout


def test_a_run_whose_sessions_grow_their_context_says_the_trace_cannot_carry_it(tmp_path):
    run = invoke(
        "run", f"{SCENARIOS}/kv_cpu_offload.yaml", "--num-requests", 40,
        "--trace-output", tmp_path / "k",
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    assert "grow each session's context round by round" in run.stderr
    plain = invoke("run", "--num-requests", 20, "--trace-output", tmp_path / "p")
    assert "round by round" not in plain.stderr


def test_a_replays_export_keeps_the_traces_request_ids_so_calibrate_joins_the_same_requests(
    tmp_path,
):
    """An observe cell without its first 20 rows (request_ids 20..199, sent out of id order):
    the replay's exported trace names each request by its row's request_id, so comparing it
    with the real trace (`calibrate --sim-trace`) pairs every request with itself."""
    cell = Path("tests/data/observe_v3/sweep_rate-agg_2rps")
    lines = (cell / "trace.csv").read_text().splitlines()
    real = tmp_path / "real"
    (tmp_path / "real.csv").write_text("\n".join([lines[0], *lines[21:]]) + "\n")
    (tmp_path / "real.yaml").write_text((cell / "trace.yaml").read_text())
    sim = tmp_path / "sim"
    assert _replay(real, "--trace-output", sim, "-q").exit_code == 0
    real_ids = [line.split(",")[0] for line in lines[21:]]
    sim_ids = [line.split(",")[0] for line in (tmp_path / "sim.csv").read_text().splitlines()[1:]]
    assert sorted(sim_ids, key=int) == sorted(real_ids, key=int)
    scored = invoke(
        "calibrate", "--trace-header", f"{real}.yaml", "--trace-data", f"{real}.csv",
        "--sim-trace", f"{sim}.csv",
    )  # fmt: skip
    assert scored.exit_code == 0, scored.output
    assert f"unmatched 0, matched {len(real_ids)}" in scored.stdout
    ttft_r = float(re.search(r"TTFT .*Pearson r (-?[0-9.]+)", scored.stdout).group(1))
    assert ttft_r > 0.5  # the same requests: correlated (pairing by row number gave ~0)


def test_a_row_that_never_went_out_does_not_shift_an_observe_traces_clock(tmp_path):
    """An observe trace's sends are wall-clock µs; a row with send_time_us 0 (a request that
    never went out) is on the arrival clock. The origin shift is taken over the rows that
    were sent, so the replay spans what the client did (12 s here), not decades."""
    cell = Path("tests/data/observe_v3/sweep_rate-agg_2rps")
    rows = list(csv.reader((cell / "trace.csv").read_text().splitlines()))
    header, body = rows[0], rows[1:21]
    for column in ("send_time_us", "first_chunk_time_us", "last_chunk_time_us"):
        body[5][header.index(column)] = "0"
    body[5][header.index("status")] = "error"
    with open(tmp_path / "mix.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([header, *body])
    (tmp_path / "mix.yaml").write_text((cell / "trace.yaml").read_text())
    for client in ("auto", "off"):
        result = simulator.replay(tmp_path / "mix.yaml", tmp_path / "mix.csv", max_in_flight=client)
        arrivals_s = result.requests.arrival_us.to_numpy(dtype=float) / 1e6
        assert arrivals_s.min() >= 0 and arrivals_s.max() < 20, client
        assert result.summary["vllm_estimated_duration_s"] < 30, client


@pytest.mark.parametrize("rtt", [-50, "fast", float("nan")])
def test_a_header_rtt_must_be_a_non_negative_number(tmp_path, rtt):
    """The header's round trip is added to every simulated latency compared with the trace,
    as --rtt-ms is, and refused on the same terms."""
    from simulator.workload.trace import read_header

    cell = Path("tests/data/observe_v3/sweep_rate-agg_2rps")
    header = yaml.safe_load((cell / "trace.yaml").read_text())
    header["network"] = {"measured_rtt_ms": rtt}
    (tmp_path / "h.yaml").write_text(yaml.safe_dump(header))
    with pytest.raises(simulator.ConfigError, match="network.measured_rtt_ms: invalid value"):
        read_header(tmp_path / "h.yaml")


def test_a_bad_recorded_server_setting_is_blamed_on_the_trace_header(tmp_path):
    """A header's `max_num_seqs: -1` was reported as coming from "command-line flags", then
    from "the trace header's server section" without saying which file."""
    header = tmp_path / "t.yaml"
    header.write_text("trace_version: 2\nserver: {max_num_seqs: -1}\n")
    data = "tests/data/blis/r1_fixed512.trace.csv"
    named = f"the recorded server (trace header {str(header)!r}): engine.max_num_running_reqs"
    with pytest.raises(simulator.ConfigError) as caught:
        simulator.replay(header, data)
    assert str(caught.value).startswith(named)
    res = invoke("replay", "--trace-header", header, "--trace-data", data)
    assert res.exit_code == 2 and named in res.stderr


def test_replaying_with_a_scenario_that_replaces_the_recorded_server_says_so(tmp_path):
    """`--scenario` outranks what the trace header records: its tp and block size are
    simulated instead of the recording's, and the replay says which and what they were."""
    scenario = Path("scenarios/quickstart.yaml").resolve()
    run = simulator.simulate(
        scenario, tp=2, engine__block_size_tokens=32, workload__num_requests=20
    )
    header, data = run.write_trace(tmp_path / "t")
    res = invoke(
        "replay", "--trace-header", header, "--trace-data", data, "--scenario", scenario, "-q"
    )
    assert res.exit_code == 0, res.output
    assert (
        "note: the scenario's tp 1, block_size_tokens 16 replace the recorded server's 2, 32"
        in res.stderr
    )
    plain = invoke("replay", "--trace-header", header, "--trace-data", data, "-q")
    assert "replace the recorded server's" not in plain.stderr
    # A recorded model servesim lacks is simulated by the default one: its own note says so,
    # and the default replaced nothing the user chose.
    unknown = tmp_path / "u.yaml"
    unknown.write_text(
        header.read_text().replace("meta-llama/llama-3.1-8b-instruct", "foo/unknown-model")
    )
    stand_in = invoke("replay", "--trace-header", unknown, "--trace-data", data, "-q")
    assert "is not in servesim's catalog" in stand_in.stderr
    assert "replace the recorded server's" not in stand_in.stderr


def test_a_capped_replays_export_keeps_the_schedule_so_the_same_cap_reproduces_it(tmp_path):
    """A replay through a client cap sends a request late when the cap is full; latency counts
    from the send. Its export records both times, as a load generator does: arrival_time_us
    the schedule, send_time_us the send (and the deadline as scheduled). Replaying the export
    through the same cap, or with `auto` (the client fell far behind), is the replay again,
    request by request. Before, the rows held the sends as their schedule, and a replay
    of them let each late request into the step that started at its send, a step earlier
    than the capped replay did (TTFT about one decode step lower)."""
    source = tmp_path / "source"
    run = invoke(
        "run", "--rate", 60, "--num-requests", 120, "--latency-model", "roofline",
        "--trace-output", source, "-q",
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    capped = tmp_path / "capped"
    first = _replay(source, "--latency-model", "roofline", "--max-in-flight", 6, "-q",
                    "--trace-output", capped)  # fmt: skip
    assert first.exit_code == 0, first.output
    assert "client cap of 6 outstanding" in first.stderr
    assert "--max-in-flight 6" in first.stderr
    rows = list(csv.DictReader((tmp_path / "capped.csv").read_text().splitlines()))
    late = [r for r in rows if int(r["send_time_us"]) > int(r["arrival_time_us"])]
    assert len(late) > len(rows) // 2  # 60 req/s through 6 slots: most wait
    source_rows = {
        r["request_id"]: r
        for r in csv.DictReader((tmp_path / "source.csv").read_text().splitlines())
    }
    for row in rows:  # the schedule is the source trace's, untouched by the cap
        assert row["arrival_time_us"] == source_rows[row["request_id"]]["arrival_time_us"]
    for cap in ("6", "auto"):
        again = _replay(capped, "--latency-model", "roofline", "--max-in-flight", cap, "-q")
        assert again.exit_code == 0, again.output
        assert again.stdout == first.stdout, cap


def test_a_run_without_prefix_caching_says_so_for_its_replay(tmp_path):
    """A replay takes prefix caching from the recording (vLLM's default, on, for an exported
    trace). A run with it off must say so, or its replay of shared-prefix traffic finds
    cached prompts the run never had (TTFT 82 ms against 1,104 ms in the QA's case)."""
    (tmp_path / "w.yaml").write_text(
        yaml.safe_dump(
            {
                "version": "2", "seed": 11, "aggregate_rate": 30, "num_requests": 60,
                "clients": [{
                    "id": "a", "rate_fraction": 1, "prefix_group": "sys",
                    "prefix_length": 400, "arrival": {"process": "poisson"},
                    "input_distribution": {"type": "constant", "params": {"value": 300}},
                    "output_distribution": {"type": "constant", "params": {"value": 20}},
                }],
            }
        )
    )  # fmt: skip
    scenario = tmp_path / "off.yaml"
    scenario.write_text(
        "latency: {model: roofline}\nengine: {enable_prefix_caching: false}\n"
        f"workload_spec: {tmp_path / 'w.yaml'}\n"
    )
    prefix = tmp_path / "t"
    run = invoke("run", scenario, "--trace-output", prefix)
    assert run.exit_code == 0, run.output
    flags = _suggested_flags(run.stderr)
    assert "--no-prefix-caching" in flags, flags
    replay = _replay(prefix, *flags)
    assert replay.exit_code == 0, replay.output
    assert replay.stdout == run.stdout


def test_a_closed_loop_replays_export_names_each_round_by_its_trace_row(tmp_path):
    """A closed-loop replay names a session's later rounds as BLIS does
    (session_<id>_round_<r>_<k>); its export still writes each row's own request_id, so
    `calibrate --sim-trace` pairs every round, not only the first ones (40 of 160 before)."""
    (tmp_path / "sess.yaml").write_text(
        yaml.safe_dump(
            {
                "version": "2", "seed": 5, "aggregate_rate": 4, "num_requests": 40,
                "clients": [{
                    "id": "agent", "rate_fraction": 1, "arrival": {"process": "poisson"},
                    "input_distribution": {"type": "constant", "params": {"value": 200}},
                    "output_distribution": {"type": "constant", "params": {"value": 30}},
                    "reasoning": {"multi_turn": {"max_rounds": 4, "think_time_us": 500000}},
                }],
            }
        )
    )  # fmt: skip
    real = tmp_path / "real"
    run = invoke("run", "--latency-model", "roofline", "--workload-spec", tmp_path / "sess.yaml",
                 "--trace-output", real, "-q")  # fmt: skip
    assert run.exit_code == 0, run.output
    sim = tmp_path / "sim"
    replay = _replay(real, "--latency-model", "roofline", "--session-mode", "closed-loop",
                     "--trace-output", sim, "-q")  # fmt: skip
    assert replay.exit_code == 0, replay.output
    real_rows = list(csv.DictReader((tmp_path / "real.csv").read_text().splitlines()))
    sim_rows = list(csv.DictReader((tmp_path / "sim.csv").read_text().splitlines()))
    assert any(int(r["round_index"]) > 0 for r in sim_rows)
    by_id = {r["request_id"]: r for r in real_rows}
    assert sorted(by_id) == sorted(r["request_id"] for r in sim_rows)
    for row in sim_rows:  # the same request: same session, round and lengths
        mate = by_id[row["request_id"]]
        for column in ("session_id", "round_index", "input_tokens", "output_tokens"):
            assert row[column] == mate[column], (row["request_id"], column)


def _v2(tmp_path: Path, body: dict) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"version": "2", "seed": 4, **body}))
    return path


def _constant_client(cid: str, **extra) -> dict:
    lengths = {
        "input_distribution": {"type": "constant", "params": {"value": 500}},
        "output_distribution": {"type": "constant", "params": {"value": 300}},
    }
    return {"id": cid, "rate_fraction": 1, "arrival": {"process": "poisson"}, **lengths, **extra}


def test_a_workload_s_own_horizon_is_among_the_replay_s_settings(tmp_path):
    """A horizon given in the workload spec (not the scenario) was left out of the export's
    settings: the replay ran every row to its end (4.98 s became 7.39 s, 79 requests changed
    state). Given the settings, the replay reproduces the run."""
    workload = {"version": "2", "seed": 4, "aggregate_rate": 20, "horizon": 5_000_000,
                "clients": [_constant_client("c")]}  # fmt: skip
    run = simulator.simulate({"workload": workload}, warn_unsteady=False)
    header, data, settings = export(run, tmp_path / "t", note=False)
    assert settings.get("horizon_us") == 5_000_000
    replayed = simulator.replay(
        header, data, **{k.replace(".", "__"): v for k, v in settings.items()}
    )
    assert replayed.summary["completed_requests"] == run.summary["completed_requests"]
    assert replayed.summary["vllm_estimated_duration_s"] == run.summary["vllm_estimated_duration_s"]


def test_a_cohort_whose_sessions_grow_their_context_is_said_too(tmp_path, caplog):
    grow = {"reasoning": {"multi_turn": {"max_rounds": 3, "think_time_us": 100_000,
                                         "context_growth": "accumulate"}}}  # fmt: skip
    cohort = {**_constant_client("acc", **grow), "population": 2}
    spec = _v2(tmp_path, {"aggregate_rate": 4, "num_requests": 30, "cohorts": [cohort]})
    run = simulator.simulate({"workload_spec": str(spec)}, warn_unsteady=False)
    with caplog.at_level("WARNING", logger="servesim"):
        export(run, tmp_path / "t")
    assert [r for r in caplog.records if "acc grow each session's context" in r.getMessage()]


def test_a_capped_replay_cut_by_its_horizon_counts_what_it_never_sent(tmp_path):
    """Through a client cap, requests due before the horizon can still wait for a slot when
    it comes: they were in no count (881 rows due, 387 accounted for). Arrived, never sent
    and not arrived add up to the trace's rows."""
    data = "tests/data/blis/r1_fixed512.trace"
    out = tmp_path / "r.json"
    res = invoke(
        "replay", "--trace-header", f"{data}.yaml", "--trace-data", f"{data}.csv",
        "--horizon", 1_000_000, "--max-in-flight", 2, "--results-path", out,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    document = json.loads(out.read_text())
    horizon, client = document["horizon"], document["client"]
    assert horizon["never_sent_requests"] == client["requests_never_sent"] > 0
    rows = horizon["arrived_requests"] + horizon["never_sent_requests"]
    assert rows + horizon["not_arrived_requests"] == 1000


def test_a_replay_with_the_run_s_scenario_keeps_its_workload_s_slo_targets(tmp_path):
    """The export offers `--scenario X.yaml` as a way to replay; the replay dropped the
    scenario's workload (the trace replaces it) and its goodput_slo_targets with it: the
    attainment went from 0.908 to 0.954 in the QA's case, against no targets."""
    workload = {
        "version": "2", "seed": 3, "aggregate_rate": 30, "num_requests": 150,
        "goodput_slo_targets": {"standard": {"ttft_ms": 40}},
        "clients": [_constant_client("c", slo_class="standard")],
    }  # fmt: skip
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({"seed": 3, "workload": workload}))
    run = simulator.simulate(scenario, warn_unsteady=False)
    assert 0 < run.summary["slo_attainment"] < 1
    header, data = run.write_trace(tmp_path / "t")
    python = simulator.replay(header, data, scenario=scenario)
    assert python.summary["slo_attainment"] == run.summary["slo_attainment"]
    out = tmp_path / "r.json"
    done = invoke(
        "replay", "--trace-header", header, "--trace-data", data, "--scenario", scenario,
        "--results-path", out,
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert json.loads(out.read_text())["slo_attainment"] == run.summary["slo_attainment"]
