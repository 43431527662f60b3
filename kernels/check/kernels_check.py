"""Static proof for GPU targets we cannot run, per tier (rl_kernel.tiers: each tier's `scan`): the exact
tier's scan ("compiled") compiles its device code and scans the assembly for contracted FMA, vendor math and
NaN-dropping max/min; another tier's scan is its own function (`module:function`, e.g. the fast tier's
compile of every Triton kernel for each target and the scan of its matrix instructions).

    python kernels/check/kernels_check.py [--tier exact|fast ...] [--only hip|cuda] [--target T ...] [--json PATH]
    python kernels/check/kernels_check.py --built PATH   # the device code a built library ships (exact)

--built scans what ships instead of a separate compile: the AMD code objects of a
HIP library (its .hip_fatbin section, every gfx target found) or the SASS of a CUDA
library (cuobjdump -sass), with the same rules, kernel by kernel.

HIP: clang++-19 -x hip for gfx908, gfx90a, gfx942, gfx1100 (wave32 and wave64),
gfx1201. CUDA: nvcc -ptx for sm_90 and sm_80 (and SASS through cuobjdump where it exists). --target keeps the
named targets of the compiled scan (the exact tier's).
RL_KERNEL_EXTRA_FLAGS is appended to every compile, so
`RL_KERNEL_EXTRA_FLAGS=-ffp-contract=fast make kernels-check` must fail.
Exit status: 0 clean, 1 a violation or a failed compile, 2 a compiler is missing.

This script is the command line and its report; each job is a module beside it (kernels/check is no package: run
as a script, its folder is first on sys.path): asm_rules (the scanning rules), amd_toolchain (clang, gfx targets),
cuda_toolchain (nvcc, PTX and SASS), built_library (--built) and compile_unit (what they share).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from amd_toolchain import HIP_TARGETS, check_hip, find_clang
from built_library import check_built
from compile_unit import TargetResult, build_flags, write_unit
from cuda_toolchain import CUDA_TARGETS, check_cuda


def tier_scans(only: list[str] | None) -> dict[str, str]:
    """{tier: its scan} for the tiers asked for (default every tier rl_kernel offers; one without a scan has
    nothing to check here). Imports rl_kernel only to read the descriptors."""
    from rl_kernel import tiers

    known = tiers.tiers()
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise SystemExit(f"kernels-check: unknown tier {', '.join(unknown)} (known: {', '.join(known)})")
    return {n: t.scan for n, t in known.items() if t.scan and (not only or n in only)}


def tier_scan(name: str, scan: str, only: str | None) -> list[TargetResult]:
    """A tier's own scan (`module:function`, called with the toolchain asked for or None): its per-target
    results ({target, toolchain, kernels, violations, error}) as TargetResults named after the tier."""
    import importlib

    module, _, func = scan.partition(":")
    found = getattr(importlib.import_module(module), func)(only)
    return [
        TargetResult(
            r["target"],
            f"{name}: {r['toolchain']}",
            not r.get("violations") and not r.get("error"),
            r.get("kernels", 0),
            list(r.get("violations", [])),
            r.get("error", ""),
        )
        for r in found
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["hip", "cuda"], help="check one toolchain only")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--built", type=Path, help="scan this built library's device code instead of compiling")
    ap.add_argument("--tier", action="append", help="only this tier's scan (repeatable; default every tier's)")
    ap.add_argument("--target", action="append", help="compile only for this target (repeatable: sm_90, gfx942, ...; "
                    "default every target of the toolchains)")  # fmt: skip
    args = ap.parse_args(argv)
    known = [t for t, _ in (*HIP_TARGETS, *CUDA_TARGETS)]
    unknown = sorted(set(args.target or ()) - set(known))
    if unknown:
        ap.error(f"unknown target {', '.join(unknown)} (known: {', '.join(known)})")
    chosen = set(args.target or known)
    extra = build_flags.extra_flags()
    results: list[TargetResult] = []
    missing: list[str] = []
    optional: list[str] = []
    scans = tier_scans(args.tier) if args.built is None else {"exact": "compiled"}
    for name, scan_fn in scans.items():
        if scan_fn != "compiled":
            results += tier_scan(name, scan_fn, args.only)
    if args.built is not None:
        results = check_built(args.built)
        extra = []
    with tempfile.TemporaryDirectory() as d:
        if args.built is not None or "compiled" not in scans.values():
            args.only = "none"
        tmp = Path(d)
        source = write_unit(tmp)
        if args.only in (None, "hip"):
            clang = find_clang()
            if clang is None:
                missing.append("clang++-19 (apt-get install clang-19 llvm-19 lld-19 libamdhip64-dev)")
            else:
                results += [check_hip(clang, t, f, extra, tmp, source) for t, f in HIP_TARGETS if t in chosen]
        if args.only in (None, "cuda"):
            if shutil.which("nvcc") is None:
                # nvcc is optional unless asked for: the CUDA check runs where nvcc exists.
                (missing if args.only == "cuda" else optional).append("nvcc")
            else:
                for t, f in CUDA_TARGETS:
                    if t in chosen:
                        results += check_cuda(t, f, extra, tmp, source)
    what = f"built library {args.built}" if args.built is not None else f"extra flags {extra or 'none'}"
    print(f"kernels-check: {what}")
    for r in results:
        status = "ok" if r.ok else "FAIL"
        print(f"  {r.target:<16} {r.toolchain:<16} {r.kernels:>3} kernels  {status}")
        for v in r.violations[:6]:
            print(f"      {v}")
        if len(r.violations) > 6:
            print(f"      ... {len(r.violations) - 6} more")
        if r.error:
            print("      " + r.error.replace("\n", "\n      ")[:1500])
    for m in missing:
        print(f"  missing compiler: {m}")
    for m in optional:
        print(f"  skipped (not installed): {m}")
    if args.json:
        args.json.write_text(
            json.dumps({"extra_flags": extra, "results": [asdict(r) for r in results], "missing": missing}, indent=1)
        )
    if any(not r.ok for r in results):
        return 1
    return 2 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
