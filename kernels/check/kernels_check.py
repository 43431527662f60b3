"""Static proof for GPU targets we cannot run: compile the exact kernels' device
code and scan the assembly for contracted FMA and vendor math.

    python kernels/check/kernels_check.py [--only hip|cuda] [--json PATH]

HIP: clang++-19 -x hip for gfx908, gfx90a, gfx942, gfx1100 (wave32 and wave64),
gfx1201. CUDA: nvcc -ptx for sm_90 (and SASS through cuobjdump where it exists).
RL_KERNEL_EXTRA_FLAGS is appended to every compile, so
`RL_KERNEL_EXTRA_FLAGS=-ffp-contract=fast make kernels-check` must fail.
Exit status: 0 clean, 1 a violation or a failed compile, 2 a compiler is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "rl_kernel"))
import build_flags  # noqa: E402  (pure-Python flag lists, no extension needed)

# (name, extra clang flags). gfx1100 builds wave32 by default; -mwavefrontsize64 switches.
HIP_TARGETS = [
    ("gfx908", ["--offload-arch=gfx908"]),
    ("gfx90a", ["--offload-arch=gfx90a"]),
    ("gfx942", ["--offload-arch=gfx942"]),
    ("gfx1100-wave32", ["--offload-arch=gfx1100"]),
    ("gfx1100-wave64", ["--offload-arch=gfx1100", "-mwavefrontsize64"]),
    ("gfx1201", ["--offload-arch=gfx1201"]),
]
CUDA_TARGETS = [("sm_90", ["-arch=sm_90"]), ("sm_80", ["-arch=sm_80"])]

# Fused multiply-add in any AMD encoding (contracted a*b+c), and hardware
# transcendental/division helpers whose results differ between vendors.
AMD_FMA = re.compile(
    r"\bv_(?:pk_)?(?:fma|fmac|mac|mad|fmaak|fmamk|madak|madmk)(?:_mix\w*|_legacy)?_f32(?:_e32|_e64|_dpp|_sdwa)?\b"
    r"|\bv_(?:fma|mad)_mix"
)
AMD_VENDOR_MATH = re.compile(
    r"\bv_(?:exp|log|rcp|rsq|sqrt|sin|cos)(?:_legacy)?_f32(?:_e32|_e64|_dpp|_sdwa)?\b|\bv_div_\w+|__ocml_|__ockl_"
)
AMD_CALL = re.compile(r"\bs_swappc_b64\b|\bs_call_b64\b")
PTX_FMA = re.compile(r"\b(?:fma|mad)(?:\.\w+)*\.f32\b")
# An add/sub/mul without a rounding modifier may be contracted by ptxas.
PTX_CONTRACTIBLE = re.compile(r"\b(?:add|sub|mul)(?:\.ftz|\.sat)*\.f32\b")
PTX_VENDOR_MATH = re.compile(r"\b(?:ex2|lg2|rcp|rsqrt|sqrt|sin|cos)\.approx|\bdiv\.(?:approx|full)|\bcall\b")
# HFMA2.MMA Rd, -RZ, RZ, imm is the compiler's way to load a constant, not arithmetic.
SASS_FMA = re.compile(r"\bFFMA\b|\bHFMA2(?:\.\w+)*\s+R\d+\s*,(?!\s*-?RZ\s*,\s*RZ\b)")
SASS_VENDOR_MATH = re.compile(r"\bMUFU\b")
# A call into a subroutine (a vendor math slow path, an outlined function) needs
# a RET in the function's code. sm_80 code also uses CALL.REL.NOINC as a
# structured branch with no RET anywhere; that is not flagged.
SASS_CALL = re.compile(r"\bCALL\S*\s+\S+")
SASS_RET = re.compile(r"\bRET\b")


def sass_calls(body: str) -> list[str]:
    return sorted(set(SASS_CALL.findall(body))) if SASS_RET.search(body) else []


@dataclass
class TargetResult:
    target: str
    toolchain: str
    ok: bool
    kernels: int = 0
    violations: list[str] = field(default_factory=list)
    error: str = ""


def find_clang() -> str | None:
    for name in ("clang++-19", "clang++-20", "clang++-18"):
        if shutil.which(name):
            return name
    return None


def kernel_bodies_amd(asm: str) -> dict[str, str]:
    """Split AMDGPU assembly into {kernel symbol: body} using the function labels."""
    bodies: dict[str, str] = {}
    for m in re.finditer(r"^(_Z\w+):[^\n]*$(.*?)^\s*s_endpgm", asm, re.M | re.S):
        bodies[m.group(1)] = m.group(2)
    return bodies


def scan(bodies: dict[str, str], rules: dict[str, re.Pattern]) -> list[str]:
    found = []
    for name, body in bodies.items():
        for rule, pat in rules.items():
            hits = sorted(set(pat.findall(body)))
            if hits:
                found.append(f"{name}: {rule}: {', '.join(hits[:5])}")
    return found


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def check_hip(
    clang: str, target: str, arch_flags: list[str], extra: list[str], tmp: Path, source: Path
) -> TargetResult:
    out = tmp / f"{target}.s"
    cmd = [
        clang,
        "-x",
        "hip",
        *arch_flags,
        "--rocm-path=/usr",
        "-nogpulib",
        "--cuda-device-only",
        "-S",
        *build_flags.HIP_FLAGS,
        *extra,
        str(source),
        "-o",
        str(out),
    ]
    proc = run(cmd)
    if proc.returncode != 0:
        return TargetResult(target, clang, False, error=proc.stderr.strip()[-2000:])
    bodies = kernel_bodies_amd(out.read_text())
    wave = "64" if "-mwavefrontsize64" in arch_flags or not target.startswith("gfx1") else "32"
    asm = out.read_text()
    violations = scan(bodies, {"contracted FMA": AMD_FMA, "vendor math": AMD_VENDOR_MATH, "call": AMD_CALL})
    if f".amdhsa_wavefront_size32 {0 if wave == '64' else 1}" not in asm and "wavefront_size: 64" not in asm:
        violations.append(f"expected wave{wave} code object")
    ok = bool(bodies) and not violations
    return TargetResult(target, clang, ok, len(bodies), violations, "" if bodies else "no kernels found")


def ptx_bodies(ptx: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"\.entry\s+(\w+)\s*\((.*?)^\}", ptx, re.M | re.S)}


def check_cuda(target: str, arch_flags: list[str], extra: list[str], tmp: Path, source: Path) -> list[TargetResult]:
    ptx = tmp / f"{target}.ptx"
    nvcc_extra = [f for f in extra if not f.startswith("-ffp-contract")]
    if "-ffp-contract=fast" in extra:  # the same negative control, spelled for nvcc
        nvcc_extra.append("--fmad=true")
    flags = [f for f in build_flags.NVCC_FLAGS if not f.startswith("--fmad")]
    fmad = [f for f in nvcc_extra if f.startswith("--fmad")] or ["--fmad=false"]
    nvcc_extra = [f for f in nvcc_extra if not f.startswith("--fmad")]
    cmd = ["nvcc", *arch_flags, *flags, *fmad, *nvcc_extra, "-ptx", str(source), "-o", str(ptx)]
    proc = run(cmd)
    if proc.returncode != 0:
        return [TargetResult(target, "nvcc", False, error=proc.stderr.strip()[-2000:])]
    bodies = ptx_bodies(ptx.read_text())
    rules = {"contracted FMA": PTX_FMA, "contractible op": PTX_CONTRACTIBLE, "vendor math": PTX_VENDOR_MATH}
    violations = scan(bodies, rules)
    results = [TargetResult(f"{target}-ptx", "nvcc", bool(bodies) and not violations, len(bodies), violations)]
    if shutil.which("cuobjdump"):
        cubin = tmp / f"{target}.cubin"
        proc = run(["nvcc", *arch_flags, *flags, *fmad, *nvcc_extra, "-cubin", str(source), "-o", str(cubin)])
        sass = run(["cuobjdump", "-sass", str(cubin)]).stdout if proc.returncode == 0 else ""
        sbodies = {m.group(1): m.group(2) for m in re.finditer(r"Function : (\S+)(.*?)(?=Function :|\Z)", sass, re.S)}
        sv = scan(sbodies, {"contracted FMA": SASS_FMA, "vendor math": SASS_VENDOR_MATH})
        sv += [f"{name}: call: {c}" for name, body in sbodies.items() for c in sass_calls(body)[:3]]
        results.append(
            TargetResult(
                f"{target}-sass",
                "nvcc+cuobjdump",
                bool(sbodies) and not sv,
                len(sbodies),
                sv,
                "" if sbodies else (proc.stderr.strip()[-500:] or "no SASS functions found"),
            )
        )
    return results


def write_unit(tmp: Path) -> Path:
    """One translation unit that includes every family's csrc/<family>/<family>_check.cu (found by name),
    so each target is compiled once and every kernel of every family is scanned."""
    unit = tmp / "kernels_check.cu"
    unit.write_text("".join(f'#include "{p}"\n' for p in build_flags.check_sources()))
    return unit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["hip", "cuda"], help="check one toolchain only")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    extra = build_flags.extra_flags()
    results: list[TargetResult] = []
    missing: list[str] = []
    optional: list[str] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        source = write_unit(tmp)
        if args.only in (None, "hip"):
            clang = find_clang()
            if clang is None:
                missing.append("clang++-19 (apt-get install clang-19 llvm-19 lld-19 libamdhip64-dev)")
            else:
                results += [check_hip(clang, t, f, extra, tmp, source) for t, f in HIP_TARGETS]
        if args.only in (None, "cuda"):
            if shutil.which("nvcc") is None:
                # nvcc is optional unless asked for: the CUDA check runs where nvcc exists.
                (missing if args.only == "cuda" else optional).append("nvcc")
            else:
                for t, f in CUDA_TARGETS:
                    results += check_cuda(t, f, extra, tmp, source)
    print(f"kernels-check: extra flags {extra or 'none'}")
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
