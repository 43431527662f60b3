"""The nightly history, pure functions over Nights: per target and night the cells passed / failed and the
stock drift, and for each cell failing tonight the first night of its unbroken run of failures.

The nights come from `--history DIR...` (model.load_nights); the rules are in docs/harness.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from rlparity.report.model import Entry, History, Night, NightCount, Onset
from rlparity.report.rules import FAILING, match, stock_drift

BY_TIME = "by run time (each dir's earliest cell start)"
AS_GIVEN = "as given (a --history dir records no cell start time)"


def run_time(n: Night) -> datetime | None:
    """The earliest `started` of the night's cells (UTC when it names no zone); None when none is readable."""
    times = []
    for e in n.entries:
        try:
            t = datetime.fromisoformat(e.result.started.replace("Z", "+00:00"))
        except (TypeError, ValueError):
            continue  # "" (not recorded) or not ISO 8601
        times.append(t if t.tzinfo else t.replace(tzinfo=timezone.utc))
    return min(times, default=None)


def order(nights: Sequence[Night]) -> tuple[list[Night], str]:
    """The earlier nights oldest first, and how: by run time when every night records one (ties keep the
    order given), otherwise in the order given (one night without a time could belong anywhere)."""
    times = [run_time(n) for n in nights]
    if any(t is None for t in times):
        return list(nights), AS_GIVEN
    ranked = sorted(range(len(nights)), key=lambda i: (times[i], i))
    return [nights[i] for i in ranked], BY_TIME


def count(entries: Sequence[Entry], target: str) -> NightCount:
    """One target's cells on one night: passed, failed (or error), the stock drift fraction, the largest k3 KL."""
    mine = [e for e in entries if e.result.cell.target == target]
    stock = stock_drift(mine)  # one row (this target) when a stock comparison ran
    return NightCount(
        cells=len(mine),
        passed=sum(e.status == "passed" for e in mine),
        failed=sum(e.status in FAILING for e in mine),
        stock=stock[0].fraction if stock else None,
        k3=max((e.result.mismatch["k3_kl"] for e in mine if "k3_kl" in e.result.mismatch), default=None),
    )


def status_on(e: Entry, n: Night) -> str:
    """The cell's status on night n (matched as against a baseline), or "absent"."""
    _, then = match([e], n.entries)[0]
    return then.status if then is not None else "absent"


def onset(e: Entry, earlier: Sequence[Night]) -> Onset:
    """Walking back from tonight, the run of failures ends at the first night the cell did not fail
    (passed, skipped or absent: only nights seen failing count); `since` is the run's oldest night."""
    since = len(earlier)  # tonight's index
    while since > 0:
        before = status_on(e, earlier[since - 1])
        if before not in FAILING:
            return Onset(e.key, e.result.cell.target, e.required, e.status, since, before)
        since -= 1
    return Onset(e.key, e.result.cell.target, e.required, e.status, 0, "")


def trend(history: Sequence[Night], tonight: Night) -> History:
    """The history: the earlier nights (put in order) and tonight, last."""
    earlier, how = order(history)
    nights = [*earlier, tonight]
    targets = sorted({e.result.cell.target for n in nights for e in n.entries})
    onsets = [onset(e, earlier) for e in tonight.entries if e.status in FAILING]
    return History(
        nights=tuple(n.label for n in nights),
        ordered_by=how,
        by_target={t: tuple(count(n.entries, t) for n in nights) for t in targets},
        onsets=tuple(sorted(onsets, key=lambda o: (not o.required, o.since, o.key))),
        notes=tuple(_later_than_tonight(earlier, tonight)),
    )


def _later_than_tonight(earlier: Sequence[Night], tonight: Night) -> list[str]:
    """A --history dir that started after tonight's results is most likely a mistake: said, not fatal."""
    now = run_time(tonight)
    if now is None:
        return []
    return [f"--history {n.label} started after tonight's results" for n in earlier if (run_time(n) or now) > now]
