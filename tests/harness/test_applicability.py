"""Which cells can run on which inventory, and why the others are skipped."""

from __future__ import annotations

import dataclasses
import json

from rlparity import inventory
from rlparity.applicability import devices_for, skip_reason
from rlparity.inventory import Device, Inventory

from harness.factories import (
    make_cell,
)

# ---- applicability --------------------------------------------------------------------------------------
MI300X = Device(0, "rocm", "AMD Instinct MI300X", "gfx942", 64)
MI210 = Device(0, "rocm", "AMD Instinct MI210", "gfx90a", 64)


def mi250x_host(gpu: bool = True) -> Inventory:
    devs = tuple(Device(i, "rocm", "AMD Instinct MI250X", "gfx90a", 64) for i in range(4))
    return Inventory(devs, ((0, 1), (2, 3)), gpu)


def test_cpu_cell_runs_without_gpu():
    cell = make_cell("cpu")
    assert skip_reason(cell, Inventory()) is None
    assert devices_for(cell, Inventory()) == [[]]
    # a failed device probe does not stop a CPU cell
    assert skip_reason(cell, Inventory(error="RuntimeError: boom")) is None


def test_gpu_cell_on_a_host_without_gpu():
    reason = skip_reason(make_cell("gfx942"), Inventory())
    assert reason and "gfx942" in reason and "no GPU" in reason


def test_gfx942_cell_on_mi300x_runs():
    inv = Inventory((MI300X,), (), True)
    cell = make_cell("gfx942")
    assert skip_reason(cell, inv) is None
    assert devices_for(cell, inv) == [[0]]


def test_arch_mismatch_is_skipped():
    inv = Inventory((MI210,), (), True)
    reason = skip_reason(make_cell("gfx942"), inv)
    assert reason and "gfx942" in reason and "MI210" in reason and "gfx90a" in reason
    assert devices_for(make_cell("gfx942"), inv) == []


def test_cuda_target_needs_a_cuda_device():
    h200 = Device(0, "cuda", "NVIDIA H200", "sm_90", 32)
    assert skip_reason(make_cell("sm90"), Inventory((h200,), (), True)) is None
    assert "sm_90" in skip_reason(make_cell("sm90"), Inventory((MI300X,), (), True))


def test_dual_die_on_cpu_is_skipped():
    reason = skip_reason(make_cell("cpu", placement="dual-die"), Inventory())
    assert reason and "dual-die" in reason


def test_dual_die_with_a_die_pair_runs():
    cell = make_cell("gfx90a", placement="dual-die")
    inv = mi250x_host()
    assert skip_reason(cell, inv) is None
    assert devices_for(cell, inv) == [[0, 1], [2, 3]]


def test_dual_die_without_a_pair_is_skipped():
    inv = Inventory((MI210, Device(1, "rocm", "AMD Instinct MI210", "gfx90a", 64)), (), True)
    reason = skip_reason(make_cell("gfx90a", placement="dual-die"), inv)
    assert reason and "dual-die" in reason and "gfx90a" in reason


def test_dual_die_pair_of_another_arch_does_not_count():
    devs = (
        Device(0, "rocm", "MI250X", "gfx90a", 64),
        Device(1, "rocm", "MI250X", "gfx90a", 64),
        dataclasses.replace(MI300X, index=2),
    )
    inv = Inventory(devs, ((0, 1),), True)
    assert skip_reason(make_cell("gfx942", placement="dual-die"), inv) is not None


def test_split_needs_two_devices():
    cell = make_cell("gfx942", placement="split")
    one = Inventory((MI300X,), (), True)
    reason = skip_reason(cell, one)
    assert reason and "two" in reason and "has 1" in reason
    four = Inventory(tuple(Device(i, "rocm", "MI300X", "gfx942", 64) for i in range(4)), (), True)
    assert skip_reason(cell, four) is None
    assert devices_for(cell, four) == [[0, 1], [2, 3]]


# What a probe of an image with both tiers and the three workloads reports (rlparity.cell.inventory.offered).
BOTH_TIERS = {
    "exact": {"platforms": ["cpu", "cuda", "rocm"], "operators": ["token_logprobs", "row_stats", "linear"]},
    "fast": {"platforms": ["cuda", "rocm"], "operators": ["token_logprobs", "row_stats", "linear"], "dtypes": ["bf16"]},
}
WORKLOADS = {"plain": {"params": [], "needs": ["token_logprobs"]}, "model": {"params": [], "needs": ["attention"]}}


def test_a_tier_the_image_lacks_is_skipped_with_what_it_offers():
    """An inventory that reports no tiers (an older probe) offers the exact tier only."""
    reason = "this image's rl_kernel offers no tier 'fast' (it offers: exact)"
    assert skip_reason(make_cell("cpu", tier="fast"), Inventory()) == reason
    assert skip_reason(make_cell("gfx942", tier="fast"), Inventory((MI300X,), (), True)) == reason


def test_the_fast_tier_skips_on_a_cpu_for_no_gpu_and_runs_on_its_gpu():
    both = Inventory((MI300X,), (), True, tiers=BOTH_TIERS)
    reason = skip_reason(make_cell("cpu", tier="fast", dtype="bf16"), both)
    assert reason == "no GPU: the fast tier has no CPU kernels (it runs on cuda, rocm)"
    assert skip_reason(make_cell("gfx942", tier="fast", dtype="bf16"), both) is None
    assert skip_reason(make_cell("cpu", tier="exact"), both) is None
    assert skip_reason(make_cell("gfx942", tier="fast"), both) == "the fast tier takes bf16, not fp32"


def test_a_workload_the_image_lacks_or_a_tier_without_its_operators_is_skipped():
    inv = Inventory((MI300X,), (), True, tiers=BOTH_TIERS, workloads=WORKLOADS)
    assert skip_reason(make_cell("cpu"), inv) is None  # plain
    edges = dataclasses.replace(make_cell("cpu"), workload="edges")
    assert skip_reason(edges, inv) == "this image offers no workload 'edges' (it offers: plain, model)"
    model = dataclasses.replace(make_cell("gfx942", tier="fast", dtype="bf16"), workload="model")
    assert skip_reason(model, inv) == "the fast tier provides no attention, which the model workload calls"
    # a probe that lists no operators for a tier (an older image) does not skip the tier's cells on their account
    unlisted = {**BOTH_TIERS, "fast": {k: v for k, v in BOTH_TIERS["fast"].items() if k != "operators"}}
    assert skip_reason(model, dataclasses.replace(inv, tiers=unlisted)) is None


def test_build_without_gpu_kernels_is_skipped():
    reason = skip_reason(make_cell("gfx942"), Inventory((MI300X,), (), False))
    assert reason and "no GPU kernels" in reason


def test_inventory_error_skips_gpu_cells_with_the_error():
    reason = skip_reason(make_cell("gfx942"), Inventory(error="RuntimeError: HIP error: no ROCm-capable device"))
    assert reason and "RuntimeError: HIP error: no ROCm-capable device" in reason


def test_inventory_round_trips_through_a_dict():
    inv = mi250x_host()
    back = Inventory.from_dict(json.loads(json.dumps(inv.to_dict())))
    assert back == inv
    assert inventory.normalise_arch("gfx942:sramecc+:xnack-") == "gfx942"
