"""The environment fingerprint every result carries (design.md): versions, build, devices, driver, the
env vars that change numerics, the image. `rlparity env` prints it; the report diffs it between runs."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

ENV_PREFIXES = (
    "HSA_", "HIP_", "ROCR_", "ROCM_", "MIOPEN_", "PYTORCH_TUNABLEOP_", "ROCBLAS_", "HIPBLASLT_", "CUBLAS_",
    "CUBLASLT_", "CUDA_", "NCCL_", "RCCL_", "OMP_", "MKL_", "RL_KERNEL_", "TORCH_", "PYTORCH_",
)  # fmt: skip
IMAGE_RECORD = Path("/etc/rlparity/build.json")  # written into the image at build time (docker/)
VOLATILE = ("hostname", "pid")  # left out of the hash: they change between identical environments


def relevant_env(environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    return {k: environ[k] for k in sorted(environ) if k.startswith(ENV_PREFIXES)}


def collect() -> dict[str, Any]:
    """Fingerprint this process's environment (imports torch and rl_kernel)."""
    import torch

    fp: dict[str, Any] = {
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "hostname": platform.node(),
        "pid": os.getpid(),
        "torch": {
            "version": torch.__version__,
            "git": getattr(torch.version, "git_version", ""),
            "cuda": torch.version.cuda,
            "hip": torch.version.hip,
            "debug": torch.version.debug,
            "threads": torch.get_num_threads(),
        },
        "rl_kernel": _rl_kernel(),
        "devices": _devices(torch),
        "driver": _driver(),
        "rocm": _read(Path("/opt/rocm/.info/version")),
        "env": relevant_env(),
        "image": {
            "name": os.environ.get("RLPARITY_IMAGE", ""),
            "digest": os.environ.get("RLPARITY_IMAGE_DIGEST", ""),
            "record": _json(IMAGE_RECORD),
        },
    }
    return fp


def fingerprint_hash(fp: dict[str, Any]) -> str:
    stable = {k: v for k, v in fp.items() if k not in VOLATILE}
    return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()[:16]


def diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Leaf-by-leaf differences between two fingerprints: [(dotted key, a value, b value)]."""
    out = []
    for key in sorted(set(a) | set(b)):
        if not prefix and key in VOLATILE:
            continue
        va, vb = a.get(key), b.get(key)
        name = f"{prefix}{key}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += diff(va, vb, name + ".")
        elif va != vb:
            out.append((name, va, vb))
    return out


def _rl_kernel() -> dict[str, Any]:
    try:
        import rl_kernel
        from rl_kernel import build_flags
        from rl_kernel._ops import has_gpu_kernels
    except ImportError as exc:
        return {"error": str(exc)}
    pkg = Path(rl_kernel.__file__).parent
    lib = os.environ.get("RL_KERNEL_LIBRARY") or next((str(p) for p in sorted(pkg.glob("_C*.so"))), "")
    return {
        "tier": rl_kernel.TIER,
        "library": Path(lib).name if lib else "",
        "library_sha256": _sha256(Path(lib)) if lib else "",
        "gpu_kernels": has_gpu_kernels(),
        "contract_flags": {"cxx": build_flags.CXX_FLAGS, "nvcc": build_flags.NVCC_FLAGS, "hip": build_flags.HIP_FLAGS},
        "extra_flags": build_flags.extra_flags(),
        "build": _json(pkg / "_build.json"),
    }


def _devices(torch) -> list[dict[str, Any]]:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(
            {
                "index": i,
                "name": p.name,
                "arch": p.gcnArchName if torch.version.hip else f"sm_{p.major}{p.minor}",
                "wave": int(getattr(p, "warp_size", 0) or 0),
                "units": p.multi_processor_count,
                "memory_gib": round(p.total_memory / 2**30, 1),
            }
        )
    return out


def _driver() -> str:
    nv = _read(Path("/proc/driver/nvidia/version"))
    if nv:
        return nv.splitlines()[0]
    amd = _read(Path("/sys/module/amdgpu/version"))
    return f"amdgpu {amd}" if amd else ""


def _cpu_model() -> str:
    for line in (_read(Path("/proc/cpuinfo")) or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _json(path: Path) -> dict[str, Any]:
    text = _read(path)
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {"error": f"{path} is not JSON"}


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def main() -> int:
    fp = collect()
    json.dump({"hash": fingerprint_hash(fp), **fp}, sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
