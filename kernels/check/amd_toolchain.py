"""kernels_check's AMD toolchain: clang++-19 -x hip for each gfx target (wave32 and wave64), the kernels of its
assembly and their scan, the reference FMA count a shipped library's code objects are held to, and the LLVM tools
(llvm-objcopy, llvm-objdump, ...) the --built scan uses."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from asm_rules import AMD_EXPLICIT_FMA, AMD_FMA, AMD_RULES, explicit_fmas, fma_counts, scan
from compile_unit import TargetResult, build_flags, compile_cached, write_unit

# (name, extra clang flags). gfx1100 builds wave32 by default; -mwavefrontsize64 switches.
HIP_TARGETS = [
    ("gfx908", ["--offload-arch=gfx908"]),
    ("gfx90a", ["--offload-arch=gfx90a"]),
    ("gfx942", ["--offload-arch=gfx942"]),
    ("gfx1100-wave32", ["--offload-arch=gfx1100"]),
    ("gfx1100-wave64", ["--offload-arch=gfx1100", "-mwavefrontsize64"]),
    ("gfx1201", ["--offload-arch=gfx1201"]),
]


def find_clang() -> str | None:
    for name in ("clang++-19", "clang++-20", "clang++-18"):
        if shutil.which(name):
            return name
    return None


def find_llvm_tool(name: str) -> str | None:
    """An LLVM tool: the versioned one (llvm-19), ROCm's (/opt/rocm/llvm/bin, in the ROCm images), or any."""
    for v in ("19", "20", "18"):
        for cand in (f"{name}-{v}", f"/usr/lib/llvm-{v}/bin/{name}"):
            if shutil.which(cand):
                return shutil.which(cand)
    for cand in ("/opt/rocm/llvm/bin/" + name, name):
        if shutil.which(cand):
            return shutil.which(cand)
    return None


def kernel_bodies_amd(asm: str) -> dict[str, str]:
    """Split AMDGPU assembly into {kernel symbol: body} using the function labels."""
    bodies: dict[str, str] = {}
    # A body runs to the function's end label (a kernel may hold several s_endpgm: an early return).
    for m in re.finditer(r"^(_Z\w+):[^\n]*$(.*?)^\.Lfunc_end\d+:", asm, re.M | re.S):
        bodies[m.group(1)] = m.group(2)
    return bodies


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
    proc = compile_cached(cmd, source, out)
    if proc.returncode != 0:
        return TargetResult(target, clang, False, error=proc.stderr.strip()[-2000:])
    bodies = explicit_fmas(kernel_bodies_amd(out.read_text()), AMD_EXPLICIT_FMA)
    wave = "64" if "-mwavefrontsize64" in arch_flags or not target.startswith("gfx1") else "32"
    asm = out.read_text()
    violations = scan(bodies, AMD_RULES)
    if f".amdhsa_wavefront_size32 {0 if wave == '64' else 1}" not in asm and "wavefront_size: 64" not in asm:
        violations.append(f"expected wave{wave} code object")
    ok = bool(bodies) and not violations
    return TargetResult(target, clang, ok, len(bodies), violations, "" if bodies else "no kernels found")


def reference_fmas_hip(mcpu: str, tmp: Path) -> dict[str, int] | str:
    """The same for an AMD target (clang -S: every FMA instruction, the inline-asm ones included), or the error."""
    clang = find_clang()
    if clang is None:
        return "clang++-19 is needed to count the FMAs the source writes"
    asm = tmp / f"reference-{mcpu}.s"
    unit = write_unit(tmp)
    cmd = [clang, "-x", "hip", f"--offload-arch={mcpu}", "--rocm-path=/usr", "-nogpulib", "--cuda-device-only", "-S"]
    proc = compile_cached([*cmd, *build_flags.HIP_FLAGS, str(unit), "-o", str(asm)], unit, asm)
    if proc.returncode != 0:
        return proc.stderr.strip()[-1500:] or "clang failed"
    return fma_counts(kernel_bodies_amd(asm.read_text()), AMD_FMA)
