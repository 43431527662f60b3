"""`rlparity run`: run a matrix of bitwise cells (local processes or docker containers) and gate on them."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlparity import collect, gate, results
from rlparity.applicability import skip_reason
from rlparity.backends.base import Backend
from rlparity.cells import Cell
from rlparity.config import ConfigError, EnvError
from rlparity.inventory import Inventory
from rlparity.matrix import check_workload_params, load_axes, load_matrix
from rlparity.runner import run_cells
from rlparity.select import select
from rlparity.selftest import CONTROLS
from rlparity.targets import for_targets, inventory_file, load_inventory, parse_targets, resolve_targets
from rlparity.ui import STYLE, console


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="run a matrix of bitwise cells and gate on the outcome")
    r.add_argument("--matrix", default="quick", help="a matrix name (quick, nightly) or a path to a TOML file")
    r.add_argument("--backend", default="local", choices=("local", "docker"))
    r.add_argument("--filter", default=None, help="e.g. 'target=cpu dtype=bf16|fp16 placement!=split' or a glob")
    r.add_argument("--targets", default="auto", help="auto (cpu + this host's GPUs), all, or e.g. 'cpu,gfx942'")
    r.add_argument("--inventory", default=None, help="a device inventory JSON instead of probing ($RLPARITY_INVENTORY)")
    r.add_argument("--list", action="store_true", help="print the selected cells and whether they run here; run none")
    r.add_argument("--jobs", type=int, default=1, help="cells run at once (one GPU set each)")
    r.add_argument("--strict", action="store_true", help="a required cell of the targets that cannot run fails")
    r.add_argument("--min-ran", type=int, default=1, help="fewer cells ran than this fails the gate (exit 4)")
    r.add_argument("--out", default="results", help="results directory (default: results/)")
    r.add_argument("--resume", action="store_true", help="skip cells with a finished result in --out")
    r.add_argument("--timeout", type=float, default=None, help="per-cell timeout in seconds (overrides the matrix)")
    r.add_argument("--verbose", action="store_true", help="list skipped cells one by one")
    r.add_argument(
        "--control", "--variant", dest="control", default="none",
        help="run a negative control instead of rl_kernel, to test the harness itself (--variant: deprecated)",
    )  # fmt: skip
    r.set_defaults(func=cmd_run)


def _backend(name: str) -> Backend:
    if name == "local":
        from rlparity.backends.local import LocalBackend

        return LocalBackend()
    if name == "docker":
        try:
            from rlparity.backends.docker import DockerBackend
        except ImportError as exc:
            raise EnvError(f"the docker backend is not available (the docker SDK): {exc}") from exc
        return DockerBackend()
    raise ConfigError(f"unknown backend {name!r} (local, docker)")


# ---- run ----------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    backend = _backend(args.backend)
    axes = load_axes()
    targets_spec = parse_targets(args.targets, axes)
    matrix = load_matrix(args.matrix, axes=axes, backend=backend.name)
    cells = select(matrix.cells, args.filter)
    if not cells:
        raise ConfigError(f"--filter {args.filter!r} selects no cell of matrix {matrix.name}")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout must be > 0 seconds, not {args.timeout:g}")
    if args.control not in CONTROLS:
        raise ConfigError(f"unknown --control {args.control!r} (known: {', '.join(CONTROLS)})")
    if args.min_ran < 0:
        raise ConfigError(f"--min-ran must be >= 0, not {args.min_ran}")
    if args.timeout:
        cells = [dataclasses.replace(c, timeout_s=args.timeout) for c in cells]
    inv_path = inventory_file(args.inventory)
    synthetic = load_inventory(inv_path) if inv_path else None
    if not (args.list and synthetic is not None):  # docker: images built (and pinned, with --strict) first
        backend.prepare(cells, args.strict)
    inventory = synthetic if synthetic is not None else backend.probe()
    offered = {n: w.get("params", []) for n, w in inventory.workloads.items()} if inventory.workloads else None
    check_workload_params(matrix.axes or axes, offered)  # the workloads' keys, now that the image said them
    targets = resolve_targets(targets_spec, axes, inventory)
    host_cells = for_targets(cells, targets)
    if not host_cells:
        whose = "this host's targets" if targets_spec == "auto" else "--targets"
        raise EnvError(
            f"none of the {len(cells)} cell(s) selected is for {whose} ({', '.join(targets or ())}); "
            "`--targets all` runs them anyway (each is skipped with its reason), `--list --targets all` shows them"
        )
    cells = host_cells
    if args.list:
        print_plan(cells, inventory, matrix.name, targets)
        return gate.OK
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra_env = backend.control_env(args.control)
    where = f"targets {', '.join(targets)}" if targets else "every target"
    source = f", inventory {inv_path}" if inv_path else ""
    console.print(f"[bold]rlparity[/] matrix [cyan]{matrix.name}[/] ({matrix.path}): {len(cells)} cells "
                  f"({where}{source}), backend {backend.name}, {args.jobs} job(s), results in {out}")  # fmt: skip

    with _progress() as progress:
        task = progress.add_task("cells", total=len(cells))

        def on_result(res: results.CellResult) -> None:
            progress.advance(task)
            if res.status != "skipped" or args.verbose:
                progress.console.print(f"  [{STYLE[res.status]}]{res.status.upper():7}[/] {res.cell.id}  {res.reason}")

        def on_start(cell) -> None:
            progress.update(task, description=cell.id)

        all_results = run_cells(
            cells,
            backend,
            out,
            inventory,
            jobs=args.jobs,
            resume=args.resume,
            control=args.control,
            extra_env=extra_env,
            on_start=on_start,
            on_result=on_result,
        )
    junit = collect.merge(all_results, out)
    verdict = gate.decide(all_results, strict=args.strict, min_ran=args.min_ran)
    _write_summary(out, matrix.name, backend.name, args, all_results, verdict, targets)
    print_table(all_results, verbose=args.verbose)
    for reason in verdict.reasons:
        console.print(f"  [red]-[/] {reason}")
    label = {0: "[green]PASS[/]", 1: "[red]MISMATCH[/]", 2: "[magenta]ERROR[/]", 3: "[red]CONFIGURATION[/]",
             4: "[red]TOO FEW RAN[/]"}[verdict.code]  # fmt: skip
    console.print(f"gate: {label} (exit {verdict.code}); junit: {junit}")
    return verdict.code


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def print_plan(cells: list[Cell], inventory: Inventory, matrix: str, targets: tuple[str, ...] | None) -> None:
    """--list: every selected cell, required or informational, and whether it runs here (or why not)."""
    table = Table(title=f"rlparity {matrix}: {len(cells)} cell(s), targets {', '.join(targets or ('all',))}")
    table.add_column("cell", no_wrap=True)  # ids stay whole: copied into --filter
    table.add_column("req")
    table.add_column("here")
    runs = 0
    for c in cells:
        reason = skip_reason(c, inventory)
        runs += reason is None
        table.add_row(c.id, "yes" if c.required else "info", "[green]runs here[/]" if reason is None else reason)
    console.print(table)
    console.print(f"  {runs} of {len(cells)} cell(s) run here; nothing was run (--list)")


def _write_summary(
    out: Path, matrix: str, backend: str, args, all_results, verdict: gate.Verdict, targets: tuple[str, ...] | None
) -> None:
    summary = {
        "matrix": matrix,
        "backend": backend,
        "targets": list(targets) if targets is not None else "all",
        "min_ran": args.min_ran,
        "strict": args.strict,
        "filter": args.filter,
        "variant": args.control,  # the field keeps its name: reports and baselines read it
        "exit_code": verdict.code,
        "reasons": list(verdict.reasons),
        "counts": dict(Counter(r.status for r in all_results)),
        "cells": {r.cell.id: r.status for r in all_results},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def print_table(all_results: list[results.CellResult], verbose: bool = False) -> None:
    table = Table(title="rlparity cells", show_lines=False)
    numeric = ("elem mismatches", "digest mismatches", "max ulp", "time s")
    for col in ("cell (target/profile/placement/dtype/shapes/tier)", "image", "req", "status", *numeric[:3],
                "stock drift", "time s"):  # fmt: skip
        table.add_column(col, justify="right" if col in numeric else "left")
    skipped: Counter[str] = Counter()
    for r in all_results:
        if r.status == "skipped" and not verbose:
            skipped[r.reason] += 1
            continue
        c, ran = r.cell, r.status in gate.RAN
        differ, total = r.stock_differ
        table.add_row(
            c.id.split("/", 1)[1], c.image,
            "yes" if c.required else "info",
            f"[{STYLE[r.status]}]{r.status}[/]",
            *((str(r.element_mismatches), str(r.digest_mismatches)) if ran else ("-", "-")),
            str(r.max_ulp) if r.status == "failed" else "-",
            f"{differ}/{total}" if total else "-",
            f"{r.timings.get('wall_s', 0):.1f}",
        )  # fmt: skip
    console.print(table)
    for reason, n in skipped.most_common():
        console.print(f"  [yellow]skipped[/] {n} cell(s): {reason}")
    counts = Counter(r.status for r in all_results)
    console.print("  " + ", ".join(f"{counts[s]} {s}" for s in results.STATUSES))
