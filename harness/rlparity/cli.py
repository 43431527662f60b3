"""rlparity: run the bitwise matrix and gate on it; compare results; print the fingerprint; self-test.

Exit codes (README): 0 every required cell passed; 1 a bitwise mismatch; 2 a cell errored (or, with
--strict, a required cell could not run); 3 bad configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlparity import collect, gate, results
from rlparity.config import ConfigError
from rlparity.matrix import load_matrix, select

# Piped output (CI logs) gets a wide table instead of rich's 80-column default.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
STYLE = {"passed": "green", "failed": "bold red", "error": "bold magenta", "skipped": "yellow"}


def _backend(name: str):
    if name == "local":
        from rlparity.backend import LocalBackend

        return LocalBackend()
    if name == "docker":
        try:
            from rlparity.docker_backend import DockerBackend
        except ImportError as exc:
            raise ConfigError(f"the docker backend is not available: {exc}") from exc
        return DockerBackend()
    raise ConfigError(f"unknown backend {name!r} (local, docker)")


# ---- run ----------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    backend = _backend(args.backend)
    matrix = load_matrix(args.matrix, backend=backend.name)
    cells = select(matrix.cells, args.filter)
    if not cells:
        raise ConfigError(f"--filter {args.filter!r} selects no cell of matrix {matrix.name}")
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout must be > 0 seconds, not {args.timeout:g}")
    from rlparity.variants import VARIANTS

    if args.variant not in VARIANTS:
        raise ConfigError(f"unknown --variant {args.variant!r} (known: {', '.join(VARIANTS)})")
    if args.timeout:
        cells = [dataclasses.replace(c, timeout_s=args.timeout) for c in cells]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra_env = {}
    if args.variant != "none":
        from rlparity.variants import variant_env

        extra_env = variant_env(args.variant)
    console.print(f"[bold]rlparity[/] matrix [cyan]{matrix.name}[/] ({matrix.path}): {len(cells)} cells, "
                  f"backend {backend.name}, {args.jobs} job(s), results in {out}")  # fmt: skip
    if hasattr(backend, "prepare"):  # docker: images built (and pinned, with --strict) before any cell
        backend.prepare(cells, args.strict)
    inventory = backend.probe()
    from rlparity.runner import run_cells

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
            variant=args.variant,
            extra_env=extra_env,
            on_start=on_start,
            on_result=on_result,
        )
    junit = collect.merge(all_results, out)
    verdict = gate.decide(all_results, strict=args.strict)
    _write_summary(out, matrix.name, backend.name, args, all_results, verdict)
    print_table(all_results, verbose=args.verbose)
    for reason in verdict.reasons:
        console.print(f"  [red]-[/] {reason}")
    label = {0: "[green]PASS[/]", 1: "[red]MISMATCH[/]", 2: "[magenta]ERROR[/]"}[verdict.code]
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


def _write_summary(out: Path, matrix: str, backend: str, args, all_results, verdict: gate.Verdict) -> None:
    summary = {
        "matrix": matrix,
        "backend": backend,
        "strict": args.strict,
        "filter": args.filter,
        "variant": args.variant,
        "exit_code": verdict.code,
        "reasons": list(verdict.reasons),
        "counts": dict(Counter(r.status for r in all_results)),
        "cells": {r.cell.id: r.status for r in all_results},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def print_table(all_results: list[results.CellResult], verbose: bool = False) -> None:
    table = Table(title="rlparity cells", show_lines=False)
    for col in ("cell (target/profile/placement/dtype/shapes/tier)", "image", "req", "status", "mismatches",
                "max ulp", "stock drift", "time s"):  # fmt: skip
        table.add_column(col, justify="right" if col in ("mismatches", "max ulp", "time s") else "left")
    skipped: Counter[str] = Counter()
    for r in all_results:
        if r.status == "skipped" and not verbose:
            skipped[r.reason] += 1
            continue
        c = r.cell
        differ, total = r.stock_differ
        table.add_row(
            c.id.split("/", 1)[1], c.image,
            "yes" if c.required else "info",
            f"[{STYLE[r.status]}]{r.status}[/]",
            str(r.mismatches) if r.status in ("passed", "failed") else "-",
            str(r.max_ulp) if r.status == "failed" else "-",
            f"{differ}/{total}" if total else "-",
            f"{r.timings.get('wall_s', 0):.1f}",
        )  # fmt: skip
    console.print(table)
    for reason, n in skipped.most_common():
        console.print(f"  [yellow]skipped[/] {n} cell(s): {reason}")
    counts = Counter(r.status for r in all_results)
    console.print("  " + ", ".join(f"{counts[s]} {s}" for s in results.STATUSES))


# ---- compare / env / selftest / golden ---------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> int:
    from rlparity.compare import compare_dirs, compare_tensors

    a, b = Path(args.a), Path(args.b)
    if a.is_dir() and b.is_dir():
        deltas = compare_dirs(a, b)
        table = Table(title=f"{a} vs {b}")
        for col in ("cell", "status A", "status B", "verdict"):
            table.add_column(col)
        for d in deltas:
            verdict = "[green]equal[/]" if d.equal else f"[red]differ[/] {', '.join(d.differing)}"
            table.add_row(d.cell, d.status_a, d.status_b, verdict)
        console.print(table)
        return 0 if all(d.equal for d in deltas) else 1
    if a.is_dir() or b.is_dir():
        raise ConfigError(f"compare takes two tensors or two result dirs, not a mix: {a}, {b}")
    d = compare_tensors(a, b)
    console.print(("[green]" if d.equal else "[red]") + d.summary() + "[/]")
    if not d.equal:
        console.print(json.dumps(d.to_dict(), default=str))
    return 0 if d.equal else 1


def cmd_env(args: argparse.Namespace) -> int:
    from rlparity import fingerprint

    fp = fingerprint.collect()
    print(json.dumps({"hash": fingerprint.fingerprint_hash(fp), **fp}, indent=1, default=str))
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    from rlparity import selftest

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rlparity-selftest-"))
    variants = tuple(args.only) if args.only else ("none", *selftest.CONTROLS)
    unknown = [v for v in variants if v not in ("none", *selftest.CONTROLS)]
    if unknown:
        raise ConfigError(f"unknown variant(s) {', '.join(unknown)} (known: none, {', '.join(selftest.CONTROLS)})")
    console.print(f"[bold]rlparity selftest[/]: {len(variants)} cells (the kernel and its negative controls) in {out}")

    def show(o) -> None:
        mark = "[green]caught[/]" if o.caught else "[red]MISSED[/]"
        if o.variant == "none":
            mark = "[green]passes[/]" if o.caught else "[red]FAILS[/]"
        console.print(f"  {o.variant:15} {mark}  ({o.status}) {', '.join(o.caught_by[:3])}")

    outcomes = selftest.run(out, variants, on_result=show, target=args.target)
    ok = all(o.caught for o in outcomes)
    console.print(f"selftest: {'[green]every control caught[/]' if ok else '[red]a control was missed[/]'}")
    return 0 if ok else 1


def cmd_golden(args: argparse.Namespace) -> int:
    from rlparity import golden
    from rlparity.matrix import load_axes

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


def cmd_images(args: argparse.Namespace) -> int:
    from rlparity import images
    from rlparity.matrix import load_images

    if args.action == "list":
        table = Table(title="docker/images.toml")
        for col in ("name", "flavour", "reference", "targets"):
            table.add_column(col)
        for img in load_images().values():
            table.add_row(img.name, img.flavour, img.reference, " ".join(img.targets))
        console.print(table)
        return 0
    import docker

    try:
        client = docker.from_env()
    except Exception as exc:
        raise ConfigError(f"no Docker engine reachable: {exc}") from exc
    if args.action == "lock":
        outcomes = images.lock(client, names=args.names or None)
        for o in outcomes:
            mark = f"[green]{o.digest}[/]" if o.digest else f"[yellow]not resolved[/]: {o.error}"
            console.print(f"  {o.name:18} {o.reference}  {mark}")
        return 0 if all(o.digest or "built locally" in o.error for o in outcomes) else 2
    if not args.names:
        raise ConfigError("images build needs at least one image name")
    extra = dict(kv.split("=", 1) for kv in args.build_arg or [])
    for name in args.names:
        console.print(f"building {images.project_tag(name)} ...")
        console.print(f"  {images.build(client, name, extra)}")
    return 0


# ---- argument parsing -----------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """Bad arguments are bad configuration: exit 3, not argparse's 2 (which means a cell errored)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(gate.CONFIG, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rlparity", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a matrix of bitwise cells and gate on the outcome")
    r.add_argument("--matrix", default="quick", help="a name under harness/matrices or a path to a TOML file")
    r.add_argument("--backend", default="local", choices=("local", "docker"))
    r.add_argument("--filter", default=None, help="e.g. 'target=cpu dtype=bf16|fp16 placement!=split' or a glob")
    r.add_argument("--jobs", type=int, default=1, help="cells run at once (one GPU set each)")
    r.add_argument("--strict", action="store_true", help="a required cell that cannot run here fails the gate")
    r.add_argument("--out", default="results", help="results directory (default: results/)")
    r.add_argument("--resume", action="store_true", help="skip cells with a finished result in --out")
    r.add_argument("--timeout", type=float, default=None, help="per-cell timeout in seconds (overrides the matrix)")
    r.add_argument("--verbose", action="store_true", help="list skipped cells one by one")
    r.add_argument(
        "--variant", default="none", help="run a negative control instead of rl_kernel (to test the harness itself)"
    )
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("compare", help="bitwise verdict on two saved tensors or two result dirs")
    c.add_argument("a")
    c.add_argument("b")
    c.set_defaults(func=cmd_compare)

    e = sub.add_parser("env", help="print this environment's fingerprint (JSON)")
    e.set_defaults(func=cmd_env)

    s = sub.add_parser("selftest", help="every negative control must be caught (exit 0 only then)")
    s.add_argument("--out", default=None, help="where the control cells write (default: a temp dir)")
    s.add_argument("--only", nargs="+", default=None, help="run only these variants")
    s.add_argument("--target", default="cpu", help="run the controls on this target (cpu, or this host's GPU)")
    s.set_defaults(func=cmd_selftest)

    g = sub.add_parser("golden", help="check (or --update) the exact tier's golden digests on this machine")
    g.add_argument("--update", action="store_true")
    g.add_argument("--shapes", nargs="+", default=["smoke", "quick", "selftest"])
    g.add_argument("--dtypes", nargs="+", default=["fp32", "bf16", "fp16"], choices=["fp32", "bf16", "fp16"])
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(func=cmd_golden)

    i = sub.add_parser("images", help="list docker/images.toml, lock tags to digests, build rlparity:<name>")
    i.add_argument("action", choices=("list", "lock", "build"))
    i.add_argument("names", nargs="*", help="image names (default for lock: all)")
    i.add_argument("--build-arg", action="append", help="KEY=VALUE passed to the image build")
    i.set_defaults(func=cmd_images)

    from rlparity import report

    report.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "jobs", 1) < 1:
        console.print("[red]error:[/] --jobs must be >= 1")
        return gate.CONFIG
    try:
        return args.func(args)
    except ConfigError as exc:
        console.print(f"[red]configuration error:[/] {exc}")
        return gate.CONFIG
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: finished cells are saved; rerun with --resume")
        return gate.ERROR


if __name__ == "__main__":
    sys.exit(main())
