"""A cell: one point of the matrix, the unit every side shares (matrix, backends, results, the cell itself).

Plain data only, so anything may import it without pulling in the TOML expander or torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# What a cell may run: "none" is rl_kernel itself, the rest are the negative controls (rlparity.cell.controls
# implements each; the host validates --control and plans selftest with these names, never importing it).
CONTROLS = (
    "none",
    "ulp-flip",
    "reversed-order",
    "fma-build",
    "wave-tree",
    "atomics",
    "batch-variant",
    "rollout-variant",
    "profile-variant",
    "placement-variant",
    "range-unchecked",
    "rank-order",
)

AXES = ("image", "target", "profile", "placement", "dtype", "shapes", "tier")
# The episode builders a shape set may name (axes.toml `workload`): the host's copy of the cell side's
# rlparity.cell.workloads.BUILDERS, then rlparity.cell.model's (tests/harness/test_edges.py keeps them equal).
WORKLOADS = ("plain", "edges", "model")
DEFAULT_WORKLOAD = "plain"


@dataclass(frozen=True)
class Cell:
    """One bitwise check: a point of the matrix, run in its own process or container."""

    image: str
    target: str
    profile: str
    placement: str
    dtype: str
    shapes: str
    tier: str
    required: bool = True
    platform: str = "cpu"
    arch: str = ""
    env: dict[str, str] = field(default_factory=dict)
    shape_list: tuple[tuple[int, int, int], ...] = ()
    workload: str = DEFAULT_WORKLOAD  # how each shape's episode is built (plain, edges, model)
    timeout_s: float = 300.0
    repeats: int = 3
    seed: int = 0

    @property
    def id(self) -> str:
        return "/".join(getattr(self, a) for a in AXES)

    @property
    def dirname(self) -> str:
        """A file-system name for the cell's result directory."""
        return self.id.replace("/", "__")

    def axis(self, name: str) -> str:
        return getattr(self, name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cell:
        d = {k: v for k, v in d.items() if k != "id"}
        d["shape_list"] = tuple(tuple(s) for s in d.get("shape_list", ()))
        return cls(**d)
