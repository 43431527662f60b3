"""What the report shows: every table as a Section of plain-text rows, built from a Report.

The one place that decides which tables exist, their columns and their rows; markdown.py and html.py only
format them. Where the two pages differ in detail (the compact Markdown summary, the HTML page that lists
everything), the builder takes `full` and the renderer says which one it wants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlparity import gate
from rlparity.report.model import Entry, Failure, History, NightCount, Onset, Report, is_number
from rlparity.report.rules import canon
from rlparity.results import MISMATCH_METRICS, STATUSES

NO_BASELINE = "no baseline given"
VERDICT = {gate.OK: "PASS", gate.MISMATCH: "MISMATCH", gate.ERROR: "ERROR", gate.ENVIRONMENT: "TOO FEW RAN"}
COMPARISONS = ("New failures", "Fixed", "Digest drift", "Environment changes", "Performance deltas")
CELL = frozenset({"cell"})


@dataclass(frozen=True)
class Section:
    """A table as plain text, for both renderers. An empty `title` continues the section above."""

    title: str
    header: list[str]
    rows: list[list[str]]
    empty: str = "none"  # said instead of an empty table
    note: str = ""  # a line of explanation under the title
    code: frozenset[str] = frozenset()  # columns shown as code (ids, fingerprint values)


# ---- cell text ------------------------------------------------------------------------------------------
def short(v: Any, n: int = 100) -> str:
    """One line of at most n characters; None is a dash, other non-strings canonical JSON."""
    s = "—" if v is None else v if isinstance(v, str) else canon(v)
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def secs(x: float) -> str:
    return f"{x:.2f}"


def pct(x: float) -> str:
    return f"{x:+.0f} %"


def req(required: bool) -> str:
    return "required" if required else "info"


def status_line(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts[s]} {s}" for s in STATUSES)


def summary_lines(rep: Report) -> list[str]:
    """The report in a few lines: the console output of `rlparity report` and the HTML page's top."""
    t = rep.totals
    lines = [f"{status_line(t.counts)}; gate over the merged results: {VERDICT.get(t.verdict, t.verdict)}"]
    if rep.has_baseline:
        assert rep.new_failures is not None and rep.fixed is not None and rep.drift is not None
        assert rep.env_changes is not None and rep.perf is not None and rep.gone is not None
        lines.append(
            f"vs baseline: {len(rep.new_failures)} new failure(s), {len(rep.fixed)} fixed, {len(rep.drift)} digest "
            f"drift, {len(rep.env_changes)} environment change(s), {len(rep.perf)} performance delta(s), "
            f"{len(rep.gone)} cell(s) that ran in the baseline gone"
        )
        lines.append(f"regressions: {len(rep.regressions)}" if rep.regressions else "regressions: none")
    else:
        lines.append(f"vs baseline: {NO_BASELINE}")
    return lines


# ---- the tables -----------------------------------------------------------------------------------------
def totals(rep: Report) -> list[Section]:
    """Cells per status: required / informational / all, then per target with its stock drift."""
    t = rep.totals
    by_kind = [
        [name, *(str(c[s]) for s in STATUSES), str(sum(c.values()))]
        for name, c in (("required", t.required), ("informational", t.informational), ("all", t.counts))
    ]
    stock = {s.target: s for s in rep.stock}
    by_target = [
        [tgt, *(str(c[s]) for s in STATUSES), f"{stock[tgt].differ}/{stock[tgt].total}" if tgt in stock else "-"]
        for tgt, c in t.by_target.items()
    ]
    return [
        Section("", ["", *STATUSES, "total"], by_kind),
        Section("", ["target", *STATUSES, "stock drift"], by_target),
    ]


def failures(rep: Report, full: bool) -> Section:
    """Every failing cell; `full` adds the first mismatch and keeps reasons and counts whole."""
    header = ["cell", "", "status", "new", "mismatches", "max ulp", *(["first mismatch"] if full else []), "reason"]
    rows = [_failure_row(f, full) for f in rep.failures]
    return Section("Failures", header, rows, "No cell failed or errored", code=CELL)


def _failure_row(f: Failure, full: bool) -> list[str]:
    counted = full or f.status == "failed"  # an errored cell compared nothing: dashes in the compact table
    new = {True: "yes", False: "no", None: "-"}[f.new]
    row = [f.key, req(f.required), f.status, new, *((str(f.mismatches), str(f.max_ulp)) if counted else ("-", "-"))]
    return [*row, f.first_mismatch, f.reason] if full else [*row, short(f.reason, 160)]


def comparisons(rep: Report, full: bool) -> list[Section]:
    """The five baseline comparisons; without a baseline each says so. `full` lists every cell of an
    environment change (the compact table names three)."""
    if not rep.has_baseline:
        return [Section(t, [], [], NO_BASELINE) for t in COMPARISONS]
    assert rep.new_failures is not None and rep.fixed is not None and rep.drift is not None
    assert rep.env_changes is not None and rep.perf is not None
    return [
        Section(
            "New failures",
            ["cell", "", "baseline", "now", "reason"],
            [[c.key, req(c.required), c.before, c.after, short(c.reason, 160)] for c in rep.new_failures],
            code=CELL,
        ),
        Section(
            "Fixed",
            ["cell", "", "baseline", "now", "baseline reason"],
            [[c.key, req(c.required), c.before, c.after, short(c.reason, 160)] for c in rep.fixed],
            code=CELL,
        ),
        Section(
            "Digest drift",
            ["cell", "", "outputs whose digest changed", "baseline", "now"],
            [[d.key, req(d.required), ", ".join(d.outputs), d.before, d.after] for d in rep.drift],
            note="Same cell in both, a different digest for an output present in both.",
            code=CELL,
        ),
        _environment(rep, full),
        _performance(rep),
    ]


def _environment(rep: Report, full: bool) -> Section:
    assert rep.env_changes is not None
    last = "which" if full else "e.g."
    rows = [
        [c.field, short(c.before), short(c.after), str(len(c.cells)), ", ".join(c.cells if full else c.cells[:3])]
        for c in rep.env_changes
    ]
    return Section(
        "Environment changes",
        ["field", "baseline", "now", "cells", last],
        rows,
        "none (hostname and pid ignored)",
        "fingerprint differences per cell, baseline -> now (— : absent or null); the same change across cells "
        "is one row.",
        frozenset({"field", "baseline", "now"}),
    )


def _performance(rep: Report) -> Section:
    assert rep.perf is not None
    slower = sum(d.after > d.before for d in rep.perf)
    title = f"Performance deltas ({slower} slower, {len(rep.perf) - slower} faster)" if rep.perf else COMPARISONS[4]
    return Section(
        title,
        ["cell", "timing", "baseline s", "now s", "change"],
        [[d.key, d.timing, secs(d.before), secs(d.after), pct(d.change_pct)] for d in rep.perf],
        f"none beyond ±{rep.threshold_pct:g} %",
        f"Wall time and per-test timings of cells that ran in both, beyond ±{rep.threshold_pct:g} %; "
        f"timings under {rep.min_seconds:g} s in both runs are ignored.",
        CELL,
    )


def cells(title: str, entries: Sequence[Entry]) -> Section:
    """One row per cell: status, stock drift, wall time."""
    return Section(title, ["cell", "", "status", "stock drift", "wall s"], [_cell_row(e) for e in entries], code=CELL)


def _cell_row(e: Entry) -> list[str]:
    differ, total = e.result.stock_differ
    wall = (e.result.timings or {}).get("wall_s")
    return [
        e.key,
        req(e.required),
        e.status,
        f"{differ}/{total}" if total else "-",
        secs(wall) if is_number(wall) else "-",
    ]


def mismatch(rep: Report) -> Section:
    """Every cell that recorded a rollout/training mismatch (not bitwise: the stock controls, users' engines)."""
    rows = [
        [e.result.cell.id, e.result.cell.workload, *(f"{e.result.mismatch.get(k, float('nan')):.3g}"
                                                    for k in MISMATCH_METRICS)]
        for e in rep.entries
        if e.result.mismatch
    ]  # fmt: skip
    return Section(
        "Rollout/training mismatch (informational)",
        ["cell", "workload", "tokens", "mean |dlogp|", "max |dlogp|", "k3 KL", "clipped share"],
        rows,
        "No cell recorded a mismatch",
        "What a mismatch does to PPO/GRPO where a path is not bitwise (the stock controls, users' engines): mean "
        "and max |dlogp| of the sampled tokens, k3 KL, the share of ratios outside the clip range.",
        CELL,
    )


def history(rep: Report) -> list[Section]:
    """With --history: cells passed/failed per target and night, and when each failing cell began failing."""
    h = rep.history
    if h is None:
        return []
    first: dict[str, Onset] = {}
    for o in h.onsets:  # each target's oldest onset
        if o.target not in first or o.since < first[o.target].since:
            first[o.target] = o
    rows = [
        [tgt, *(_night(c) for c in counts), _since(h, first[tgt]) if tgt in first else "-"]
        for tgt, counts in h.by_target.items()
    ]
    note = (
        f"Cells passed/failed (failed includes error) per target and night, oldest first, ordered {h.ordered_by}, "
        "with the largest rollout/training k3 KL a cell recorded (the stock controls, users' engines); "
        "failing since: the oldest onset among the target's cells failing tonight."
    )
    return [
        Section("History", ["target", *h.nights, "failing since"], rows, note=" ".join([note, *h.notes])),
        Section(
            "Failing since",
            ["cell", "", "target", "now", "failing since", "nights", "before"],
            [_onset_row(h, o) for o in h.onsets],
            "No cell failed or errored tonight",
            "Each cell failing tonight: the first night of its unbroken run of failures ending tonight (a night "
            "it passed, was skipped or is absent ends the run), the run's length and the status before it.",
            CELL,
        ),
    ]


def _night(c: NightCount) -> str:
    if not c.cells:
        return "-"
    return f"{c.passed}/{c.failed}" + (f" k3 {c.k3:.2g}" if c.k3 is not None else "")


def _since(h: History, o: Onset) -> str:
    """The onset's night; "or earlier" when the run reaches back to the oldest night given."""
    return h.nights[o.since] + ("" if o.before else " or earlier")


def _onset_row(h: History, o: Onset) -> list[str]:
    nights = len(h.nights) - o.since
    return [o.key, req(o.required), o.target, o.status, _since(h, o), str(nights), o.before or "-"]
