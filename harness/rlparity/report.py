"""`rlparity report RESULTS... [--baseline DIR]`: the nightly regression report, report.md + report.html.

    rlparity report RESULTS... [--baseline DIR]... [--out DIR] [--fail-on-regression]
                    [--perf-threshold PCT] [--perf-min-seconds S]

Three layers, so every rule below is a pure function that tests can call on lists of CellResult:

- reading (edges): `load` reads each results dir with results.read_all; a path that is not a results dir
  (missing, no cells/ inside, no result.json under cells/) or holds an unreadable result.json is a
  ConfigError naming the path (exit 3), as are a dir given twice, a bad --perf-threshold or
  --perf-min-seconds and an --out that cannot be written.
- logic (pure): `merge` joins several runners' dirs into one list of Entry; `build` turns the current and
  the baseline entries into a Report (totals, failures, new failures, fixed, digest drift, environment
  changes, performance deltas, stock-PyTorch drift, regressions).
- rendering: `render_markdown` (compact, for a GitHub job summary, < 1 MiB), `make_plots` (matplotlib,
  Agg canvas, PNG bytes) and `render_html` (one self-contained file: CSS inline, plots as base64 data URIs).
  Markdown tables stop at 40 rows ("... and N more (see report.html)"); passing cells are counted per
  target and listed only when at most 40 cells ran. The HTML lists every cell.

Merging several RESULTS dirs (one per runner). Each dir is labelled by its base name (by the path as given
when two base names collide). A cell id found in one dir keeps its plain id. A cell id found in several
dirs: the copies that were skipped are dropped when at least one copy ran (every runner of a full matrix
skips the targets it lacks); if one copy is left it keeps its plain id, if several ran each is kept as
"<cell id> @ <dir label>". Several --baseline dirs are merged the same way. A current cell is compared with
the baseline entry of the same cell id when there is one; when the baseline holds several, with the one of
the same dir label (none matches: the cell counts as new).

Comparison rules (all need --baseline; without one each comparison section says "no baseline given"):

- cells gone: ran (not skipped) in the baseline, absent now; listed, never a regression.
- failing means status failed or error. New failure: failing now, and passed, skipped or absent in the
  baseline. Fixed: failing in the baseline, passed now. Cells failing in both are listed under Failures.
- digest drift: the cell is in both, and an output name present in both `digests` has a different digest
  (names present on one side only are not drift).
- environment changes: fingerprint.diff (hostname and pid ignored) between the baseline's and the current
  fingerprint of each cell that has both; the same (field, old, new) across many cells is one row with a
  count. Skipped cells carry no fingerprint and are not compared.
- performance deltas: cells that ran in both (passed or failed both times); wall_s and each test of
  timings["tests"] present in both. Reported when |new - old| / old exceeds --perf-threshold (default 25 %),
  slower or faster, and the larger of the two times is at least --perf-min-seconds (default 0.5 s): below
  that, scheduling noise dominates.

Exit code: 0, or 3 for bad input. With --fail-on-regression it is 1 when there is a regression, which is
exactly: a required cell (current matrix's `required`) that is a new failure, or a required cell with digest
drift. Informational cells, fixed cells, environment changes, performance deltas and cells gone from the
results are reported but never fail it; without --baseline there is nothing to regress against (exit 0).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlparity import fingerprint, gate, results
from rlparity.config import ConfigError
from rlparity.results import STATUSES, CellResult

DEFAULT_OUT = "report"
DEFAULT_THRESHOLD = 25.0  # percent, slower or faster
MIN_SECONDS = 0.5  # timings where both runs are shorter than this are not compared
MD_ROWS = 40  # rows per Markdown table before "... and N more (report.html)"
HTML_ROWS = 5000
MD_LIMIT = 1024 * 1024 - 16 * 1024  # GitHub's job summary takes at most 1 MiB
FAILING = ("failed", "error")
RAN = ("passed", "failed")  # ran to the end: digests and timings mean something
NO_BASELINE = "no baseline given"
MD_NAME, HTML_NAME = "report.md", "report.html"
COLOURS = {"passed": "#2da44e", "failed": "#cf222e", "error": "#8250df", "skipped": "#afb8c1"}
SEVERITY = {"skipped": 1, "passed": 2, "error": 3, "failed": 4}  # the heatmap shows a square's worst


# ---- data -------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Entry:
    """One cell result and the results dir it came from. `key` is the cell id, or "<id> @ <label>"."""

    key: str
    source: str
    result: CellResult

    @property
    def id(self) -> str:
        return self.result.cell.id

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def required(self) -> bool:
        return self.result.cell.required


@dataclass(frozen=True)
class Totals:
    counts: dict[str, int]  # status -> cells
    required: dict[str, int]
    informational: dict[str, int]
    by_target: dict[str, dict[str, int]]
    verdict: int  # gate.decide over the merged results
    reasons: tuple[str, ...]
    skipped_reasons: list[tuple[str, int]]


@dataclass(frozen=True)
class Failure:
    key: str
    required: bool
    status: str
    reason: str
    mismatches: int
    max_ulp: int
    first_mismatch: str
    new: bool | None  # None: no baseline


@dataclass(frozen=True)
class StatusChange:
    key: str
    required: bool
    before: str  # baseline status, or "absent"
    after: str
    reason: str


@dataclass(frozen=True)
class Drift:
    key: str
    required: bool
    outputs: tuple[str, ...]  # digest names that changed
    before: str
    after: str


@dataclass(frozen=True)
class EnvChange:
    field: str
    before: Any
    after: Any
    cells: tuple[str, ...]


@dataclass(frozen=True)
class PerfDelta:
    key: str
    timing: str  # "wall" or a test name
    before: float
    after: float

    @property
    def change_pct(self) -> float:
        return (self.after - self.before) / self.before * 100.0


@dataclass(frozen=True)
class StockDrift:
    target: str
    cells: int
    differ: int
    total: int

    @property
    def fraction(self) -> float:
        return self.differ / self.total if self.total else 0.0


@dataclass
class Report:
    sources: list[tuple[str, int]]  # (label, cells read)
    baseline_sources: list[tuple[str, int]] | None
    entries: list[Entry]
    baseline: list[Entry] | None
    totals: Totals
    failures: list[Failure]
    stock: list[StockDrift]
    new_failures: list[StatusChange] | None = None  # None everywhere: no baseline
    fixed: list[StatusChange] | None = None
    drift: list[Drift] | None = None
    env_changes: list[EnvChange] | None = None
    perf: list[PerfDelta] | None = None
    gone: list[str] | None = None  # cells that ran in the baseline and are absent now
    regressions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    threshold_pct: float = DEFAULT_THRESHOLD
    min_seconds: float = MIN_SECONDS

    @property
    def has_baseline(self) -> bool:
        return self.baseline is not None


# ---- reading (side effects) ---------------------------------------------------------------------------
def labels(dirs: Sequence[Path]) -> list[str]:
    """Base names; the paths as given when two base names collide."""
    names = [d.resolve().name or str(d) for d in dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in dirs]


def read_dir(d: Path) -> list[CellResult]:
    if not d.is_dir():
        raise ConfigError("not a results directory (does not exist or is not a directory)", d)
    if not (d / "cells").is_dir():
        raise ConfigError("not a results directory (no cells/ inside)", d)
    try:
        found = results.read_all(d)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if not found:
        raise ConfigError(f"not a results directory (no cells/*/{results.RESULT_FILE} inside)", d)
    return found


def load(dirs: Sequence[Path]) -> tuple[list[Entry], list[tuple[str, int]], list[str]]:
    """Read and merge results dirs: (entries, [(label, cells read)], notes)."""
    resolved = [d.resolve() for d in dirs]
    for i, r in enumerate(resolved):
        if r in resolved[:i]:
            raise ConfigError("results directory given twice", dirs[i])
    sets = [(label, read_dir(d)) for label, d in zip(labels(dirs), dirs, strict=True)]
    entries, notes = merge(sets)
    return entries, [(label, len(rs)) for label, rs in sets], notes


# ---- logic (pure) -------------------------------------------------------------------------------------
def merge(sets: Sequence[tuple[str, Sequence[CellResult]]]) -> tuple[list[Entry], list[str]]:
    """Several runners' results as one list (rules in the module docstring), and notes on what was dropped."""
    by_id: dict[str, list[tuple[str, CellResult]]] = defaultdict(list)
    for label, rs in sets:
        for r in rs:
            by_id[r.cell.id].append((label, r))
    entries, dropped, duplicated = [], 0, []
    for cid in sorted(by_id):
        copies = by_id[cid]
        if len(copies) > 1:
            ran = [c for c in copies if c[1].status != "skipped"]
            keep = ran or copies[:1]
            dropped += len(copies) - len(keep)
            copies = keep
        if len(copies) == 1:
            entries.append(Entry(cid, copies[0][0], copies[0][1]))
        else:
            duplicated.append(cid)
            entries += [Entry(f"{cid} @ {label}", label, r) for label, r in copies]
    notes = []
    if dropped:
        notes.append(f"{dropped} skipped duplicate(s) dropped: the same cell ran in another results dir")
    if duplicated:
        notes.append(f"{len(duplicated)} cell id(s) ran in several results dirs; each copy is listed as 'id @ dir'")
    return entries, notes


def match(current: Sequence[Entry], baseline: Sequence[Entry]) -> list[tuple[Entry, Entry | None]]:
    """Each current entry with its baseline entry (same cell id; same dir label when the baseline has several)."""
    by_id: dict[str, list[Entry]] = defaultdict(list)
    for b in baseline:
        by_id[b.id].append(b)
    pairs = []
    for e in current:
        cands = by_id.get(e.id, [])
        if len(cands) > 1:
            cands = [b for b in cands if b.source == e.source]
        pairs.append((e, cands[0] if len(cands) == 1 else None))
    return pairs


def _count(entries: Iterable[Entry]) -> dict[str, int]:
    c = Counter(e.status for e in entries)
    return {s: c[s] for s in STATUSES}


def totals(entries: Sequence[Entry]) -> Totals:
    by_target: dict[str, dict[str, int]] = {}
    for target in sorted({e.result.cell.target for e in entries}):
        by_target[target] = _count(e for e in entries if e.result.cell.target == target)
    verdict = gate.decide([e.result for e in entries])
    skipped = Counter(e.result.reason or "(no reason)" for e in entries if e.status == "skipped")
    return Totals(
        counts=_count(entries),
        required=_count(e for e in entries if e.required),
        informational=_count(e for e in entries if not e.required),
        by_target=by_target,
        verdict=verdict.code,
        reasons=verdict.reasons,
        skipped_reasons=skipped.most_common(),
    )


def failures(entries: Sequence[Entry], new_keys: set[str] | None) -> list[Failure]:
    """Every failing cell now, required first; `new` says whether it is a new failure (None: no baseline)."""
    out = []
    for e in entries:
        if e.status not in FAILING:
            continue
        r = e.result
        first = r.first_mismatch
        out.append(
            Failure(
                e.key,
                e.required,
                e.status,
                r.reason,
                r.mismatches,
                r.max_ulp,
                f"{first['comparison']} [{first['index']}]" if first else "",
                None if new_keys is None else e.key in new_keys,
            )
        )
    return sorted(out, key=lambda f: (not f.required, f.status != "failed", f.key))


def new_failures(pairs: Sequence[tuple[Entry, Entry | None]]) -> list[StatusChange]:
    return [
        StatusChange(e.key, e.required, b.status if b else "absent", e.status, e.result.reason)
        for e, b in pairs
        if e.status in FAILING and (b is None or b.status not in FAILING)
    ]


def fixed(pairs: Sequence[tuple[Entry, Entry | None]]) -> list[StatusChange]:
    return [
        StatusChange(e.key, e.required, b.status, e.status, b.result.reason)
        for e, b in pairs
        if b is not None and b.status in FAILING and e.status == "passed"
    ]


def digest_drift(pairs: Sequence[tuple[Entry, Entry | None]]) -> list[Drift]:
    out = []
    for e, b in pairs:
        if b is None:
            continue
        now, then = e.result.digests, b.result.digests
        changed = tuple(sorted(n for n in set(now) & set(then) if now[n] != then[n]))
        if changed:
            out.append(Drift(e.key, e.required, changed, b.status, e.status))
    return out


def env_changes(pairs: Sequence[tuple[Entry, Entry | None]]) -> list[EnvChange]:
    """fingerprint.diff per cell, grouped: one row per (field, old, new), most cells first."""
    groups: dict[tuple[str, str, str], tuple[Any, Any, list[str]]] = {}
    for e, b in pairs:
        if b is None or not e.result.fingerprint or not b.result.fingerprint:
            continue
        for name, old, new in fingerprint.diff(b.result.fingerprint, e.result.fingerprint):
            k = (name, _canon(old), _canon(new))
            groups.setdefault(k, (old, new, []))[2].append(e.key)
    rows = [EnvChange(k[0], old, new, tuple(cells)) for k, (old, new, cells) in groups.items()]
    return sorted(rows, key=lambda r: (-len(r.cells), r.field))


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def perf_deltas(
    pairs: Sequence[tuple[Entry, Entry | None]],
    threshold_pct: float = DEFAULT_THRESHOLD,
    min_seconds: float = MIN_SECONDS,
) -> list[PerfDelta]:
    """Timings (wall_s, each test) that moved by more than threshold_pct: cells' wall time first, then tests,
    each by the largest relative change."""
    out = []
    for e, b in pairs:
        if b is None or e.status not in RAN or b.status not in RAN:
            continue
        now, then = e.result.timings or {}, b.result.timings or {}
        items = [("wall", then.get("wall_s"), now.get("wall_s"))]
        tests_now, tests_then = now.get("tests") or {}, then.get("tests") or {}
        items += [(t, tests_then[t], tests_now[t]) for t in sorted(set(tests_now) & set(tests_then))]
        for name, old, new in items:
            if not _number(old) or not _number(new) or old <= 0 or max(old, new) < min_seconds:
                continue
            if abs(new - old) / old * 100.0 > threshold_pct:
                out.append(PerfDelta(e.key, name, float(old), float(new)))
    return sorted(out, key=lambda d: (d.timing != "wall", -abs(d.change_pct), d.key, d.timing))


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def stock_drift(entries: Sequence[Entry]) -> list[StockDrift]:
    """Per target: informational (stock PyTorch) comparisons that differ, over the cells that ran."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for e in entries:
        differ, total = e.result.stock_differ
        if e.status in RAN and total:
            a = acc[e.result.cell.target]
            a[0], a[1], a[2] = a[0] + 1, a[1] + differ, a[2] + total
    return [StockDrift(t, *acc[t]) for t in sorted(acc)]


def build(
    entries: Sequence[Entry],
    baseline: Sequence[Entry] | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD,
    min_seconds: float = MIN_SECONDS,
    sources: list[tuple[str, int]] | None = None,
    baseline_sources: list[tuple[str, int]] | None = None,
    notes: Sequence[str] = (),
) -> Report:
    entries = sorted(entries, key=lambda e: e.key)
    rep = Report(
        sources=sources or [],
        baseline_sources=baseline_sources if baseline is not None else None,
        entries=entries,
        baseline=list(baseline) if baseline is not None else None,
        totals=totals(entries),
        failures=[],
        stock=stock_drift(entries),
        notes=list(notes),
        threshold_pct=threshold_pct,
        min_seconds=min_seconds,
    )
    if baseline is None:
        rep.failures = failures(entries, None)
        return rep
    pairs = match(entries, baseline)
    rep.new_failures = new_failures(pairs)
    rep.failures = failures(entries, {c.key for c in rep.new_failures})
    rep.fixed = fixed(pairs)
    rep.drift = digest_drift(pairs)
    rep.env_changes = env_changes(pairs)
    rep.perf = perf_deltas(pairs, threshold_pct, min_seconds)
    matched = {id(b) for _, b in pairs if b is not None}
    rep.gone = sorted(b.key for b in baseline if id(b) not in matched and b.status != "skipped")
    rep.regressions = regressions(rep.new_failures, rep.drift)
    return rep


def regressions(new: Sequence[StatusChange], drift: Sequence[Drift]) -> list[str]:
    """What --fail-on-regression fails on: required new failures and required digest drift."""
    out = [f"new failure: {c.key} ({c.before} -> {c.after})" for c in new if c.required]
    out += [f"digest drift: {d.key} ({', '.join(d.outputs)})" for d in drift if d.required]
    return out


# ---- rendering: shared bits ---------------------------------------------------------------------------
VERDICT = {gate.OK: "PASS", gate.MISMATCH: "MISMATCH", gate.ERROR: "ERROR"}


def _short(v: Any, n: int = 100) -> str:
    s = "—" if v is None else v if isinstance(v, str) else _canon(v)
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _secs(x: float) -> str:
    return f"{x:.2f}"


def _pct(x: float) -> str:
    return f"{x:+.0f} %"


def _req(required: bool) -> str:
    return "required" if required else "info"


def _status_line(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts[s]} {s}" for s in STATUSES)


@dataclass(frozen=True)
class Section:
    """A comparison section as plain-text rows, for both renderers."""

    title: str
    header: list[str]
    rows: list[list[str]]
    empty: str  # said instead of an empty table
    code: frozenset[str] = frozenset()  # columns shown as code (ids, fingerprint values)


_COMPARISONS = ("New failures", "Fixed", "Digest drift", "Environment changes", "Performance deltas")


def _sections(rep: Report) -> list[Section]:
    if not rep.has_baseline:
        return [Section(t, [], [], NO_BASELINE) for t in _COMPARISONS]
    assert rep.new_failures is not None and rep.fixed is not None and rep.drift is not None
    assert rep.env_changes is not None and rep.perf is not None
    cell = frozenset({"cell"})
    slower = sum(d.after > d.before for d in rep.perf)
    perf_title = (
        f"Performance deltas ({slower} slower, {len(rep.perf) - slower} faster)" if rep.perf else _COMPARISONS[4]
    )
    return [
        Section(
            "New failures",
            ["cell", "", "baseline", "now", "reason"],
            [[c.key, _req(c.required), c.before, c.after, _short(c.reason, 160)] for c in rep.new_failures],
            "none",
            cell,
        ),
        Section(
            "Fixed",
            ["cell", "", "baseline", "now", "baseline reason"],
            [[c.key, _req(c.required), c.before, c.after, _short(c.reason, 160)] for c in rep.fixed],
            "none",
            cell,
        ),
        Section(
            "Digest drift",
            ["cell", "", "outputs whose digest changed", "baseline", "now"],
            [[d.key, _req(d.required), ", ".join(d.outputs), d.before, d.after] for d in rep.drift],
            "none",
            cell,
        ),
        Section(
            "Environment changes",
            ["field", "baseline", "now", "cells", "e.g."],
            [
                [c.field, _short(c.before), _short(c.after), str(len(c.cells)), ", ".join(c.cells[:3])]
                for c in rep.env_changes
            ],
            "none (hostname and pid ignored)",
            frozenset({"field", "baseline", "now"}),
        ),
        Section(
            perf_title,
            ["cell", "timing", "baseline s", "now s", "change"],
            [[d.key, d.timing, _secs(d.before), _secs(d.after), _pct(d.change_pct)] for d in rep.perf],
            f"none beyond ±{rep.threshold_pct:g} %",
            cell,
        ),
    ]


def _section_note(rep: Report, title: str) -> str:
    if title.startswith("Performance"):
        return (
            f"Wall time and per-test timings of cells that ran in both, beyond ±{rep.threshold_pct:g} %; "
            f"timings under {rep.min_seconds:g} s in both runs are ignored."
        )
    if title == "Environment changes":
        return (
            "fingerprint differences per cell, baseline -> now (— : absent or null); the same change across cells "
            "is one row."
        )
    if title == "Digest drift":
        return "Same cell in both, a different digest for an output present in both."
    return ""


def _summary_lines(rep: Report) -> list[str]:
    t = rep.totals
    lines = [f"{_status_line(t.counts)}; gate over the merged results: {VERDICT.get(t.verdict, t.verdict)}"]
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


# ---- Markdown -----------------------------------------------------------------------------------------
def _md_cell(s: str, code: bool = False) -> str:
    s = " ".join(str(s).split())
    if code and s:
        return "`" + s.replace("`", "'").replace("|", "\\|") + "`"
    return html.escape(s, quote=False).replace("|", "\\|")


def _md_table(header: list[str], rows: list[list[str]], limit: int = MD_ROWS, code: set[str] = frozenset()) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows[:limit]:
        lines.append("| " + " | ".join(_md_cell(v, h in code) for h, v in zip(header, row, strict=True)) + " |")
    if len(rows) > limit:
        lines.append(f"\n… and {len(rows) - limit} more (see {HTML_NAME})")
    return "\n".join(lines)


def render_markdown(rep: Report) -> str:
    t = rep.totals
    src = ", ".join(f"`{label}` ({n} cells)" for label, n in rep.sources) or "(none)"
    base = (
        ", ".join(f"`{label}` ({n} cells)" for label, n in rep.baseline_sources or []) or "given"
        if rep.has_baseline
        else NO_BASELINE
    )
    verdict = VERDICT.get(t.verdict, str(t.verdict))
    reg = (
        f"**{len(rep.regressions)} regression(s)**"
        if rep.regressions
        else ("no regressions" if rep.has_baseline else "regressions: " + NO_BASELINE)
    )
    out = [
        "# rlparity report",
        "",
        f"Results: {src}. Baseline: {base}.",
        "",
        f"**Gate: {verdict}** · {reg} · {_status_line(t.counts)}",
        "",
        "## Totals",
        "",
        _md_table(
            ["", *STATUSES, "total"],
            [
                [name, *(str(c[s]) for s in STATUSES), str(sum(c.values()))]
                for name, c in (("required", t.required), ("informational", t.informational), ("all", t.counts))
            ],
        ),
        "",
    ]
    stock = {s.target: s for s in rep.stock}
    out += [
        _md_table(
            ["target", *STATUSES, "stock drift"],
            [
                [
                    tgt,
                    *(str(c[s]) for s in STATUSES),
                    f"{stock[tgt].differ}/{stock[tgt].total}" if tgt in stock else "-",
                ]
                for tgt, c in t.by_target.items()
            ],
        ),
        "",
        "Stock drift: informational stock-PyTorch comparisons that differ / all of them, over the cells that ran.",
        "",
    ]
    if t.reasons:
        out += ["Gate reasons:", ""] + [f"- {_md_cell(_short(r, 300))}" for r in t.reasons[:10]]
        out += [f"- … and {len(t.reasons) - 10} more"] if len(t.reasons) > 10 else []
        out.append("")
    if rep.regressions:
        out += ["Regressions (`--fail-on-regression` fails on these):", ""]
        out += [f"- {_md_cell(r)}" for r in rep.regressions[:MD_ROWS]]
        out += [f"- … and {len(rep.regressions) - MD_ROWS} more"] if len(rep.regressions) > MD_ROWS else []
        out.append("")
    if t.skipped_reasons:
        out += ["<details><summary>Skipped cells by reason</summary>", ""]
        out += [f"- {n} × {_md_cell(_short(r, 200))}" for r, n in t.skipped_reasons[:20]]
        out += ["", "</details>", ""]
    for note in rep.notes:
        out += [f"Note: {_md_cell(note)}", ""]
    if rep.gone:
        out += [f"Cells that ran in the baseline but are not in these results ({len(rep.gone)}): "
                + ", ".join(f"`{g}`" for g in rep.gone[:20]) + (" …" if len(rep.gone) > 20 else ""), ""]  # fmt: skip

    out += ["## Failures", ""]
    if rep.failures:
        rows = [
            [
                f.key,
                _req(f.required),
                f.status,
                "-" if f.new is None else "yes" if f.new else "no",
                str(f.mismatches) if f.status == "failed" else "-",
                str(f.max_ulp) if f.status == "failed" else "-",
                _short(f.reason, 160),
            ]
            for f in rep.failures
        ]
        out += [_md_table(["cell", "", "status", "new", "mismatches", "max ulp", "reason"], rows, code={"cell"}), ""]
    else:
        out += ["No cell failed or errored.", ""]

    for sec in _sections(rep):
        out += [f"## {sec.title}", ""]
        note = _section_note(rep, sec.title) if rep.has_baseline else ""
        if note:
            out += [note, ""]
        out += [_md_table(sec.header, sec.rows, code=sec.code) if sec.rows else sec.empty + ".", ""]

    ran = [e for e in rep.entries if e.status != "skipped"]
    out += ["## Cells", ""]
    if ran and len(ran) <= MD_ROWS:
        out += ["<details><summary>Cells that ran</summary>", "", _cells_md(ran), "", "</details>", ""]
    out += [f"{len(ran)} cell(s) ran; every cell and the plots are in {HTML_NAME}.", ""]
    text = "\n".join(out)
    if len(text.encode()) > MD_LIMIT:
        cut = text.encode()[:MD_LIMIT].decode(errors="ignore")
        text = cut + f"\n\n… truncated at {MD_LIMIT} bytes (see {HTML_NAME})\n"
    return text


def _cells_md(entries: Sequence[Entry]) -> str:
    return _md_table(["cell", "", "status", "stock drift", "wall s"], [_cell_row(e) for e in entries], code={"cell"})


def _cell_row(e: Entry) -> list[str]:
    differ, total = e.result.stock_differ
    wall = (e.result.timings or {}).get("wall_s")
    return [
        e.key,
        _req(e.required),
        e.status,
        f"{differ}/{total}" if total else "-",
        _secs(wall) if _number(wall) else "-",
    ]


# ---- plots (matplotlib, Agg canvas: no display, no global pyplot state) -------------------------------
def make_plots(rep: Report) -> dict[str, bytes]:
    """PNG bytes by title; a plot with nothing to show is left out."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def png(fig: Figure) -> bytes:
        FigureCanvasAgg(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        return buf.getvalue()

    plots = {}
    if rep.entries:
        plots["Status by target and profile"] = png(_status_figure(Figure, rep.entries))
    if rep.stock:
        plots["Stock PyTorch drift per target (informational)"] = png(_stock_figure(Figure, rep.stock))
    timed = [e for e in rep.entries if e.status != "skipped" and _number((e.result.timings or {}).get("wall_s"))]
    if timed:
        plots["Wall time per cell"] = png(_timing_figure(Figure, timed, rep.baseline))
    return plots


def _status_figure(Figure, entries: Sequence[Entry]):
    from matplotlib.colors import ListedColormap

    targets = sorted({e.result.cell.target for e in entries})
    profiles = sorted({e.result.cell.profile for e in entries})
    worst = [[0] * len(profiles) for _ in targets]
    label = [[""] * len(profiles) for _ in targets]
    for i, tgt in enumerate(targets):
        for j, prof in enumerate(profiles):
            cs = Counter(e.status for e in entries if e.result.cell.target == tgt and e.result.cell.profile == prof)
            if cs:
                worst[i][j] = max(SEVERITY[s] for s in cs)
                ran = cs["passed"] + cs["failed"] + cs["error"]
                label[i][j] = f"{cs['passed']}/{ran}" if ran else "skip"
    fig = Figure(figsize=(max(6.0, 1.0 * len(profiles) + 6.0), max(2.5, 0.45 * len(targets) + 1.5)))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [max(len(profiles), 2), 3]})
    cmap = ListedColormap(["#ffffff", COLOURS["skipped"], COLOURS["passed"], COLOURS["error"], COLOURS["failed"]])
    ax.imshow(worst, cmap=cmap, vmin=-0.5, vmax=4.5, aspect="auto")
    ax.set_xticks(range(len(profiles)), profiles, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(len(targets)), targets, fontsize=8)
    for i in range(len(targets)):
        for j in range(len(profiles)):
            ax.text(j, i, label[i][j], ha="center", va="center", fontsize=7)
    ax.set_title("worst status of the cells (passed/ran; white: no cell)", fontsize=9)
    left = [0] * len(targets)
    for s in STATUSES:
        n = [sum(e.status == s for e in entries if e.result.cell.target == t) for t in targets]
        bx.barh(range(len(targets)), n, left=left, color=COLOURS[s], label=s)
        left = [a + b for a, b in zip(left, n, strict=True)]
    bx.set_yticks(range(len(targets)), targets, fontsize=8)
    bx.invert_yaxis()
    bx.set_title("cells per target", fontsize=9)
    bx.legend(fontsize=7, loc="lower right")
    return fig


def _stock_figure(Figure, stock: Sequence[StockDrift]):
    fig = Figure(figsize=(max(4.0, 0.8 * len(stock) + 2.0), 2.8))
    ax = fig.subplots()
    ax.bar(range(len(stock)), [s.fraction for s in stock], color="#bf8700")
    for i, s in enumerate(stock):
        ax.text(i, s.fraction, f"{s.differ}/{s.total}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(stock)), [s.target for s in stock], fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("fraction differing", fontsize=8)
    return fig


def _timing_figure(Figure, timed: Sequence[Entry], baseline: Sequence[Entry] | None, top: int = 40):
    wall = {e.key: float(e.result.timings["wall_s"]) for e in timed}
    shown = sorted(timed, key=lambda e: -wall[e.key])[:top]
    fig = Figure(figsize=(8.0, 0.22 * len(shown) + 1.2))
    ax = fig.subplots()
    y = range(len(shown))
    ax.barh(y, [wall[e.key] for e in shown], color=[COLOURS[e.status] for e in shown])
    if baseline is not None:
        pairs = match(shown, baseline)
        pts = [(i, (b.result.timings or {}).get("wall_s")) for i, (_, b) in enumerate(pairs) if b is not None]
        pts = [(i, w) for i, w in pts if _number(w)]
        if pts:
            ax.plot([w for _, w in pts], [i for i, _ in pts], "k|", markersize=9, label="baseline")
            ax.legend(fontsize=7)
    ax.set_yticks(list(y), [e.key for e in shown], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("wall s", fontsize=8)
    if len(timed) > top:
        ax.set_title(f"the {top} slowest of {len(timed)} cells", fontsize=9)
    return fig


# ---- HTML (one file: inline CSS, plots as data URIs) --------------------------------------------------
CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#1f2328}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #d0d7de;padding:2px 8px;text-align:left}
th{background:#f6f8fa}code,td.c{font-family:ui-monospace,monospace;font-size:12px}img{max-width:100%}
.passed{color:#1a7f37}.failed{color:#cf222e;font-weight:bold}.error{color:#8250df;font-weight:bold}
.skipped{color:#6e7781}.muted{color:#6e7781}"""


def _h(s: Any) -> str:
    return html.escape(str(s))


def _html_table(header: list[str], rows: list[list[str]], code: set[str] = frozenset()) -> str:
    head = "".join(f"<th>{_h(h)}</th>" for h in header)
    body = []
    for row in rows[:HTML_ROWS]:
        tds = []
        for h, v in zip(header, row, strict=True):
            cls = v if v in STATUSES else "c" if h in code else ""
            tds.append(f'<td class="{cls}">{_h(v)}</td>' if cls else f"<td>{_h(v)}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    more = f'<p class="muted">… and {len(rows) - HTML_ROWS} more</p>' if len(rows) > HTML_ROWS else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def render_html(rep: Report, plots: dict[str, bytes] | None = None) -> str:
    t = rep.totals
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>rlparity report</title>',
        f"<style>{CSS}</style></head><body>",
        "<h1>rlparity report</h1>",
        "<p>Results: " + ", ".join(f"<code>{_h(lbl)}</code> ({n} cells)" for lbl, n in rep.sources) + ". Baseline: "
        + (", ".join(f"<code>{_h(lbl)}</code> ({n} cells)" for lbl, n in rep.baseline_sources or [])
           if rep.has_baseline else NO_BASELINE) + ".</p>",
    ]  # fmt: skip
    parts += [f"<p><b>{_h(line)}</b></p>" for line in _summary_lines(rep)]
    parts += ["<h2>Totals</h2>"]
    parts.append(
        _html_table(
            ["", *STATUSES, "total"],
            [
                [name, *(str(c[s]) for s in STATUSES), str(sum(c.values()))]
                for name, c in (("required", t.required), ("informational", t.informational), ("all", t.counts))
            ],
        )
    )
    stock = {s.target: s for s in rep.stock}
    parts.append(
        _html_table(
            ["target", *STATUSES, "stock drift"],
            [
                [
                    tgt,
                    *(str(c[s]) for s in STATUSES),
                    f"{stock[tgt].differ}/{stock[tgt].total}" if tgt in stock else "-",
                ]
                for tgt, c in t.by_target.items()
            ],
        )
    )
    if t.reasons:
        parts += ["<p>Gate reasons:</p><ul>"] + [f"<li>{_h(r)}</li>" for r in t.reasons] + ["</ul>"]
    if rep.regressions:
        parts += ["<p>Regressions (--fail-on-regression fails on these):</p><ul>"]
        parts += [f'<li class="failed">{_h(r)}</li>' for r in rep.regressions] + ["</ul>"]
    if t.skipped_reasons:
        parts += ["<details><summary>Skipped cells by reason</summary><ul>"]
        parts += [f"<li>{n} × {_h(r)}</li>" for r, n in t.skipped_reasons] + ["</ul></details>"]
    parts += [f'<p class="muted">Note: {_h(n)}</p>' for n in rep.notes]
    if rep.gone:
        parts.append(f"<p>Cells that ran in the baseline but are not in these results ({len(rep.gone)}): "
                     + ", ".join(f"<code>{_h(g)}</code>" for g in rep.gone) + "</p>")  # fmt: skip
    for title, data in (plots or {}).items():
        b64 = base64.b64encode(data).decode("ascii")
        parts.append(f'<h3>{_h(title)}</h3><img alt="{_h(title)}" src="data:image/png;base64,{b64}">')

    parts.append("<h2>Failures</h2>")
    if rep.failures:
        rows = [
            [f.key, _req(f.required), f.status, "-" if f.new is None else "yes" if f.new else "no",
             str(f.mismatches), str(f.max_ulp), f.first_mismatch, f.reason]
            for f in rep.failures
        ]  # fmt: skip
        parts.append(
            _html_table(
                ["cell", "", "status", "new", "mismatches", "max ulp", "first mismatch", "reason"], rows, {"cell"}
            )
        )
    else:
        parts.append("<p>No cell failed or errored.</p>")
    for sec in _sections(rep):
        parts.append(f"<h2>{_h(sec.title)}</h2>")
        note = _section_note(rep, sec.title) if rep.has_baseline else ""
        if note:
            parts.append(f'<p class="muted">{_h(note)}</p>')
        header, rows = sec.header, sec.rows
        if sec.title == "Environment changes" and rows and rep.env_changes:  # every cell, not three of them
            rows = [[*r[:3], str(len(c.cells)), ", ".join(c.cells)] for r, c in zip(rows, rep.env_changes, strict=True)]
            header = [*header[:4], "which"]
        parts.append(_html_table(header, rows, set(sec.code)) if rows else f"<p>{_h(sec.empty)}.</p>")
    parts.append("<h2>All cells</h2>")
    parts.append(
        _html_table(["cell", "", "status", "stock drift", "wall s"], [_cell_row(e) for e in rep.entries], {"cell"})
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---- edges: files, command line -----------------------------------------------------------------------
def write(rep: Report, out: Path, plots: dict[str, bytes] | None = None) -> tuple[Path, Path]:
    """report.md and report.html under out; returns their paths."""
    md, page = render_markdown(rep), render_html(rep, make_plots(rep) if plots is None else plots)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / MD_NAME).write_text(md)
        (out / HTML_NAME).write_text(page)
    except OSError as exc:
        raise ConfigError(f"cannot write the report: {exc.strerror or exc}", out) from exc
    return out / MD_NAME, out / HTML_NAME


def _threshold(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"--perf-threshold must be a percentage > 0, not {text!r}")
    return v


def _min_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"--perf-min-seconds must be a number of seconds >= 0, not {text!r}")
    return v


def cmd_report(args: argparse.Namespace) -> int:
    threshold, min_s = _threshold(str(args.perf_threshold)), _min_seconds(str(args.perf_min_seconds))
    entries, sources, notes = load([Path(d) for d in args.results])
    baseline = base_sources = None
    if args.baseline:
        baseline, base_sources, base_notes = load([Path(d) for d in args.baseline])
        notes += [f"baseline: {n}" for n in base_notes]
    rep = build(entries, baseline, threshold, min_s, sources, base_sources, notes)
    md, page = write(rep, Path(args.out))
    print(f"report: {md} ({md.stat().st_size} bytes), {page} ({page.stat().st_size} bytes)")
    for line in _summary_lines(rep):
        print(f"  {line}")
    for r in rep.regressions[:20]:
        print(f"  - {r}")
    if args.fail_on_regression and rep.regressions:
        print("  --fail-on-regression: exit 1")
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand (func=cmd_report) to the rlparity parser's subparsers."""
    r = subparsers.add_parser(
        "report",
        help="nightly regression report (report.md, report.html) from results dirs, against a baseline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("results", nargs="+", metavar="RESULTS", help="results dir(s) of `rlparity run`; merged")
    r.add_argument(
        "--baseline", action="append", metavar="DIR", help="results dir to compare against (repeat to merge several)"
    )
    r.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"where report.md and report.html go (default: {DEFAULT_OUT}/)",
    )
    r.add_argument("--fail-on-regression", action="store_true", help="exit 1 on a required new failure or digest drift")
    r.add_argument(
        "--perf-threshold", default=DEFAULT_THRESHOLD, metavar="PCT",
        help=f"report timings that moved by more than PCT percent, either way (default: {DEFAULT_THRESHOLD:g})",
    )  # fmt: skip
    r.add_argument(
        "--perf-min-seconds", default=MIN_SECONDS, metavar="S",
        help=f"ignore timings under S seconds in both runs (default: {MIN_SECONDS:g})",
    )  # fmt: skip
    r.set_defaults(func=cmd_report)


class _Parser(argparse.ArgumentParser):
    """Bad arguments are bad configuration: exit 3 (as rlparity's own parser)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(gate.CONFIG, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """`rlparity report ...` on its own: argv without the word `report`."""
    p = _Parser(prog="rlparity")
    sub = p.add_subparsers(dest="command")
    register(sub)
    args = p.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return gate.CONFIG


if __name__ == "__main__":
    sys.exit(main())
