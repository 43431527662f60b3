"""rlparity.report, pure: merging, the comparison rules and the compact Markdown, on lists of CellResult."""

from __future__ import annotations

from rlparity import report

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
)


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


def test_speedups_count_cells_that_ran_only_and_failed_cells_list_first():
    """A 2x speed-up is a change as a 2x slow-down is; an errored cell's timings and stock comparisons mean nothing
    (it did not run to the end); among failing cells, failed ones come before errored ones."""
    fast, broken, lost = cell("gfx942", "a-fast"), cell("gfx942", "b-failed"), cell("gfx942", "a-errored")
    cur, _ = report.merge([("a", [result(fast, wall=2.0), result(broken, "failed"), result(lost, "error", wall=0.1)])])
    base, _ = report.merge([("b", [result(fast), result(broken), result(lost)])])
    rep = report.build(cur, base)
    assert [(d.key, d.timing, round(d.change_pct)) for d in rep.perf] == [(fast.id, "wall", -50)]
    assert [(s.target, s.cells, s.differ, s.total) for s in rep.stock] == [("gfx942", 2, 2, 4)]
    assert [(f.key, f.status) for f in rep.failures] == [(broken.id, "failed"), (lost.id, "error")]
