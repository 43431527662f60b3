"""Builds rl_kernel._C: always the CPU reference; CUDA or HIP when torch has them.

RL_KERNEL_BUILD=cpu|gpu|auto (default auto) chooses. No GPU is needed to build:
CUDA targets come from TORCH_CUDA_ARCH_LIST, ROCm targets from PYTORCH_ROCM_ARCH
or GPU_TARGETS (default gfx90a;gfx942;gfx1100).
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

ROOT = Path(__file__).parent
# Flags and the discovered sources (<tier>/common/*.cpp, <tier>/<family>/*_cpu.cpp and *_gpu.cu); no list here.
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
        return CppExtension("rl_kernel._C", flags["sources"](gpu=False), extra_compile_args={"cxx": cxx})
    if torch.version.hip is not None:
        os.environ["PYTORCH_ROCM_ARCH"] = flags["rocm_arch"]()
        device = flags["HIP_FLAGS"] + extra
    else:
        device = flags["NVCC_FLAGS"] + extra
    return CUDAExtension(
        "rl_kernel._C",
        flags["sources"](gpu=True),
        extra_compile_args={"cxx": cxx, "nvcc": device},
    )


def _output_line(cmd: list[str], last: bool = False) -> str:
    """One line of a command's output ('' if it cannot run): compiler versions and the git revision."""
    try:
        lines = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return ""
    return (lines[-1] if last else lines[0]) if lines else ""


def _device_compiler() -> str:
    if torch.version.hip:
        return _output_line(["hipcc", "--version"])
    return _output_line(["nvcc", "--version"], last=True) if torch.version.cuda else ""


def build_record(ext) -> dict:
    """kernels/rl_kernel/_build.json: compilers, flags, targets and revision; the fingerprint reads it."""
    args = ext.extra_compile_args
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "cxx": _output_line([os.environ.get("CXX", "c++"), "--version"]),
        "cxx_flags": args["cxx"] if isinstance(args, dict) else args,
        "device_compiler": _device_compiler(),
        "device_flags": args.get("nvcc", []) if isinstance(args, dict) else [],
        "cuda_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
        "rocm_arch": os.environ.get("PYTORCH_ROCM_ARCH", "") if torch.version.hip else "",
        "revision": os.environ.get("RLPARITY_REVISION") or _output_line(["git", "-C", str(ROOT), "rev-parse", "HEAD"]),
        "sources": flags["contract_digest"](),  # what is compiled (build_flags.contract_digest)
    }


class BuildExt(BuildExtension):
    """RL_KERNEL_PREBUILT=PATH ships that library as rl_kernel._C instead of compiling it, when it is what this
    build would compile (build_flags.prebuilt_differs: its build record equals this one but for the revision);
    otherwise this compiles, saying why. tests/repo/test_wheel.py passes make build's in-place extension."""

    def build_extension(self, ext) -> None:
        library = os.environ.get("RL_KERNEL_PREBUILT")
        if library:
            why = flags["prebuilt_differs"](Path(library), RECORD)
            if why is None:
                out = Path(self.get_ext_fullpath(ext.name))
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(library, out)
                print(f"rl_kernel._C: not compiled, the prebuilt {library} (the same build record)")
                return
            print(f"rl_kernel._C: compiled, not the prebuilt {library}: {why}")
        super().build_extension(ext)


ext = extension()
RECORD = build_record(ext)
(ROOT / "kernels/rl_kernel/_build.json").write_text(json.dumps(RECORD, indent=1) + "\n")
setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt.with_options(use_ninja=True)})
