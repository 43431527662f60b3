"""Builds rl_kernel._C: always the CPU reference; CUDA or HIP when torch has them.

RL_KERNEL_BUILD=cpu|gpu|auto (default auto) chooses. No GPU is needed to build:
CUDA targets come from TORCH_CUDA_ARCH_LIST, ROCm targets from PYTORCH_ROCM_ARCH
or GPU_TARGETS (default gfx90a;gfx942;gfx1100).
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

ROOT = Path(__file__).parent
CSRC = "kernels/rl_kernel/csrc"
flags = runpy.run_path(str(ROOT / "kernels/rl_kernel/build_flags.py"))


def want_gpu() -> bool:
    mode = os.environ.get("RL_KERNEL_BUILD", "auto")
    if mode not in ("auto", "cpu", "gpu"):
        raise SystemExit(f"RL_KERNEL_BUILD must be auto, cpu or gpu, not {mode!r}")
    has_gpu_torch = torch.version.cuda is not None or torch.version.hip is not None
    if mode == "gpu" and not has_gpu_torch:
        raise SystemExit("RL_KERNEL_BUILD=gpu but this torch has neither CUDA nor ROCm")
    return mode != "cpu" and has_gpu_torch


def extension():
    extra = flags["extra_flags"]()
    cxx = flags["CXX_FLAGS"] + extra
    if not want_gpu():
        return CppExtension("rl_kernel._C", [f"{CSRC}/ops_cpu.cpp"], extra_compile_args={"cxx": cxx})
    if torch.version.hip is not None:
        os.environ["PYTORCH_ROCM_ARCH"] = flags["rocm_arch"]()
        device = flags["HIP_FLAGS"] + extra
    else:
        device = flags["NVCC_FLAGS"] + extra
    return CUDAExtension(
        "rl_kernel._C",
        [f"{CSRC}/ops_cpu.cpp", f"{CSRC}/ops_gpu.cu"],
        extra_compile_args={"cxx": cxx, "nvcc": device},
    )


setup(ext_modules=[extension()], cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)})
