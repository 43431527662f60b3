"""Golden digests of every tier: one owner, one file per family (and per target), one writer.

Each entry is the SHA-256 (`rl_kernel.bitwise.digest`: dtype, shape and bytes) of one output or
gradient of one operator on one fixed input set (vocabulary x dtype). Where the tier lives is its
descriptor's (rl_kernel.tiers): the exact tier's digests are computed by the CPU build, the golden
reference, and every GPU build must give them (rl_kernel/exact/<family>/golden.json); a per-target tier
(fast) records them on each target (rl_kernel/fast/<family>/golden/<target>.json), and a target without a file
has nothing to check yet.

    python -m rl_kernel.contract.golden [--tier exact] [--device cpu|cuda]   # check: drifted keys, exit 1 if any
    python -m rl_kernel.contract.golden --update                # rewrite from the CPU build (the only writer)
    python -m rl_kernel.contract.golden --tier fast --device cuda --update   # record this target's digests

Update only after an intended change of the numerical contract, and say so in the commit. load(),
update() and diff() take any family name and table, so other digest owners can reuse them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from rl_kernel import inputs, tiers
from rl_kernel.bitwise import digest
from rl_kernel.contract.families import OpSpec, all_specs
from rl_kernel.spec import Case
from rl_kernel.tiers import Tier

DEFAULT_TIER = "exact"


def path_for(family: str, root: Path | None = None, tier: Tier | None = None, target: str | None = None) -> Path:
    return (tier or tiers.get(DEFAULT_TIER)).golden_path(family, target, root)


def load(family: str, root: Path | None = None, tier: Tier | None = None, target: str | None = None) -> dict[str, str]:
    path = path_for(family, root, tier, target)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; create it with: python -m rl_kernel.contract.golden --update")
    return json.loads(path.read_text())


def update(
    family: str, entries: dict[str, str], root: Path | None = None, tier: Tier | None = None, target: str | None = None
) -> Path:
    """Write a family's table (sorted keys, so a review sees a stable diff); returns the path."""
    path = path_for(family, root, tier, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return path


def diff(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """One line per key that differs between the table and what was computed (changed, new or gone)."""
    lines = [f"changed: {k}" for k in sorted(expected.keys() & actual.keys()) if expected[k] != actual[k]]
    lines += [f"not in the golden file: {k}" for k in sorted(actual.keys() - expected.keys())]
    lines += [f"no longer computed: {k}" for k in sorted(expected.keys() - actual.keys())]
    return lines


def families(tier: Tier | None = None) -> list[str]:
    """A tier's families with at least one operator in the golden digests, in name order."""
    return sorted({s.family for s in all_specs(tier or tiers.get(DEFAULT_TIER)) if s.in_golden})


def key(name: str, vocab: int, dtype: torch.dtype) -> str:
    return f"{name}/V{vocab}/{str(dtype).removeprefix('torch.')}"


def spec_digests(spec: OpSpec, case: Case, vocab: int, dtype: torch.dtype, name: str | None = None) -> dict[str, str]:
    """The digests of one operator on one case: its output and, if differentiable, its gradient (keyed by
    name, default the operator's)."""
    name = spec.name if name is None else name
    found = {key(name, vocab, dtype): digest(spec.output(case))}
    if spec.differentiable:
        found[key(f"grad_{name}", vocab, dtype)] = digest(spec.gradient(case))
    return found


def compute(family: str, device: str = "cpu", tier: Tier | None = None) -> dict[str, str]:
    """Every golden digest of a tier's family on device (the tier's dtypes only)."""
    tier = tier or tiers.get(DEFAULT_TIER)
    dtypes = [d for d in inputs.DTYPES if inputs.dtype_name(d) in tier.dtypes]
    found: dict[str, str] = {}
    cases: dict[tuple, Case] = {}
    for spec in (s for s in all_specs(tier) if s.family == family and s.in_golden):
        for name, golden_case in spec.golden_cases():
            for vocab in spec.golden_vocabs:
                for dtype in dtypes:
                    made = (golden_case, vocab, dtype)
                    if made not in cases:
                        cases[made] = golden_case(vocab, dtype).to(device)
                    found.update(spec_digests(spec, cases[made], vocab, dtype, name))
    return found


def check(family: str, device: str = "cpu", root: Path | None = None, tier: Tier | None = None) -> list[str]:
    """The drift of a family's digests on device against its golden file ([] when all match)."""
    tier = tier or tiers.get(DEFAULT_TIER)
    return diff(load(family, root, tier, target_for(tier, device)), compute(family, device, tier))


def target_for(tier: Tier, device: str) -> str | None:
    """The target a per-target tier's file is named after (None for an all-devices tier)."""
    return tiers.target_of(device) if tier.per_target else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--update", action="store_true", help="rewrite the golden files (the only writer)")
    ap.add_argument("--tier", default=DEFAULT_TIER, help=f"the tier (default {DEFAULT_TIER}; see rl_kernel.tiers)")
    ap.add_argument("--device", default="cpu", help="device to check (default cpu)")
    ap.add_argument("--family", action="append", help="only this family (repeatable; default all)")
    ap.add_argument(
        "--dir", type=Path, default=None, help="another directory of <family>/ golden files (default the tier's folder)"
    )
    args = ap.parse_args(argv)
    tier = tiers.get(args.tier)
    # An all-devices tier is written from its CPU reference; a per-target tier from the device it runs on.
    device = "cpu" if args.update and tier.cpu_reference else args.device
    target = target_for(tier, device)
    names = args.family or families(tier)
    drifted = 0
    for family in names:
        where = path_for(family, args.dir, tier, target)
        if args.update:
            found = compute(family, device, tier)
            old = load(family, args.dir, tier, target) if where.exists() else {}
            changes = diff(old, found)
            path = update(family, found, args.dir, tier, target)
            print(f"{family}: wrote {len(found)} digests to {path}; {len(changes)} changed")
            for line in changes:
                print(f"  {line}")
            continue
        if tier.per_target and not where.exists():
            print(f"{family}: no digests recorded for {target} ({where}): nothing to check on this target")
            continue
        problems = check(family, device, args.dir, tier)
        drifted += bool(problems)
        verdict = f"{len(problems)} drifted against {where}" if problems else f"all digests match {where}"
        print(f"{family}: {verdict}")
        for line in problems:
            print(f"  {line}")
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
