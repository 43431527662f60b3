"""The local backend and the runner on real subprocess cells that misbehave (crash, hang, leave children,
exit without a result, lie about it), mixed with a real CPU cell, and --resume."""

from __future__ import annotations

import json
import time

import pytest
from junitparser import Failure

from rlparity import results
from rlparity.backends.base import TAIL_CHARS
from rlparity.backends.local import LocalBackend
from rlparity.inventory import Inventory
from rlparity.matrix import load_matrix
from rlparity.runner import run_cells
from rlparity.select import select

from harness.scripted import (
    CHILD_MARK,
    RecordingBackend,
    ScriptedBackend,
    kill_if_ours,
    mode_cell,
    printed,
    suites_by_name,
    wait_dead,
)

# ---- the local backend on misbehaving cells --------------------------------------------------------
MISBEHAVIOUR = {
    # mode: (words the reason must contain, timeout_s or None)
    "segfault": (("crashed", "SIGSEGV"), None),
    "hang": (("timed out after 2 s",), 2.0),
    "exit0-no-result": (("exited with code 0", "without writing result.json"), None),
    "exit3": (("exited with code 3",), None),
    "passed-but-exit1": (("exited with code 1", "result says passed"), None),
    "garbage-result": (("unreadable result.json",), None),
}


@pytest.mark.parametrize("mode", sorted(MISBEHAVIOUR))
def test_misbehaving_cell_is_an_error_that_says_what_happened(mode, cpu_cell, tmp_path):
    words, timeout_s = MISBEHAVIOUR[mode]
    cell = mode_cell(cpu_cell, mode, timeout_s=timeout_s or cpu_cell.timeout_s)
    t0 = time.monotonic()
    res = ScriptedBackend(default=mode).run_cell(cell, [], tmp_path / "cell")
    assert time.monotonic() - t0 < 15
    assert res.status == "error"
    for word in words:
        assert word in res.reason, res.reason
    assert printed(mode) in res.output_tail
    assert res.started and res.finished


def test_output_tail_is_the_last_of_stdout_and_stderr(cpu_cell, tmp_path):
    res = ScriptedBackend(default="exit3").run_cell(mode_cell(cpu_cell, "exit3"), [], tmp_path / "cell")
    assert res.status == "error"
    assert len(res.output_tail) <= TAIL_CHARS
    assert "progress line 0599" in res.output_tail
    assert "progress line 0000" not in res.output_tail  # the head scrolled out of the tail
    assert res.output_tail.rstrip().endswith("rlparity-test: last words on stderr")  # stderr is merged
    assert (tmp_path / "cell" / results.LOG_FILE).read_text().startswith("rlparity-test cell exit3: hello")


def test_hung_cell_is_killed_with_its_children(cpu_cell, tmp_path):
    cell = mode_cell(cpu_cell, "hang-with-child", timeout_s=2.0)
    out = tmp_path / "cell"
    t0 = time.monotonic()
    res = ScriptedBackend(default="hang-with-child").run_cell(cell, [], out)
    wall = time.monotonic() - t0
    child = int((out / "child.pid").read_text())
    try:
        assert wall < 15, f"a 2 s timeout took {wall:.1f} s"
        assert res.status == "error"
        assert res.reason == "timed out after 2 s (killed)"
        assert res.timings["wall_s"] >= 2.0
        assert "rlparity-test cell hang-with-child: hello" in res.output_tail
        assert wait_dead(child), f"the hung cell's child {child} survived the process-group kill"
    finally:
        kill_if_ours(child, CHILD_MARK)


def test_a_cell_started_after_cancel_is_killed_at_once(cpu_cell, tmp_path):
    """An interrupt that lands while a worker starts its cell: that cell is killed, not left to its timeout."""
    backend = ScriptedBackend(default="hang")
    backend.cancel()
    t0 = time.monotonic()
    res = backend.run_cell(mode_cell(cpu_cell, "hang", timeout_s=60.0), [], tmp_path / "cell")
    assert time.monotonic() - t0 < 15, "a cell started after cancel() ran on towards its timeout"
    assert res.status == "error" and "SIGKILL" in res.reason, res.reason


def test_crashed_cell_leaves_no_children(cpu_cell, tmp_path):
    out = tmp_path / "cell"
    res = ScriptedBackend(default="segfault-with-child").run_cell(mode_cell(cpu_cell, "segv-child"), [], out)
    child = int((out / "child.pid").read_text())
    try:
        assert res.status == "error" and "SIGSEGV" in res.reason
        assert wait_dead(child), f"the crashed cell's child {child} is still running"
    finally:
        kill_if_ours(child, CHILD_MARK)


@pytest.mark.parametrize("mode", ["slow-exit0-no-result", "slow-passed-but-exit1"])
def test_errored_cell_keeps_its_wall_time(mode, cpu_cell, tmp_path):
    """Regression: judge() once dropped wall_s on these two error paths (0.0 s in the table and the junit)."""
    res = ScriptedBackend(default=mode).run_cell(mode_cell(cpu_cell, mode), [], tmp_path / "cell")
    assert res.status == "error"
    assert res.timings["wall_s"] >= 1.5


def test_stale_result_is_not_trusted(cpu_cell, tmp_path):
    """A passed result.json (and junit) left by an earlier run must not stand in for a cell that wrote none."""
    cell = mode_cell(cpu_cell, "exit0-no-result")
    out = tmp_path / "cell"
    results.write(results.CellResult(cell, "passed", "from an earlier run"), out)
    (out / results.JUNIT_FILE).write_text("<testsuite/>")
    res = ScriptedBackend(default="exit0-no-result").run_cell(cell, [], out)
    assert res.status == "error"
    assert "without writing result.json" in res.reason
    assert not (out / results.JUNIT_FILE).exists()


def test_cell_env_is_clean_and_carries_the_profile(monkeypatch, tmp_path):
    (cell,) = select(load_matrix("quick").cells, "target=cpu profile=threads-1 placement=single dtype=fp32")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.setenv("TORCH_RLPARITY_TEST", "leak")
    monkeypatch.setenv("PYTORCH_TUNABLEOP_ENABLED", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # handed to the job by CI: kept
    monkeypatch.setenv("RLPARITY_TEST_OTHER", "kept")
    out = tmp_path / "cell"
    res = ScriptedBackend(default="dump-env").run_cell(cell, [], out, "ulp-flip", {"RL_KERNEL_LIBRARY": "/x.so"})
    assert res.status == "error"  # dump-env writes no result
    env = json.loads((out / "env.json").read_text())
    assert env["OMP_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1"  # the profile's, not the caller's
    assert "TORCH_RLPARITY_TEST" not in env and "PYTORCH_TUNABLEOP_ENABLED" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["RLPARITY_TEST_OTHER"] == "kept"
    assert env["RLPARITY_CONTROL"] == "ulp-flip"
    assert env["RL_KERNEL_LIBRARY"] == "/x.so"
    assert env["PYTHONUNBUFFERED"] == "1"


@pytest.mark.slow
def test_run_cells_mixes_good_and_bad_cells(cpu_cell, tmp_path):
    """Two jobs: the real CPU cell passes while crashing, hanging and silent cells error; every result is on disk."""
    bad = {
        "segfault": mode_cell(cpu_cell, "segfault"),
        "hang": mode_cell(cpu_cell, "hang", timeout_s=2.0),
        "exit0-no-result": mode_cell(cpu_cell, "exit0-no-result"),
        "exit3": mode_cell(cpu_cell, "exit3"),
    }
    cells = [bad["segfault"], cpu_cell, bad["hang"], bad["exit0-no-result"], bad["exit3"]]
    backend = ScriptedBackend({c.id: mode for mode, c in bad.items()})
    seen: list[str] = []
    t0 = time.monotonic()
    got = run_cells(cells, backend, tmp_path, Inventory(), jobs=2, on_result=lambda r: seen.append(r.cell.id))
    wall = time.monotonic() - t0

    assert [r.cell.id for r in got] == [c.id for c in cells]  # in the order asked, whatever order they finished
    by_id = {r.cell.id: r for r in got}
    assert by_id[cpu_cell.id].status == "passed", by_id[cpu_cell.id].reason
    assert by_id[cpu_cell.id].comparisons and not by_id[cpu_cell.id].mismatches
    assert "SIGSEGV" in by_id[bad["segfault"].id].reason
    assert "timed out" in by_id[bad["hang"].id].reason
    assert "without writing result.json" in by_id[bad["exit0-no-result"].id].reason
    assert "exited with code 3" in by_id[bad["exit3"].id].reason
    for mode, cell in bad.items():
        assert by_id[cell.id].status == "error"
        assert printed(mode) in by_id[cell.id].output_tail
    assert sorted(seen) == sorted(c.id for c in cells)
    assert wall < 120

    on_disk = {r.cell.id: r for r in results.read_all(tmp_path)}
    assert set(on_disk) == {c.id for c in cells}
    assert {k: r.status for k, r in on_disk.items()} == {k: r.status for k, r in by_id.items()}
    assert on_disk[bad["exit3"].id].output_tail == by_id[bad["exit3"].id].output_tail
    assert (results.cell_dir(tmp_path, cpu_cell) / results.JUNIT_FILE).exists()


def test_resume_reruns_only_unfinished_cells(cpu_cell, tmp_path):
    names = ("passed", "failed", "skipped", "error", "corrupt", "absent")
    cells = {n: mode_cell(cpu_cell, n) for n in names}
    for n in ("passed", "failed", "skipped", "error"):
        results.write(
            results.CellResult(cells[n], n, f"earlier {n}", started="2000-01-01"), results.cell_dir(tmp_path, cells[n])
        )
    corrupt = results.cell_dir(tmp_path, cells["corrupt"])
    corrupt.mkdir(parents=True)
    (corrupt / results.RESULT_FILE).write_text('{"status": "passed"')

    backend = RecordingBackend()
    got = run_cells(list(cells.values()), backend, tmp_path, Inventory(), jobs=2, resume=True)
    assert sorted(backend.calls) == sorted(cells[n].id for n in ("error", "corrupt", "absent"))
    by_id = {r.cell.id: r for r in got}
    for n in ("passed", "failed", "skipped"):
        assert by_id[cells[n].id].reason == f"earlier {n}"
        assert by_id[cells[n].id].started == "2000-01-01"
        assert results.read(results.cell_dir(tmp_path, cells[n])).reason == f"earlier {n}"  # untouched
    for n in ("error", "corrupt", "absent"):
        assert by_id[cells[n].id].status == "passed"
        assert results.read(results.cell_dir(tmp_path, cells[n])).reason == "recorded"

    backend = RecordingBackend()
    run_cells(list(cells.values()), backend, tmp_path, Inventory(), resume=False)
    assert sorted(backend.calls) == sorted(c.id for c in cells.values())  # without --resume everything runs


@pytest.mark.slow
def test_resume_reruns_an_errored_cell_for_real(cpu_cell, tmp_path):
    """An errored real cell on disk is rerun by the real backend and replaced by its passing result."""
    results.write(results.errored(cpu_cell, "lost the machine"), results.cell_dir(tmp_path, cpu_cell))
    (res,) = run_cells([cpu_cell], LocalBackend(), tmp_path, Inventory(), resume=True)
    assert res.status == "passed", res.reason
    (again,) = run_cells([cpu_cell], RecordingBackend(), tmp_path, Inventory(), resume=True)
    assert again.started == res.started and again.status == "passed"  # now finished: kept


def test_failed_cell_without_junit_is_a_failure_in_the_merged_junit(cpu_cell, tmp_path):
    """Regression: a failed cell that left no junit.xml once got a passing synthetic testcase (green in CI)."""
    from rlparity import collect

    cell = mode_cell(cpu_cell, "failed-no-junit")
    (res,) = run_cells([cell], ScriptedBackend(default="failed-no-junit"), tmp_path, Inventory())
    assert res.status == "failed"
    suite = suites_by_name(collect.merge([res], tmp_path))[cell.id]
    assert suite.failures == 1
    (case,) = list(suite)
    (failure,) = [r for r in case.result if isinstance(r, Failure)]
    assert failure.message == "planted failed"
