"""kernels_check's CUDA toolchain: nvcc -ptx for each sm target and the scan of its PTX (and of its SASS through
cuobjdump where it exists), the reference FMA count a shipped library's SASS is held to, and cuobjdump's output cut
into kernels and architectures."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from asm_rules import (
    PTX_EXPLICIT_FMA,
    PTX_RULES,
    SASS_FMA,
    SASS_RULES,
    explicit_fmas,
    fma_count_violations,
    fma_counts,
    sass_calls,
    scan,
)
from compile_unit import TargetResult, build_flags, compile_cached, output_cached, write_unit

CUDA_TARGETS = [("sm_90", ["-arch=sm_90"]), ("sm_80", ["-arch=sm_80"])]


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
    proc = compile_cached(cmd, source, ptx)
    if proc.returncode != 0:
        return [TargetResult(target, "nvcc", False, error=proc.stderr.strip()[-2000:])]
    bodies = explicit_fmas(ptx_bodies(ptx.read_text()), PTX_EXPLICIT_FMA)
    violations = scan(bodies, PTX_RULES)
    results = [TargetResult(f"{target}-ptx", "nvcc", bool(bodies) and not violations, len(bodies), violations)]
    if shutil.which("cuobjdump"):
        cubin = tmp / f"{target}.cubin"
        proc = assemble(ptx, arch_flags, fmad, cubin)
        sass = output_cached(["cuobjdump", "-sass", str(cubin)], cubin).stdout if proc.returncode == 0 else ""
        sbodies = sass_bodies(sass)
        sv = scan_sass(sbodies)
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


def assemble(ptx: Path, arch_flags: list[str], fmad: list[str], cubin: Path) -> subprocess.CompletedProcess:
    """The PTX's SASS: ptxas with nvcc's own choices (the arch, --fmad: ptxas too may contract a mul and an add),
    what `nvcc -cubin` runs after the same front end (the same SASS, without compiling the source twice)."""
    arch = next(f.split("=", 1)[1] for f in arch_flags if f.startswith("-arch="))
    return compile_cached(["ptxas", f"-arch={arch}", *fmad, str(ptx), "-o", str(cubin)], ptx, cubin)


def sass_bodies(sass: str) -> dict[str, str]:
    """cuobjdump -sass output split into {function: body}."""
    heads = list(re.finditer(r"Function : (\S+)", sass))  # each body runs to the next head (a lazy .*? was seconds)
    ends = [h.start() for h in heads[1:]] + [len(sass)]
    return {h.group(1): sass[h.end() : end] for h, end in zip(heads, ends, strict=True)}


def scan_sass(bodies: dict[str, str], reference: dict[str, int] | None = None) -> list[str]:
    """The SASS rules and the calls; with a reference ({kernel: FMA instructions of the contract's compile},
    for a shipped library), the FMA count too. (A compile's own SASS needs none: its PTX is the proof.)"""
    found = scan(bodies, SASS_RULES)
    if reference is not None:
        found += fma_count_violations(bodies, SASS_FMA, reference)
    return found + [f"{name}: call: {c}" for name, body in bodies.items() for c in sass_calls(body)[:3]]


def reference_fmas_cuda(arch: str, tmp: Path) -> dict[str, int] | str:
    """{kernel: FMA instructions} of the exact kernels compiled for arch with the contract's flags (SASS), the
    reference a shipped library's SASS is held to; or the compile error."""
    ptx, cubin = tmp / f"reference-{arch}.ptx", tmp / f"reference-{arch}.cubin"
    flags = [f for f in build_flags.NVCC_FLAGS if not f.startswith("--fmad")]
    unit = write_unit(tmp)
    proc = compile_cached(
        ["nvcc", f"-arch={arch}", *flags, "--fmad=false", "-ptx", str(unit), "-o", str(ptx)], unit, ptx
    )
    if proc.returncode == 0:
        proc = assemble(ptx, [f"-arch={arch}"], ["--fmad=false"], cubin)
    if proc.returncode != 0:
        return proc.stderr.strip()[-1500:] or "nvcc failed"
    return fma_counts(sass_bodies(output_cached(["cuobjdump", "-sass", str(cubin)], cubin).stdout), SASS_FMA)


def sass_by_arch(sass: str) -> list[tuple[str, str]]:
    """cuobjdump -sass output cut into (arch, text) per ELF ("arch = sm_90" opens each)."""
    parts = re.split(r"^\s*arch = (sm_\d+a?)\s*$", sass, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
