"""The one place tests make cells, results, comparisons and small matrix files (tests/harness and tests/)."""

from __future__ import annotations

from pathlib import Path

from rlparity import results
from rlparity.cells import Cell
from rlparity.config import IMAGES_FILE, MATRICES_DIR
from rlparity.matrix import load_matrix
from rlparity.results import CellResult

ROOT = Path(__file__).resolve().parents[2]
MATRICES = MATRICES_DIR
IMAGES_TOML = IMAGES_FILE
D1, D2 = "1" * 64, "2" * 64  # two digests

_PLATFORM = {"cpu": ("cpu", ""), "sm90": ("cuda", "sm_90")}
_SCOPE = {"exact": "all-devices", "fast": "per-target"}  # axes.toml's [tiers.NAME] scope (test_matrix keeps it)


def make_cell(
    target: str = "cpu",
    profile: str = "baseline",
    placement: str = "single",
    dtype: str = "fp32",
    tier: str = "exact",
    required: bool = True,
    image: str = "local",
    shapes: str = "quick",
    env: dict[str, str] | None = None,
) -> Cell:
    platform, arch = _PLATFORM.get(target, ("rocm", target))
    return Cell(
        image=image,
        target=target,
        profile=profile,
        placement=placement,
        dtype=dtype,
        shapes=shapes,
        tier=tier,
        tier_scope=_SCOPE.get(tier, "per-target"),
        required=required,
        platform=platform,
        arch=arch,
        env=dict(env or {}),
        shape_list=((1, 128, 4096),),
        timeout_s=240.0,
    )


def comparison(name, equal, count=0, max_abs=0.0, max_ulp=0, first_index=None, informational=False) -> dict:
    return {
        "test": "test_x",
        "name": name,
        "equal": equal,
        "informational": informational,
        "digest_a": "a",
        "digest_b": "b",
        "count": count,
        "total": 10,
        "max_abs": max_abs,
        "max_ulp": max_ulp,
        "first_index": first_index,
    }


def make_result(cell: Cell, status: str = "passed", digests: dict[str, str] | None = None, **kw) -> CellResult:
    return CellResult(cell, status, kw.pop("reason", ""), digests=dict(digests or {}), **kw)


BASE_AXES = {
    "image": '["rocm64-torch26"]',
    "target": '["cpu", "gfx942"]',
    "profile": '["baseline", "threads-1", "sdma-off"]',
    "placement": '["single", "split"]',
    "dtype": '["fp32", "bf16"]',
    "shapes": '["smoke"]',
    "tier": '["exact"]',
}
FULL_INCLUDE = """[[include]]
image = "rocm64-torch26"
target = "cpu"
profile = "baseline"
placement = "dual-die"
dtype = "fp16"
shapes = "llm"
tier = "exact"
"""


def matrix_text(head: str = "", axes: dict[str, str] | None = None, tail: str = "", extra_axes: str = "") -> str:
    lines = ["[matrix]", 'description = "unit test"', "timeout_s = 60", "repeats = 2", head, "", "[axes]"]
    lines += [f"{k} = {v}" for k, v in (axes if axes is not None else BASE_AXES).items()]
    return "\n".join(lines) + "\n" + extra_axes + "\n" + tail


def write(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def ids_of(path: Path, backend_name: str = "local") -> set[str]:
    return {c.id for c in load_matrix(str(path), backend=backend_name).cells}


def write_log(out: Path, text: str = "line 1\nTraceback: boom\n") -> None:
    """A cell's output log, as a cell that printed `text` leaves it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / results.LOG_FILE).write_text(text)
