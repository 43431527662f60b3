"""`rlparity report RESULTS... [--baseline DIR]... [--history DIR...]`: arguments, exit codes and console output.

The report itself is rlparity.report; its rules are in docs/harness.md. Exit code: 0; 3 for bad input
(a ConfigError: not a results dir, a dir given twice, a --history dir that is a RESULTS dir, a bad
threshold, an unwritable --out); with --fail-on-regression 1 when there is a regression.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from rlparity import gate
from rlparity.config import ConfigError
from rlparity.report.history import trend
from rlparity.report.model import DEFAULT_THRESHOLD, MIN_SECONDS, TONIGHT, Entry, History, Night, load, load_nights
from rlparity.report.output import write
from rlparity.report.rules import build
from rlparity.report.sections import summary_lines

DEFAULT_OUT = "report"
DESCRIPTION = "Merge results dirs, compare them with a baseline, write report.md and report.html (docs/harness.md)."


def _threshold(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"--perf-threshold must be a percentage > 0, not {text!r}")
    return v


def _min_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"--perf-min-seconds must be a number of seconds >= 0, not {text!r}")
    return v


def cmd_report(args: argparse.Namespace) -> int:
    # the thresholds are checked before any dir is read: a typo fails fast
    threshold, min_s = _threshold(str(args.perf_threshold)), _min_seconds(str(args.perf_min_seconds))
    entries, sources, notes = load([Path(d) for d in args.results])
    baseline = base_sources = None
    if args.baseline:
        baseline, base_sources, base_notes = load([Path(d) for d in args.baseline])
        notes += [f"baseline: {n}" for n in base_notes]
    history = _history(args.history, args.results, entries)
    rep = build(entries, baseline, threshold, min_s, sources, base_sources, notes, history)
    md, page = write(rep, Path(args.out))
    print(f"report: {md} ({md.stat().st_size} bytes), {page} ({page.stat().st_size} bytes)")
    for line in summary_lines(rep):
        print(f"  {line}")
    for r in rep.regressions[:20]:
        print(f"  - {r}")
    if args.fail_on_regression and rep.regressions:
        print("  --fail-on-regression: exit 1")
        return 1
    return 0


def _history(dirs: list[str] | None, results_dirs: list[str], tonight: list[Entry]) -> History | None:
    """--history: the earlier nights (read and checked by load_nights) with tonight's entries, last."""
    if not dirs:
        return None
    nights = load_nights([Path(d) for d in dirs], [Path(d) for d in results_dirs])
    return trend(nights, Night(TONIGHT, tuple(tonight)))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand (func=cmd_report) to the rlparity parser's subparsers."""
    r = subparsers.add_parser(
        "report",
        help="nightly regression report (report.md, report.html) from results dirs, against a baseline",
        description=DESCRIPTION,
    )
    r.add_argument("results", nargs="+", metavar="RESULTS", help="results dir(s) of `rlparity run`; merged")
    r.add_argument(
        "--baseline", action="append", metavar="DIR", help="results dir to compare against (repeat to merge several)"
    )
    r.add_argument(
        "--history", action="extend", nargs="+", metavar="DIR",
        help="earlier nights' results dirs: a trend per target (ordered by run time)",
    )  # fmt: skip
    r.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"where report.md and report.html go (default: {DEFAULT_OUT}/)",
    )
    r.add_argument("--fail-on-regression", action="store_true", help="exit 1 on a required new failure or digest drift")
    r.add_argument(
        "--perf-threshold", default=DEFAULT_THRESHOLD, metavar="PCT",
        help=f"report timings that moved by more than PCT percent, either way (default: {DEFAULT_THRESHOLD:g})",
    )  # fmt: skip
    r.add_argument(
        "--perf-min-seconds", default=MIN_SECONDS, metavar="S",
        help=f"ignore timings under S seconds in both runs (default: {MIN_SECONDS:g})",
    )  # fmt: skip
    r.set_defaults(func=cmd_report)


class _Parser(argparse.ArgumentParser):
    """Bad arguments are bad configuration: exit 3 (as rlparity's own parser)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(gate.CONFIG, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """`rlparity report ...` on its own (`python -m rlparity.report`): argv without the word `report`."""
    p = _Parser(prog="rlparity")
    sub = p.add_subparsers(dest="command")
    register(sub)
    args = p.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return gate.CONFIG
