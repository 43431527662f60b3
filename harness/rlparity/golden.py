"""Committed golden digests of the bitwise suite's outputs, per tier (harness/rlparity/data/golden/<tier>.json).

The exact tier's digests are one set for every target: CPU, NVIDIA and AMD must all produce them.
They are written from the CPU build with `rlparity golden --update` (the one update command; this module
owns the table, rlparity.cell.golden computes the digests) and reviewed like code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rlparity.cells import DEFAULT_WORKLOAD
from rlparity.config import GOLDEN_DIR

OUTPUTS = ("logprobs", "grad", "stats")  # stats: the row intermediates [max, sum of exp, log of the sum]
# A per-target tier's digests travel from its cells to its table in result.json, each named RECORDED + its table
# key (golden/sm90/fp32/...): the cell side writes them (recorded_name), `rlparity golden --record` reads them back.
RECORDED = "golden/"


def shape_id(shape: tuple[int, int, int], workload: str = DEFAULT_WORKLOAD) -> str:
    """A shape's name in keys and comparisons: 1x128x4096 for the plain workload; another workload's prefixed with
    its name (edges:2x32x4099), so shape sets with one shape but different workloads never share a name."""
    sid = "x".join(map(str, shape))
    return sid if workload == DEFAULT_WORKLOAD else f"{workload}:{sid}"


def key(dtype: str, shape: tuple[int, int, int], seed: int, what: str, workload: str = DEFAULT_WORKLOAD) -> str:
    """fp32/1x128x4096/seed0/grad; fp32/edges:2x32x4099/seed0/grad (shape_id)."""
    return f"{dtype}/{shape_id(shape, workload)}/seed{seed}/{what}"


def table_key(key_: str, tier_scope: str, target: str) -> str:
    """A key as a tier's table holds it: as is for an all-devices tier, under the target for a per-target one
    (sm90/fp32/...: the same work gives other bits on another architecture)."""
    return key_ if tier_scope == "all-devices" else f"{target}/{key_}"


def recorded_name(key_: str, tier_scope: str, target: str) -> str:
    """The name a cell records a digest under in result.json for its tier's table (read back by `recorded`)."""
    return RECORDED + table_key(key_, tier_scope, target)


def recorded(digests: dict[str, str]) -> dict[str, str]:
    """The table entries ({table key: digest}) among a result's digests: those named by recorded_name."""
    return {name.removeprefix(RECORDED): d for name, d in digests.items() if name.startswith(RECORDED)}


def expected(tier: str, tier_scope: str, target: str, keys: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The committed digest of each of a cell's keys ({what: key}), and the table keys that have none."""
    table = load(tier)
    full = {what: table_key(k, tier_scope, target) for what, k in keys.items()}
    return {what: table[k] for what, k in full.items() if k in table}, [k for k in full.values() if k not in table]


def path_for(tier: str, root: Path = GOLDEN_DIR) -> Path:
    return root / f"{tier}.json"


def load(tier: str, root: Path = GOLDEN_DIR) -> dict[str, str]:
    p = path_for(tier, root)
    return json.loads(p.read_text()) if p.exists() else {}


def update(tier: str, entries: dict[str, str], root: Path = GOLDEN_DIR) -> Path:
    p = path_for(tier, root)
    merged = {**load(tier, root), **entries}
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
    return p


def compute(
    shapes: list[tuple[int, int, int]],
    dtypes: list[str],
    seed: int = 0,
    workload: str = DEFAULT_WORKLOAD,
    params: dict | None = None,
    tier: str = "exact",
) -> dict[str, str]:
    """The digests on this machine's CPU build, computed by `python -m rlparity.cell.golden` in a
    subprocess (the host never imports rl_kernel)."""
    argv = ["--shapes", *("x".join(map(str, s)) for s in shapes), "--dtypes", *dtypes, "--seed", str(seed)]
    argv += ["--workload", workload, "--params", json.dumps(params or {}), "--tier", tier]
    proc = subprocess.run([sys.executable, "-m", "rlparity.cell.golden", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"computing the golden digests failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)
