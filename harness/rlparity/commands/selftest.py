"""`rlparity selftest`: the negative controls. Each deliberately wrong kernel runs as a real cell and must
be caught (a bitwise mismatch); rl_kernel itself must pass. Proves the harness can fail."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rlparity import selftest
from rlparity.config import ConfigError
from rlparity.ui import console


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "selftest", help="negative controls: every deliberately wrong kernel must be caught (exit 0 only then)"
    )
    s.add_argument("--out", default=None, help="where the control cells write (default: a temp dir)")
    s.add_argument("--only", nargs="+", default=None, help="run only these controls (none: rl_kernel itself)")
    s.add_argument("--target", default="cpu", help="run the controls on this target (cpu, or this host's GPU)")
    s.set_defaults(func=cmd_selftest)


def cmd_selftest(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rlparity-selftest-"))
    controls = tuple(args.only) if args.only else selftest.CONTROLS
    unknown = [v for v in controls if v not in selftest.CONTROLS]
    if unknown:
        raise ConfigError(f"unknown control(s) {', '.join(unknown)} (known: {', '.join(selftest.CONTROLS)})")
    console.print(f"[bold]rlparity selftest[/]: {len(controls)} cells (the kernel and its negative controls) in {out}")

    def show(o: selftest.ControlOutcome) -> None:
        mark = "[green]caught[/]" if o.caught else "[red]MISSED[/]"
        if o.control == "none":
            mark = "[green]passes[/]" if o.caught else "[red]FAILS[/]"
        console.print(f"  {o.control:15} {mark}  ({o.status}) {', '.join(o.caught_by[:3])}")

    outcomes = selftest.run(out, controls, on_result=show, target=args.target)
    ok = all(o.caught for o in outcomes)
    console.print(f"selftest: {'[green]every control caught[/]' if ok else '[red]a control was missed[/]'}")
    return 0 if ok else 1
