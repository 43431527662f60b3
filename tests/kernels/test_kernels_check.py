"""`make kernels-check`: the static scan of the exact kernels' device code.

The scan must pass on the contract's flags and must fail when contraction is
switched on (its negative control). clang 19 is installed by .ci/run, so in CI
(CI=true) a missing compiler is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "kernels" / "check" / "kernels_check.py"
sys.path.insert(0, str(CHECK.parent))
import kernels_check  # noqa: E402

CLANG = kernels_check.find_clang()
if CLANG is None and os.environ.get("CI") == "true":
    raise RuntimeError("clang++-19 is missing in CI: .ci/run must install clang-19 llvm-19 lld-19 libamdhip64-dev")
needs_clang = pytest.mark.skipif(CLANG is None, reason="clang++-19 not installed (apt-get install clang-19)")
if shutil.which("nvcc") is None and os.environ.get("CI") == "true":
    raise RuntimeError("nvcc is missing in CI: the CUDA half of kernels-check cannot run")


def run_check(*args: str, extra: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, RL_KERNEL_EXTRA_FLAGS=extra)
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, env=env, check=False)


@needs_clang
def test_hip_targets_clean_with_contract_flags() -> None:
    proc = run_check("--only", "hip")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for target, _ in kernels_check.HIP_TARGETS:
        assert f"{target} " in proc.stdout
    assert "FAIL" not in proc.stdout


@needs_clang
def test_contracted_build_is_caught() -> None:
    proc = run_check("--only", "hip", extra="-ffp-contract=fast")
    assert proc.returncode == 1, proc.stdout
    assert "contracted FMA" in proc.stdout
    assert proc.stdout.count("FAIL") == len(kernels_check.HIP_TARGETS)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_ptx_clean_and_negative_control() -> None:
    assert run_check("--only", "cuda").returncode == 0
    bad = run_check("--only", "cuda", extra="-ffp-contract=fast")
    assert bad.returncode == 1 and "contracted FMA" in bad.stdout


def test_scanners_flag_what_they_should() -> None:
    fma = "v_fmac_f32_e32 v1, v2, v3\nv_pk_fma_f32 v[0:1], v[2:3], v[4:5]"
    clean = "v_mul_f32_e32 v1, v2, v3\nv_add_f32_e32 v1, v1, v4"
    bodies = {
        "k_fma": fma,
        "k_clean": clean,
        "k_exp": "v_exp_f32_e32 v1, v2",
        "k_call": "s_swappc_b64 s[30:31], s[4:5]",
    }
    rules = {"fma": kernels_check.AMD_FMA, "math": kernels_check.AMD_VENDOR_MATH, "call": kernels_check.AMD_CALL}
    found = kernels_check.scan(bodies, rules)
    assert any(f.startswith("k_fma: fma") for f in found)
    assert any(f.startswith("k_exp: math") for f in found)
    assert any(f.startswith("k_call: call") for f in found)
    assert not any(f.startswith("k_clean") for f in found)
    assert kernels_check.PTX_FMA.search("fma.rn.f32 %f1, %f2, %f3, %f4;")
    assert kernels_check.PTX_CONTRACTIBLE.search("mul.f32 %f1, %f2, %f3;")
    assert not kernels_check.PTX_CONTRACTIBLE.search("mul.rn.f32 %f1, %f2, %f3;")
    assert kernels_check.SASS_FMA.search("FFMA R1, R2, R3, R4 ;")
    assert not kernels_check.SASS_FMA.search("HFMA2.MMA R12, -RZ, RZ, 0, 0 ;")
    assert kernels_check.sass_calls("CALL.REL.NOINC 0x100 ;\nRET.REL.NODEC R20 0x0 ;")
    assert not kernels_check.sass_calls("@!P0 CALL.REL.NOINC 0x18a0 ;\nEXIT ;")
