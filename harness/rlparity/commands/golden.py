"""`rlparity golden [--update]`: check, or rewrite, every committed golden digest of the all-devices tiers (exact;
the shape sets axes.toml marks `golden = true`, each with its workload and parameters); `--record RESULTS` writes
a per-target tier's (fast) from what its cells recorded on their target.

The one update command for both sets: the kernels' per-family digests (kernels/rl_kernel/exact/<family>/golden.json,
written by `python -m rl_kernel.contract.golden`, run here as a subprocess) and the harness workloads' digests
(harness/rlparity/data/golden/, owned by rlparity.golden, computed on the cell side by
`python -m rlparity.cell.golden`).
No test writes either: checking tests only read them."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from rlparity import golden, results
from rlparity.cells import DTYPES
from rlparity.config import GOLDEN_DIR, ConfigError
from rlparity.matrix import load_axes
from rlparity.ui import console


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("golden", help="check (or --update) every golden digest of the exact tier (kernels + workloads)")
    g.add_argument("--update", action="store_true")
    g.add_argument("--shapes", nargs="+", default=None, help="shape sets (default: axes.toml's `golden = true` sets)")
    g.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--record", type=Path, metavar="RESULTS", help="a per-target tier: write the digests its passing "
                   "cells of RESULTS recorded (golden/<target>/<key>) into its table, and nothing else")  # fmt: skip
    g.set_defaults(func=cmd_golden)


def cmd_golden(args: argparse.Namespace) -> int:
    axes = load_axes()
    if args.record is not None:
        return record(args.record)
    shape_sets = args.shapes or [name for name, w in axes.workloads.items() if w.golden]
    unknown = [s for s in shape_sets if s not in axes.shapes]
    if unknown:
        raise ConfigError(f"unknown shape set(s) {', '.join(unknown)} (known: {', '.join(axes.shapes)})")
    code = _kernel_digests(args.update)
    # An all-devices tier's table is computed here, on the CPU; a per-target tier's comes from its cells (--record).
    for tier in (name for name, t in axes.tiers.items() if t.scope == "all-devices"):
        entries = {}
        for name in shape_sets:  # one subprocess per shape set: each set names its workload and parameters
            w = axes.workloads[name]
            entries.update(golden.compute(list(axes.shapes[name]), args.dtypes, args.seed, w.name, w.params, tier))
        code = max(code, _write_or_check(tier, entries, args.update))
    return code


def _write_or_check(tier: str, entries: dict[str, str], update: bool) -> int:
    if update:
        path = golden.update(tier, entries)
        console.print(f"{tier}: wrote {len(entries)} digests to {path}")
        return 0
    table = golden.load(tier)
    wrong = {k: v for k, v in entries.items() if table.get(k) != v}
    for k in wrong:
        console.print(f"  [red]differs[/] {k}")
    console.print(f"{tier}: {len(entries) - len(wrong)}/{len(entries)} workload digests equal the committed ones")
    return 1 if wrong else 0


def _kernel_digests(update: bool) -> int:
    """rl_kernel's per-family digests, checked or rewritten in a subprocess (the host never imports rl_kernel)."""
    proc = subprocess.run([sys.executable, "-m", "rl_kernel.contract.golden", *(["--update"] if update else [])],
                          capture_output=True, text=True)  # fmt: skip
    console.print(proc.stdout.rstrip() or proc.stderr.rstrip()[-2000:])
    return 0 if proc.returncode == 0 else 1


def record(results_dir: Path, root: Path = GOLDEN_DIR) -> int:
    """A per-target tier's digests as its cells on a target recorded them (rlparity.golden.recorded_name),
    merged into data/golden/<tier>.json: the only way a per-target table is written (no CPU can compute it)."""
    by_tier: dict[str, dict[str, str]] = {}
    for res in results.read_all(results_dir) if (results_dir / "cells").is_dir() else []:
        if res.status != "passed" or res.cell.tier_scope != "per-target" or res.variant != "none":
            continue
        entries = golden.recorded(res.digests)
        if entries:
            by_tier.setdefault(res.cell.tier, {}).update(entries)
    if not by_tier:
        raise ConfigError(f"no passed per-target cell in {results_dir} recorded a golden digest: nothing to write")
    for tier, entries in sorted(by_tier.items()):
        path = golden.update(tier, entries, root)
        console.print(f"{tier}: wrote {len(entries)} digests recorded by its cells to {path}")
    return 0
