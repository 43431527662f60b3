"""`rlparity selftest`: the negative controls. Each deliberately wrong variant (variants.py) runs as a real
cell through the local backend, and the bitwise suite must fail it with a bitwise mismatch; the unmodified
kernel must pass. A harness that cannot fail proves nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlparity import results
from rlparity.backend import LocalBackend
from rlparity.matrix import Cell, load_axes
from rlparity.variants import VARIANTS, variant_env

CONTROLS = tuple(v for v in VARIANTS if v != "none")


@dataclass(frozen=True)
class ControlOutcome:
    variant: str
    status: str
    caught: bool  # the suite reported a bitwise mismatch (for "none": it passed)
    caught_by: tuple[str, ...]  # the comparisons that differed
    reason: str


def selftest_cell(shapes: str = "selftest", dtype: str = "fp32", timeout_s: float = 600.0) -> Cell:
    axes = load_axes()
    return Cell(
        image="local",
        target="cpu",
        profile="baseline",
        placement="single",
        dtype=dtype,
        shapes=shapes,
        tier="exact",
        platform="cpu",
        shape_list=axes.shapes[shapes],
        timeout_s=timeout_s,
        repeats=3,
    )


def outcome(variant: str, res: results.CellResult) -> ControlOutcome:
    differed = tuple(c["name"] for c in res.gated if not c["equal"])
    caught = res.status == "passed" if variant == "none" else (res.status == "failed" and bool(differed))
    return ControlOutcome(variant, res.status, caught, differed, res.reason)


def run(out: Path, variants: tuple[str, ...] = ("none", *CONTROLS), on_result=None) -> list[ControlOutcome]:
    backend = LocalBackend()
    cell = selftest_cell()
    outcomes = []
    for v in variants:
        res = backend.run_cell(cell, [], out / v, v, variant_env(v))
        results.write(res, out / v)
        outcomes.append(outcome(v, res))
        if on_result:
            on_result(outcomes[-1])
    return outcomes
