"""`rlparity report --history DIR...`: the nights' order, the counts per target, the first night of each
failing cell's unbroken run of failures (and that moving it moves the answer), the plot, bad input."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from rlparity import report
from rlparity.config import ConfigError
from rlparity.report import command, history, sections
from rlparity.report.model import TONIGHT
from rlparity.report.plots import HISTORY
from rlparity.results import CellResult

from harness.report_data import (
    FIXED,
    INFO_FAIL,
    NEWFAIL,
    baseline_set,
    comparisons,
    current_set,
    result,
    section,
    write_set,
)

NIGHTS = 4  # night-1 .. night-4, then tonight (current_set: NEWFAIL fails)


def at(rs: list[CellResult], day: int | None) -> list[CellResult]:
    """The results as run on June `day` (None: no start time recorded, as in an old results dir)."""
    return [replace(r, started="" if day is None else f"2025-06-{day:02d}T02:00:00+00:00") for r in rs]


def night_results(n: int, fails: set[int]) -> list[CellResult]:
    """baseline_set (NEWFAIL passes, FIXED fails) with NEWFAIL failing on the nights in `fails`."""
    return [result(NEWFAIL, "failed") if r.cell == NEWFAIL and n in fails else r for r in baseline_set()]


def nights(fails: set[int], days: dict[int, int | None] | None = None) -> list[report.Night]:
    """The four earlier nights, given newest first (the order must come from their run times)."""
    out = []
    for n in range(NIGHTS, 0, -1):
        entries, _ = report.merge([(f"night-{n}", at(night_results(n, fails), (days or {}).get(n, n)))])
        out.append(report.Night(f"night-{n}", tuple(entries)))
    return out


def tonight() -> report.Night:
    entries, _ = report.merge([("nightly", at(current_set(), 10))])
    return report.Night(TONIGHT, tuple(entries))


def onset_of(h: report.History, key: str) -> tuple[str, int, str]:
    """(the first failing night's label, the run's length in nights, the status before it)."""
    (o,) = [o for o in h.onsets if o.key == key]
    return h.nights[o.since], len(h.nights) - o.since, o.before


# ---- the rules, pure ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("first", [3, 2])
def test_the_first_failing_night_is_named(first):
    """NEWFAIL fails from night `first` on, to tonight: night `first` is named (the nights given newest first)."""
    h = history.trend(nights(set(range(first, NIGHTS + 1))), tonight())
    assert h.nights == ("night-1", "night-2", "night-3", "night-4", "tonight")
    assert onset_of(h, NEWFAIL.id) == (f"night-{first}", NIGHTS + 2 - first, "passed")
    assert onset_of(h, INFO_FAIL.id) == ("tonight", 1, "passed")  # a failure of tonight only
    assert FIXED.id not in {o.key for o in h.onsets}  # failed every earlier night, passes tonight
    assert [o.key for o in h.onsets] == [NEWFAIL.id, INFO_FAIL.id]  # required first


def test_moving_the_failure_one_night_earlier_changes_the_answer():
    later = history.trend(nights({3, 4}), tonight())
    earlier = history.trend(nights({2, 3, 4}), tonight())
    assert onset_of(later, NEWFAIL.id)[0] == "night-3" and onset_of(earlier, NEWFAIL.id)[0] == "night-2"


def edited(n: report.Night, edit: Callable[[CellResult], CellResult | None]) -> report.Night:
    """Night n with each cell's result passed through `edit` (None: the cell left out)."""
    pairs = [(e, edit(e.result)) for e in n.entries]
    return replace(n, entries=tuple(replace(e, result=r) for e, r in pairs if r is not None))


def test_only_the_unbroken_run_counts():
    """A night the cell passed ends the run; so does a night it was skipped or absent."""
    assert onset_of(history.trend(nights({1, 3, 4}), tonight()), NEWFAIL.id) == ("night-3", 3, "passed")
    n = nights({1, 2, 3, 4})  # newest first: n[1] is night-3
    n[1] = edited(n[1], lambda r: result(r.cell, "skipped") if r.cell == NEWFAIL else r)
    assert onset_of(history.trend(n, tonight()), NEWFAIL.id) == ("night-4", 2, "skipped")
    n[1] = edited(n[1], lambda r: None if r.cell == NEWFAIL else r)
    assert onset_of(history.trend(n, tonight()), NEWFAIL.id) == ("night-4", 2, "absent")


def test_a_run_back_to_the_oldest_night():
    h = history.trend(nights({1, 2, 3, 4}), tonight())
    assert onset_of(h, NEWFAIL.id) == ("night-1", 5, "")  # it may have begun before the history
    rows = {r[0]: r for r in sections.history(report.build(list(tonight().entries), history=h))[0].rows}
    assert rows["gfx942"][-1] == "night-1 or earlier"


def test_nights_ordered_by_run_time_else_as_given():
    shuffled = nights(set(), {4: 2, 3: 4, 2: 1, 1: 3})  # run on June 2, 4, 1, 3
    ordered, how = history.order(shuffled)
    assert [n.label for n in ordered] == ["night-2", "night-4", "night-1", "night-3"] and how == history.BY_TIME
    unknown = nights(set(), {2: None})  # one dir records no start: nothing to sort it by
    ordered, how = history.order(unknown)
    assert [n.label for n in ordered] == [n.label for n in unknown] and how == history.AS_GIVEN
    late = history.trend(nights(set(), {4: 11}), tonight())  # night-4 started after tonight (June 10)
    assert late.nights[-2:] == ("night-4", "tonight") and late.notes == (
        "--history night-4 started after tonight's results",
    )


def test_run_times_compare_across_zones_and_ties_keep_the_order_given():
    n = nights(set())  # newest first: night-4, night-3, night-2, night-1
    # night-4 at 01:00 in UTC+02:00 is June 3, 23:00 UTC: before night-3 (June 4, 00:30 UTC), not after it
    n[0] = edited(n[0], lambda r: replace(r, started="2025-06-04T01:00:00+02:00"))
    n[1] = edited(n[1], lambda r: replace(r, started="2025-06-04T00:30:00"))  # no zone: UTC
    n[2] = edited(n[2], lambda r: replace(r, started="2025-06-01T02:00:00Z"))
    n[3] = edited(n[3], lambda r: replace(r, started="2025-06-01T02:00:00+00:00"))  # the same time as night-2
    ordered, how = history.order(n)
    assert [x.label for x in ordered] == ["night-2", "night-1", "night-4", "night-3"] and how == history.BY_TIME


def test_an_error_tonight_has_its_onset_and_required_cells_come_first():
    """An errored cell fails as a failed one does; a required cell's onset is listed before an informational one's,
    whichever began first."""
    n = nights({4})  # NEWFAIL (required) fails on night-4 and tonight
    n[2] = edited(n[2], lambda r: result(r.cell, "failed") if r.cell == INFO_FAIL else r)  # night-2 ..
    n[1] = edited(n[1], lambda r: result(r.cell, "error") if r.cell == INFO_FAIL else r)  # .. night-3 ..
    n[0] = edited(n[0], lambda r: result(r.cell, "failed") if r.cell == INFO_FAIL else r)  # .. night-4
    now = edited(tonight(), lambda r: result(r.cell, "error") if r.cell == NEWFAIL else r)
    h = history.trend(n, now)
    assert onset_of(h, NEWFAIL.id) == ("night-4", 2, "passed")
    assert onset_of(h, INFO_FAIL.id) == ("night-2", 4, "passed")
    assert [o.key for o in h.onsets] == [NEWFAIL.id, INFO_FAIL.id]


def test_counts_and_stock_drift_per_target_and_night():
    n = nights({3, 4})  # newest first: n[2] is night-2, where the passing gfx942 cells show no stock drift
    quiet = comparisons(equal=True, stock_differ=0)
    n[2] = edited(
        n[2], lambda r: replace(r, comparisons=quiet) if r.cell.target == "gfx942" and r.status == "passed" else r
    )
    n[3] = edited(n[3], lambda r: result(r.cell, "error") if r.cell == INFO_FAIL else r)  # night-1: an error
    h = history.trend(n, tonight())
    assert [(c.passed, c.failed) for c in h.by_target["gfx90a"]] == [(1, 1), (2, 0), (2, 0), (2, 0), (1, 1)]
    gfx942 = h.by_target["gfx942"]
    assert [(c.cells, c.passed, c.failed) for c in gfx942] == [(5, 4, 1), (5, 4, 1), (5, 3, 2), (5, 3, 2), (5, 4, 1)]
    # 5 cells x 2 stock comparisons, one differing each; on night-2 only FIXED's (failed) differs
    assert [c.stock for c in gfx942] == [0.5, 0.1, 0.5, 0.5, 0.5]
    assert all(c.cells == 1 and c.passed == c.failed == 0 and c.stock is None for c in h.by_target["sm90"])  # skipped


# ---- the command ---------------------------------------------------------------------------------------------
@pytest.fixture
def night_dirs(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Tonight's results dir, and four nights' dirs given out of order (night-3, night-1, night-4, night-2)."""
    cur = write_set(tmp_path / "nightly", at(current_set(), 10))
    earlier = [write_set(tmp_path / f"night-{n}", at(night_results(n, {3, 4}), n)) for n in (3, 1, 4, 2)]
    return cur, earlier


def test_history_tables_and_plot(night_dirs, tmp_path, capsys):
    cur, earlier = night_dirs
    out = tmp_path / "out"
    assert command.main([str(cur), "--history", *map(str, earlier), "--out", str(out)]) == 0
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    table = section(md, "History")
    assert "| target | night-1 | night-2 | night-3 | night-4 | tonight | failing since |" in table
    assert "| gfx942 | 4/1 | 4/1 | 3/2 | 3/2 | 4/1 | night-3 |" in table and "ordered by run time" in table
    since = section(md, "Failing since")
    assert f"| `{NEWFAIL.id}` | required | gfx942 | failed | night-3 | 3 | passed |" in since

    # the plot: inline in the page (report.html is self-contained), a PNG, under its title
    src = dict(re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]*)"', page))
    assert base64.b64decode(src[HISTORY]).startswith(b"\x89PNG\r\n\x1a\n")
    assert page.count("data:image/png;base64,") == 4 and "<h2>History</h2>" in page


def test_no_history_no_history_section(night_dirs, tmp_path):
    cur, _ = night_dirs
    assert command.main([str(cur), "--out", str(tmp_path / "out")]) == 0
    md, page = (tmp_path / "out" / "report.md").read_text(), (tmp_path / "out" / "report.html").read_text()
    assert "## History" not in md and HISTORY not in page and page.count("data:image/png;base64,") == 3


@pytest.mark.parametrize("case", ["not-results", "missing", "twice", "tonight", "tonight-spelled-otherwise"])
def test_bad_history_exits_3(night_dirs, tmp_path, capsys, case):
    cur, earlier = night_dirs
    plain = tmp_path / "plain"
    plain.mkdir()
    history_dirs, named, why = {
        "not-results": ([earlier[0], plain], plain, "not a results directory"),
        "missing": ([tmp_path / "nope"], tmp_path / "nope", "not a results directory"),
        "twice": ([earlier[0], earlier[1], earlier[0]], earlier[0], "given twice"),
        "tonight": ([earlier[0], cur], cur, "RESULTS"),
        "tonight-spelled-otherwise": ([cur / "cells" / ".."], cur / "cells" / "..", "RESULTS"),
    }[case]
    with pytest.raises(ConfigError, match=why):
        report.load_nights(history_dirs, [cur])
    out = tmp_path / "out"
    assert command.main([str(cur), "--history", *map(str, history_dirs), "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert str(named) in err and why in err
    assert not out.exists()


def test_a_night_may_be_a_dir_of_runner_dirs(tmp_path):
    """The nightly workflow's merged artifact holds one results dir per runner kind (results-<label>/): such
    a dir is one night of all of them, so its cells count as one night's."""
    cur = write_set(tmp_path / "nightly", at(current_set(), 10))
    night = tmp_path / "night-1"
    rs = at(night_results(1, {1}), 1)
    gfx = [r for r in rs if r.cell.target == "gfx942"]
    write_set(night / "results-gfx942", gfx)
    write_set(night / "results-rest", [r for r in rs if r.cell.target != "gfx942"])
    (n,) = report.load_nights([night], [cur])
    assert len(n.entries) == len(rs) and {e.status for e in n.entries if e.key == NEWFAIL.id} == {"failed"}
    (whole,) = report.load_nights([write_set(tmp_path / "whole", rs)], [cur])
    assert sorted(e.key for e in n.entries) == sorted(e.key for e in whole.entries)
