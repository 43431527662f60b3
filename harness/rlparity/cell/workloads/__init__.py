"""Workloads as descriptors: what runs in a cell for each shape of its shape set.

A workload is one `Workload`: its suite (the pytest files run for each of its cells, over the fixtures of
rlparity.cell.suite.plugin: cell, control, record, shape, params), its golden digests (a function the
`rlparity golden` command calls on the CPU) and its parameters with their defaults (a matrix file passes
them in `[shapes.NAME] params = {...}`; a key the workload does not take is a configuration error).

It is found without editing any list: a folder `rlparity/cell/workloads/<name>/` with a module `workload.py`
that defines `WORKLOAD`, or a distribution's entry point in the group `rlparity.workloads` whose value is an
import string of a `Workload` (`pkg.module:WORKLOAD`), so that a user's package can add one. The device
probe (rlparity.cell.inventory) reports what an image offers; the host never imports this package.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rl_kernel.plugins import Registry

ENTRY_POINT_GROUP = "rlparity.workloads"
SUITE_DIR = Path(__file__).resolve().parents[1] / "suite"

# (shape [B, T, V], dtype name, seed, params, tier) -> {what: digest}, keyed by rlparity.golden.key's `what`.
GoldenFn = Callable[[tuple[int, int, int], str, int, dict[str, Any], str], dict[str, str]]
# (batch, seq, vocab, dtype name, seed) -> rlparity.cell.episodes.Episode (not imported here: the probe stays light)
EpisodeFn = Callable[[int, int, int, str, int], Any]


class WorkloadError(LookupError):
    """An unknown workload, or a descriptor that does not hold together."""


@dataclass(frozen=True)
class Workload:
    """One workload.

    name      what shape sets call it (axes.toml / a matrix file: `workload = "name"`)
    suite     the pytest files its cells run (absolute paths)
    golden    its committed digests' compute function (None: the workload commits none)
    params    the parameters it takes, each with its default
    needs     the tier operators its suite calls (a cell whose tier lacks one is skipped with that reason)
    episode   a logits workload's episode builder, which build_episode (below) finds here (None:
              the workload builds its own inputs)
    """

    name: str
    suite: tuple[Path, ...]
    golden: GoldenFn | None = None
    params: dict[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    description: str = ""
    episode: EpisodeFn | None = None
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        missing = [str(p) for p in self.suite if not Path(p).is_file()]
        if not self.suite or missing:
            raise WorkloadError(f"workload {self.name!r}: suite files missing: {', '.join(missing) or '(none given)'}")

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """The parameters a cell runs with: the defaults, overridden by the matrix's (unknown keys: an error)."""
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            takes = ", ".join(self.params) or "none"
            raise WorkloadError(f"workload {self.name!r} takes no parameter {unknown[0]!r} (it takes: {takes})")
        return {**self.params, **given}

    def describe(self) -> dict[str, Any]:
        """Plain data for the device probe."""
        return {"params": sorted(self.params), "needs": list(self.needs), "origin": self.origin}


def workloads() -> dict[str, Workload]:
    """Every workload this installation offers, by name (a name given twice is an error naming both places);
    found once per process."""
    return dict(_discovered())


@functools.cache
def _discovered() -> tuple[tuple[str, Workload], ...]:
    here = Path(__file__).resolve().parent
    registry = Registry("workload", __name__, here, "workload", "WORKLOAD", ENTRY_POINT_GROUP, Workload,
                        WorkloadError, lambda w, where: replace(w, origin=where))  # fmt: skip
    return tuple(registry.found().items())


def get(name: str) -> Workload:
    known = workloads()
    if name not in known:
        raise WorkloadError(f"no workload {name!r} here (offered: {', '.join(known)})")
    return known[name]


def build_episode(workload: str, batch: int, seq: int, vocab: int, dtype: str, seed: int = 0) -> Any:
    """The episode (rlparity.cell.episodes.Episode) of a cell's workload for one shape: its descriptor's own builder
    (Workload.episode; plain's is rlparity.cell.episodes.make_episode, edges' rlparity.cell.workloads.edges.episode).
    Here, beside the registry, so that episodes.py (which the workloads import) imports no workload."""
    build = get(workload).episode
    if build is None:
        raise ValueError(f"workload {workload!r} builds no episode of logits (its descriptor names no `episode`)")
    return build(batch, seq, vocab, dtype, seed)
