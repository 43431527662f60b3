"""The fingerprint of a cell's process (torch, rl_kernel, devices, driver, env): what result.json records.

`python -m rlparity.cell.fingerprint` prints it as JSON (`rlparity env` runs that: the host never imports
torch). The pure parts (hash, diff, the env filter) are host code in rlparity.fingerprint.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from rlparity.fingerprint import (
    IMAGE_RECORD,
    _cpu_model,
    _driver,
    _json,
    _read,
    _sha256,
    fingerprint_hash,
    partitions_record,
    relevant_env,
)
from rlparity.inventory import read_partitions


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
        "partitions": partitions_record(read_partitions()),
        "env": relevant_env(),
        "image": {
            "name": os.environ.get("RLPARITY_IMAGE", ""),
            "digest": os.environ.get("RLPARITY_IMAGE_DIGEST", ""),
            "record": _json(IMAGE_RECORD),
        },
    }
    return fp


def _rl_kernel() -> dict[str, Any]:
    try:
        import rl_kernel
        from rl_kernel import build_flags
        from rl_kernel._library import BUILD_RECORD, EXTENSION, has_gpu_kernels
    except ImportError as exc:
        return {"error": str(exc)}
    lib = os.environ.get("RL_KERNEL_LIBRARY") or (str(EXTENSION) if EXTENSION.is_file() else "")
    return {
        "tiers": {name: tier.fingerprint() for name, tier in rl_kernel.tiers.tiers().items()},
        "library": Path(lib).name if lib else "",
        "library_sha256": _sha256(Path(lib)) if lib else "",
        "gpu_kernels": has_gpu_kernels(),
        "contract_flags": {"cxx": build_flags.CXX_FLAGS, "nvcc": build_flags.NVCC_FLAGS, "hip": build_flags.HIP_FLAGS},
        "extra_flags": build_flags.extra_flags(),
        "build": _json(BUILD_RECORD),
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


def main() -> int:
    fp = collect()
    json.dump({"hash": fingerprint_hash(fp), **fp}, sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
