"""kernels_check --built: the device code a built library ships, scanned instead of a separate compile. The AMD
code objects of a HIP library (its .hip_fatbin section: clang offload bundles, every gfx target found) or the SASS
of a CUDA library (cuobjdump -sass), with the same rules, kernel by kernel, their FMAs counted against the
contract's compile. Also writes such a bundle (the tests' stand-in for a HIP build where ROCm is missing)."""

from __future__ import annotations

import re
import shutil
import struct
import tempfile
from pathlib import Path

from amd_toolchain import find_clang, find_llvm_tool, reference_fmas_hip
from asm_rules import AMD_FMA, AMD_RULES_NO_FMA, fma_count_violations, scan
from compile_unit import TargetResult, build_flags, compile_cached, output_cached, run
from cuda_toolchain import reference_fmas_cuda, sass_bodies, sass_by_arch, scan_sass

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"


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


def check_built_cuda(path: Path, tmp: Path) -> list[TargetResult]:
    if shutil.which("cuobjdump") is None:
        return [TargetResult("built-cuda", "cuobjdump", False, error="cuobjdump is not installed")]
    proc = output_cached(["cuobjdump", "-sass", str(path)], path)
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
        proc = compile_cached([*cmd, "-o", str(code)], source, code)  # kept like kernels_check's own compiles
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
