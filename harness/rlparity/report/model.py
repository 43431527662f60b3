"""The report's data (plain dataclasses) and its edges: reading results dirs and merging several runners' results."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlparity import results
from rlparity.config import ConfigError
from rlparity.results import CellResult

DEFAULT_THRESHOLD = 25.0  # percent, slower or faster
MIN_SECONDS = 0.5  # timings where both runs are shorter than this are not compared


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


@dataclass(frozen=True)
class Night:
    """One night's results: a --history dir, or tonight's (the RESULTS dirs, merged)."""

    label: str
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class NightCount:
    """One target on one night."""

    cells: int  # any status; 0: the target is not in that night's results
    passed: int
    failed: int  # failed or error
    stock: float | None  # StockDrift.fraction over the cells that ran; None: no stock comparison ran
    k3: float | None = None  # the largest rollout/training k3 KL a cell recorded (CellResult.mismatch); None: none


@dataclass(frozen=True)
class Onset:
    """A cell failing tonight and the first night of its unbroken run of failures ending tonight."""

    key: str
    target: str
    required: bool
    status: str  # tonight's: failed or error
    since: int  # index into History.nights (its last index: tonight only)
    before: str  # its status the night before `since` (passed, skipped, absent); "": `since` is the oldest night


@dataclass(frozen=True)
class History:
    nights: tuple[str, ...]  # labels, oldest first, tonight last
    ordered_by: str  # how the earlier nights were put in order (history.BY_TIME or history.AS_GIVEN)
    by_target: dict[str, tuple[NightCount, ...]]  # target -> one count per night, as `nights`
    onsets: tuple[Onset, ...]  # required first, then the oldest onset first
    notes: tuple[str, ...] = ()


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
    history: History | None = None  # None: no --history given

    @property
    def has_baseline(self) -> bool:
        return self.baseline is not None


def is_number(x: Any) -> bool:
    """A finite int or float (not a bool): a timing that can be compared or plotted."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ---- reading (side effects) ---------------------------------------------------------------------------
def labels(dirs: Sequence[Path]) -> list[str]:
    """Base names; the paths as given when two base names collide."""
    names = [d.resolve().name or str(d) for d in dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in dirs]


def load(dirs: Sequence[Path]) -> tuple[list[Entry], list[tuple[str, int]], list[str]]:
    """Read and merge results dirs: (entries, [(label, cells read)], notes)."""
    resolved = [d.resolve() for d in dirs]
    for i, r in enumerate(resolved):
        if r in resolved[:i]:
            raise ConfigError("results directory given twice", dirs[i])
    sets = [(label, results.open_dir(d)) for label, d in zip(labels(dirs), dirs, strict=True)]
    entries, notes = merge(sets)
    return entries, [(label, len(rs)) for label, rs in sets], notes


TONIGHT = "tonight"  # tonight's label in the history


def load_nights(dirs: Sequence[Path], results_dirs: Sequence[Path]) -> list[Night]:
    """Each --history dir as one night, in the order given (history.order sorts them): read as `load` reads
    a results dir. A ConfigError names a dir given twice, one of tonight's RESULTS dirs, or a bad dir."""
    tonight = {d.resolve() for d in results_dirs}
    resolved = [d.resolve() for d in dirs]
    for i, (d, r) in enumerate(zip(dirs, resolved, strict=True)):
        if r in tonight:
            raise ConfigError("--history dir is also one of the RESULTS dirs (tonight's)", d)
        if r in resolved[:i]:
            raise ConfigError("--history dir given twice", d)
    names = labels(dirs)
    if TONIGHT in names:  # a dir named "tonight" keeps its full path: the label is tonight's own
        names = [str(r) for r in resolved]
    return [Night(name, tuple(load(runner_dirs(d))[0])) for name, d in zip(names, dirs, strict=True)]


def runner_dirs(night: Path) -> list[Path]:
    """One night's results: a results dir, or a dir of them (one per runner kind, as the nightly workflow's
    merged artifact holds: results-<label>/); anything else goes to `load`, whose error names it."""
    if (night / "cells").is_dir() or not night.is_dir():
        return [night]
    runners = sorted(d for d in night.iterdir() if (d / "cells").is_dir())
    return runners or [night]


# ---- merging (pure) -------------------------------------------------------------------------------------
def merge(sets: Sequence[tuple[str, Sequence[CellResult]]]) -> tuple[list[Entry], list[str]]:
    """Several runners' results as one list (rules in docs/harness.md), and notes on what was dropped.

    A cell id in several dirs: skipped copies are dropped when one ran (every runner skips the targets it
    lacks); one copy left keeps the plain id, several are each kept as "<id> @ <label>"."""
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
