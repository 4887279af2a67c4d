"""Outputs (simulator/atomic_io.py, and the CLI's checks of every output flag).

The law: an output flag naming something servesim must not replace (a device, a FIFO, a
socket, a folder, a dangling link or a link to one of those, a path on /proc or /sys, a path
under a file) ends the command before it simulates with exit status 2, exactly one `error:`
line on stderr naming the flag and the value, no traceback, and the target untouched (the
same kind of file, with the same content or link). A write that fails (a full disk, EIO,
EACCES, EROFS) is one `OutputError` line, the previous file untouched and no temporary file
left. A symbolic link to a regular file is followed: that file is replaced, the link kept.
Standard output: a full one (/dev/full) is one line and status 2; a reader that went away
(EPIPE) is silent, status 141, and the files are still written.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator import atomic_io
from simulator.atomic_io import (
    atomic_open,
    check_output,
    check_output_folder,
    pseudo_file_system,
    replacing,
    write_json_atomically,
    write_text_atomically,
    write_with,
)
from simulator.cli import app
from simulator.errors import ConfigError, OutputError, ServesimError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX special files")

RUN = ["run", "--num-requests", "5"]
runner = CliRunner()


# ------------------------------------------------------------------------------- helpers


def identity(path: Path) -> tuple:
    """What must not change: the kind of file, its inode, its link target, its content."""
    info = os.lstat(path)
    kind = stat.S_IFMT(info.st_mode)
    link = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
    content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
    return kind, info.st_ino, info.st_rdev, link, content


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


def assert_one_error_line(code: int, stderr: str, *needles: str) -> str:
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def make_device(path: Path) -> None:
    """A character device like /dev/null (1, 3) of our own, or skip (mknod needs root)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError, OSError) as exc:
        pytest.skip(f"cannot create a device node here: {exc}")


SPECIALS = ["fifo", "directory", "dangling_link", "link_to_fifo", "socket", "under_a_file"]


def make_special(kind: str, folder: Path) -> Path:
    """A target of `kind` in `folder`; returns the path to give as the output."""
    if kind == "fifo":
        os.mkfifo(folder / "out.json")
    elif kind == "directory":
        (folder / "out.json").mkdir()
        (folder / "out.json" / "keep.txt").write_text("keep\n")
    elif kind == "dangling_link":
        os.symlink("missing.json", folder / "out.json")
    elif kind == "link_to_fifo":
        os.mkfifo(folder / "pipe")
        os.symlink("pipe", folder / "out.json")
    elif kind == "socket":
        import socket

        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.bind(str(folder / "out.json"))
        except OSError as exc:  # a path too long for AF_UNIX
            pytest.skip(f"cannot bind a socket here: {exc}")
        finally:
            sock.close()
    elif kind == "device":
        make_device(folder / "out.json")
    elif kind == "under_a_file":
        (folder / "plain").write_text("not a folder\n")
        return folder / "plain" / "sub" / "out.json"
    return folder / "out.json"


def start_cli(args: list, stdout=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", *map(str, args)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


# ------------------------------------------------------- special targets, CLI (processes)


def test_run_refuses_special_targets_before_simulating(tmp_path):
    """Every kind at once, in concurrent processes: one line, status 2, nothing replaced."""
    kinds = [*SPECIALS, "device"] if os.geteuid() == 0 else SPECIALS
    cases = {}
    for kind in kinds:
        folder = tmp_path / kind
        folder.mkdir()
        if kind == "device":
            try:
                os.mknod(folder / "out.json", stat.S_IFCHR | 0o666, os.makedev(1, 3))
            except OSError:
                continue
            target = folder / "out.json"
        else:
            target = make_special(kind, folder)
        before = {p: identity(p) for p in folder.iterdir()}
        proc = start_cli([*RUN, "--results-path", target])
        cases[kind] = (proc, folder, before, target)
    for kind, (proc, folder, before, target) in cases.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert_one_error_line(proc.returncode, stderr, "--results-path", str(target))
        assert stdout == "", kind  # refused before the run: no report
        assert {p: identity(p) for p in folder.iterdir()} == before, kind
        assert leftovers(folder) == [], kind


@pytest.mark.skipif(not Path("/proc/self/mountinfo").exists(), reason="Linux /proc")
@pytest.mark.parametrize("target", ["/proc/servesim-test-output.json", "/sys/servesim-test.json"])
def test_run_refuses_a_pseudo_file_system(target):
    """/proc files stat as regular files; the file system is what says no. (These paths do
    not exist and cannot be created; servesim must not even try.)"""
    proc = start_cli([*RUN, "--results-path", target])
    stdout, stderr = proc.communicate(timeout=180)
    assert_one_error_line(proc.returncode, stderr, "--results-path", target, "file system")
    assert stdout == ""
    assert not Path(target).exists()


def test_symlink_to_a_regular_file_is_followed_and_kept(tmp_path):
    real = tmp_path / "store" / "results.json"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "results.json"
    link.symlink_to(real)
    proc = start_cli([*RUN, "--results-path", link])
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["completed_requests"] == 5
    assert leftovers(tmp_path) == []


# --------------------------------------------------- every output flag of every command


def one_line_refusal(args: list, *needles: str) -> str:
    res = runner.invoke(app, [str(a) for a in args])
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.stdout == ""
    return assert_one_error_line(res.exit_code, res.stderr, *needles)


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_every_run_output_flag_is_checked(tmp_path, fifo):
    for flag in ("--results-path", "--timeline-path", "--decisions-path"):
        one_line_refusal([*RUN, flag, fifo], flag, "FIFO")
    os.mkfifo(tmp_path / "trace.yaml")
    one_line_refusal([*RUN, "--trace-output", tmp_path / "trace"], "--trace-output", "trace.yaml")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_decisions_path_from_the_scenario_file_is_checked(tmp_path, fifo):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(f"cluster:\n  trace:\n    level: decisions\n    path: {fifo}\n")
    one_line_refusal(["run", scenario, "--num-requests", "5"], "cluster.trace.path", "FIFO")


def test_replay_output_is_checked(tmp_path, fifo):
    data = Path(__file__).parent / "data" / "blis" / "r1_fixed512.trace.csv"
    one_line_refusal(["replay", "--trace-data", data, "--results-path", fifo], "--results-path")


def test_sweep_out_is_checked(tmp_path):
    sweep_yaml = tmp_path / "sweep.yaml"
    sweep_yaml.write_text(
        "base: {workload: {num_requests: 5}}\ngrid: {engine.max_num_running_reqs: [8, 16]}\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "runs.csv")
    one_line_refusal(["sweep", sweep_yaml, "--out", out], "--out", "runs.csv", "FIFO")
    assert not (out / "runs.d").exists()  # no run was simulated or saved
    plain = tmp_path / "plain"
    plain.write_text("a file\n")
    one_line_refusal(["sweep", sweep_yaml, "--out", plain], "--out", "regular file")


def test_plan_validate_calibrate_observe_and_plot_outputs_are_checked(tmp_path, fifo):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("workload: {num_requests: 5}\n")
    one_line_refusal(["plan", scenario, "--slo", "ttft_p99_ms=500", "--plot", fifo], "--plot")
    one_line_refusal(["validate", tmp_path, "--output", fifo], "--output", "FIFO")
    one_line_refusal(["calibrate", tmp_path, "--output", fifo], "--output", "FIFO")
    observe = ["observe", "--server-url", "http://127.0.0.1:9", "--model", "m", "--rate", "1"]
    one_line_refusal(
        [*observe, "--trace-header", tmp_path / "h.yaml", "--trace-data", fifo], "--trace-data"
    )
    (tmp_path / "t.itl.csv").mkdir()
    one_line_refusal(
        [*observe, "--trace-header", tmp_path / "h.yaml", "--trace-data", tmp_path / "t.csv"]
        + ["--record-itl"],
        "--record-itl",
        "directory",
    )
    one_line_refusal(["plot", tmp_path, "--out", fifo], "--out", "FIFO")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_nul_byte_in_an_output_path_is_one_line(tmp_path):
    """An OS argument list cannot carry a NUL byte (Python's subprocess refuses one), so it
    comes from in-process callers or from a scenario file ("\\0" in YAML)."""
    line = one_line_refusal([*RUN, "--trace-output", "a\x00b"], "--trace-output", "NUL")
    assert "\\x00" in line
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text('cluster:\n  trace:\n    level: decisions\n    path: "d\\0.jsonl"\n')
    one_line_refusal(["run", scenario, "--num-requests", "5"], "cluster.trace.path", "NUL")
    # Path-typed flags: click refuses the value itself (a usage error, status 2).
    res = runner.invoke(app, [*RUN, "--results-path", "a\x00b"])
    assert res.exit_code == 2 and "null byte" in res.stderr and "Traceback" not in res.stderr


# ---------------------------------------------------- the writer itself (Python callers)

WRITERS = {
    "write_text_atomically": lambda t: write_text_atomically(t, "new\n"),
    "write_json_atomically": lambda t: write_json_atomically(t, {"a": 1}),
    "write_with": lambda t: write_with(t, lambda tmp: tmp.write_text("new\n")),
    "atomic_open": lambda t: _write_through_atomic_open(t),
    "replacing": lambda t: _write_through_replacing(t),
}


def _write_through_atomic_open(target: Path) -> None:
    with atomic_open(target) as handle:
        handle.write("new\n")


def _write_through_replacing(target: Path) -> None:
    with replacing(target) as tmp:
        tmp.write_text("new\n")


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("kind", SPECIALS)
def test_writers_refuse_special_targets(tmp_path, writer, kind):
    """Sweeps, traces, plots and decision logs write through these: they are protected
    without a check of their own."""
    target = make_special(kind, tmp_path)
    before = {p: identity(p) for p in tmp_path.iterdir()}
    with pytest.raises(OutputError) as caught:
        WRITERS[writer](target)
    assert str(target) in str(caught.value) and "\n" not in str(caught.value)
    assert {p: identity(p) for p in tmp_path.iterdir()} == before
    assert leftovers(tmp_path) == []


def test_writer_refuses_a_device(tmp_path):
    make_device(tmp_path / "dev")
    with pytest.raises(OutputError, match="character device"):
        write_text_atomically(tmp_path / "dev", "x")
    assert stat.S_ISCHR(os.lstat(tmp_path / "dev").st_mode)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_writers_follow_a_link_to_a_regular_file(tmp_path, writer):
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "file.txt"
    real.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(Path("real") / "file.txt")
    WRITERS[writer](link)
    assert os.readlink(link) == str(Path("real") / "file.txt")
    assert real.read_text() != "old\n"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "number", [errno.ENOSPC, errno.EIO, errno.EACCES, errno.EROFS, errno.EDQUOT]
)
@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_write_failure_is_one_output_error(tmp_path, monkeypatch, number, step):
    target = tmp_path / "results.json"
    target.write_text("previous\n")

    def fail(*_args, **_kwargs):
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(atomic_io.os, step, fail)
    with pytest.raises(OutputError) as caught:
        write_json_atomically(target, {"a": 1})
    assert str(caught.value) == f"cannot write {str(target)!r}: {os.strerror(number)}"
    assert isinstance(caught.value, OSError) and isinstance(caught.value, ServesimError)
    assert target.read_text() == "previous\n"
    assert leftovers(tmp_path) == []


def test_folder_that_cannot_be_created_is_one_output_error(tmp_path, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(atomic_io.Path, "mkdir", refuse)
    target = tmp_path / "new" / "results.json"
    with pytest.raises(OutputError, match="Permission denied"):
        write_text_atomically(target, "x")
    assert not target.parent.exists()


def test_write_failure_in_the_cli_is_one_line_and_keeps_the_old_file(tmp_path):
    """A disk that fills up after the checks passed: status 2, one line, old file kept."""
    target = tmp_path / "results.json"
    target.write_text("previous\n")
    fill_the_disk = (
        "import errno, os, sys\n"
        "def full(fd):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "os.fsync = full\n"
        "sys.argv[0] = 'servesim'\n"
        "from simulator.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", fill_the_disk, *RUN, "--results-path", str(target)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert_one_error_line(
        proc.returncode, proc.stderr, f"cannot write {str(target)!r}: No space left on device"
    )
    assert target.read_text() == "previous\n"
    assert leftovers(tmp_path) == []


def test_nul_byte_in_a_written_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="NUL"):
        write_text_atomically(str(tmp_path / "a\x00b"), "x")


def test_folder_outputs_are_checked(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="regular file"):
        check_output_folder(tmp_path / "file", "--out")
    os.symlink("nowhere", tmp_path / "dangling")
    with pytest.raises(OutputError, match="does not exist"):
        check_output_folder(tmp_path / "dangling", "--out")
    assert check_output_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"


def test_check_output_names_the_flag_or_the_path(tmp_path, fifo):
    with pytest.raises(OutputError) as flagged:
        check_output(fifo, "--results-path")
    assert str(flagged.value).startswith(f"--results-path: invalid value {str(fifo)!r}; ")
    with pytest.raises(OutputError) as plain:
        check_output(fifo)
    assert str(plain.value).startswith(f"cannot write {str(fifo)!r}: it is a FIFO")


# --------------------------------------------------- pseudo file systems (mountinfo)

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=100k,mode=755
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:5 - cgroup cgroup rw,cpu
40 27 0:40 / /data/my\\040disk rw,relatime - xfs /dev/vdb rw
41 27 0:41 / /data/my\\040disk/kernel rw,relatime - debugfs debugfs rw
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/proc/self/x", ("proc", "/proc")),
        ("/proc", ("proc", "/proc")),
        ("/sys/kernel/x", ("sysfs", "/sys")),
        ("/sys/fs/cgroup/x", ("sysfs", "/sys")),  # a tmpfs, but under /sys
        ("/sys/fs/cgroup/cpu/x", ("cgroup", "/sys/fs/cgroup/cpu")),
        ("/dev/x", ("devtmpfs", "/dev")),
        ("/dev/shm/x", None),  # scratch space, a tmpfs
        ("/home/u/x", None),
        ("/processed/x", None),  # /proc is a path prefix, not a parent
        ("/data/my disk/x", None),
        ("/data/my disk/kernel/x", ("debugfs", "/data/my disk/kernel")),
    ],
)
def test_pseudo_file_system_from_mountinfo(tmp_path, monkeypatch, path, expected):
    fake = tmp_path / "mountinfo"
    fake.write_text(MOUNTINFO)
    monkeypatch.setattr(atomic_io, "MOUNTINFO", str(fake))
    assert pseudo_file_system(path) == expected


def test_without_mountinfo_kernel_paths_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic_io, "MOUNTINFO", str(tmp_path / "absent"))
    assert pseudo_file_system("/proc/x") == ("proc", "/proc")
    assert pseudo_file_system("/dev/full") == ("dev", "/dev")
    assert pseudo_file_system(str(tmp_path / "x")) is None


# ----------------------------------------------------------------------- standard output


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_full_stdout_is_one_line_and_status_2():
    with open("/dev/full", "w") as full:
        proc = start_cli(RUN, stdout=full)
        _, stderr = proc.communicate(timeout=180)
    assert_one_error_line(
        proc.returncode, stderr, "cannot write to standard output: No space left on device"
    )


def test_closed_stdout_is_silent_status_141_and_files_are_still_written(tmp_path):
    """`servesim run | head -1`: the reader left; no traceback, no 'Exception ignored'."""
    results = tmp_path / "results.json"
    proc = start_cli([*RUN, "--results-path", results])
    proc.stdout.close()  # before the report is written: its write meets EPIPE
    stderr = proc.stderr.read()
    proc.wait(timeout=180)
    assert proc.returncode == 141, stderr
    assert stderr == ""
    assert json.loads(results.read_text())["completed_requests"] == 5


def test_written_files_get_the_usual_permissions(tmp_path):
    """Not the temporary file's private 0600: what any new file gets under the umask."""
    current = os.umask(0o022)
    try:
        write_text_atomically(tmp_path / "new" / "out.txt", "x")
    finally:
        os.umask(current)
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "out.txt").st_mode) == 0o644


def test_python_callers_are_protected_by_the_writer(tmp_path):
    """A sweep's tables and a result's trace go through the writer: a FIFO where a file
    would go is refused and left as it was, with no check of their own."""
    import simulator

    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "points.csv")
    with pytest.raises(OutputError, match="points.csv"):
        simulator.sweep(
            {"workload": {"num_requests": 3}},
            {"engine.max_num_running_reqs": [8]},
            seeds=[1],
            workers=1,
            out=out,
        )
    assert stat.S_ISFIFO(os.lstat(out / "points.csv").st_mode)
    result = simulator.simulate({"workload": {"num_requests": 3}})
    os.mkfifo(tmp_path / "trace.csv")
    with pytest.raises(OutputError, match="FIFO"):
        result.write_trace(tmp_path / "trace")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "trace.csv").st_mode)
    assert not (tmp_path / "trace.yaml").exists()
    assert leftovers(tmp_path) == []
