"""Can a cell run here? Pure: a cell and the host's inventory in, None or the reason to skip out.

A skipped cell is never counted as passed; with --strict a required skipped cell fails the gate.
"""

from __future__ import annotations

from rlparity.cells import Cell
from rlparity.inventory import Device, Inventory


def offer_reason(cell: Cell, inv: Inventory) -> str | None:
    """Why the image cannot run the cell's tier or workload at all (the probe says what it offers)."""
    tiers = inv.offered_tiers()
    if cell.tier not in tiers:
        return f"this image's rl_kernel offers no tier {cell.tier!r} (it offers: {', '.join(tiers) or 'none'})"
    dtypes = tiers[cell.tier].get("dtypes")
    if dtypes and cell.dtype not in dtypes:
        return f"the {cell.tier} tier takes {', '.join(dtypes)}, not {cell.dtype}"
    if inv.workloads is None:
        return None
    if cell.workload not in inv.workloads:
        return f"this image offers no workload {cell.workload!r} (it offers: {', '.join(inv.workloads) or 'none'})"
    ops = tiers[cell.tier].get("operators") or []
    missing = [op for op in inv.workloads[cell.workload].get("needs", []) if ops and op not in ops]
    if missing:
        return f"the {cell.tier} tier provides no {', '.join(missing)}, which the {cell.workload} workload calls"
    return None


def platform_reason(cell: Cell, inv: Inventory) -> str | None:
    """Why the cell's tier has no kernels for its target's platform (the fast tier on the CPU)."""
    platforms = inv.offered_tiers()[cell.tier].get("platforms", [])
    if cell.platform in platforms:
        return None
    if cell.platform == "cpu":
        return f"no GPU: the {cell.tier} tier has no CPU kernels (it runs on {', '.join(platforms)})"
    return f"the {cell.tier} tier has no {cell.platform} kernels (it runs on {', '.join(platforms)})"


def skip_reason(cell: Cell, inv: Inventory) -> str | None:
    reason = offer_reason(cell, inv)
    if reason:
        return reason
    if cell.platform == "cpu":
        if cell.placement == "dual-die":
            return "dual-die places rollout and training on two dies of one GPU package: not a CPU placement"
        return platform_reason(cell, inv)
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
    return platform_reason(cell, inv)


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
