"""The inventory: KFD die pairs from the topology, and the probe's mapping through visible devices."""

from __future__ import annotations

import types
from pathlib import Path

import torch

from rlparity import inventory
from rlparity.cell import inventory as cell_inventory


# ---- KFD die pairs -------------------------------------------------------------------------------------
def kfd_node(node: int, links: dict[int, tuple[int, int]]) -> dict:
    return {"node": node, "location_id": 0x100 * node, "links": links}


def mi250x_nodes(first: int = 2, packages: tuple[tuple[int, int], ...] = ((0, 1), (2, 3), (4, 5), (6, 7))) -> list:
    """8 GCDs (KFD nodes first..first+7): in-package xGMI weight 15, cross-package 30 or 45, PCIe to CPU 0."""
    package_of = {gcd: p for p, pair in enumerate(packages) for gcd in pair}
    nodes = []
    for i in range(8):
        links = {0: (2, 10)}  # PCIe (type 2) to the CPU, lighter than any xGMI: must be ignored
        for j in range(8):
            if j != i:
                same = package_of[i] == package_of[j]
                links[first + j] = (11, 15 if same else 30 + 15 * (abs(package_of[i] - package_of[j]) % 2))
        nodes.append(kfd_node(first + i, links))
    return nodes


def test_die_pairs_mi250x():
    assert inventory.die_pairs(mi250x_nodes()) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_die_pairs_follow_links_not_indices():
    assert inventory.die_pairs(mi250x_nodes(packages=((0, 2), (1, 3), (4, 7), (5, 6)))) == [
        (0, 2),
        (1, 3),
        (4, 7),
        (5, 6),
    ]


def test_die_pairs_pcie_only_radeon():
    # PCIe (type 2) links to the CPU and between the two cards: no xGMI, so no pairs
    nodes = [kfd_node(1, {0: (2, 20), 2: (2, 40)}), kfd_node(2, {0: (2, 20), 1: (2, 40)})]
    assert inventory.die_pairs(nodes) == []
    assert inventory.die_pairs([]) == []


def test_die_pairs_ignore_links_to_nodes_that_are_not_gpus():
    nodes = [kfd_node(1, {7: (11, 15)}), kfd_node(2, {})]
    assert inventory.die_pairs(nodes) == []


def test_die_pairs_equal_weight_hive_has_no_pairs():
    nodes = [kfd_node(2 + i, {2 + j: (11, 15) for j in range(8) if j != i}) for i in range(8)]
    assert inventory.die_pairs(nodes) == []


def fake_kfd(root: Path, cpus: list[int], gpus: dict[int, dict[int, tuple[int, int]]]) -> Path:
    nodes = root / "nodes"
    for n in cpus:
        (nodes / str(n) / "io_links").mkdir(parents=True)
        (nodes / str(n) / "properties").write_text(f"cpu_cores_count 16\nsimd_count 0\nlocation_id 0\nnode_id {n}\n")
    for n, links in gpus.items():
        d = nodes / str(n)
        (d / "io_links").mkdir(parents=True)
        (d / "properties").write_text(
            f"cpu_cores_count 0\nsimd_count 440\nlocation_id {0x1000 + n}\nmax_engine_clk_fcompute 1700\n"
        )
        for k, (to, (kind, weight)) in enumerate(sorted(links.items())):
            (d / "io_links" / str(k)).mkdir()
            (d / "io_links" / str(k) / "properties").write_text(
                f"type {kind}\nversion_major 0\nnode_from {n}\nnode_to {to}\nweight {weight}\nmin_latency 0\n"
            )
    return nodes


def test_read_kfd_topology_fake_sysfs(tmp_path):
    # node 0: CPU; nodes 1..4: two packages of two GCDs
    gpus = {
        1: {0: (2, 20), 2: (11, 15), 3: (11, 30), 4: (11, 30)},
        2: {0: (2, 20), 1: (11, 15), 3: (11, 30), 4: (11, 30)},
        3: {0: (2, 20), 4: (11, 15), 1: (11, 30), 2: (11, 30)},
        4: {0: (2, 20), 3: (11, 15), 1: (11, 30), 2: (11, 30)},
    }
    root = fake_kfd(tmp_path, [0], gpus)
    nodes = inventory.read_kfd_topology(root)
    assert [n["node"] for n in nodes] == [1, 2, 3, 4]
    assert nodes[0]["location_id"] == 0x1001
    assert nodes[0]["links"] == {0: (2, 20), 2: (11, 15), 3: (11, 30), 4: (11, 30)}
    assert inventory.die_pairs(nodes) == [(0, 1), (2, 3)]


def test_read_kfd_topology_orders_nodes_numerically(tmp_path):
    # two CPU nodes then ten GCDs (nodes 2..11): lexical order would put 10 and 11 before 2
    gpus = {2 + i: {2 + j: (11, 15 if i // 2 == j // 2 else 40) for j in range(10) if j != i} for i in range(10)}
    nodes = inventory.read_kfd_topology(fake_kfd(tmp_path, [0, 1], gpus))
    assert [n["node"] for n in nodes] == list(range(2, 12))
    assert inventory.die_pairs(nodes) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]


def test_read_kfd_topology_missing_root(tmp_path):
    assert inventory.read_kfd_topology(tmp_path / "nope") == []


def test_probe_maps_die_pairs_through_visible_devices(monkeypatch):
    # host: 2 MI250X = GCDs 0..3, pairs (0,1), (2,3); this job may see GCDs 1 and 2 (different packages)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1,2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    props = types.SimpleNamespace(name="AMD Instinct MI250X", gcnArchName="gfx90a:sramecc+:xnack-", warp_size=64)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    four = [
        kfd_node(1 + i, {1 + j: (11, 15 if i // 2 == j // 2 else 30) for j in range(4) if j != i}) for i in range(4)
    ]
    monkeypatch.setattr(cell_inventory, "read_kfd_topology", lambda root=None: four)
    inv = cell_inventory.probe()
    assert [d.arch for d in inv.devices] == ["gfx90a", "gfx90a"]
    assert inv.die_pairs == ()
