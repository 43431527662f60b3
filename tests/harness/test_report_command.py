"""`rlparity report`: the command on results dirs written with results.write; files, output, exit codes."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlparity.report import command as report

from harness.report_data import (
    DRIFT,
    ENV,
    FIXED,
    INFO_FAIL,
    NEWFAIL,
    RAN_BOTH,
    SLOW,
    STEADY,
    baseline_set,
    cell,
    current_set,
    result,
    section,
    write_set,
)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return write_set(tmp_path / "nightly", current_set()), write_set(tmp_path / "last-night", baseline_set())


def test_register_adds_the_subcommand():
    p = argparse.ArgumentParser()
    report.register(p.add_subparsers(dest="command"))
    args = p.parse_args(["report", "a", "b", "--baseline", "c", "--fail-on-regression", "--perf-threshold", "10"])
    assert args.func is report.cmd_report
    assert (args.results, args.baseline, args.fail_on_regression, args.out) == (["a", "b"], ["c"], True, "report")


# ---- the command: files, exit codes -------------------------------------------------------------------------
def test_report_files(dirs, tmp_path, capsys):
    cur, base = dirs
    out = tmp_path / "out"
    assert report.main([str(cur), "--baseline", str(base), "--out", str(out)]) == 0  # no --fail-on-regression
    printed = capsys.readouterr().out
    assert str(out / "report.md") in printed and "regressions: 2" in printed
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert len(md.encode()) < 1024 * 1024

    assert NEWFAIL.id in section(md, "New failures") and INFO_FAIL.id in section(md, "New failures")
    assert FIXED.id not in section(md, "New failures")
    assert FIXED.id in section(md, "Fixed") and NEWFAIL.id not in section(md, "Fixed")
    assert DRIFT.id in section(md, "Digest drift") and "1x128x4096/logprobs" in section(md, "Digest drift")
    env = section(md, "Environment changes")
    assert "`env.HSA_ENABLE_SDMA`" in env and ENV.id in env
    assert env.count("torch.version") == 1 and f"| {len(RAN_BOTH)} |" in env
    perf = section(md, "Performance deltas")
    assert SLOW.id in perf and "+100 %" in perf and STEADY.id not in perf
    assert NEWFAIL.id in section(md, "Failures")
    assert "**Gate: MISMATCH**" in md and "**2 regression(s)**" in md

    for c in (NEWFAIL, FIXED, DRIFT, ENV, SLOW, INFO_FAIL):
        assert c.id in page
    assert "HSA_ENABLE_SDMA" in page and "+100 %" in page
    # self-contained: every image inline, no external stylesheet, script or image
    assert page.count("data:image/png;base64,") == 3
    assert 'src="http' not in page and "<link" not in page and "<script" not in page
    assert all(src.startswith("data:image/png;base64,") for src in re.findall(r'src="([^"]*)"', page))


def test_fail_on_regression(dirs, tmp_path):
    cur, base = dirs
    out = str(tmp_path / "out")
    assert report.main([str(cur), "--baseline", str(base), "--out", out, "--fail-on-regression"]) == 1
    assert report.main([str(base), "--baseline", str(base), "--out", out, "--fail-on-regression"]) == 0
    assert report.main([str(cur), "--baseline", str(cur), "--out", out, "--fail-on-regression"]) == 0
    # what changed only in timings, environment and informational cells does not fail it
    quiet = [r for r in current_set() if r.cell not in (NEWFAIL, DRIFT)]
    q = write_set(tmp_path / "quiet", quiet)
    assert report.main([str(q), "--baseline", str(base), "--out", out, "--fail-on-regression"]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert INFO_FAIL.id in section(md, "New failures") and "no regressions" in md
    assert NEWFAIL.id in md.split("Cells that ran in the baseline but are not in these results")[1]  # gone, reported


def test_no_baseline(dirs, tmp_path, capsys):
    cur, _ = dirs
    out = tmp_path / "out"
    assert report.main([str(cur), "--out", str(out), "--fail-on-regression"]) == 0
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    for title in ("New failures", "Fixed", "Digest drift", "Environment changes", "Performance deltas"):
        assert "no baseline given" in section(md, title)
    assert NEWFAIL.id in section(md, "Failures")  # failures now are listed either way
    assert page.count("no baseline given") >= 5 and "data:image/png;base64," in page
    assert "no baseline given" in capsys.readouterr().out


def test_multiple_results_dirs_merged(tmp_path):
    x, y, z = cell("gfx942", "baseline"), cell("cpu", "baseline"), cell("sm90", "baseline")
    a = write_set(tmp_path / "mi300", [result(x), result(y), result(z, "skipped")])
    b = write_set(tmp_path / "h200", [result(x, "skipped"), result(y), result(z, "failed")])
    base = write_set(tmp_path / "base", [result(x), result(y), result(z)])
    out = tmp_path / "out"
    code = report.main([str(a), str(b), "--baseline", str(base), "--out", str(out), "--fail-on-regression"])
    assert code == 1  # z failed on h200, passed in the baseline
    md = (out / "report.md").read_text()
    assert "`mi300` (3 cells), `h200` (3 cells)" in md
    assert f"{y.id} @ mi300" in md and f"{y.id} @ h200" in md
    assert z.id in section(md, "New failures") and x.id not in section(md, "New failures")
    assert "| gfx942 | 1 | 0 | 0 | 0 |" in md and "| sm90 | 0 | 1 | 0 | 0 |" in md  # skipped copies dropped


@pytest.mark.parametrize(
    "case", ["missing", "no-cells", "empty-cells", "corrupt", "bad-baseline", "twice", "threshold", "min-seconds"]
)
def test_bad_input_exits_3(dirs, tmp_path, capsys, case):
    cur, _ = dirs
    out = ["--out", str(tmp_path / "out")]
    plain = tmp_path / "plain"
    plain.mkdir()
    (tmp_path / "empty" / "cells").mkdir(parents=True)
    bad = cur / "cells" / NEWFAIL.dirname / "result.json"
    argv, named = {
        "missing": ([str(tmp_path / "nope")], tmp_path / "nope"),
        "no-cells": ([str(plain)], plain),
        "empty-cells": ([str(tmp_path / "empty")], tmp_path / "empty"),
        "corrupt": ([str(cur)], bad),
        "bad-baseline": ([str(cur), "--baseline", str(plain)], plain),
        "twice": ([str(cur), str(cur)], cur),
        "threshold": ([str(cur), "--perf-threshold", "-5"], "--perf-threshold"),
        "min-seconds": ([str(cur), "--perf-min-seconds", "x"], "--perf-min-seconds"),
    }[case]
    if case == "corrupt":
        bad.write_text('{"cell": ')
    assert report.main(argv + out) == 3
    assert str(named) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unwritable_out_exits_3(dirs, tmp_path, capsys):
    cur, _ = dirs
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert report.main([str(cur), "--out", str(blocker)]) == 3
    assert str(blocker) in capsys.readouterr().err


def test_bad_arguments_exit_3(capsys):
    with pytest.raises(SystemExit) as exc:
        report.main(["--no-such-option"])
    assert exc.value.code == 3


# ---- the package's shape ------------------------------------------------------------------------------------
def test_help_is_short(capsys):
    with pytest.raises(SystemExit) as exc:
        report.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--fail-on-regression" in out and "--perf-min-seconds" in out
    assert len(out.splitlines()) < 25  # the rules live in docs/harness.md, not in --help


def test_python_dash_m_rlparity_report(dirs, tmp_path):
    cur, base = dirs
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "rlparity.report", str(cur), "--baseline", str(base), "--out", str(out)]
    proc = subprocess.run([*argv, "--fail-on-regression"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "regressions: 2" in proc.stdout and (out / "report.html").is_file()


def test_only_plots_imports_matplotlib():
    """Building and rendering the Markdown (a CI job summary) does not pay for matplotlib."""
    code = (
        "import sys\n"
        "from rlparity import report\n"
        "rep = report.build([], [])\n"
        "report.render_markdown(rep), report.render_html(rep, {})\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
