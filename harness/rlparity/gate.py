"""The gate: one exit code from all cell results (documented in README).

0 every required cell passed; 1 a bitwise mismatch (in a required cell, or two required cells that must
agree gave different digests); 2 a required cell errored (crash, timeout, OOM, lost container), or with
--strict could not run; 3 bad configuration (raised before any cell runs, or found by a cell: an engine's import
string that does not resolve, an engine's return of the wrong keys or shape; CellResult.config_error, which wins
over every other outcome since nothing such a cell compared means anything); 4 an environment problem: no
Docker engine, an image or device missing, or fewer cells ran than --min-ran asks (a run in which nothing
ran is not a pass). Informational cells never change the exit code.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from rlparity.results import CellResult

OK, MISMATCH, ERROR, CONFIG, ENVIRONMENT = 0, 1, 2, 3, 4
RAN = ("passed", "failed")  # a cell that ran to a verdict


@dataclass(frozen=True)
class Verdict:
    code: int
    reasons: tuple[str, ...]


def digest_disagreements(all_results: list[CellResult]) -> list[str]:
    """Cells that did the same work must produce the same digests: across env profiles and placements
    always, and across targets too for an all-devices tier (a per-target tier's, fast's, within a target)."""
    groups: dict[tuple, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in all_results:
        if r.status not in ("passed", "failed") or not r.cell.required or r.variant != "none":
            continue
        scope = () if r.cell.tier_scope == "all-devices" else (r.cell.target,)
        for name, dig in r.digests.items():
            groups[(r.cell.tier, r.cell.dtype, r.cell.seed, name, *scope)][dig].append(r.cell.id)
    out = []
    for (tier, dtype, _seed, name, *scope), by_digest in sorted(groups.items()):
        if len(by_digest) > 1:
            parts = "; ".join(f"{d[:12]}: {', '.join(ids)}" for d, ids in sorted(by_digest.items()))
            where = f" on {scope[0]}" if scope else ""
            out.append(f"{tier} {dtype} {name}{where} differs between cells: {parts}")
    return out


def too_few_ran(all_results: list[CellResult], min_ran: int) -> list[str]:
    """Why the run proves too little: fewer than `min_ran` cells ran, with the skipped ones grouped by reason."""
    ran = sum(r.status in RAN for r in all_results)
    if ran >= min_ran:
        return []
    skipped: dict[str, list[str]] = defaultdict(list)
    for r in all_results:
        if r.status == "skipped":
            skipped[r.reason].append(r.cell.id)
    out = [f"only {ran} cell(s) ran, --min-ran asks for {min_ran}: this host ran too little to gate on"]
    for reason, ids in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        out.append(f"skipped {len(ids)} cell(s) ({shown}): {reason}")
    return out


def decide(all_results: list[CellResult], strict: bool = False, min_ran: int = 1) -> Verdict:
    config = [f"{r.cell.id}: {r.config_error}" for r in all_results if r.config_error]
    if config:  # informational cells too: a bad matrix entry is the user's to fix wherever it is
        return Verdict(CONFIG, tuple(config))
    required = [r for r in all_results if r.cell.required]
    mismatched = [f"{r.cell.id}: {r.reason}" for r in required if r.status == "failed"]
    mismatched += digest_disagreements(all_results)
    errored = [f"{r.cell.id}: {r.reason}" for r in required if r.status == "error"]
    if strict:
        errored += [
            f"{r.cell.id}: required but not run (--strict): {r.reason}" for r in required if r.status == "skipped"
        ]
    if mismatched:
        return Verdict(MISMATCH, tuple(mismatched + errored))
    if errored:
        return Verdict(ERROR, tuple(errored))
    too_few = too_few_ran(all_results, min_ran)
    if too_few:
        return Verdict(ENVIRONMENT, tuple(too_few))
    return Verdict(OK, ())
