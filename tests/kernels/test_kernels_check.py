"""`make kernels-check`: the static scan of the exact kernels' device code.

The scan must pass on the contract's flags and must fail when contraction is
switched on (its negative control). clang 19 is installed by .ci/run, so in CI
(CI=true) a missing compiler is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from tooling import require

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "kernels" / "check" / "kernels_check.py"
sys.path.insert(0, str(CHECK.parent))  # kernels/check is a folder of scripts, no package
import amd_toolchain  # noqa: E402
import asm_rules  # noqa: E402
import built_library  # noqa: E402
import compile_unit  # noqa: E402
import cuda_toolchain  # noqa: E402

CLANG = amd_toolchain.find_clang()
if CLANG is None and os.environ.get("CI") == "true":
    raise RuntimeError("clang++-19 is missing in CI: .ci/run must install clang-19 llvm-19 lld-19 libamdhip64-dev")
needs_clang = pytest.mark.skipif(CLANG is None, reason="clang++-19 not installed (apt-get install clang-19)")
if not (shutil.which("nvcc") and shutil.which("fatbinary")) and os.environ.get("CI") == "true":
    raise RuntimeError("nvcc (with fatbinary) is missing in CI: the CUDA half of kernels-check cannot run")
if not (shutil.which("cuobjdump") and shutil.which("nvdisasm")) and os.environ.get("CI") == "true":
    raise RuntimeError("cuobjdump/nvdisasm are missing in CI: .ci/run takes them from the triton wheel")


def run_check(*args: str, extra: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, RL_KERNEL_EXTRA_FLAGS=extra)
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, env=env, check=False)


@pytest.mark.slow(minutes=True)
@needs_clang
def test_hip_targets_clean_with_contract_flags() -> None:
    proc = run_check("--tier", "exact", "--only", "hip")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for target, _ in amd_toolchain.HIP_TARGETS:
        assert f"{target} " in proc.stdout
    assert "FAIL" not in proc.stdout


# Kernels a contracting build must change, by family: each has a product feeding a sum in plain code.
# (linear's chains are explicit fma_rn only, so a contracting build cannot change them: its own negative
# control is the split-K check of tests/kernels/test_decoder.py.)
CONTRACTIBLE = {
    "softmax": ("log_softmax_kernel", "entropy_kernel", "token_logprobs_kernel"),
    "decoder": (
        "rms_norm_kernel",
        "rotary_kernel",
        "attention_kernel",
        "silu_mul_backward_kernel",
        "rope_table_kernel",
    ),
}


@pytest.mark.slow(minutes=True)
@needs_clang
def test_contracted_build_is_caught(tmp_path: Path) -> None:
    report = tmp_path / "bad.json"
    proc = run_check("--tier", "exact", "--only", "hip", "--json", str(report), extra="-ffp-contract=fast")
    assert proc.returncode == 1, proc.stdout
    assert "contracted FMA" in proc.stdout
    assert proc.stdout.count("FAIL") == len(amd_toolchain.HIP_TARGETS)
    results = json.loads(report.read_text())
    for result in results if isinstance(results, list) else results["results"]:
        flagged = " ".join(v for v in result["violations"] if "contracted FMA" in v)
        for family, kernels in CONTRACTIBLE.items():
            for kernel in kernels:
                assert f"{len(kernel)}{kernel}" in flagged, f"{result['target']}: {family}'s {kernel} not flagged"


@pytest.mark.slow(minutes=True)
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_ptx_clean_and_negative_control() -> None:
    """Every CUDA target clean; the control (a contracting build) flagged, on one target: the scan is the same for
    each, and a cold compile of both costs half a minute more."""
    clean = run_check("--tier", "exact", "--only", "cuda")
    assert clean.returncode == 0 and "sm_90-ptx" in clean.stdout and "sm_80-ptx" in clean.stdout, clean.stdout
    bad = run_check("--tier", "exact", "--only", "cuda", "--target", "sm_80", extra="-ffp-contract=fast")
    assert bad.returncode == 1 and "contracted FMA" in bad.stdout and "sm_90" not in bad.stdout, bad.stdout
    unknown = run_check("--target", "sm_99")
    assert unknown.returncode == 2 and "unknown target sm_99 (known: " in unknown.stderr


@pytest.mark.slow
def test_each_tier_is_scanned_by_its_own_rules() -> None:
    """The fast tier's scan (its descriptor's `scan`: compile_check's Triton compiles) runs under kernels_check, a
    row per target plus its negative controls; an unknown tier is refused."""
    require("triton (requirements-dev.txt: the fast tier's scan compiles with it)", find_spec("triton") is not None,
            "not installed")  # fmt: skip
    proc = run_check("--tier", "fast", "--only", "cuda")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"sm_90\s+fast: triton \S+\s+\d+ kernels\s+ok", proc.stdout), proc.stdout
    assert re.search(r"controls\s+fast: triton \S+\s+5 kernels\s+ok", proc.stdout), proc.stdout
    assert "gfx942" not in proc.stdout  # --only cuda keeps the tier's CUDA targets
    bad = run_check("--tier", "nope")
    assert bad.returncode != 0 and "unknown tier nope (known: exact, fast)" in bad.stdout + bad.stderr


def test_word_rules_keep_the_word_boundary() -> None:
    """word_rule moves each leading \\b behind its literal (a faster search): the matches stay re's own."""
    text = "RET xRET _RET RETx .RET v_fma_f32 xv_fma_f32 mad.f32 amad.f32"
    for pattern in (r"\bRET\b", r"\bv_fma_f32\b", r"\b(?:fma|mad)\.f32\b"):
        got = [(m.start(), m.group()) for m in asm_rules.word_rule(pattern).finditer(text)]
        assert got == [(m.start(), m.group()) for m in re.finditer(pattern, text)] and got, pattern


def test_scanners_flag_what_they_should() -> None:
    fma = "v_fmac_f32_e32 v1, v2, v3\nv_pk_fma_f32 v[0:1], v[2:3], v[4:5]"
    clean = "v_mul_f32_e32 v1, v2, v3\nv_add_f32_e32 v1, v1, v4"
    bodies = {
        "k_fma": fma,
        "k_clean": clean,
        "k_exp": "v_exp_f32_e32 v1, v2",
        "k_call": "s_swappc_b64 s[30:31], s[4:5]",
    }
    rules = {"fma": asm_rules.AMD_FMA, "math": asm_rules.AMD_VENDOR_MATH, "call": asm_rules.AMD_CALL}
    found = asm_rules.scan(bodies, rules)
    assert any(f.startswith("k_fma: fma") for f in found)
    assert any(f.startswith("k_exp: math") for f in found)
    assert any(f.startswith("k_call: call") for f in found)
    assert not any(f.startswith("k_clean") for f in found)
    assert asm_rules.PTX_FMA.search("fma.rn.f32 %f1, %f2, %f3, %f4;")
    assert asm_rules.PTX_CONTRACTIBLE.search("mul.f32 %f1, %f2, %f3;")
    assert not asm_rules.PTX_CONTRACTIBLE.search("mul.rn.f32 %f1, %f2, %f3;")
    assert asm_rules.SASS_FMA.search("FFMA R1, R2, R3, R4 ;")
    assert not asm_rules.SASS_FMA.search("HFMA2.MMA R12, -RZ, RZ, 0, 0 ;")
    assert asm_rules.sass_calls("CALL.REL.NOINC 0x100 ;\nRET.REL.NODEC R20 0x0 ;")
    assert not asm_rules.sass_calls("@!P0 CALL.REL.NOINC 0x18a0 ;\nEXIT ;")


def test_explicit_fmas_are_told_from_contracted_ones() -> None:
    """The contract's fma_rn is inline assembly: taken out of PTX / AMD assembly before the FMA rule, so a bare
    fma there is a contraction. In SASS (no marks) a shipped kernel's count must equal the reference's."""
    ptx = "// begin inline asm\nfma.rn.f32 %f1, %f2, %f3, %f4;\n// end inline asm\nmul.rn.f32 %f5, %f1, %f1;\n"
    bodies = {"k": ptx, "c": ptx + "fma.rn.f32 %f6, %f5, %f5, %f1;\n"}
    stripped = asm_rules.explicit_fmas(bodies, asm_rules.PTX_EXPLICIT_FMA)
    assert asm_rules.scan({"k": stripped["k"]}, asm_rules.PTX_RULES) == []
    assert any("contracted FMA" in f for f in asm_rules.scan({"c": stripped["c"]}, asm_rules.PTX_RULES))
    amd = ";;#ASMSTART\nv_fma_f32 v1, v2, v3, v4\n;;#ASMEND\nv_fmac_f32_e32 v5, v1, v1\n"
    stripped = asm_rules.explicit_fmas({"k": amd}, asm_rules.AMD_EXPLICIT_FMA)
    assert "v_fma_f32" not in stripped["k"] and "v_fmac_f32" in stripped["k"]
    assert asm_rules.fma_counts({"k": amd}, asm_rules.AMD_FMA) == {"k": 2}
    sass = "FFMA R1, R2, R3, 0.5 ;\nFADD R4, R1, R1 ;\n"
    assert asm_rules.fma_count_violations({"k": sass}, asm_rules.SASS_FMA, {"k": 1}) == []
    more = asm_rules.fma_count_violations({"k": sass + "FFMA R5, R4, R4, R1 ;\n"}, asm_rules.SASS_FMA, {"k": 1})
    assert more and "2 FMA instructions, 1 in the contract's compile" in more[0]
    assert asm_rules.fma_count_violations({"x": sass}, asm_rules.SASS_FMA, {})  # no reference: flagged


def test_amd_bodies_run_to_the_function_end_past_an_early_return() -> None:
    """A kernel with an early return holds two s_endpgm: what follows the first is scanned too."""
    asm = (
        "_Z1kv: ; @_Z1kv\n  s_cbranch_scc1 .LBB0_2\n  s_endpgm\n.LBB0_2:\n  v_fmac_f32_e32 v1, v2, v3\n"
        "  s_endpgm\n.Lfunc_end0:\n  .size _Z1kv, .Lfunc_end0-_Z1kv\n"
    )
    bodies = amd_toolchain.kernel_bodies_amd(asm)
    assert list(bodies) == ["_Z1kv"] and "v_fmac_f32" in bodies["_Z1kv"]
    assert asm_rules.scan(bodies, asm_rules.AMD_RULES)


# sm_80 SASS as ptxas writes it: a structured branch (0x0010 -> 0x0030, over the BRA), then the two warp
# helpers it outlines for __shfl_xor_sync (0x0060) and __syncwarp (0x00a0).
SM80_HELPERS = """
        /*0000*/                   CALL.REL.NOINC 0x0060 ;
        /*0010*/              @!P0 CALL.REL.NOINC 0x0030 ;
        /*0020*/                   BRA 0x0000 ;
        /*0030*/                   BSYNC B2 ;
        /*0040*/                   CALL.REL.NOINC 0x00a0 ;
        /*0050*/                   EXIT ;
        /*0060*/                   HFMA2.MMA R13, -RZ, RZ, 0, 0 ;
        /*0070*/                   WARPSYNC R14 ;
        /*0080*/                   SHFL.BFLY PT, R14, R17, R16, R15 ;
        /*0090*/                   RET.REL.NODEC R12 0x0 ;
        /*00a0*/                   WARPSYNC R13 ;
        /*00b0*/                   IMAD.MOV.U32 R13, RZ, RZ, 0x0 ;
        /*00c0*/                   RET.REL.NODEC R12 0x0 ;
"""


def test_sass_calls_accept_ptxas_warp_helpers_and_flag_arithmetic_subroutines() -> None:
    assert asm_rules.sass_calls(SM80_HELPERS) == []
    spilled = SM80_HELPERS.replace(  # under register pressure ptxas saves a register around the shuffle
        "WARPSYNC R14 ;",
        "STL [R1+0x6bc], R0 ;\n        /*0071*/ WARPSYNC R14 ;\n        /*0072*/ LDL.LU R0, [R1+0x6bc] ;",
    )
    assert asm_rules.sass_calls(spilled) == []
    with_math = SM80_HELPERS.replace("SHFL.BFLY PT, R14, R17, R16, R15 ;", "FADD R14, R17, R16 ;")
    assert asm_rules.sass_calls(with_math) == ["CALL.REL.NOINC 0x0060"]
    far = SM80_HELPERS.replace("@!P0 CALL.REL.NOINC 0x0030 ;", "@!P0 CALL.REL.NOINC 0x0040 ;")
    assert asm_rules.sass_calls(far) == ["CALL.REL.NOINC 0x0040"]


# ---- NaN-dropping max/min (the contract's max propagates NaN) ------------------------------------
FMAX_HIP = """#include <hip/hip_runtime.h>
__global__ void fmax_kernel(const float* a, const float* b, float* c) {
  int i = __builtin_amdgcn_workitem_id_x(); c[i] = fmaxf(a[i], b[i]); }
"""
FMAX_CUDA = """__global__ void fmax_kernel(const float* a, const float* b, float* c) {
  int i = threadIdx.x; c[i] = fmaxf(a[i], b[i]); }
"""


def test_minmax_scanners() -> None:
    amd = asm_rules.AMD_FLOAT_MINMAX
    for bad in (
        "v_max_f32_e32 v1, v2, v3",
        "v_min_f32_e64 v1, v2, v3",
        "v_max3_f32 v1, v2, v3, v4",
        "v_pk_max_f32 v[0:1], v[2:3], v[4:5]",
        "v_maximum3_f32 v1, v2, v3, v4",
        "v_med3_f32 v1, v2, v3, v4",
        "v_minimum_f32 v1, v2, v3",
        "v_max_num_f32_e32 v1, v2, v3",
    ):
        assert amd.search(bad), bad
    for ok in (
        "v_max_i32_e32 v1, v2, v3",
        "v_max_u32_e32 v1, v2, v3",
        "v_cndmask_b32_e32 v1, v2, v3, vcc",
        "v_max_u16_e32 v1, v2, v3",
        "s_max_i32 s1, s2, s3",
    ):
        assert not amd.search(ok), ok
    assert asm_rules.PTX_FLOAT_MINMAX.search("max.f32 %f1, %f2, %f3;")
    assert asm_rules.PTX_FLOAT_MINMAX.search("min.ftz.f32 %f1, %f2, %f3;")
    assert not asm_rules.PTX_FLOAT_MINMAX.search("max.NaN.f32 %f1, %f2, %f3;")
    assert not asm_rules.PTX_FLOAT_MINMAX.search("max.s32 %r1, %r2, %r3;")
    assert asm_rules.SASS_FLOAT_MINMAX.search("FMNMX R0, R1, R2, !PT ;")
    assert asm_rules.SASS_FLOAT_MINMAX.search("FMNMX.FTZ R0, R1, R2, PT ;")
    assert not asm_rules.SASS_FLOAT_MINMAX.search("FMNMX.NAN R0, R1, R2, !PT ;")


@needs_clang
def test_fmaxf_kernel_is_caught_on_amd(tmp_path: Path) -> None:
    """Negative control: a kernel using fmaxf, compiled the way the exact kernels are, is flagged."""
    src = tmp_path / "fmax.cu"
    src.write_text(FMAX_HIP)
    r = amd_toolchain.check_hip(CLANG, "gfx942", ["--offload-arch=gfx942"], [], tmp_path, src)
    assert r.kernels == 1, r
    # The max is the only violation: without the max/min rule this kernel would pass.
    assert not r.ok and all("NaN-dropping max/min" in v for v in r.violations), r


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_fmaxf_kernel_is_caught_in_ptx(tmp_path: Path) -> None:
    src = tmp_path / "fmax.cu"
    src.write_text(FMAX_CUDA)
    results = cuda_toolchain.check_cuda("sm_90", ["-arch=sm_90"], [], tmp_path, src)
    ptx = next(r for r in results if r.target.endswith("-ptx"))
    assert not ptx.ok and any("NaN-dropping max/min" in v for v in ptx.violations), ptx


# ---- --built: the device code a built library ships -----------------------------------------------
HIP_ARCHS = ["gfx942", "gfx90a"]


def test_bundle_round_trip() -> None:
    entries = [("hipv4-amdgcn-amd-amdhsa--gfx942", b"\x7fELF" + b"a" * 100), ("hipv4-amdgcn-amd-amdhsa--gfx90a", b"b")]
    blob = built_library.write_bundle(entries)
    two = blob + b"\0" * 7 + blob  # a section holds one bundle per translation unit
    got = built_library.unbundle(two)
    assert [t for t, _ in got] == ["host-x86_64-unknown-linux-gnu-", *(t for t, _ in entries)] * 2
    assert [c for _, c in got][1:3] == [c for _, c in entries]


@pytest.mark.slow(minutes=True)
@needs_clang
def test_built_hip_object_clean_and_contracted_caught(tmp_path: Path) -> None:
    """--built on a host object that embeds the exact kernels' AMD code objects (.hip_fatbin) for two
    targets: clean with the contract's flags; with -ffp-contract=fast it fails (contracted FMA)."""
    unit = compile_unit.write_unit(tmp_path)
    good = built_library.build_hip_fat_object(unit, HIP_ARCHS, tmp_path / "good.o")
    proc = run_check("--built", str(good))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for arch in HIP_ARCHS:
        assert re.search(rf"built-{arch}\s+\S+\s+\d+ kernels\s+ok", proc.stdout), proc.stdout
    assert "FAIL" not in proc.stdout
    bad = built_library.build_hip_fat_object(unit, HIP_ARCHS[:1], tmp_path / "bad.o", ["-ffp-contract=fast"])
    proc = run_check("--built", str(bad))
    assert proc.returncode == 1, proc.stdout
    assert "contracted FMA" in proc.stdout and "FAIL" in proc.stdout


def test_built_rejects_a_library_without_device_code(tmp_path: Path) -> None:
    """A library without device code proves nothing: --built fails rather than passes. (A shared object that
    surely has none: the standard library's _ctypes; rl_kernel._C has device code in a GPU build.)"""
    import _ctypes

    proc = run_check("--built", _ctypes.__file__)
    assert proc.returncode == 1, proc.stdout
    assert "no .hip_fatbin or .nv_fatbin section" in proc.stdout


@pytest.mark.slow(minutes=True)
def test_built_cuda_object_clean_and_fmad_caught(tmp_path: Path) -> None:
    """--built on an object whose .nv_fatbin carries nvcc's sm_90 code of the exact kernels (the cubin of the PTX
    check: the same compile, kept by the cache; packed by fatbinary as nvcc packs it), through cuobjdump -sass:
    clean with --fmad=false; with --fmad=true it fails (FFMA)."""
    missing = [t for t in ("nvcc", "cuobjdump", "fatbinary", "objcopy") if not shutil.which(t)]
    require(f"the CUDA tools {', '.join(missing)}", not missing, "not on PATH (.ci/run installs them)")
    unit = compile_unit.write_unit(tmp_path)
    host = tmp_path / "empty.o"
    subprocess.run(["cc", "-x", "c", "-c", "-", "-o", str(host)], input="", text=True, check=True)
    for extra, want in (([], 0), (["-ffp-contract=fast"], 1)):
        (tmp_path / "sm_90.cubin").unlink(missing_ok=True)
        cuda_toolchain.check_cuda("sm_90", ["-arch=sm_90"], extra, tmp_path, unit)
        fatbin, obj = tmp_path / f"k{want}.fatbin", tmp_path / f"k{want}.o"
        image = f"--image3=kind=elf,sm=90,file={tmp_path / 'sm_90.cubin'}"
        subprocess.run(["fatbinary", f"--create={fatbin}", "-64", image], check=True, capture_output=True)
        subprocess.run(["objcopy", "--add-section", f".nv_fatbin={fatbin}", "--set-section-flags",
                        ".nv_fatbin=alloc,readonly", str(host), str(obj)], check=True, capture_output=True)  # fmt: skip
        proc = run_check("--built", str(obj))
        assert proc.returncode == want, proc.stdout
        if want:
            assert "contracted FMA" in proc.stdout
        else:
            assert "sm_90" in proc.stdout and "FAIL" not in proc.stdout


def test_a_compile_is_kept_for_every_clone_of_the_same_sources(tmp_path: Path, monkeypatch) -> None:
    """compile_cached's key leaves out the checkout's folder (in the include flags and the unit's #includes), so a
    fresh clone of the same sources reuses the kept compiles; what the unit includes and the flags still key it."""
    monkeypatch.setenv("RL_KERNEL_CHECK_CACHE", str(tmp_path / "cache"))

    def entry(root: Path, include: str = "kernels/x_check.cu", flag: str = "-O2") -> Path:
        monkeypatch.setattr(compile_unit.build_flags, "REPO", root)
        unit, out = tmp_path / f"unit-{len(list(tmp_path.iterdir()))}.cu", tmp_path / "out.o"
        unit.write_text(f'#include "{root / include}"\n')
        with compile_unit._kept_entry(["clang", f"-I{root}/kernels", flag, str(unit), "-o", str(out)], (unit, out),
                                      [unit]) as kept:  # fmt: skip
            return kept

    here = entry(Path("/work/one"))
    assert entry(Path("/tmp/another-clone")) == here
    assert entry(Path("/work/one"), include="kernels/y_check.cu") != here  # another source: another entry
    assert entry(Path("/work/one"), flag="-ffp-contract=fast") != here  # another flag: another entry
