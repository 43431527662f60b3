"""`rlparity golden [--update]`: check, or rewrite, the exact tier's committed golden digests.

The one update command for harness/golden/: rlparity.golden owns the table; the digests are computed on
the cell side (`python -m rlparity.cell.golden`, a subprocess)."""

from __future__ import annotations

import argparse

from rlparity import golden
from rlparity.config import ConfigError
from rlparity.matrix import load_axes
from rlparity.ui import console


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("golden", help="check (or --update) the exact tier's golden digests on this machine")
    g.add_argument("--update", action="store_true")
    g.add_argument("--shapes", nargs="+", default=["smoke", "quick", "selftest"])
    g.add_argument("--dtypes", nargs="+", default=["fp32", "bf16", "fp16"], choices=["fp32", "bf16", "fp16"])
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(func=cmd_golden)


def cmd_golden(args: argparse.Namespace) -> int:
    axes = load_axes()
    unknown = [s for s in args.shapes if s not in axes.shapes]
    if unknown:
        raise ConfigError(f"unknown shape set(s) {', '.join(unknown)} (known: {', '.join(axes.shapes)})")
    entries = golden.compute([s for name in args.shapes for s in axes.shapes[name]], args.dtypes, args.seed)
    if args.update:
        path = golden.update("exact", entries)
        console.print(f"wrote {len(entries)} digests to {path}")
        return 0
    table = golden.load("exact")
    wrong = {k: v for k, v in entries.items() if table.get(k) != v}
    for k in wrong:
        console.print(f"  [red]differs[/] {k}")
    console.print(f"{len(entries) - len(wrong)}/{len(entries)} digests equal the committed ones")
    return 1 if wrong else 0
