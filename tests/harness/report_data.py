"""Two result sets for the report tests (written with results.write), a regression planted in every section."""

from __future__ import annotations

import copy
import re
from pathlib import Path

from rlparity import results
from rlparity.matrix import Cell
from rlparity.results import CellResult

DIGESTS = {"1x128x4096/logprobs": "a" * 64, "1x128x4096/grad": "b" * 64}
FP = {
    "python": "3.11.7",
    "hostname": "runner-1",
    "pid": 100,
    "torch": {"version": "2.13.0+rocm6.4", "hip": "6.4", "threads": 8},
    "env": {"HIP_VISIBLE_DEVICES": "0"},
}


def cell(target: str, profile: str, dtype: str = "fp32", placement: str = "single", required: bool = True) -> Cell:
    return Cell("local", target, profile, placement, dtype, "quick", "exact", required=required, platform="rocm")


NEWFAIL = cell("gfx942", "baseline")  # passed -> failed: a regression
FIXED = cell("gfx942", "threads-1")  # failed -> passed
DRIFT = cell("gfx942", "baseline", "bf16")  # a digest changed: a regression
ENV = cell("gfx942", "sdma-off")  # HSA_ENABLE_SDMA appears in its fingerprint
SLOW = cell("gfx942", "baseline", placement="split")  # wall and one test 2x slower
STEADY = cell("gfx90a", "baseline")  # +10 % wall, a tiny test 5x slower: neither reported
INFO_FAIL = cell("gfx90a", "tunableop-on", required=False)  # informational new failure: reported, not a regression
SKIP = cell("sm90", "baseline")  # skipped in both
RAN_BOTH = [NEWFAIL, FIXED, DRIFT, ENV, SLOW, STEADY, INFO_FAIL]  # cells with a fingerprint in both sets


def comparisons(equal: bool = True, stock_differ: int = 1) -> list[dict]:
    def comp(name: str, eq: bool, informational: bool) -> dict:
        return {
            "test": f"test_x[{name}]", "name": name, "equal": eq, "informational": informational,
            "digest_a": "a" * 64, "digest_b": ("a" if eq else "f") * 64, "count": 0 if eq else 3, "total": 128,
            "max_abs": 0.0 if eq else 1e-7, "max_ulp": 0 if eq else 2, "first_index": None if eq else [0, 5],
        }  # fmt: skip

    return [
        comp("rollout vs training", equal, False),
        comp("stock rollout vs training", stock_differ < 1, True),
        comp("stock mm row", True, True),
    ]


def result(c: Cell, status: str = "passed", **kw) -> CellResult:
    if status == "skipped":
        return results.skipped(c, "target sm90 needs a CUDA device")
    fp = copy.deepcopy(FP)
    fp["torch"]["version"] = kw.pop("torch", fp["torch"]["version"])
    fp["env"].update(kw.pop("env", {}))
    return CellResult(
        c,
        status,
        kw.pop("reason", "1x128x4096 rollout vs training: 3 elements differ" if status == "failed" else ""),
        fingerprint=fp,
        fingerprint_hash="h",
        digests=kw.pop("digests", dict(DIGESTS)),
        comparisons=comparisons(equal=status != "failed"),
        timings={"wall_s": kw.pop("wall", 4.0), "tests": kw.pop("tests", {"test_x[1x128x4096]": 1.0})},
    )


def baseline_set() -> list[CellResult]:
    return [
        result(NEWFAIL),
        result(FIXED, "failed"),
        result(DRIFT),
        result(ENV),
        result(SLOW),
        result(STEADY, tests={"test_x[1x128x4096]": 1.0, "test_tiny": 0.01}),
        result(INFO_FAIL),
        result(SKIP, "skipped"),
    ]


def current_set() -> list[CellResult]:
    new = "2.14.0+rocm6.4"  # a torch upgrade: the same change on every cell, one row
    return [
        result(NEWFAIL, "failed", torch=new),
        result(FIXED, torch=new),
        result(DRIFT, torch=new, digests={**DIGESTS, "1x128x4096/logprobs": "c" * 64}),
        result(ENV, torch=new, env={"HSA_ENABLE_SDMA": "0"}),
        result(SLOW, torch=new, wall=8.0, tests={"test_x[1x128x4096]": 2.0}),
        result(STEADY, torch=new, wall=4.4, tests={"test_x[1x128x4096]": 1.0, "test_tiny": 0.05}),
        result(INFO_FAIL, "failed", torch=new),
        result(SKIP, "skipped"),
    ]


def write_set(d: Path, rs: list[CellResult]) -> Path:
    for r in rs:
        results.write(r, results.cell_dir(d, r.cell))
    return d


def section(text: str, title: str) -> str:
    """A Markdown section's body: from '## title...' to the next '## '."""
    m = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"no section {title!r}"
    return m.group(1)
