"""The `rlparity` CLI as a subprocess: exit codes 0/1/2/3, the table, summary.json, the merged junit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from junitparser import Error, Failure

from rlparity import results

from harness.scripted import (
    CELL_SCRIPT,
    CHILD_MARK,
    CPU_CELL_ID,
    CPU_FILTER,
    kill_if_ours,
    rlparity,
    show,
    squash,
    suites_by_name,
    wait_dead,
    write_matrix,
)


# ---- the CLI end to end ----------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_run_passes_writes_junit_and_summary_and_resumes(tmp_path):
    out = tmp_path / "res"
    proc = rlparity("run", "--matrix", "quick", "--filter", CPU_FILTER, "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    assert CPU_CELL_ID in proc.stdout
    assert "PASS" in proc.stdout
    assert "cpu/baseline/single/fp32/quick/exact" in proc.stdout and "passed" in proc.stdout  # the table row
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == 0
    assert summary["cells"] == {CPU_CELL_ID: "passed"}
    assert summary["matrix"] == "quick" and summary["filter"] == CPU_FILTER
    suite = suites_by_name(out / "junit.xml")[CPU_CELL_ID]
    assert suite.tests > 0 and suite.failures == 0 and suite.errors == 0
    props = {p.name: p.value for p in suite.properties()}
    assert props["cell"] == CPU_CELL_ID and props["status"] == "passed"
    first = results.read(out / "cells" / CPU_CELL_ID.replace("/", "__"))

    # --resume: the finished cell is not run again
    proc = rlparity("run", "--filter", CPU_FILTER, "--out", str(out), "--resume", cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    again = results.read(out / "cells" / CPU_CELL_ID.replace("/", "__"))
    assert again.started == first.started and again.finished == first.finished
    assert json.loads((out / "summary.json").read_text())["cells"] == {CPU_CELL_ID: "passed"}

    # compare of a results dir with itself: equal
    proc = rlparity("compare", str(out), str(out), cwd=tmp_path)
    assert proc.returncode == 0, show(proc)


@pytest.mark.slow
def test_cli_planted_mismatch_exits_1_with_a_junit_failure(tmp_path):
    out = tmp_path / "res"
    proc = rlparity("run", "--filter", CPU_FILTER, "--control", "ulp-flip", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 1, show(proc)
    assert "MISMATCH" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == 1 and summary["variant"] == "ulp-flip"
    assert summary["cells"] == {CPU_CELL_ID: "failed"}
    suite = suites_by_name(out / "junit.xml")[CPU_CELL_ID]
    assert suite.failures >= 1
    failing = [c for c in suite if any(isinstance(r, Failure) for r in c.result)]
    messages = [r.message for c in failing for r in c.result if isinstance(r, Failure)]
    assert any("max 1 ulp" in m for m in messages), messages
    props = {p.name: p.value for p in suite.properties()}
    assert props["cell"] == CPU_CELL_ID
    assert props["status"] == "failed"
    assert int(props["mismatches"]) >= 1 and int(props["max_ulp"]) >= 1


BAD_TOML = "[matrix\ntimeout_s = 10\n"
UNKNOWN_TARGET = '[axes]\nimage = ["rocm64-torch26"]\ntarget = ["cpu", "sm99"]\nprofile = ["baseline"]\n'


@pytest.mark.parametrize(
    ("case", "args", "expect"),
    [
        ("malformed-toml", ["--matrix", "{tmp}/bad.toml"], "not valid TOML"),
        ("unknown-value", ["--matrix", "{tmp}/unknown.toml"], "sm99"),
        ("missing-file", ["--matrix", "{tmp}/nowhere.toml"], "does not exist"),
        ("unknown-axis", ["--filter", "colour=red"], "unknown axis 'colour'"),
        ("selects-nothing", ["--filter", "target=cpu dtype=fp64"], "selects no cell"),
        ("unknown-matrix", ["--matrix", "no-such-matrix"], "no matrix named 'no-such-matrix'"),
        ("bad-flag", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        ("bad-jobs", ["--jobs", "0"], "--jobs must be >= 1"),
    ],
)
def test_cli_bad_configuration_exits_3_before_running_anything(case, args, expect, tmp_path):
    (tmp_path / "bad.toml").write_text(BAD_TOML)
    (tmp_path / "unknown.toml").write_text(UNKNOWN_TARGET)
    out = tmp_path / "res"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = rlparity("run", *argv, "--out", str(out), cwd=tmp_path, timeout=120)
    assert proc.returncode == 3, show(proc)
    assert squash(expect) in squash(proc.stdout + proc.stderr)
    assert not (out / "cells").exists()
    if case == "malformed-toml":
        assert squash(f"{tmp_path}/bad.toml:1") in squash(proc.stdout)  # names the file and the line


def test_cli_bad_subcommand_via_console_script_exits_3(tmp_path):
    script = Path(sys.executable).with_name("rlparity")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "rlparity.cli"]
    proc = subprocess.run([*cmd, "frobnicate"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, show(proc)
    assert "invalid choice" in proc.stderr


@pytest.mark.slow
def test_cli_timeout_exits_2_with_a_junit_error(tmp_path):
    matrix = write_matrix(tmp_path / "one.toml")
    out = tmp_path / "res"
    t0 = time.monotonic()
    proc = rlparity("run", "--matrix", str(matrix), "--timeout", "0.5", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 2, show(proc)
    assert time.monotonic() - t0 < 60
    cell_id = "local/cpu/baseline/single/fp32/smoke/exact"
    assert json.loads((out / "summary.json").read_text())["cells"] == {cell_id: "error"}
    suite = suites_by_name(out / "junit.xml")[cell_id]
    assert suite.errors == 1
    (case,) = list(suite)
    (err,) = [r for r in case.result if isinstance(r, Error)]
    assert err.message == "timed out after 0.5 s (killed)"
    assert err.type == "CellError"


def test_cli_nonpositive_timeout_is_bad_configuration(tmp_path):
    proc = rlparity("run", "--filter", CPU_FILTER, "--timeout", "-1", "--out", str(tmp_path / "res"), cwd=tmp_path)
    assert proc.returncode == 3, show(proc)


def test_cli_unknown_control_is_bad_configuration(tmp_path):
    out = tmp_path / "res"
    proc = rlparity("run", "--filter", CPU_FILTER, "--control", "ulp-flop", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 3, show(proc)
    assert not (out / "cells").exists()


@pytest.mark.slow
def test_cli_strict_turns_a_skipped_required_cell_into_an_error(tmp_path):
    gpu_filter = "target=gfx942 profile=baseline dtype=fp32 shapes=quick"
    cell_id = "local/gfx942/baseline/single/fp32/quick/exact"
    # --targets all: the gfx942 cell is selected on this CPU host (auto would not select it); --min-ran 0: a run
    # in which nothing ran may pass only when asked to
    every = ("--targets", "all")
    lenient = rlparity(
        "run", *every, "--min-ran", "0", "--filter", gpu_filter, "--out", str(tmp_path / "a"), cwd=tmp_path
    )
    assert lenient.returncode == 0, show(lenient)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["cells"] == {cell_id: "skipped"} and summary["exit_code"] == 0
    strict = rlparity("run", *every, "--filter", gpu_filter, "--strict", "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert strict.returncode == 2, show(strict)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["exit_code"] == 2 and summary["strict"] is True
    assert any("required but not run (--strict)" in r and cell_id in r for r in summary["reasons"])
    assert "required but not run" in strict.stdout


def test_cli_env_prints_the_fingerprint(tmp_path):
    proc = rlparity("env", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, show(proc)
    fp = json.loads(proc.stdout)
    assert {"hash", "torch", "rl_kernel", "env"} <= set(fp)
    assert fp["torch"]["version"] == torch.__version__
    assert len(fp["hash"]) == 16 and int(fp["hash"], 16) >= 0
    assert isinstance(fp["env"], dict)


@pytest.mark.slow
def test_cli_compare_tensors(tmp_path):
    a = torch.linspace(-3, 3, 1000, dtype=torch.float32)
    b = a.clone()
    b.view(torch.int32)[123] ^= 1  # one element, last bit
    torch.save(a, tmp_path / "a.pt")
    torch.save(a.clone(), tmp_path / "same.pt")
    torch.save(b, tmp_path / "b.pt")
    same = rlparity("compare", str(tmp_path / "a.pt"), str(tmp_path / "same.pt"), cwd=tmp_path, timeout=120)
    assert same.returncode == 0, show(same)
    assert "bitwise equal (1000 elements)" in same.stdout
    differ = rlparity("compare", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), cwd=tmp_path, timeout=120)
    assert differ.returncode == 1, show(differ)
    assert "1/1000 elements differ" in differ.stdout and "max 1 ulp" in differ.stdout
    mixed = rlparity("compare", str(tmp_path), str(tmp_path / "a.pt"), cwd=tmp_path, timeout=120)
    assert mixed.returncode == 3, show(mixed)


def test_cli_interrupt_stops_promptly_and_kills_the_running_cell(tmp_path):
    matrix = write_matrix(tmp_path / "two.toml", timeout_s=120, dtype=["fp32", "bf16"])
    out = tmp_path / "res"
    # The driver takes SIGINT as Python does by default: a suite started in the background (`make test &`) hands
    # its processes an ignored SIGINT, which Python then leaves ignored.
    driver = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from rlparity import cli\n"
        "from rlparity.backends.local import LocalBackend\n"
        f"SCRIPT = {CELL_SCRIPT!r}\n"
        "LocalBackend.command = lambda self, cell_file, out: "
        "[self.python, '-c', SCRIPT, str(cell_file), str(out), 'hang-with-child']\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    argv = [sys.executable, "-c", driver, "run", "--matrix", str(matrix), "--out", str(out), "--jobs", "1"]
    cli = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cells = out / "cells"
    started: list[tuple[int, int]] = []  # (cell pid, child pid)
    try:
        deadline = time.monotonic() + 120
        while not list(cells.glob("*/child.pid")) and time.monotonic() < deadline:
            assert cli.poll() is None, cli.communicate()[0]
            time.sleep(0.1)
        (first_dir,) = [p.parent for p in cells.glob("*/child.pid")]
        time.sleep(0.3)
        cli.send_signal(signal.SIGINT)
        try:  # promptly: well before the cell's 120 s timeout, with room for a 2-core machine under load
            text, _ = cli.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("rlparity run was still running 30 s after SIGINT")
        assert cli.returncode == 2, text
        assert "interrupted" in text
        for d in cells.glob("*/child.pid"):
            log = (d.parent / results.LOG_FILE).read_text()
            started.append((int(log.split("hello from pid ")[1].split()[0]), int(d.read_text())))
        assert [p.parent for p in cells.glob("*/child.pid")] == [first_dir], "a queued cell started after SIGINT"
        for pid, child in started:
            assert wait_dead(pid) and wait_dead(child), "the running cell outlived the interrupted run"
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
        for d in cells.glob("*/child.pid"):
            log = (d.parent / results.LOG_FILE).read_text()
            started.append((int(log.split("hello from pid ")[1].split()[0]), int(d.read_text())))
        for pid, child in started:
            kill_if_ours(pid, "hang-with-child", group=True)
            kill_if_ours(child, CHILD_MARK)
