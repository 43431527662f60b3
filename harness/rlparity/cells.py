"""A cell: one point of the matrix, the unit every side shares (matrix, backends, results, the cell itself).

Plain data only, so anything may import it without pulling in the TOML expander or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
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

# The controls whose cells need an env the host prepares (rlparity.cell.controls.control_env): fma-build's library,
# built on the host. Every other control's env is empty, so the local backend asks the cell side only for these
# (tests/harness/test_controls.py holds control_env to it), and the docker backend refuses them.
HOST_BUILT_CONTROLS = ("fma-build",)

CONTROL_VAR = "RLPARITY_CONTROL"  # which negative control a cell runs ("none": rl_kernel itself)
CONTROL_VAR_DEPRECATED = "RLPARITY_VARIANT"  # the old name, still read for a release
# A cell process's exit status for each result status: the backends judge it, cellrun returns it.
EXIT_CODES = {"passed": 0, "skipped": 0, "failed": 1, "error": 2}

AXES = ("image", "target", "profile", "placement", "dtype", "shapes", "tier")
# Two facts rl_kernel holds too: the dtype names (rl_kernel.inputs.DTYPE_NAMES maps them to torch dtypes on the
# cell side) and the tier scopes (rl_kernel.tiers.SCOPES checks a tier's descriptor). The host checks matrix files
# with these before any cell runs and may not import rl_kernel, nor rl_kernel rlparity: one copy each side, held
# equal by tests/harness/test_shared_facts.py (the device probe then reports which dtypes each tier takes).
DTYPES = ("fp32", "bf16", "fp16")  # the dtype axis
# A shape set names the workload that runs it (axes.toml `workload`). The host keeps no list of workloads:
# the cell side finds them (rlparity.cell.workloads: this repository's folders and the `rlparity.workloads`
# entry points) and the device probe reports which ones an image offers.
DEFAULT_WORKLOAD = "plain"
TIER_SCOPES = ("all-devices", "per-target")  # a tier's golden scope (axes.toml [tiers.NAME] scope; see DTYPES)


def control_from_env(environ: Mapping[str, str]) -> str:
    """The control a cell runs: RLPARITY_CONTROL, else the deprecated RLPARITY_VARIANT, else none."""
    return environ.get(CONTROL_VAR) or environ.get(CONTROL_VAR_DEPRECATED) or "none"


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
    workload: str = DEFAULT_WORKLOAD  # what runs each shape (plain, edges, model, or a package's own)
    params: dict[str, Any] = field(default_factory=dict)  # the workload's parameters (matrix [shapes.NAME] params)
    params_where: str = ""  # "FILE:LINE" of those params: a cell that finds them bad names the place (exit 3)
    tier_scope: str = "all-devices"  # "per-target": digests are compared within one target only
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
