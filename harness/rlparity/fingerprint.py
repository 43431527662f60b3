"""The environment fingerprint every result carries (design.md): versions, build, devices, driver, the
env vars that change numerics, the image. `rlparity env` prints it; the report diffs it between runs.

Host side: the hash, the diff and the file readers. Collecting it (torch, rl_kernel) is rlparity.cell.fingerprint."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from rlparity.inventory import PackagePartitions

ENV_PREFIXES = (
    "HSA_", "HIP_", "ROCR_", "ROCM_", "MIOPEN_", "PYTORCH_TUNABLEOP_", "ROCBLAS_", "HIPBLASLT_", "CUBLAS_",
    "CUBLASLT_", "CUDA_", "NCCL_", "RCCL_", "OMP_", "MKL_", "RL_KERNEL_", "TORCH_", "PYTORCH_",
)  # fmt: skip
IMAGE_RECORD = Path("/etc/rlparity/build.json")  # written into the image at build time (docker/)
VOLATILE = ("hostname", "pid")  # left out of the hash: they change between identical environments


def relevant_env(environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    return {k: environ[k] for k in sorted(environ) if k.startswith(ENV_PREFIXES)}


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


def partitions_record(partitions: tuple[PackagePartitions, ...]) -> dict[str, dict[str, Any]]:
    """{package PCI address: its modes and XCCs}: keyed, not a list, so that diff() names the field that
    changed (partitions.0000:c1:00.0.compute SPX -> CPX) and a package added or gone is one row."""
    return {
        p.bdf: {
            "compute": p.compute,
            "memory": p.memory,
            "compute_modes": list(p.compute_modes),
            "memory_modes": list(p.memory_modes),
            "num_xcc": list(p.num_xcc),
        }
        for p in partitions
    }


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
