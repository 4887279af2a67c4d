"""Interrupting a command (SIGINT = Ctrl-C, SIGTERM): it stops with a non-zero status and one
line saying what was lost, leaves no partial or temporary files, and an interrupted sweep
resumes without redoing the runs it finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simulator.sweeps import RUNS_DIR, sweep

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SERVESIM_CHECK_INVARIANTS": "0"},
    )


def _wait_for_line(proc: subprocess.Popen, marker: str, timeout_s: float = 120) -> list[str]:
    """Read stderr lines until one contains `marker` (the process is then past start-up)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return seen
    proc.kill()
    raise AssertionError(f"never saw {marker!r}; stderr so far: {seen}")


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_writes_no_result_file(tmp_path, signal_number):
    results = tmp_path / "out" / "results.json"
    proc = _start(
        ["run", "scenarios/quickstart.yaml", "--num-requests", "2000000", "--rate", "2000"]
        + ["--results-path", results, "--trace-output", tmp_path / "trace", "--log", "info"]
    )
    _wait_for_line(proc, "simulating")
    time.sleep(0.5)  # inside the event loop by now
    proc.send_signal(signal_number)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal_number
    assert stdout == ""  # no half report
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    name = signal.Signals(signal_number).name
    assert errors == [
        f"error: interrupted by {name}; the run was abandoned; not written: {results}, "
        f"{tmp_path / 'trace'}.yaml/.csv"
    ]
    assert "Traceback" not in stderr
    assert not results.exists()
    assert not (tmp_path / "trace.csv").exists() and not (tmp_path / "trace.yaml").exists()
    assert _leftovers(tmp_path) == []


def _sweep_file(tmp_path: Path) -> Path:
    doc = {
        "base": {"workload": {"num_requests": 500, "rate": 40}},
        "grid": {"engine.max_num_running_reqs": [8, 16, 32, 64]},
        "seeds": [1],
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_interrupted_sweep_keeps_finished_runs_and_resumes(tmp_path):
    sweep_yaml = _sweep_file(tmp_path)
    out = tmp_path / "out"
    proc = _start(["sweep", sweep_yaml, "--out", out, "--workers", "2"])
    _wait_for_line(proc, "[1/4]")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    kept = sorted((out / RUNS_DIR).glob("*.json"))
    assert 1 <= len(kept) < 4
    (error,) = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert f"{len(kept)} finished run(s) are kept in {out / RUNS_DIR}" in error
    assert "resume" in error
    assert not (out / "points.csv").exists()  # the tables are written only at the end
    assert _leftovers(tmp_path) == []
    before = {p.name: p.stat().st_mtime_ns for p in kept}

    resumed = _start(["sweep", sweep_yaml, "--out", out, "--workers", "2"])
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert f"resumed: {len(kept)} run(s) already in {out}" in stderr
    simulated = [line for line in stderr.splitlines() if line.startswith("[")]
    assert len(simulated) == 4 - len(kept)  # finished points are not redone
    assert {p.name: p.stat().st_mtime_ns for p in kept} == before  # nor rewritten

    fresh = sweep(
        yaml.safe_load(sweep_yaml.read_text())["base"],
        {"engine.max_num_running_reqs": [8, 16, 32, 64]},
        seeds=[1],
        workers=1,
    )
    resumed_runs = pd.read_csv(out / "runs.csv")
    pd.testing.assert_frame_equal(
        resumed_runs, fresh.runs.astype(resumed_runs.dtypes.to_dict()), check_exact=False
    )


# ------------------------------------------------ the program's edges: start-up, repeats

LONG_RUN = ["run", "--num-requests", "2000000", "--rate", "2000"]


def _servesim() -> list[str]:
    """The console script when installed (its entry point is the one users hit)."""
    script = Path(sys.executable).with_name("servesim")
    return [str(script)] if script.exists() else [sys.executable, "-m", "simulator.cli"]


def _catches(pid: int, signal_number: int) -> bool:
    """Whether process `pid` has a handler for `signal_number` (Linux /proc), i.e. servesim's
    entry point is past its first lines: SIGTERM is left at its default until then."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signal_number - 1) & 1)
    except OSError:
        pass
    return False


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc")
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_while_the_program_starts_is_one_line(signal_number):
    """The entry point installs its handlers before the heavy imports: a signal sent as soon
    as they are there (while typer and the simulator load) is one line and 128 + N."""
    proc = subprocess.Popen(
        [*_servesim(), *LONG_RUN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not _catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None and time.monotonic() < deadline, "handlers never installed"
        time.sleep(0.001)
    proc.send_signal(signal_number)
    stdout, stderr = proc.communicate(timeout=120)
    name = signal.Signals(signal_number).name
    assert proc.returncode == 128 + signal_number, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.splitlines() == _errors(stderr)  # nothing but the one line
    (error,) = _errors(stderr)
    assert error.startswith(f"error: interrupted by {name}")
    assert stdout == ""


def test_the_entry_point_module_loads_nothing_heavy():
    """`simulator.cli` itself adds no heavy import to the package's: its `main` runs first."""
    probe = (
        "import sys, simulator; before = set(sys.modules); import simulator.cli; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    added = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    heavy = {"typer", "click", "rich", "numpy", "pandas", "simpy", "simulator.cli.commands"}
    assert heavy.isdisjoint(added), added


def test_importing_the_console_script_target_is_fast():
    probe = "import sys, simulator.cli; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert {"numpy", "pandas", "simpy", "typer", "simulator.api"}.isdisjoint(loaded)


def test_a_second_signal_while_unwinding_changes_nothing(tmp_path):
    """SIGINT, then SIGTERM and SIGINT during the clean-up: the first decides the message and
    the status; no second line, no traceback, no file."""
    results = tmp_path / "results.json"
    proc = _start(
        [*LONG_RUN, "--results-path", results, "--trace-output", tmp_path / "trace"]
        + ["--log", "info"]
    )
    _wait_for_line(proc, "simulating")
    time.sleep(0.5)  # inside the event loop by now
    proc.send_signal(signal.SIGINT)
    for later in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
        if proc.poll() is not None:
            break
        proc.send_signal(later)
        time.sleep(0.01)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    (error,) = _errors(stderr)
    assert error.startswith("error: interrupted by SIGINT; the run was abandoned")
    assert not results.exists()
    assert _leftovers(tmp_path) == []


def test_first_signal_decides_in_process():
    """The handlers themselves: the first signal raises, the next ones are ignored."""
    from simulator.interruption import Interrupted, interruptible, stopping_on_signals

    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as caught, stopping_on_signals() as stop:
        assert signal.getsignal(signal.SIGTERM) is not previous  # else SIGTERM ends pytest
        with interruptible(lambda: "lost: everything"):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler raises before this ends
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # ignored: SIGINT came first
                time.sleep(0.01)
    assert caught.value.signal_number == signal.SIGINT
    assert caught.value.message() == "interrupted by SIGINT; lost: everything"
    assert stop.first == signal.SIGINT
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_signal_handled_inside_the_first_ones_handler_does_not_take_its_place():
    """CPython runs a signal's Python-level handler at the next bytecode boundary, which can be
    inside the handler of the signal just before it (a SIGTERM sent right after a SIGINT, on a
    busy machine). A trace function plays that here: as SIGINT's handler starts, SIGTERM's
    handler runs on its frame, before SIGINT's has recorded anything. SIGINT must still be the
    first signal, and the one raised."""
    import sys

    from simulator import interruption

    stop = interruption.Stop()
    interruption._active.append(stop)

    def tracer(frame, event, _arg):
        is_sigint_handler = (
            frame.f_code is interruption._ON_SIGNAL_CODE
            and frame.f_locals.get("signal_number") == signal.SIGINT
        )
        if event == "call" and is_sigint_handler:
            sys.settrace(None)
            interruption._on_signal(signal.SIGTERM, frame)
        return None

    try:
        sys.settrace(tracer)
        with pytest.raises(interruption.Interrupted) as caught:
            interruption._on_signal(signal.SIGINT, None)
    finally:
        sys.settrace(None)
        interruption._active.remove(stop)
    assert caught.value.signal_number == signal.SIGINT
    assert stop.first == signal.SIGINT


def test_a_signal_the_caller_ignores_stays_ignored():
    """A shell starts a background job with SIGINT ignored; servesim installed its handler
    over that, and a Ctrl-C meant for the script stopped every job (status 130). An ignored
    signal stays ignored; the others are still handled."""
    from simulator.interruption import stopping_on_signals

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stopping_on_signals() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        assert stop.first is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def _signal_sent_after_installing(monkeypatch, installed: int, sent: int) -> list:
    """`signal.signal` sends `sent` to this thread right after it installs a handler on
    `installed`: the moment CI met, a signal delivered while the entry point's handlers were
    still being installed, when the first was already in force. Sent to the main thread
    itself (`pthread_kill`), so that it is held there as a program's only thread holds it
    (a plain kill could be taken by another thread of pytest's). Returns the signal masks in
    force at each installation."""
    from simulator.interruption import _on_signal

    real_signal = signal.signal
    masks = []
    done = []

    def installing(number, handler):
        previous = real_signal(number, handler)
        masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))
        # Only while installing servesim's own handler, and once: restoring whatever handler
        # the process had before (another test's, in a full run) must send nothing.
        if number == installed and handler is _on_signal and not done:
            done.append(True)
            signal.pthread_kill(threading.main_thread().ident, sent)
            time.sleep(0.01)  # unheld, the handler would run here, inside this call
        return previous

    monkeypatch.setattr(signal, "signal", installing)
    return masks


def _handlers() -> dict:
    return {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}


def test_signals_are_held_while_the_handlers_are_installed(monkeypatch):
    """CI once met SIGINT while `stopping_on_signals` was installing SIGTERM's handler: the
    SIGINT handler (already in force) raised out of the `with` line, which nothing caught, and
    the program printed a traceback with status 1. Both signals are now held pending while the
    handlers go in, and come through at `Stop.release()`, which the block calls inside its
    own `try`; leaving restores the handlers and the mask."""
    from simulator.interruption import Interrupted, stopping_on_signals

    before, mask_before = _handlers(), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    masks = _signal_sent_after_installing(monkeypatch, signal.SIGTERM, signal.SIGINT)
    with stopping_on_signals() as stop:
        assert stop.first is None  # held: nothing handled yet
        assert all({signal.SIGINT, signal.SIGTERM} <= mask for mask in masks[:2])
        with pytest.raises(Interrupted) as caught:
            stop.release()
        assert caught.value.signal_number == stop.first == signal.SIGINT
        stop.release()  # a second call does nothing
    monkeypatch.undo()
    assert _handlers() == before
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask_before


def test_interruptible_raises_a_signal_that_came_while_installing(monkeypatch):
    """In-process, the same early signal stops the block before its work starts, with what
    the block says was lost."""
    from simulator.interruption import Interrupted, interruptible

    _signal_sent_after_installing(monkeypatch, signal.SIGTERM, signal.SIGINT)
    started = False
    with pytest.raises(Interrupted) as caught, interruptible(lambda: "nothing written"):
        started = True
    assert not started
    assert caught.value.message() == "interrupted by SIGINT; nothing written"


def test_a_failure_while_installing_leaves_no_state_behind(monkeypatch):
    """Whatever escapes the installation (here an error; in a process with other threads,
    a signal one of them took), leaving restores the handlers and the mask and forgets the
    block: one that escaped once left every later block interrupted before it began."""
    from simulator import interruption

    before, mask_before = _handlers(), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    real_signal = signal.signal

    def failing(number, handler):
        previous = real_signal(number, handler)
        if number == signal.SIGTERM and handler is interruption._on_signal:
            raise RuntimeError("boom")
        return previous

    monkeypatch.setattr(signal, "signal", failing)
    with pytest.raises(RuntimeError), interruption.stopping_on_signals():
        pass
    monkeypatch.undo()
    assert interruption._active == [] and interruption.active_stop() is None
    assert _handlers()[signal.SIGINT] == before[signal.SIGINT]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask_before
    ran = False
    with interruption.interruptible(lambda: ""):
        ran = True
    assert ran


def test_the_entry_point_reports_a_signal_that_came_while_installing(monkeypatch, capsys):
    """`main` does not start the command when a signal came during the installation; it exits
    with 128 + N and one line, as for any other interrupt."""
    from simulator import cli, collector

    # What main changes for the rest of a command-line process stays out of pytest's.
    monkeypatch.setattr(collector, "fewer_collections_for_this_process", lambda: None)
    monkeypatch.setattr(collector, "skip_the_final_collection", lambda: None)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    _signal_sent_after_installing(monkeypatch, signal.SIGTERM, signal.SIGINT)
    monkeypatch.setattr(sys, "argv", ["servesim", "run", "--help"])
    from simulator.cli import commands

    started = []
    monkeypatch.setattr(commands, "app_for", lambda argv: started.append(argv))
    with pytest.raises(SystemExit) as exited:
        cli.main()
    monkeypatch.undo()
    for s in (signal.SIGINT, signal.SIGTERM):  # main leaves them ignored; pytest needs them
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    assert exited.value.code == 128 + signal.SIGINT
    assert not started
    assert capsys.readouterr().err.strip() == "error: interrupted by SIGINT"


def test_a_block_in_another_thread_is_not_the_commands():
    """Outside the main thread no handler can be installed, and the block runs unprotected;
    it must not register as the active one either: the main thread's block then took it for
    an outer block and installed nothing."""
    from simulator.interruption import active_stop, stopping_on_signals

    inside, go_on = threading.Event(), threading.Event()
    seen = {}

    def worker():
        with stopping_on_signals():
            inside.set()
            go_on.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert inside.wait(10)
        seen["active"] = active_stop()
        before = signal.getsignal(signal.SIGTERM)
        with stopping_on_signals() as stop:
            stop.release()
            seen["installed"] = signal.getsignal(signal.SIGTERM) is not before
    finally:
        go_on.set()
        thread.join(10)
    assert seen == {"active": None, "installed": True}
