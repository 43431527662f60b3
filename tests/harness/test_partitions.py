"""MI300X/MI355X partition modes: read from synthetic sysfs trees (DRM + KFD), carried by the inventory and the
fingerprint, and dual-die pairing of the partitions of one package."""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from rlparity import inventory
from rlparity.cell import fingerprint as cell_fingerprint
from rlparity.cell import inventory as cell_inventory
from rlparity.fingerprint import diff, partitions_record
from rlparity.inventory import Inventory, PackagePartitions

DATA = Path(__file__).parent / "data"
MI300X_MODES = ("SPX, DPX, QPX, CPX", "NPS1, NPS4")


@dataclass
class Package:
    """One synthetic GPU package: its PCI address, the DRM files (None: absent) and one KFD node per partition."""

    bus: int
    compute: str | None = "SPX"
    memory: str | None = "NPS1"
    available: tuple[str, str] | None = MI300X_MODES
    num_xcc: tuple[int, ...] = (8,)  # one entry per partition (KFD node)
    node_id_shift: int = 0  # amdgpu ORs the partition id into location_id (bits 0.. or 28..)
    domain: int = 0

    @property
    def bdf(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:00.0"


def fake_sysfs(
    root: Path, packages: list[Package], kfd_order: list[tuple[int, int]] | None = None
) -> tuple[Path, Path]:
    """A /sys/class/drm and a KFD nodes tree. kfd_order: (package, partition) per GPU node, in KFD order
    (default: package by package). Every GPU node links to every other by xGMI of one weight, as an MI300X
    hive does, so the xGMI rule alone finds no pairs."""
    drm, pci, kfd = root / "drm", root / "pci", root / "kfd" / "nodes"
    for card, p in enumerate(packages):
        dev = pci / p.bdf
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x1002\n")
        if p.compute is not None:
            (dev / "current_compute_partition").write_text(p.compute + "\n")
        if p.memory is not None:
            (dev / "current_memory_partition").write_text(p.memory + "\n")
        if p.available is not None:
            (dev / "available_compute_partition").write_text(p.available[0] + "\n")
            (dev / "available_memory_partition").write_text(p.available[1] + "\n")
        (drm / f"card{card + 1}").mkdir(parents=True)
        (drm / f"card{card + 1}" / "device").symlink_to(dev)
        (drm / f"card{card + 1}-DP-1").mkdir()  # a connector: not a card
    order = kfd_order or [(i, k) for i, p in enumerate(packages) for k in range(len(p.num_xcc))]
    (kfd / "0" / "io_links").mkdir(parents=True)
    (kfd / "0" / "properties").write_text("cpu_cores_count 96\nsimd_count 0\nlocation_id 0\ndomain 0\n")
    gpu_nodes = list(range(1, len(order) + 1))
    for node, (i, k) in zip(gpu_nodes, order, strict=True):
        p = packages[i]
        location_id = (p.bus << 8) | (k << p.node_id_shift)
        d = kfd / str(node)
        (d / "io_links").mkdir(parents=True)
        (d / "properties").write_text(
            f"cpu_cores_count 0\nsimd_count 1216\nlocation_id {location_id}\ndomain {p.domain}\n"
            f"num_xcc {p.num_xcc[k]}\nunique_id 1234\n"
        )
        for j, to in enumerate(n for n in gpu_nodes if n != node):
            (d / "io_links" / str(j)).mkdir()
            (d / "io_links" / str(j) / "properties").write_text(f"type 11\nnode_from {node}\nnode_to {to}\nweight 15\n")
    return drm, kfd


def pairs_of(drm: Path, kfd: Path, multi_die: bool = False) -> list[tuple[int, int]]:
    return inventory.die_pairs(inventory.read_kfd_topology(kfd), multi_die, inventory.read_partitions(drm, kfd))


# ---- read_partitions -----------------------------------------------------------------------------------
def test_mi300x_spx_nps1_one_device_eight_xcc_no_pairs(tmp_path):
    drm, kfd = fake_sysfs(tmp_path, [Package(0xC1)])
    assert inventory.read_partitions(drm, kfd) == (
        PackagePartitions(
            bdf="0000:c1:00.0",
            compute="SPX",
            memory="NPS1",
            compute_modes=("SPX", "DPX", "QPX", "CPX"),
            memory_modes=("NPS1", "NPS4"),
            kfd_nodes=(1,),
            num_xcc=(8,),
        ),
    )
    assert pairs_of(drm, kfd) == []


def test_mi300x_cpx_nps4_eight_partitions_four_pairs(tmp_path):
    drm, kfd = fake_sysfs(tmp_path, [Package(0xC1, "CPX", "NPS4", num_xcc=(1,) * 8)])
    (part,) = inventory.read_partitions(drm, kfd)
    assert (part.compute, part.memory, part.kfd_nodes, part.num_xcc) == ("CPX", "NPS4", tuple(range(1, 9)), (1,) * 8)
    assert pairs_of(drm, kfd) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_mi300x_dpx_two_partitions_one_pair(tmp_path):
    drm, kfd = fake_sysfs(tmp_path, [Package(0xC1, "DPX", "NPS1", num_xcc=(4, 4))])
    assert inventory.read_partitions(drm, kfd)[0].num_xcc == (4, 4)
    assert pairs_of(drm, kfd) == [(0, 1)]


def test_partitions_pair_within_their_package_not_by_kfd_neighbours(tmp_path):
    # two DPX packages whose partitions KFD interleaves: A0 B0 A1 B1
    packages = [Package(0xC1, "DPX", num_xcc=(4, 4)), Package(0xD1, "DPX", num_xcc=(4, 4))]
    drm, kfd = fake_sysfs(tmp_path, packages, kfd_order=[(0, 0), (1, 0), (0, 1), (1, 1)])
    assert [p.kfd_nodes for p in inventory.read_partitions(drm, kfd)] == [(1, 3), (2, 4)]
    assert pairs_of(drm, kfd) == [(0, 2), (1, 3)]


def test_partition_id_in_the_high_bits_of_location_id(tmp_path):
    # one kernel series put the partition id in location_id[31:28]: still one package
    drm, kfd = fake_sysfs(tmp_path, [Package(0xC1, "QPX", "NPS1", num_xcc=(2,) * 4, node_id_shift=28)])
    assert inventory.read_partitions(drm, kfd)[0].kfd_nodes == (1, 2, 3, 4)
    assert pairs_of(drm, kfd) == [(0, 1), (2, 3)]


def test_several_nodes_need_a_partitioned_mode_to_pair(tmp_path):
    # SPX, or no compute mode at all, with several nodes at one address: not trusted as partitions
    for name, compute in (("spx", "SPX"), ("unknown", None)):
        drm, kfd = fake_sysfs(tmp_path / name, [Package(0xC1, compute, num_xcc=(4, 4))])
        assert pairs_of(drm, kfd) == [], name


def test_mixed_hive_spx_packages_keep_the_xgmi_rule(tmp_path):
    # one CPX package next to SPX ones: only the CPX partitions pair; equal-weight xGMI among the rest pairs none
    packages = [Package(0xC1, "DPX", num_xcc=(4, 4)), Package(0xD1), Package(0xE1)]
    drm, kfd = fake_sysfs(tmp_path, packages)
    assert pairs_of(drm, kfd) == [(0, 1)]


def test_mi250x_xgmi_rule_still_pairs_gcds(tmp_path):
    # 2 MI250X = 4 GCDs, each its own PCI device with no partition files: pairs come from link weights
    packages = [Package(0x29 + 3 * i, None, None, None, num_xcc=(1,)) for i in range(4)]
    drm, kfd = fake_sysfs(tmp_path, packages)
    for n in range(1, 5):
        for link in (kfd / str(n) / "io_links").iterdir():
            props = (link / "properties").read_text()
            to = int(props.split("node_to ")[1].split()[0])
            weight = 15 if (n - 1) // 2 == (to - 1) // 2 else 30
            (link / "properties").write_text(props.replace("weight 15", f"weight {weight}"))
    parts = inventory.read_partitions(drm, kfd)
    assert [(p.compute, p.memory, p.kfd_nodes) for p in parts] == [("", "", (n,)) for n in range(1, 5)]
    assert pairs_of(drm, kfd) == [(0, 1), (2, 3)]


def test_unknown_modes_are_kept_verbatim(tmp_path):
    drm, kfd = fake_sysfs(tmp_path, [Package(0xC1, "XPX-2", "NPS8", ("SPX, XPX-2", "NPS1 NPS8"), num_xcc=(4, 4))])
    (part,) = inventory.read_partitions(drm, kfd)
    assert (part.compute, part.memory) == ("XPX-2", "NPS8")
    assert (part.compute_modes, part.memory_modes) == (("SPX", "XPX-2"), ("NPS1", "NPS8"))


def test_missing_or_unreadable_files_are_empty(tmp_path):
    drm, kfd = fake_sysfs(tmp_path, [Package(0xC1, None, None, None)])
    (part,) = inventory.read_partitions(drm, kfd)
    assert (part.compute, part.memory, part.compute_modes, part.memory_modes) == ("", "", (), ())
    (tmp_path / "pci" / part.bdf / "current_compute_partition").mkdir()  # unreadable as a file
    assert inventory.read_partitions(drm, kfd)[0].compute == ""
    assert inventory.read_partitions(tmp_path / "no-drm", tmp_path / "no-kfd") == ()


def test_drm_only_package_and_non_amd_cards(tmp_path):
    # no KFD (no /dev/kfd in this container): the DRM side is still recorded; an NVIDIA card is not
    drm, _ = fake_sysfs(tmp_path, [Package(0xC1, "CPX", "NPS4")])
    nv = tmp_path / "pci" / "0000:05:00.0"
    nv.mkdir()
    (nv / "vendor").write_text("0x10de\n")
    (drm / "card9").mkdir()
    (drm / "card9" / "device").symlink_to(nv)
    (part,) = inventory.read_partitions(drm, tmp_path / "no-kfd")
    assert (part.bdf, part.compute, part.kfd_nodes) == ("0000:c1:00.0", "CPX", ())


# ---- the inventory ---------------------------------------------------------------------------------------
def test_inventory_partitions_json_round_trip(tmp_path):
    drm, kfd = fake_sysfs(tmp_path, [Package(0xC1, "CPX", "NPS4", num_xcc=(1,) * 8)])
    inv = Inventory(die_pairs=((0, 1),), rl_kernel_gpu=True, partitions=inventory.read_partitions(drm, kfd))
    back = Inventory.from_dict(json.loads(json.dumps(inv.to_dict())))
    assert back == inv
    assert back.partitions[0].compute == "CPX"


def test_old_inventory_without_partitions_still_loads():
    old = json.loads((DATA / "mi300x.json").read_text())
    del old["partitions"]  # as the probe printed it before partitions were recorded
    inv = Inventory.from_dict(old)
    assert inv.partitions == ()
    assert len(inv.devices) == 8


def test_probe_records_partitions_and_pairs_them(monkeypatch, tmp_path):
    # an MI300X in CPX: torch sees 8 devices, the probe records the mode and pairs the partitions
    drm, kfd = fake_sysfs(tmp_path, [Package(0xC1, "CPX", "NPS4", num_xcc=(1,) * 8)])
    for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    props = types.SimpleNamespace(name="AMD Instinct MI300X", gcnArchName="gfx942:sramecc+:xnack-", warp_size=64)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(cell_inventory, "read_kfd_topology", lambda: inventory.read_kfd_topology(kfd))
    monkeypatch.setattr(cell_inventory, "read_partitions", lambda: inventory.read_partitions(drm, kfd))
    inv = cell_inventory.probe()
    assert [p.compute for p in inv.partitions] == ["CPX"]
    assert inv.die_pairs == ((0, 1), (2, 3), (4, 5), (6, 7))


# ---- the fingerprint -------------------------------------------------------------------------------------
def test_fingerprint_records_the_modes_and_diff_names_a_change(tmp_path):
    spx = inventory.read_partitions(*fake_sysfs(tmp_path / "spx", [Package(0xC1)]))
    cpx = inventory.read_partitions(*fake_sysfs(tmp_path / "cpx", [Package(0xC1, "CPX", "NPS4", num_xcc=(1,) * 8)]))
    assert partitions_record(spx) == {
        "0000:c1:00.0": {
            "compute": "SPX",
            "memory": "NPS1",
            "compute_modes": ["SPX", "DPX", "QPX", "CPX"],
            "memory_modes": ["NPS1", "NPS4"],
            "num_xcc": [8],
        }
    }
    before, after = {"partitions": partitions_record(spx)}, {"partitions": partitions_record(cpx)}
    changes = {k: (a, b) for k, a, b in diff(before, after)}
    assert changes["partitions.0000:c1:00.0.compute"] == ("SPX", "CPX")
    assert changes["partitions.0000:c1:00.0.memory"] == ("NPS1", "NPS4")


def test_cell_fingerprint_collects_partitions(monkeypatch, tmp_path):
    parts = inventory.read_partitions(*fake_sysfs(tmp_path, [Package(0xC1, "DPX", "NPS1", num_xcc=(4, 4))]))
    monkeypatch.setattr(cell_fingerprint, "read_partitions", lambda: parts)
    fp = cell_fingerprint.collect()
    assert fp["partitions"]["0000:c1:00.0"]["compute"] == "DPX"
    assert fp["partitions"]["0000:c1:00.0"]["num_xcc"] == [4, 4]
