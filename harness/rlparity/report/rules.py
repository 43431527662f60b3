"""The comparison rules, pure functions over Entry lists: the current results against a baseline.

Every rule is documented in docs/harness.md (the report section); `build` runs them all into a Report.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from rlparity import fingerprint, gate
from rlparity.report.model import (
    DEFAULT_THRESHOLD,
    MIN_SECONDS,
    Drift,
    Entry,
    EnvChange,
    Failure,
    History,
    PerfDelta,
    Report,
    StatusChange,
    StockDrift,
    Totals,
    is_number,
)
from rlparity.results import STATUSES

FAILING = ("failed", "error")
RAN = gate.RAN  # ran to the end: digests and timings mean something

Pairs = Sequence[tuple[Entry, Entry | None]]


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


def new_failures(pairs: Pairs) -> list[StatusChange]:
    """Failing now, and passed, skipped or absent in the baseline."""
    return [
        StatusChange(e.key, e.required, b.status if b else "absent", e.status, e.result.reason)
        for e, b in pairs
        if e.status in FAILING and (b is None or b.status not in FAILING)
    ]


def fixed(pairs: Pairs) -> list[StatusChange]:
    """Failing in the baseline, passed now."""
    return [
        StatusChange(e.key, e.required, b.status, e.status, b.result.reason)
        for e, b in pairs
        if b is not None and b.status in FAILING and e.status == "passed"
    ]


def digest_drift(pairs: Pairs) -> list[Drift]:
    """An output present on both sides with another digest (names on one side only are not drift)."""
    out = []
    for e, b in pairs:
        if b is None:
            continue
        now, then = e.result.digests, b.result.digests
        changed = tuple(sorted(n for n in set(now) & set(then) if now[n] != then[n]))
        if changed:
            out.append(Drift(e.key, e.required, changed, b.status, e.status))
    return out


def env_changes(pairs: Pairs) -> list[EnvChange]:
    """fingerprint.diff per cell, grouped: one row per (field, old, new), most cells first."""
    groups: dict[tuple[str, str, str], tuple[Any, Any, list[str]]] = {}
    for e, b in pairs:
        if b is None or not e.result.fingerprint or not b.result.fingerprint:
            continue  # skipped cells carry no fingerprint
        for name, old, new in fingerprint.diff(b.result.fingerprint, e.result.fingerprint):
            k = (name, canon(old), canon(new))
            groups.setdefault(k, (old, new, []))[2].append(e.key)
    rows = [EnvChange(k[0], old, new, tuple(cells)) for k, (old, new, cells) in groups.items()]
    return sorted(rows, key=lambda r: (-len(r.cells), r.field))


def canon(v: Any) -> str:
    """A value as canonical JSON: equal fingerprint values group together whatever their key order."""
    return json.dumps(v, sort_keys=True, default=str)


def perf_deltas(
    pairs: Pairs, threshold_pct: float = DEFAULT_THRESHOLD, min_seconds: float = MIN_SECONDS
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
            # below min_seconds in both runs, scheduling noise dominates
            if not is_number(old) or not is_number(new) or old <= 0 or max(old, new) < min_seconds:
                continue
            if abs(new - old) / old * 100.0 > threshold_pct:
                out.append(PerfDelta(e.key, name, float(old), float(new)))
    return sorted(out, key=lambda d: (d.timing != "wall", -abs(d.change_pct), d.key, d.timing))


def stock_drift(entries: Sequence[Entry]) -> list[StockDrift]:
    """Per target: informational (stock PyTorch) comparisons that differ, over the cells that ran."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for e in entries:
        differ, total = e.result.stock_differ
        if e.status in RAN and total:
            a = acc[e.result.cell.target]
            a[0], a[1], a[2] = a[0] + 1, a[1] + differ, a[2] + total
    return [StockDrift(t, *acc[t]) for t in sorted(acc)]


def regressions(new: Sequence[StatusChange], drift: Sequence[Drift]) -> list[str]:
    """What --fail-on-regression fails on: required new failures and required digest drift."""
    out = [f"new failure: {c.key} ({c.before} -> {c.after})" for c in new if c.required]
    out += [f"digest drift: {d.key} ({', '.join(d.outputs)})" for d in drift if d.required]
    return out


def build(
    entries: Sequence[Entry],
    baseline: Sequence[Entry] | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD,
    min_seconds: float = MIN_SECONDS,
    sources: list[tuple[str, int]] | None = None,
    baseline_sources: list[tuple[str, int]] | None = None,
    notes: Sequence[str] = (),
    history: History | None = None,
) -> Report:
    """Every rule over the current entries and (when given) the baseline's; `history` (history.trend) is
    shown as given."""
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
        history=history,
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
