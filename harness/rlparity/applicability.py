"""Can a cell run here? Pure: a cell and the host's inventory in, None or the reason to skip out.

A skipped cell is never counted as passed; with --strict a required skipped cell fails the gate.
"""

from __future__ import annotations

from rlparity.cells import Cell
from rlparity.inventory import Device, Inventory

FAST_TIER_MISSING = "the fast tier (matrix cores, per-target digests) is not implemented in rl_kernel: only 'exact'"


def skip_reason(cell: Cell, inv: Inventory) -> str | None:
    if cell.tier == "fast":
        return FAST_TIER_MISSING
    if cell.platform == "cpu":
        if cell.placement == "dual-die":
            return "dual-die places rollout and training on two dies of one GPU package: not a CPU placement"
        return None
    if inv.error:
        return f"could not list this host's devices: {inv.error}"
    found = inv.matching(cell.platform, cell.arch)
    if not found:
        return f"target {cell.target} needs a {cell.platform.upper()} device with arch {cell.arch}; {_have(inv)}"
    if not inv.rl_kernel_gpu:
        return "this rl_kernel build has no GPU kernels (built with RL_KERNEL_BUILD=cpu or a CPU-only torch)"
    if cell.placement == "dual-die" and not pair_for(cell, inv):
        return f"dual-die needs two dies of one package of {cell.arch} (e.g. an MI250X's GCD pair); none found"
    if cell.placement == "split" and len(found) < 2:
        return f"split shards over two {cell.arch} devices; this host has {len(found)}"
    return None


def devices_for(cell: Cell, inv: Inventory) -> list[list[int]]:
    """The device sets a cell may run on (each a list of device indices), for scheduling."""
    if cell.platform == "cpu":
        return [[]]
    found = [d.index for d in inv.matching(cell.platform, cell.arch)]
    if cell.placement == "single":
        return [[i] for i in found]
    if cell.placement == "dual-die":
        return [list(p) for p in pair_for(cell, inv)]
    return [found[i : i + 2] for i in range(0, len(found) - 1, 2)]


def pair_for(cell: Cell, inv: Inventory) -> list[tuple[int, int]]:
    ok = {d.index for d in inv.matching(cell.platform, cell.arch)}
    return [p for p in inv.die_pairs if p[0] in ok and p[1] in ok]


def _have(inv: Inventory) -> str:
    if not inv.devices:
        return "this host has no GPU"
    return "this host has " + ", ".join(sorted({_describe(d) for d in inv.devices}))


def _describe(d: Device) -> str:
    return f"{d.name} ({d.platform} {d.arch})"
