"""`rlparity selftest`: the negative controls. Each deliberately wrong kernel (rlparity.cell.controls) runs as a
real cell through the local backend, and the bitwise suite must fail it with a bitwise mismatch; the unmodified
kernel must pass. A harness that cannot fail proves nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlparity import results
from rlparity.applicability import skip_reason
from rlparity.backends.local import LocalBackend
from rlparity.cells import Cell
from rlparity.config import ConfigError
from rlparity.matrix import load_axes

# The host's copy of rlparity.cell.controls.CONTROLS (the host never imports the cell side; a test keeps
# the two equal): "none" is rl_kernel itself, the rest are the negative controls.
CONTROLS = ("none", "ulp-flip", "reversed-order", "fma-build", "wave-tree", "atomics")
NEGATIVE = CONTROLS[1:]


@dataclass(frozen=True)
class ControlOutcome:
    control: str
    status: str
    caught: bool  # the suite reported a bitwise mismatch (for "none": it passed)
    caught_by: tuple[str, ...]  # the comparisons that differed
    reason: str


def selftest_cell(shapes: str = "selftest", dtype: str = "fp32", timeout_s: float = 600.0, target: str = "cpu") -> Cell:
    axes = load_axes()
    if target not in axes.targets:
        raise ConfigError(f"unknown target {target!r} (known: {', '.join(axes.targets)})")
    t = axes.targets[target]
    return Cell(
        image="local",
        target=target,
        profile="baseline",
        placement="single",
        dtype=dtype,
        shapes=shapes,
        tier="exact",
        platform=t.platform,
        arch=t.arch,
        shape_list=axes.shapes[shapes],
        timeout_s=timeout_s,
        repeats=3,
    )


def outcome(control: str, res: results.CellResult) -> ControlOutcome:
    differed = tuple(c["name"] for c in res.gated if not c["equal"])
    caught = res.status == "passed" if control == "none" else (res.status == "failed" and bool(differed))
    return ControlOutcome(control, res.status, caught, differed, res.reason)


def run(out: Path, controls: tuple[str, ...] = CONTROLS, on_result=None, target: str = "cpu") -> list[ControlOutcome]:
    """Each control as a cell of `target` (cpu, or this host's GPU target: the controls then run on it)."""
    backend = LocalBackend()
    cell = selftest_cell(target=target)
    gpu = cell.platform != "cpu"
    if gpu:
        reason = skip_reason(cell, backend.probe())
        if reason:
            raise ConfigError(f"selftest --target {target}: {reason}")
    outcomes = []
    for v in controls:
        res = backend.run_cell(cell, [0] if gpu else [], out / v, v, backend.control_env(v, gpu=gpu))
        results.write(res, out / v)
        outcomes.append(outcome(v, res))
        if on_result:
            on_result(outcomes[-1])
    return outcomes
