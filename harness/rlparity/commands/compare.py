"""`rlparity compare A B`: a bitwise verdict on two saved tensors or two result dirs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from rlparity.compare import compare_dirs, compare_tensors
from rlparity.config import ConfigError
from rlparity.ui import console


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("compare", help="bitwise verdict on two saved tensors or two result dirs")
    c.add_argument("a")
    c.add_argument("b")
    c.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    a, b = Path(args.a), Path(args.b)
    if a.is_dir() and b.is_dir():
        return _dirs(a, b)
    if a.is_dir() or b.is_dir():
        raise ConfigError(f"compare takes two tensors or two result dirs, not a mix: {a}, {b}")
    d = compare_tensors(a, b)
    console.print(("[green]" if d.equal else "[red]") + d.summary + "[/]")
    if not d.equal:
        console.print(json.dumps(d.diff, default=str))
    return 0 if d.equal else 1


def _dirs(a: Path, b: Path) -> int:
    deltas = compare_dirs(a, b)
    table = Table(title=f"{a} vs {b}")
    for col in ("cell", "status A", "status B", "verdict"):
        table.add_column(col)
    for d in deltas:
        verdict = "[green]equal[/]" if d.equal else f"[red]differ[/] {', '.join(d.differing)}"
        table.add_row(d.cell, d.status_a, d.status_b, verdict)
    console.print(table)
    return 0 if all(d.equal for d in deltas) else 1
