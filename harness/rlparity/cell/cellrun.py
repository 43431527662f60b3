"""Inside a cell: `python -m rlparity.cell.cellrun CELL_JSON OUT_DIR`, in a fresh process whose env the backend
set before python started. Fingerprints the environment, runs the bitwise suite (pytest, --junitxml) and
writes result.json. Exit code: 0 passed or skipped, 1 a bitwise mismatch, 2 the cell errored (a configuration
error the suite found, Recorder.config_error, is an error whose result.json names it: the gate's exit 3).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from rlparity import fingerprint, results
from rlparity.applicability import skip_reason
from rlparity.cell import fingerprint as cell_fingerprint
from rlparity.cell import inventory, workloads
from rlparity.cell.controls import PLACEMENT_VAR
from rlparity.cell.suite.plugin import SuitePlugin
from rlparity.cells import EXIT_CODES, Cell, control_from_env

SUITE_DIR = Path(__file__).parent / "suite"  # pytest.ini and the rootdir of every suite
AUTOLOAD_OFF = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"  # every pytest reads it (the flag of that name came in 8.4)


class _Outcomes:
    """Per-test durations and the first failure's text, for result.json."""

    def __init__(self) -> None:
        self.durations: dict[str, float] = {}
        self.failures: list[str] = []

    def pytest_runtest_logreport(self, report) -> None:
        name = report.nodeid.split("::")[-1]
        self.durations[name] = round(self.durations.get(name, 0.0) + report.duration, 4)
        if report.failed:
            text = [ln for ln in report.longreprtext.strip().splitlines() if ln.startswith("E ")]
            self.failures.append(f"{name} ({report.when}): {text[0][2:].strip() if text else 'failed'}")


def run_cell(cell: Cell, out: Path, control: str = "none") -> results.CellResult:
    started, t0 = results.now(), time.monotonic()
    fp = cell_fingerprint.collect()
    fp_hash = fingerprint.fingerprint_hash(fp)
    reason = skip_reason(cell, inventory.probe())
    if reason:
        res = results.skipped(cell, reason)
        res.fingerprint, res.fingerprint_hash, res.variant = fp, fp_hash, control
        return res
    os.environ[PLACEMENT_VAR] = cell.placement  # what the placement-variant control reads
    workload = workloads.get(cell.workload)
    try:
        params = workload.resolve(cell.params)
    except workloads.WorkloadError as exc:  # the host checks keys before a run; a cell run by hand may not
        return _errored(cell, str(exc), fp, fp_hash, control)
    plugin, outcomes = SuitePlugin(cell, control, params), _Outcomes()
    code = _run_suite(
        [
            *(str(p) for p in workload.suite),
            "-c",
            str(SUITE_DIR / "pytest.ini"),
            "--rootdir",
            str(SUITE_DIR),
            "-q",
            f"--junitxml={out / results.JUNIT_FILE}",
            "-o",
            f"junit_suite_name={cell.id}",
        ],
        [plugin, outcomes],
    )
    rec = plugin.recorder
    comparisons = [c.to_dict() for c in rec.comparisons]
    mismatch = next((c for c in comparisons if not c["equal"] and not c["informational"]), None)
    if rec.config_errors:
        status, why = "error", f"configuration: {rec.config_errors[0]}"
    elif code == pytest.ExitCode.OK:
        status, why = "passed", ""
    elif code == pytest.ExitCode.TESTS_FAILED and mismatch is not None:
        status, why = "failed", f"bitwise mismatch in {mismatch['name']}"
    else:
        status = "error"
        why = outcomes.failures[0] if outcomes.failures else f"the suite exited with pytest code {int(code)}"
    return results.CellResult(
        cell,
        status,
        why,
        variant=control,  # result.json keeps the field's name
        fingerprint=fp,
        fingerprint_hash=fp_hash,
        digests=rec.digests,
        metrics=rec.metrics,
        info=rec.info,
        config_error=rec.config_errors[0] if rec.config_errors else "",
        comparisons=comparisons,
        timings={"wall_s": round(time.monotonic() - t0, 3), "tests": outcomes.durations},
        started=started,
        finished=results.now(),
    )


def _run_suite(args: list[str], plugins: list) -> int | pytest.ExitCode:
    """pytest.main with the suite's plugins and none that the image's packages register by entry point: a plugin
    installed beside torch (anyio's, xdist's) must not change how the suite runs, nor cost each cell its import."""
    before = os.environ.get(AUTOLOAD_OFF)
    os.environ[AUTOLOAD_OFF] = "1"
    try:
        return pytest.main(args, plugins=plugins)
    finally:
        if before is None:
            del os.environ[AUTOLOAD_OFF]
        else:
            os.environ[AUTOLOAD_OFF] = before


def _errored(cell: Cell, why: str, fp: dict, fp_hash: str, control: str) -> results.CellResult:
    res = results.CellResult(cell, "error", why, variant=control, fingerprint=fp, fingerprint_hash=fp_hash)
    res.started = res.finished = results.now()
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m rlparity.cell.cellrun CELL_JSON OUT_DIR", file=sys.stderr)
        return 2
    cell = Cell.from_dict(json.loads(Path(argv[0]).read_text()))
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    res = run_cell(cell, out, control_from_env(os.environ))
    results.write(res, out)
    print(f"[rlparity] {cell.id}: {res.status.upper()} {res.reason}", flush=True)
    return EXIT_CODES[res.status]


if __name__ == "__main__":
    sys.exit(main())
