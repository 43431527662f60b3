"""`rlparity report`: two result sets written with results.write, a regression planted in every section."""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path

import pytest

from rlparity import report, results
from rlparity.matrix import Cell
from rlparity.results import CellResult

DIGESTS = {"1x128x4096/logprobs": "a" * 64, "1x128x4096/grad": "b" * 64}
FP = {
    "python": "3.11.7",
    "hostname": "runner-1",
    "pid": 100,
    "torch": {"version": "2.13.0+rocm6.4", "hip": "6.4", "threads": 8},
    "env": {"HIP_VISIBLE_DEVICES": "0"},
}


def cell(target: str, profile: str, dtype: str = "fp32", placement: str = "single", required: bool = True) -> Cell:
    return Cell("local", target, profile, placement, dtype, "quick", "exact", required=required, platform="rocm")


NEWFAIL = cell("gfx942", "baseline")  # passed -> failed: a regression
FIXED = cell("gfx942", "threads-1")  # failed -> passed
DRIFT = cell("gfx942", "baseline", "bf16")  # a digest changed: a regression
ENV = cell("gfx942", "sdma-off")  # HSA_ENABLE_SDMA appears in its fingerprint
SLOW = cell("gfx942", "baseline", placement="split")  # wall and one test 2x slower
STEADY = cell("gfx90a", "baseline")  # +10 % wall, a tiny test 5x slower: neither reported
INFO_FAIL = cell("gfx90a", "tunableop-on", required=False)  # informational new failure: reported, not a regression
SKIP = cell("sm90", "baseline")  # skipped in both
RAN_BOTH = [NEWFAIL, FIXED, DRIFT, ENV, SLOW, STEADY, INFO_FAIL]  # cells with a fingerprint in both sets


def comparisons(equal: bool = True, stock_differ: int = 1) -> list[dict]:
    def comp(name: str, eq: bool, informational: bool) -> dict:
        return {
            "test": f"test_x[{name}]", "name": name, "equal": eq, "informational": informational,
            "digest_a": "a" * 64, "digest_b": ("a" if eq else "f") * 64, "count": 0 if eq else 3, "total": 128,
            "max_abs": 0.0 if eq else 1e-7, "max_ulp": 0 if eq else 2, "first_index": None if eq else [0, 5],
        }  # fmt: skip

    return [
        comp("rollout vs training", equal, False),
        comp("stock rollout vs training", stock_differ < 1, True),
        comp("stock mm row", True, True),
    ]


def result(c: Cell, status: str = "passed", **kw) -> CellResult:
    if status == "skipped":
        return results.skipped(c, "target sm90 needs a CUDA device")
    fp = copy.deepcopy(FP)
    fp["torch"]["version"] = kw.pop("torch", fp["torch"]["version"])
    fp["env"].update(kw.pop("env", {}))
    return CellResult(
        c,
        status,
        kw.pop("reason", "1x128x4096 rollout vs training: 3 elements differ" if status == "failed" else ""),
        fingerprint=fp,
        fingerprint_hash="h",
        digests=kw.pop("digests", dict(DIGESTS)),
        comparisons=comparisons(equal=status != "failed"),
        timings={"wall_s": kw.pop("wall", 4.0), "tests": kw.pop("tests", {"test_x[1x128x4096]": 1.0})},
    )


def baseline_set() -> list[CellResult]:
    return [
        result(NEWFAIL),
        result(FIXED, "failed"),
        result(DRIFT),
        result(ENV),
        result(SLOW),
        result(STEADY, tests={"test_x[1x128x4096]": 1.0, "test_tiny": 0.01}),
        result(INFO_FAIL),
        result(SKIP, "skipped"),
    ]


def current_set() -> list[CellResult]:
    new = "2.14.0+rocm6.4"  # a torch upgrade: the same change on every cell, one row
    return [
        result(NEWFAIL, "failed", torch=new),
        result(FIXED, torch=new),
        result(DRIFT, torch=new, digests={**DIGESTS, "1x128x4096/logprobs": "c" * 64}),
        result(ENV, torch=new, env={"HSA_ENABLE_SDMA": "0"}),
        result(SLOW, torch=new, wall=8.0, tests={"test_x[1x128x4096]": 2.0}),
        result(STEADY, torch=new, wall=4.4, tests={"test_x[1x128x4096]": 1.0, "test_tiny": 0.05}),
        result(INFO_FAIL, "failed", torch=new),
        result(SKIP, "skipped"),
    ]


def write_set(d: Path, rs: list[CellResult]) -> Path:
    for r in rs:
        results.write(r, results.cell_dir(d, r.cell))
    return d


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return write_set(tmp_path / "nightly", current_set()), write_set(tmp_path / "last-night", baseline_set())


def section(text: str, title: str) -> str:
    """A Markdown section's body: from '## title...' to the next '## '."""
    m = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"no section {title!r}"
    return m.group(1)


# ---- pure logic -----------------------------------------------------------------------------------------
def build_pure() -> report.Report:
    cur, _ = report.merge([("nightly", current_set())])
    base, _ = report.merge([("last-night", baseline_set())])
    return report.build(cur, base)


def test_sections_pure():
    rep = build_pure()
    assert [(c.key, c.before, c.after) for c in rep.new_failures] == [
        (INFO_FAIL.id, "passed", "failed"),
        (NEWFAIL.id, "passed", "failed"),
    ]
    assert [(c.key, c.before, c.after) for c in rep.fixed] == [(FIXED.id, "failed", "passed")]
    assert [(d.key, d.outputs) for d in rep.drift] == [(DRIFT.id, ("1x128x4096/logprobs",))]

    rows = {c.field: c for c in rep.env_changes}
    assert set(rows) == {"torch.version", "env.HSA_ENABLE_SDMA"}  # hostname and pid are volatile
    torch_row = rows["torch.version"]
    assert (torch_row.before, torch_row.after) == ("2.13.0+rocm6.4", "2.14.0+rocm6.4")
    assert sorted(torch_row.cells) == sorted(c.id for c in RAN_BOTH)  # one row, the count of cells
    assert rows["env.HSA_ENABLE_SDMA"].cells == (ENV.id,)
    assert (rows["env.HSA_ENABLE_SDMA"].before, rows["env.HSA_ENABLE_SDMA"].after) == (None, "0")
    assert rep.env_changes[0].field == "torch.version"  # most cells first

    assert [(d.key, d.timing, round(d.change_pct)) for d in rep.perf] == [
        (SLOW.id, "wall", 100),
        (SLOW.id, "test_x[1x128x4096]", 100),
    ]  # STEADY's +10 % and its 0.01 -> 0.05 s test (under 0.5 s) are not reported
    assert rep.regressions == [
        f"new failure: {NEWFAIL.id} (passed -> failed)",
        f"digest drift: {DRIFT.id} (1x128x4096/logprobs)",
    ]  # the informational INFO_FAIL is not one

    assert [(f.key, f.new) for f in rep.failures] == [(NEWFAIL.id, True), (INFO_FAIL.id, True)]  # required first
    assert rep.totals.counts == {"passed": 5, "failed": 2, "error": 0, "skipped": 1}
    assert rep.totals.required["failed"] == 1 and rep.totals.informational["failed"] == 1
    assert rep.totals.verdict == 1  # the gate: a required cell failed
    assert [(s.target, s.differ, s.total) for s in rep.stock] == [("gfx90a", 2, 4), ("gfx942", 5, 10)]
    assert rep.gone == []


def test_thresholds_and_floor():
    cur, _ = report.merge([("a", current_set())])
    base, _ = report.merge([("b", baseline_set())])
    assert report.build(cur, base, threshold_pct=150).perf == []  # 2x is +100 %
    assert {(d.key, d.timing) for d in report.build(cur, base, threshold_pct=5).perf} >= {(STEADY.id, "wall")}
    floor0 = report.build(cur, base, min_seconds=0).perf
    assert (STEADY.id, "test_tiny") in {(d.key, d.timing) for d in floor0}


def test_comparing_a_set_with_itself_is_quiet():
    cur, _ = report.merge([("a", current_set())])
    rep = report.build(cur, cur)
    assert rep.new_failures == rep.fixed == rep.drift == rep.env_changes == rep.perf == rep.regressions == []


def test_new_cells_that_fail_are_new_failures():
    fresh, was_skipped, steady = cell("gfx950", "baseline"), cell("sm90", "baseline"), cell("cpu", "baseline")
    cur, _ = report.merge([("a", [result(fresh, "error"), result(was_skipped, "failed"), result(steady)])])
    base, _ = report.merge([("b", [result(was_skipped, "skipped"), result(steady)])])
    rep = report.build(cur, base)
    assert [(c.key, c.before, c.after) for c in rep.new_failures] == [
        (fresh.id, "absent", "error"),
        (was_skipped.id, "skipped", "failed"),
    ]
    assert len(rep.regressions) == 2 and rep.gone == []


def test_merge_duplicates_across_dirs():
    x, y, z = cell("gfx942", "baseline"), cell("cpu", "baseline"), cell("sm90", "baseline")
    mi300 = [result(x), result(y), result(z, "skipped")]
    h200 = [result(x, "skipped"), result(y, wall=3.0), result(z)]
    entries, notes = report.merge([("mi300", mi300), ("h200", h200)])
    assert sorted((e.key, e.source) for e in entries) == sorted(
        [(x.id, "mi300"), (z.id, "h200"), (f"{y.id} @ mi300", "mi300"), (f"{y.id} @ h200", "h200")]
    )
    assert any("2 skipped duplicate" in n for n in notes)
    # the baseline has both copies of y: each current copy meets the one of its own dir
    pairs = report.match(entries, entries)
    assert all(b is e for e, b in pairs)
    # the baseline has one copy: every current copy is compared with it
    single, _ = report.merge([("mi300", mi300)])
    assert all(b is not None and b.id == e.id for e, b in report.match(entries, single))


def test_markdown_stays_compact_with_many_cells():
    many = [result(cell(f"t{i % 10}", f"p{i}")) for i in range(600)]
    failing = [result(cell("gfx942", f"bad{i}"), "failed") for i in range(50)]
    entries, _ = report.merge([("big", many + failing)])
    base, _ = report.merge([("big", many + [result(r.cell) for r in failing])])
    md = report.render_markdown(report.build(entries, base))
    assert len(md.encode()) < 1024 * 1024
    assert many[0].cell.id not in md  # passing cells are counted per target, not listed
    assert failing[0].cell.id in md and f"and {50 - report.MD_ROWS} more" in md
    assert "| t3 | 60 | 0 | 0 | 0 |" in md


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
