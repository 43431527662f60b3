"""`rlparity compare A B`: a bitwise verdict on two saved tensors or two result dirs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from rlparity.cells import AXES
from rlparity.compare import DIFFER, EQUAL, ONLY_A, ONLY_B, CellDelta, DirComparison, compare_dirs, compare_tensors
from rlparity.config import ConfigError
from rlparity.ui import console

_STYLE = {EQUAL: "green", DIFFER: "bold red", ONLY_A: "cyan", ONLY_B: "cyan"}  # the rest: yellow


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("compare", help="bitwise verdict on two saved tensors or two result dirs")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="AXIS",
        help=f"result dirs: match cells without this axis (repeatable; one of {', '.join(AXES)}); "
        "image is ignored anyway when the two runs used different images",
    )
    c.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    a, b = Path(args.a), Path(args.b)
    if a.is_dir() and b.is_dir():
        return _dirs(a, b, args.ignore)
    if a.is_dir() or b.is_dir():
        raise ConfigError(f"compare takes two tensors or two result dirs, not a mix: {a}, {b}")
    if args.ignore:
        raise ConfigError("--ignore applies to two result dirs, not to tensors")
    d = compare_tensors(a, b)
    console.print(("[green]" if d.equal else "[red]") + d.summary + "[/]")
    if not d.equal:
        console.print(json.dumps(d.diff, default=str))
    elif d.problem:
        console.print(f"[red]{d.problem}[/]")
    return d.exit_code


def _dirs(a: Path, b: Path, ignore: list[str]) -> int:
    comparison = compare_dirs(a, b, ignore)
    console.print(_table(comparison, a, b))
    console.print(summary_line(comparison))
    if comparison.problem:
        console.print(f"[red]{comparison.problem}[/]")
    return comparison.exit_code


def _table(comparison: DirComparison, a: Path, b: Path) -> Table:
    cell = "cell" if not comparison.ignored else f"cell (without {', '.join(comparison.ignored)})"
    table = Table(title=f"A {a} vs B {b}")
    for col in (cell, "status A", "status B", "verdict"):
        table.add_column(col)
    for d in comparison.cells:
        table.add_row(d.key, d.status_a or "-", d.status_b or "-", _verdict(d))
    return table


def _verdict(d: CellDelta) -> str:
    style = _STYLE.get(d.verdict, "yellow")
    return f"[{style}]{d.verdict}[/]" + (f": {d.detail}" if d.detail else "")


def summary_line(comparison: DirComparison) -> str:
    """Counts per verdict, then what the cells were matched on."""
    counts = ", ".join(f"{n} {v}" for v, n in comparison.counts().items() if n or v in (EQUAL, DIFFER))
    if not comparison.ignored:
        return f"{counts}; matched on the full cell id"
    why = ""
    if "image" in comparison.ignored and comparison.images_a != comparison.images_b:
        why = (
            f" (the runs used different images: A {', '.join(comparison.images_a)}; B {', '.join(comparison.images_b)})"
        )
    return f"{counts}; ignored axes: {', '.join(comparison.ignored)}{why}"
