"""`rlparity selftest`: the negative controls. Each deliberately wrong kernel runs as a real cell and must
be caught by the comparison it targets; rl_kernel itself must pass; each tier's own controls (<tier>:<control>) must
fail the gate over that tier's cells. `--mutations`: every mutation of the mutated rl_kernel build must fail the
gate. Proves the harness can fail."""

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
    s.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="run only these controls (none: rl_kernel itself; <tier>:<control>: a tier's own control)",
    )
    s.add_argument("--matrix", default="quick", help="the matrix whose cells of a tier run its tier controls")
    s.add_argument("--target", default="cpu", help="run the controls on this target (cpu, or this host's GPU)")
    s.add_argument(
        "--mutations",
        action="store_true",
        help="mutation testing instead: the quick gate's representative CPU cells once per mutation of the "
        "mutated rl_kernel build; every mutation must fail the gate (exit 1 if one passes)",
    )
    s.set_defaults(func=cmd_selftest)


def cmd_selftest(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rlparity-selftest-"))
    if args.mutations:
        return cmd_mutations(out, target=args.target)
    only = tuple(args.only) if args.only else None
    controls = tuple(v for v in only if ":" not in v) if only else selftest.CONTROLS
    tier_only = tuple(v for v in only if ":" in v) if only else None
    unknown = [v for v in controls if v not in selftest.CONTROLS]
    if unknown:
        raise ConfigError(f"unknown control(s) {', '.join(unknown)} (known: {', '.join(selftest.CONTROLS)})")
    console.print(f"[bold]rlparity selftest[/]: {len(controls)} cells (the kernel and its negative controls) in {out}")

    def show(o: selftest.ControlOutcome) -> None:
        if not o.applicable:
            console.print(f"  {o.control:18} [yellow]not applicable here[/]: {o.reason}")
            return
        mark = "[green]caught[/]" if o.caught else "[red]MISSED[/]"
        if o.control == "none":
            mark = "[green]passes[/]" if o.caught else "[red]FAILS[/]"
            console.print(f"  {o.control:18} {mark}  ({o.status}) {', '.join(o.differed[:3])}")
            return
        console.print(
            f"  {o.control:18} {mark}  ({o.status}) caught by: {', '.join(o.caught_by) or 'nothing'}; "
            f"must be caught by: {', '.join(o.expected)}"
        )

    outcomes = selftest.run(out, controls, on_result=show, target=args.target) if controls else []
    if tier_only is None or tier_only:
        tiers = selftest.run_tier_controls(out / "tiers", tier_only, args.matrix, on_result=_show_gate)
        known = {o.name for o in tiers}
        missing = sorted(set(tier_only or ()) - known)
        if missing:
            raise ConfigError(f"unknown tier control(s) {', '.join(missing)} (known: {', '.join(sorted(known))})")
        outcomes = [*outcomes, *tiers]
    ok = all(o.ok for o in outcomes)
    unrun = sum(not o.applicable for o in outcomes)
    verdict = "[green]every control caught[/]" if ok else "[red]a control was missed[/]"
    console.print(f"selftest: {verdict}" + (f" ({unrun} not applicable on this host)" if unrun else ""))
    return 0 if ok else 1


def cmd_mutations(out: Path, **kw) -> int:
    """Each mutation must fail the gate; exit 1 if one passes (kw: a stand-in builder and names, for tests)."""
    console.print(f"[bold]rlparity selftest --mutations[/]: the mutated rl_kernel build, in {out}")

    outcomes = selftest.run_mutations(out, on_result=_show_gate, **kw)
    missed = [o.name for o in outcomes if not o.ok]
    if missed:
        console.print(f"selftest --mutations: [red]{len(missed)} mutation(s) passed the gate[/]: {', '.join(missed)}")
        return 1
    equivalent = sum(bool(o.equivalent) and not o.caught for o in outcomes)
    console.print(
        f"selftest --mutations: [green]every mutation caught[/] ({len(outcomes) - equivalent} caught"
        + (f", {equivalent} equivalent and guarded statically)" if equivalent else ")")
    )
    return 0


def _show_gate(o: selftest.GateOutcome) -> None:
    """One line per mutation or tier control: caught (the gate failed), missed, equivalent or not applicable."""
    if not o.applicable:
        console.print(f"  {o.name:24} [yellow]not applicable here[/]: {'; '.join(o.reasons)}")
        return
    if o.equivalent and not o.caught:
        mark = "[yellow]equivalent[/]" if o.ok else "[red]ERROR[/]"
        console.print(f"  {o.name:24} {mark}  (gate exit {o.code}) no output can show it; guard: {o.equivalent}")
        return
    mark = "[green]caught[/]" if o.caught else "[red]MISSED[/]"
    console.print(f"  {o.name:24} {mark}  (gate exit {o.code}) caught by: {', '.join(o.caught_by) or 'nothing'}")
