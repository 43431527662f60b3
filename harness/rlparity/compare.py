"""`rlparity compare A B`: a bitwise verdict on two saved tensors (torch.save / .npy) or two result dirs.

Result dirs are compared here; tensors in `python -m rlparity.cell.tensors` (a subprocess: the host never
imports torch or rl_kernel).

Two result dirs are matched cell by cell on the axes that define the work: a cell's id over every axis but
the ignored ones. `image` is ignored by default when the two runs used different images (a `--backend
docker` run of image `cpu` and a local run, whose image axis is `local`, did the same work), so their
cells line up; each matched cell gets one verdict (VERDICTS) and the comparison one exit code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlparity import results
from rlparity.cells import AXES, Cell
from rlparity.config import ConfigError
from rlparity.gate import CONFIG, MISMATCH, OK, RAN
from rlparity.results import CellResult


@dataclass(frozen=True)
class TensorVerdict:
    """rl_kernel.bitwise.Diff as the cell-side comparison reported it."""

    equal: bool
    summary: str
    diff: dict[str, Any]

    @property
    def problem(self) -> str:
        """Why the comparison fails, or "": the tensors differ, or they hold no element (nothing was compared:
        two empty tensors are "equal" vacuously, which is no pass)."""
        if not self.equal:
            return self.summary
        if not self.diff.get("total"):
            return "both tensors have no elements: nothing was compared"
        return ""

    @property
    def exit_code(self) -> int:
        """0 when at least one element was compared and all are bitwise equal; 1 otherwise."""
        return MISMATCH if self.problem else OK


def compare_tensors(a: Path, b: Path) -> TensorVerdict:
    proc = subprocess.run(
        [sys.executable, "-m", "rlparity.cell.tensors", str(a), str(b)], capture_output=True, text=True
    )
    if proc.returncode == CONFIG:  # a file that cannot be compared: the cell side's message
        raise ConfigError(proc.stderr.strip())
    if proc.returncode != 0:
        raise RuntimeError(f"comparing {a} and {b} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout)
    return TensorVerdict(out["equal"], out["summary"], out["diff"])


# ---- result dirs ----------------------------------------------------------------------------------------
EQUAL, DIFFER = "equal", "differ"  # both sides ran the cell: its digests are bitwise equal, or not
ONLY_A, ONLY_B = "only in A", "only in B"  # the other side has no such cell
SKIPPED = "skipped"  # a side has the cell but did not run it to a verdict (skipped, error)
NO_DIGESTS = "no digests"  # both ran it, neither recorded a digest: nothing to compare
VERDICTS = (EQUAL, DIFFER, ONLY_A, ONLY_B, SKIPPED, NO_DIGESTS)
NO_CELL_IN_COMMON = "no cell in common"


@dataclass(frozen=True)
class CellDelta:
    """One cell matched across two result dirs by `key` (its id over the compared axes). A side's status and
    cell id are None where that side has no such cell; its digests are those of its result.json."""

    key: str
    id_a: str | None
    id_b: str | None
    status_a: str | None
    status_b: str | None
    digests_a: dict[str, str] = field(default_factory=dict)
    digests_b: dict[str, str] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        if self.status_b is None:
            return ONLY_A
        if self.status_a is None:
            return ONLY_B
        if self.status_a not in RAN or self.status_b not in RAN:
            return SKIPPED
        if not self.digests_a and not self.digests_b:
            return NO_DIGESTS  # both ran, neither recorded a digest: nothing to call equal
        return DIFFER if self.differing or self.only_a or self.only_b else EQUAL

    @property
    def differing(self) -> tuple[str, ...]:
        """Digest names both sides recorded, with different digests (compared exactly, as strings)."""
        both = sorted(set(self.digests_a) & set(self.digests_b))
        return tuple(n for n in both if self.digests_a[n] != self.digests_b[n])

    @property
    def only_a(self) -> tuple[str, ...]:
        """Digest names only A recorded (a difference: the two runs did not compute the same outputs)."""
        return tuple(sorted(set(self.digests_a) - set(self.digests_b)))

    @property
    def only_b(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.digests_b) - set(self.digests_a)))

    @property
    def compared(self) -> bool:
        """Both sides ran the cell and recorded digests: its verdict is equal or differ."""
        return self.verdict in (EQUAL, DIFFER)

    @property
    def equal(self) -> bool:
        return self.verdict == EQUAL

    @property
    def detail(self) -> str:
        """What the verdict rests on: the differing digests, or which side did not run the cell and why."""
        verdict = self.verdict
        if verdict == DIFFER:
            parts = [", ".join(self.differing)] if self.differing else []
            parts += [
                f"only in {side}: {', '.join(names)}"
                for side, names in (("A", self.only_a), ("B", self.only_b))
                if names
            ]
            return "; ".join(parts)
        if verdict == SKIPPED:
            sides = (("A", self.status_a), ("B", self.status_b))
            return ", ".join(f"{side} {status}" for side, status in sides if status not in RAN)
        if verdict == EQUAL and self.status_a != self.status_b:
            return f"A {self.status_a}, B {self.status_b}"
        return ""


@dataclass(frozen=True)
class DirComparison:
    """Every cell of two result dirs, matched; `ignored` names the axes left out of the match."""

    cells: tuple[CellDelta, ...]
    ignored: tuple[str, ...]
    images_a: tuple[str, ...]
    images_b: tuple[str, ...]

    def counts(self) -> dict[str, int]:
        """How many cells got each verdict (every verdict listed, in VERDICTS order)."""
        return {v: sum(d.verdict == v for d in self.cells) for v in VERDICTS}

    @property
    def in_common(self) -> tuple[CellDelta, ...]:
        return tuple(d for d in self.cells if d.verdict not in (ONLY_A, ONLY_B))

    @property
    def problem(self) -> str:
        """Why the comparison fails, or "" when every cell both sides ran has equal digests."""
        differ = [d.key for d in self.cells if d.verdict == DIFFER]
        if differ:
            return f"{len(differ)} cell(s) differ: {', '.join(differ)}"
        if not self.in_common:
            return NO_CELL_IN_COMMON
        if not any(d.compared for d in self.cells):
            return "no cell in common ran on both sides with digests: nothing was compared"
        return ""

    @property
    def exit_code(self) -> int:
        """0 when at least one cell was compared and none differs; 1 otherwise (vacuous equality fails)."""
        return MISMATCH if self.problem else OK


def check_axes(names: Iterable[str]) -> tuple[str, ...]:
    """`--ignore` names, in AXES order; a ConfigError naming the unknown ones and the known axes."""
    names = list(names)
    unknown = [n for n in names if n not in AXES]
    if unknown:
        raise ConfigError(
            f"--ignore: unknown axis {', '.join(repr(n) for n in unknown)}; the axes are {', '.join(AXES)}"
        )
    return tuple(a for a in AXES if a in names)


def match_key(cell: Cell, ignored: Iterable[str]) -> str:
    """The cell's id over the axes not ignored: what two runs' cells are matched on."""
    skip = set(ignored)
    return "/".join(cell.axis(a) for a in AXES if a not in skip)


def images_of(found: list[CellResult]) -> tuple[str, ...]:
    return tuple(sorted({r.cell.image for r in found}))


def ignored_axes(requested: Iterable[str], images_a: tuple[str, ...], images_b: tuple[str, ...]) -> tuple[str, ...]:
    """The requested axes, plus `image` when the two runs used different sets of images."""
    names = set(check_axes(requested))
    if images_a != images_b:
        names.add("image")
    return tuple(a for a in AXES if a in names)


def by_key(found: list[CellResult], ignored: tuple[str, ...], side: str) -> dict[str, CellResult]:
    """One side's results by match key; a ConfigError naming two cells that the ignored axes make one."""
    out: dict[str, CellResult] = {}
    for r in found:
        key = match_key(r.cell, ignored)
        if key in out:
            raise ConfigError(
                f"with {', '.join(ignored) or 'no axis'} ignored, cells {out[key].cell.id} and {r.cell.id} of {side} "
                f"both match as {key!r}: compare results with one cell per key (fewer --ignore axes, or a run of "
                "one image)"
            )
        out[key] = r
    return out


def delta(key: str, x: CellResult | None, y: CellResult | None) -> CellDelta:
    return CellDelta(
        key,
        x.cell.id if x else None,
        y.cell.id if y else None,
        x.status if x else None,
        y.status if y else None,
        dict(x.digests) if x else {},
        dict(y.digests) if y else {},
    )


def compare_dirs(a: Path, b: Path, ignore: Iterable[str] = ()) -> DirComparison:
    """Match the cells of two result dirs (see the module doc) and give each a verdict. ConfigError for an
    unknown axis in `ignore`, a path that is not a results dir, or two cells of one side matching as one."""
    requested = check_axes(ignore)
    found_a, found_b = results.open_dir(a), results.open_dir(b)
    images_a, images_b = images_of(found_a), images_of(found_b)
    ignored = ignored_axes(requested, images_a, images_b)
    ra, rb = by_key(found_a, ignored, f"A ({a})"), by_key(found_b, ignored, f"B ({b})")
    cells = tuple(delta(k, ra.get(k), rb.get(k)) for k in sorted(set(ra) | set(rb)))
    return DirComparison(cells, ignored, images_a, images_b)
