"""Golden digests of the `exact` tier: one owner, one file per family, one writer.

Each entry is the SHA-256 (`rl_kernel.bitwise.digest`: dtype, shape and bytes) of one output or
gradient of one operator on one fixed input set (vocabulary x dtype), computed by the CPU build, the
golden reference; the GPU build must give the same digests. Files: rl_kernel/golden/exact/<family>.json,
shipped with the package.

    python -m rl_kernel.golden [--device cpu|cuda]   # check: lists drifted keys, exit 1 if any
    python -m rl_kernel.golden --update              # rewrite from the CPU build (the only writer)

Update only after an intended change of the numerical contract, and say so in the commit. load(),
update() and diff() take any family name and table, so other digest owners can reuse them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from rl_kernel import inputs
from rl_kernel.bitwise import digest
from rl_kernel.ops import OpSpec, all_specs
from rl_kernel.ops.spec import Case

TIER = "exact"
GOLDEN_DIR = Path(__file__).parent / "golden" / TIER


def path_for(family: str, root: Path | None = None) -> Path:
    return (GOLDEN_DIR if root is None else Path(root)) / f"{family}.json"


def load(family: str, root: Path | None = None) -> dict[str, str]:
    path = path_for(family, root)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; create it with: python -m rl_kernel.golden --update")
    return json.loads(path.read_text())


def update(family: str, entries: dict[str, str], root: Path | None = None) -> Path:
    """Write a family's table (sorted keys, so a review sees a stable diff); returns the path."""
    path = path_for(family, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return path


def diff(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """One line per key that differs between the table and what was computed (changed, new or gone)."""
    lines = [f"changed: {k}" for k in sorted(expected.keys() & actual.keys()) if expected[k] != actual[k]]
    lines += [f"not in the golden file: {k}" for k in sorted(actual.keys() - expected.keys())]
    lines += [f"no longer computed: {k}" for k in sorted(expected.keys() - actual.keys())]
    return lines


def families() -> list[str]:
    """Families with at least one operator in the golden digests, in name order."""
    return sorted({s.family for s in all_specs() if s.in_golden})


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


def compute(family: str, device: str = "cpu") -> dict[str, str]:
    """Every golden digest of a family on device."""
    found: dict[str, str] = {}
    cases: dict[tuple, Case] = {}
    for spec in (s for s in all_specs() if s.family == family and s.in_golden):
        for name, golden_case in spec.golden_cases():
            for vocab in spec.golden_vocabs:
                for dtype in inputs.DTYPES:
                    made = (golden_case, vocab, dtype)
                    if made not in cases:
                        cases[made] = golden_case(vocab, dtype).to(device)
                    found.update(spec_digests(spec, cases[made], vocab, dtype, name))
    return found


def check(family: str, device: str = "cpu", root: Path | None = None) -> list[str]:
    """The drift of a family's digests on device against its golden file ([] when all match)."""
    return diff(load(family, root), compute(family, device))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--update", action="store_true", help="rewrite the golden files from the CPU build")
    ap.add_argument("--device", default="cpu", help="device to check (default cpu; --update always uses cpu)")
    ap.add_argument("--family", action="append", help="only this family (repeatable; default all)")
    ap.add_argument("--dir", type=Path, default=None, help=f"golden directory (default {GOLDEN_DIR})")
    args = ap.parse_args(argv)
    names = args.family or families()
    drifted = 0
    for family in names:
        if args.update:
            found = compute(family, "cpu")
            old = load(family, args.dir) if path_for(family, args.dir).exists() else {}
            changes = diff(old, found)
            path = update(family, found, args.dir)
            print(f"{family}: wrote {len(found)} digests to {path}; {len(changes)} changed")
            for line in changes:
                print(f"  {line}")
            continue
        problems = check(family, args.device, args.dir)
        drifted += bool(problems)
        where = path_for(family, args.dir)
        verdict = f"{len(problems)} drifted against {where}" if problems else f"all digests match {where}"
        print(f"{family}: {verdict}")
        for line in problems:
            print(f"  {line}")
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
