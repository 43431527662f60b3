"""Compiler flags that are part of the numerical contract (docs/numerics.md).

Pure data, importable before the extension is built: setup.py, `make kernels-check`
and the environment fingerprint all read it, so there is one list.
"""

from __future__ import annotations

import os
import shlex

# Host C++ (the CPU golden reference): every mul and add rounded on its own.
CXX_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-fno-finite-math-only"]

# nvcc: no FMA contraction on device code; IEEE division/sqrt (none is used on exact paths).
NVCC_FLAGS = [
    "-O3",
    "-std=c++17",
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
    "-Xcompiler=-ffp-contract=off",
]

# hipcc / clang -x hip: the same rules for AMD targets.
HIP_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-fno-gpu-flush-denormals-to-zero"]

DEFAULT_ROCM_ARCH = "gfx90a;gfx942;gfx1100"


def extra_flags() -> list[str]:
    """Flags appended from RL_KERNEL_EXTRA_FLAGS (the negative control uses it)."""
    return shlex.split(os.environ.get("RL_KERNEL_EXTRA_FLAGS", ""))


def rocm_arch() -> str:
    """GPU targets for a ROCm build: PYTORCH_ROCM_ARCH, else GPU_TARGETS, else the default."""
    return os.environ.get("PYTORCH_ROCM_ARCH") or os.environ.get("GPU_TARGETS") or DEFAULT_ROCM_ARCH
