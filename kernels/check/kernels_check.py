"""Static proof for GPU targets we cannot run, per tier (rl_kernel.tiers: each tier's `scan`): the exact
tier's scan ("compiled") compiles its device code and scans the assembly for contracted FMA, vendor math and
NaN-dropping max/min; another tier's scan is its own function (`module:function`, e.g. the fast tier's
compile of every Triton kernel for each target and the scan of its matrix instructions).

    python kernels/check/kernels_check.py [--tier exact|fast ...] [--only hip|cuda] [--json PATH]
    python kernels/check/kernels_check.py --built PATH   # the device code a built library ships (exact)

--built scans what ships instead of a separate compile: the AMD code objects of a
HIP library (its .hip_fatbin section, every gfx target found) or the SASS of a CUDA
library (cuobjdump -sass), with the same rules, kernel by kernel.

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
import struct
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
# The contract's max propagates NaN (numerics.h max_nan: a select on AMD). The hardware's float max/min
# (v_max_f32, v_max3_f32, v_pk_max_f32, v_maximum*, ..., what fmaxf lowers to) return the other operand
# for a NaN: none may appear in the exact kernels. (No current gfx target emits any: the select stays a
# compare and a v_cndmask.) Integer and f16 forms (v_max_i32, v_max_u16, ...) are not matched.
AMD_FLOAT_MINMAX = re.compile(
    r"\bv_(?:pk_)?(?:max|min|max3|min3|med3|maximum|minimum|maximum3|minimum3|maxmin|minmax|maximumminimum"
    r"|minimummaximum)(?:_num)?_f(?:32|64)(?:_e32|_e64|_dpp|_sdwa)?\b"
)
PTX_FMA = re.compile(r"\b(?:fma|mad)(?:\.\w+)*\.f32\b")
# An add/sub/mul without a rounding modifier may be contracted by ptxas.
PTX_CONTRACTIBLE = re.compile(r"\b(?:add|sub|mul)(?:\.ftz|\.sat)*\.f32\b")
# PTX max/min without .NaN return the non-NaN operand. max_nan uses max.NaN.f32 on sm_80+ (and a select
# before); only the NaN-dropping forms are flagged.
PTX_FLOAT_MINMAX = re.compile(r"\b(?:max|min)(?:\.ftz)?(?:\.xorsign\.abs)?\.f32\b")
PTX_VENDOR_MATH = re.compile(r"\b(?:ex2|lg2|rcp|rsqrt|sqrt|sin|cos)\.approx|\bdiv\.(?:approx|full)|\bcall\b")
# HFMA2.MMA Rd, -RZ, RZ, imm is the compiler's way to load a constant, not arithmetic.
SASS_FMA = re.compile(r"\bFFMA\b|\bHFMA2(?:\.\w+)*\s+R\d+\s*,(?!\s*-?RZ\s*,\s*RZ\b)")
SASS_VENDOR_MATH = re.compile(r"\bMUFU\b")
# FMNMX.NAN is max.NaN.f32 (NaN wins, as the contract's max); a plain FMNMX drops a NaN operand.
SASS_FLOAT_MINMAX = re.compile(r"\bFMNMX(?!\S*\.NAN)(?:\.FTZ)?\b")
# A call into a subroutine (a vendor math slow path, an outlined function) needs
# a RET in the function's code. sm_80 code also uses CALL.REL.NOINC as a
# structured branch with no RET anywhere; that is not flagged.
SASS_CALL = re.compile(r"\bCALL\S*\s+\S+")
SASS_RET = re.compile(r"\bRET\b")


AMD_RULES = {
    "contracted FMA": AMD_FMA,
    "vendor math": AMD_VENDOR_MATH,
    "call": AMD_CALL,
    "NaN-dropping max/min": AMD_FLOAT_MINMAX,
}
PTX_RULES = {
    "contracted FMA": PTX_FMA,
    "contractible op": PTX_CONTRACTIBLE,
    "vendor math": PTX_VENDOR_MATH,
    "NaN-dropping max/min": PTX_FLOAT_MINMAX,
}
SASS_RULES = {  # FMAs are counted instead (fma_count_violations): the contract writes some itself
    "vendor math": SASS_VENDOR_MATH,
    "NaN-dropping max/min": SASS_FLOAT_MINMAX,
}
AMD_RULES_NO_FMA = {k: v for k, v in AMD_RULES.items() if k != "contracted FMA"}

# The contract's own fused multiply-adds (numerics.h fma_rn) are inline assembly, which PTX brackets with
# "// begin inline asm" ... "// end inline asm" and AMD assembly with ";;#ASMSTART" ... ";;#ASMEND": they are
# taken out before the FMA rule, so any FMA left is a compiler's contraction (the proof for a compile; ptxas
# never fuses the .rn operations PTX then holds). SASS and a shipped library's code objects carry no such
# marks, and ptxas may duplicate code (so SASS holds more FMAs than PTX writes): a shipped library's kernels
# must hold exactly as many FMA instructions as the same kernels compiled with the contract's flags (a
# reference compile of the check unit for that target), and a contracting build holds more.
PTX_EXPLICIT_FMA = re.compile(r"//\s*begin inline asm\s*\n\s*fma\.rn\.f32\b[^;\n]*;\s*\n\s*//\s*end inline asm")
AMD_EXPLICIT_FMA = re.compile(r";;#ASMSTART\s*\n\s*v_fma_f32\b[^\n]*\n\s*;;#ASMEND")


def explicit_fmas(bodies: dict[str, str], pat: re.Pattern) -> dict[str, str]:
    """The bodies without the contract's inline-asm FMAs."""
    return {k: pat.sub("", v) for k, v in bodies.items()}


def fma_counts(bodies: dict[str, str], pat: re.Pattern) -> dict[str, int]:
    return {k: len(pat.findall(v)) for k, v in bodies.items()}


def fma_count_violations(bodies: dict[str, str], pat: re.Pattern, reference: dict[str, int]) -> list[str]:
    """Kernels whose FMA instructions are not exactly as many as the contract's compile of them holds."""
    found = []
    for name, n in fma_counts(bodies, pat).items():
        want = reference.get(name)
        if want is None:
            found.append(f"{name}: contracted FMA: {n} FMA instructions, and no reference compile of this kernel")
        elif n != want:
            found.append(f"{name}: contracted FMA: {n} FMA instructions, {want} in the contract's compile (fma_rn)")
    return found


# Calls that are no call into math, on sm_80 (ptxas's own, in code it cannot prove converged):
# * a structured branch: "@P CALL.REL.NOINC t" with t two instructions on, over a BRA (no RET of its own);
# * the warp helpers of __syncwarp() and __shfl_xor_sync(): bodies of WARPSYNC, SHFL, moves (MOV,
#   IMAD.MOV.U32, a register spilled and restored around them: STL, LDL) and a constant load
#   (HFMA2.MMA Rd, -RZ, RZ, imm) up to the RET.
# Any other called body (a vendor math slow path, an outlined function) is flagged.
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
SASS_HELPER_OPS = {"WARPSYNC", "SHFL", "MOV", "NOP", "BRA", "STL", "LDL"}
SASS_CONST_LOAD = re.compile(r"^\s*R\d+\s*,\s*-?RZ\s*,\s*RZ\b")


def _instructions(body: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each SASS instruction."""
    return [(int(m.group(1), 16), m.group(2), m.group(3)) for m in SASS_LINE.finditer(body)]


def _helper_body(instrs: list[tuple[int, str, str]], target: int) -> bool:
    """True when the code from target to its RET is one of ptxas's warp helpers (no arithmetic)."""
    for addr, op, args in instrs:
        if addr < target:
            continue
        base = op.split(".")[0]
        if base == "RET":
            return True
        move = op.startswith("IMAD.MOV") or (base == "HFMA2" and SASS_CONST_LOAD.match(args))
        if base not in SASS_HELPER_OPS and not move:
            return False
    return False


def sass_calls(body: str) -> list[str]:
    if not SASS_RET.search(body):
        return []
    instrs = _instructions(body)
    if not instrs:  # no addresses to follow: every call counts
        return sorted(set(SASS_CALL.findall(body)))
    flagged = set()
    for addr, op, args in instrs:
        if not op.startswith("CALL"):
            continue
        target = re.search(r"0x([0-9a-f]+)", args)
        t = int(target.group(1), 16) if target else -1
        step = instrs[1][0] - instrs[0][0] if len(instrs) > 1 else 16
        if t == addr + 2 * step or _helper_body(instrs, t):
            continue
        flagged.add(f"{op} {args.strip()}")
    return sorted(flagged)


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
    # A body runs to the function's end label (a kernel may hold several s_endpgm: an early return).
    for m in re.finditer(r"^(_Z\w+):[^\n]*$(.*?)^\.Lfunc_end\d+:", asm, re.M | re.S):
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
    bodies = explicit_fmas(kernel_bodies_amd(out.read_text()), AMD_EXPLICIT_FMA)
    wave = "64" if "-mwavefrontsize64" in arch_flags or not target.startswith("gfx1") else "32"
    asm = out.read_text()
    violations = scan(bodies, AMD_RULES)
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
    bodies = explicit_fmas(ptx_bodies(ptx.read_text()), PTX_EXPLICIT_FMA)
    violations = scan(bodies, PTX_RULES)
    results = [TargetResult(f"{target}-ptx", "nvcc", bool(bodies) and not violations, len(bodies), violations)]
    if shutil.which("cuobjdump"):
        cubin = tmp / f"{target}.cubin"
        proc = run(["nvcc", *arch_flags, *flags, *fmad, *nvcc_extra, "-cubin", str(source), "-o", str(cubin)])
        sass = run(["cuobjdump", "-sass", str(cubin)]).stdout if proc.returncode == 0 else ""
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


def sass_bodies(sass: str) -> dict[str, str]:
    """cuobjdump -sass output split into {function: body}."""
    return {m.group(1): m.group(2) for m in re.finditer(r"Function : (\S+)(.*?)(?=Function :|\Z)", sass, re.S)}


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
    cubin = tmp / f"reference-{arch}.cubin"
    flags = [f for f in build_flags.NVCC_FLAGS if not f.startswith("--fmad")]
    proc = run(["nvcc", f"-arch={arch}", *flags, "--fmad=false", "-cubin", str(write_unit(tmp)), "-o", str(cubin)])
    if proc.returncode != 0:
        return proc.stderr.strip()[-1500:] or "nvcc failed"
    return fma_counts(sass_bodies(run(["cuobjdump", "-sass", str(cubin)]).stdout), SASS_FMA)


def reference_fmas_hip(mcpu: str, tmp: Path) -> dict[str, int] | str:
    """The same for an AMD target (clang -S: every FMA instruction, the inline-asm ones included), or the error."""
    clang = find_clang()
    if clang is None:
        return "clang++-19 is needed to count the FMAs the source writes"
    asm = tmp / f"reference-{mcpu}.s"
    cmd = [clang, "-x", "hip", f"--offload-arch={mcpu}", "--rocm-path=/usr", "-nogpulib", "--cuda-device-only"]
    proc = run([*cmd, "-S", *build_flags.HIP_FLAGS, str(write_unit(tmp)), "-o", str(asm)])
    if proc.returncode != 0:
        return proc.stderr.strip()[-1500:] or "clang failed"
    return fma_counts(kernel_bodies_amd(asm.read_text()), AMD_FMA)


# ---- --built: the device code a built library ships ------------------------------------------
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"


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


def elf_sections(path: Path) -> set[str]:
    readelf = find_llvm_tool("llvm-readelf") or shutil.which("readelf")
    if readelf is None:
        raise RuntimeError("neither llvm-readelf nor readelf is installed")
    out = run([readelf, "-S", "-W", str(path)]).stdout
    return set(re.findall(r"\]\s+(\.\S+)", out))


def unbundle(blob: bytes) -> list[tuple[str, bytes]]:
    """(triple, code object) of every entry of every clang offload bundle in blob (a .hip_fatbin
    section holds one bundle per translation unit, each aligned)."""
    if COMPRESSED_MAGIC in blob and BUNDLE_MAGIC not in blob:
        raise RuntimeError("compressed offload bundle (CCOB): unbundle with clang-offload-bundler first")
    found = []
    start = blob.find(BUNDLE_MAGIC)
    while start >= 0:
        pos = start + len(BUNDLE_MAGIC)
        (count,) = struct.unpack_from("<Q", blob, pos)
        pos += 8
        for _ in range(count):
            offset, size, tlen = struct.unpack_from("<QQQ", blob, pos)
            pos += 24
            triple = blob[pos : pos + tlen].decode()
            pos += tlen
            found.append((triple, blob[start + offset : start + offset + size]))
        start = blob.find(BUNDLE_MAGIC, pos)
    return found


def unbundle_with_bundler(blob: Path, tmp: Path) -> list[tuple[str, bytes]]:
    """Compressed bundles (CCOB, ROCm's --offload-compress): clang-offload-bundler --list / --unbundle."""
    tool = find_llvm_tool("clang-offload-bundler")
    if tool is None:
        raise RuntimeError("compressed offload bundle and no clang-offload-bundler to unbundle it")
    listed = run([tool, "--list", "--type=o", f"--input={blob}"])
    found = []
    for i, triple in enumerate(t for t in listed.stdout.split() if "amdgcn" in t):
        out = tmp / f"unbundled{i}.co"
        run([tool, "--unbundle", "--type=o", f"--targets={triple}", f"--input={blob}", f"--output={out}"])
        if out.exists():
            found.append((triple, out.read_bytes()))
    return found


def objdump_bodies(text: str) -> dict[str, str]:
    """llvm-objdump -d output split into {symbol: instructions}."""
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"^[0-9a-f]+ <([^>]+)>:\n(.*?)(?=^[0-9a-f]+ <|\Z)", text, re.M | re.S)
    }


def check_built_hip(path: Path, tmp: Path) -> list[TargetResult]:
    objcopy, objdump = find_llvm_tool("llvm-objcopy"), find_llvm_tool("llvm-objdump")
    if objcopy is None or objdump is None:
        return [TargetResult("built-hip", "llvm", False, error="llvm-objcopy/llvm-objdump (llvm-19) missing")]
    blob_path = tmp / "hip_fatbin.bin"
    proc = run([objcopy, f"--dump-section=.hip_fatbin={blob_path}", str(path), str(tmp / "copy.o")])
    if proc.returncode != 0 or not blob_path.exists():
        return [TargetResult("built-hip", objcopy, False, error=proc.stderr.strip()[-1500:])]
    results = []
    try:
        entries = unbundle(blob_path.read_bytes())
    except RuntimeError:
        entries = unbundle_with_bundler(blob_path, tmp)
    for i, (triple, code) in enumerate(entries):
        if not triple.startswith("hip") or "amdgcn" not in triple:
            continue  # the host entry
        arch = triple.rsplit("-", 1)[-1]
        mcpu = arch.split(":")[0]
        obj = tmp / f"code{i}-{mcpu}.o"
        obj.write_bytes(code)
        dis = run([objdump, "-d", f"--mcpu={mcpu}", str(obj)])
        if dis.returncode != 0:
            results.append(TargetResult(f"built-{arch}", objdump, False, error=dis.stderr.strip()[-1500:]))
            continue
        bodies = {k: v for k, v in objdump_bodies(dis.stdout).items() if k.startswith("_Z")}
        reference = reference_fmas_hip(mcpu, tmp)
        if isinstance(reference, str):
            results.append(TargetResult(f"built-{arch}", objdump, False, error=reference))
            continue
        violations = scan(bodies, AMD_RULES_NO_FMA) + fma_count_violations(bodies, AMD_FMA, reference)
        ok = bool(bodies) and not violations
        results.append(
            TargetResult(f"built-{arch}", objdump, ok, len(bodies), violations, "" if bodies else "no kernels")
        )
    if not results:
        results.append(TargetResult("built-hip", objdump, False, error="no amdgcn code object in .hip_fatbin"))
    return results


def sass_by_arch(sass: str) -> list[tuple[str, str]]:
    """cuobjdump -sass output cut into (arch, text) per ELF ("arch = sm_90" opens each)."""
    parts = re.split(r"^\s*arch = (sm_\d+a?)\s*$", sass, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def check_built_cuda(path: Path, tmp: Path) -> list[TargetResult]:
    if shutil.which("cuobjdump") is None:
        return [TargetResult("built-cuda", "cuobjdump", False, error="cuobjdump is not installed")]
    proc = run(["cuobjdump", "-sass", str(path)])
    per_arch = sass_by_arch(proc.stdout)
    if proc.returncode != 0 or not any(sass_bodies(text) for _, text in per_arch):
        err = proc.stderr.strip()[-1500:] or "no SASS functions found"
        return [TargetResult("built-sass", "cuobjdump", False, error=err)]
    results = []
    for arch, text in per_arch:
        bodies = sass_bodies(text)
        if not bodies:
            continue
        reference = reference_fmas_cuda(arch, tmp) if shutil.which("nvcc") else "nvcc is needed for the FMA count"
        if isinstance(reference, str):
            results.append(TargetResult(f"built-{arch}", "cuobjdump", False, error=reference))
            continue
        violations = scan_sass(bodies, reference)
        results.append(TargetResult(f"built-{arch}", "cuobjdump", not violations, len(bodies), violations))
    return results


def write_bundle(entries: list[tuple[str, bytes]], align: int = 4096) -> bytes:
    """A clang offload bundle of (triple, code object) entries, as clang-offload-bundler writes it (the
    host entry first, empty)."""
    entries = [("host-x86_64-unknown-linux-gnu-", b""), *entries]
    header = len(BUNDLE_MAGIC) + 8 + sum(24 + len(t.encode()) for t, _ in entries)
    offsets, pos = [], header
    for _, code in entries:
        pos = -(-pos // align) * align if code else pos
        offsets.append(pos)
        pos += len(code)
    out = bytearray(BUNDLE_MAGIC + struct.pack("<Q", len(entries)))
    for (triple, code), off in zip(entries, offsets, strict=True):
        out += struct.pack("<QQQ", off, len(code), len(triple.encode())) + triple.encode()
    for (_, code), off in zip(entries, offsets, strict=True):
        out += b"\0" * (off - len(out)) + code
    return bytes(out)


def build_hip_fat_object(source: Path, archs: list[str], out: Path, extra: list[str] | None = None) -> Path:
    """A host object that embeds the device code of source for archs in a .hip_fatbin section, as a HIP
    build's objects and libraries carry it: each target compiled with the contract's flags (plus extra)
    into a code object, bundled (write_bundle) and added to a host object with llvm-objcopy. (Used by the
    tests of --built where no ROCm/clang-offload-bundler is installed.)"""
    clang, objcopy = find_clang(), find_llvm_tool("llvm-objcopy")
    if clang is None or objcopy is None:
        raise RuntimeError("clang++-19 and llvm-objcopy-19 are needed")
    tmp = out.parent
    entries = []
    for arch in archs:
        code = tmp / f"{out.stem}-{arch}.co"
        cmd = [clang, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "--no-gpu-bundle-output"]
        cmd += ["--rocm-path=/usr", "-nogpulib", "-c", *build_flags.HIP_FLAGS, *(extra or []), str(source)]
        proc = run([*cmd, "-o", str(code)])
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        entries.append((f"hipv4-amdgcn-amd-amdhsa--{arch}", code.read_bytes()))
    bundle = tmp / f"{out.stem}.hip_fatbin"
    bundle.write_bytes(write_bundle(entries))
    host_src = tmp / f"{out.stem}-host.cpp"
    host_src.write_text("int rl_kernel_host_part = 0;\n")
    host = tmp / f"{out.stem}-host.o"
    proc = run([clang, "-c", str(host_src), "-o", str(host)])
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    add = [f"--add-section=.hip_fatbin={bundle}", "--set-section-flags=.hip_fatbin=alloc,readonly"]
    proc = run([objcopy, *add, str(host), str(out)])
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return out


def check_built(path: Path) -> list[TargetResult]:
    """Scan the device code a built library (the extension _C.so, an object file) carries."""
    if not path.is_file():
        return [TargetResult("built", "-", False, error=f"{path} is not a file")]
    sections = elf_sections(path)
    results: list[TargetResult] = []
    with tempfile.TemporaryDirectory() as d:
        if ".hip_fatbin" in sections:
            results += check_built_hip(path, Path(d))
        if ".nv_fatbin" in sections or "__nv_relfatbin" in sections:
            results += check_built_cuda(path, Path(d))
    if not results:
        results.append(TargetResult("built", "-", False, error=f"{path}: no .hip_fatbin or .nv_fatbin section"))
    return results


def write_unit(tmp: Path) -> Path:
    """One translation unit that includes every family's <tier>/<family>/<family>_check.cu (found by name),
    so each target is compiled once and every kernel of every family is scanned."""
    unit = tmp / "kernels_check.cu"
    unit.write_text("".join(f'#include "{p}"\n' for p in build_flags.check_sources()))
    return unit


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
    args = ap.parse_args(argv)
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
                results += [check_hip(clang, t, f, extra, tmp, source) for t, f in HIP_TARGETS]
        if args.only in (None, "cuda"):
            if shutil.which("nvcc") is None:
                # nvcc is optional unless asked for: the CUDA check runs where nvcc exists.
                (missing if args.only == "cuda" else optional).append("nvcc")
            else:
                for t, f in CUDA_TARGETS:
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
