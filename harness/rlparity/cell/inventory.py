"""What this process's torch sees: `python -m rlparity.cell.inventory` prints the Inventory as JSON.

The local backend runs it on the host (in a subprocess), the docker backend inside the image; a cell
calls probe() directly before it runs.
"""

from __future__ import annotations

import json
import os
import sys

from rlparity.inventory import (
    MULTI_DIE_PRODUCTS,
    Device,
    Inventory,
    PackagePartitions,
    die_pairs,
    map_pairs,
    normalise_arch,
    read_kfd_topology,
    read_partitions,
    visible_kfd_indices,
)


def probe() -> Inventory:
    """Ask torch (in this process) what it sees."""
    import torch

    devices = []
    if torch.cuda.is_available():
        platform = "rocm" if torch.version.hip else "cuda"
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            arch = normalise_arch(getattr(p, "gcnArchName", "")) if platform == "rocm" else f"sm_{p.major}{p.minor}"
            devices.append(Device(i, platform, p.name, arch, int(getattr(p, "warp_size", 0) or 0)))
    pairs: list[tuple[int, int]] = []
    partitions: tuple[PackagePartitions, ...] = ()
    if any(d.platform == "rocm" for d in devices):
        nodes = read_kfd_topology()
        partitions = read_partitions()
        multi_die = any(name in d.name for d in devices for name in MULTI_DIE_PRODUCTS)
        visible = visible_kfd_indices(os.environ, len(nodes))
        pairs = map_pairs(die_pairs(nodes, multi_die, partitions), visible) if visible is not None else []
    try:
        from rl_kernel._library import has_gpu_kernels

        gpu = has_gpu_kernels()
    except ImportError:
        gpu = False
    return Inventory(tuple(devices), tuple(pairs), gpu, partitions=partitions, **offered())


def offered() -> dict[str, dict]:
    """The tiers and workloads this installation offers (folders and entry points), as plain data."""
    from rl_kernel import tiers
    from rlparity.cell import workloads

    return {
        "tiers": {name: t.describe() for name, t in tiers.tiers().items()},
        "workloads": {name: w.describe() for name, w in workloads.workloads().items()},
    }


def main() -> int:
    try:
        inv = probe()
    except Exception as exc:  # report, do not crash the scheduler: it turns this into skip reasons
        inv = Inventory(error=f"{type(exc).__name__}: {exc}")
    json.dump(inv.to_dict(), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
