"""What devices this host (or container) has: probed once, in a fresh process, before cells are scheduled.

`python -m rlparity.cell.inventory` probes and prints it as JSON; the local backend runs it with a clean
env, the docker backend inside the image. This module is the data and the topology logic (host side).
Die pairs (two dies of one package, e.g. the two GCDs of an MI250X, or two partitions of an MI300X in
DPX/CPX mode) come from the KFD topology, not from device indices. Partition modes (compute SPX/DPX/QPX/CPX,
memory NPS1/NPS2/NPS4) come from the amdgpu DRM sysfs of each package.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
DRM_ROOT = Path("/sys/class/drm")
AMD_VENDOR = "0x1002"
# amdgpu ORs a partition's node id into the KFD location_id (pci_dev_id | node_id, i.e. the PCI function
# bits): cleared, the partitions of one package share its PCI address. One kernel series put the id in bits
# 31:28 instead; _bdf() reads only pci_dev_id's 16 bits, so that form drops out too.
PARTITION_ID_BITS = 0x7
UNPARTITIONED = ("", "SPX")  # compute modes under which a package is one KFD node
XGMI_LINK = 11  # io_link type for xGMI in the KFD topology
MULTI_DIE_PRODUCTS = ("MI250",)  # several dies (GCDs) per package, each its own device


@dataclass(frozen=True)
class Device:
    index: int  # as torch enumerates it (the value for CUDA/HIP_VISIBLE_DEVICES)
    platform: str  # cuda or rocm
    name: str
    arch: str  # sm_90, gfx942, ...
    wave: int


@dataclass(frozen=True)
class PackagePartitions:
    """One AMD GPU package's partition modes and the KFD nodes it shows as (one per compute partition).

    Modes are kept verbatim (a mode this code does not know is still recorded); "" where the file is absent
    or unreadable (not an MI300-class part, or no amdgpu sysfs in this container)."""

    bdf: str  # the package's PCI address, 0000:c1:00.0
    compute: str = ""  # current_compute_partition: SPX, DPX, QPX, CPX
    memory: str = ""  # current_memory_partition: NPS1, NPS2, NPS4
    compute_modes: tuple[str, ...] = ()  # available_compute_partition
    memory_modes: tuple[str, ...] = ()  # available_memory_partition
    kfd_nodes: tuple[int, ...] = ()  # KFD node ids of its partitions, in KFD order
    num_xcc: tuple[int, ...] = ()  # XCCs (compute dies) per partition, same order; 0 when not reported

    @classmethod
    def from_dict(cls, d: dict) -> PackagePartitions:
        tuples = ("compute_modes", "memory_modes", "kfd_nodes", "num_xcc")
        return cls(**{k: tuple(v) if k in tuples else v for k, v in d.items()})


LEGACY_TIERS = {"exact": {"platforms": ["cpu", "cuda", "rocm"], "operators": []}}


@dataclass(frozen=True)
class Inventory:
    devices: tuple[Device, ...] = ()
    die_pairs: tuple[tuple[int, int], ...] = ()  # device indices sharing a package
    rl_kernel_gpu: bool = False  # the rl_kernel build carries GPU kernels
    error: str = ""  # why probing failed, if it did
    partitions: tuple[PackagePartitions, ...] = ()  # AMD packages' partition modes (host-wide, KFD node ids)
    # What the image's rl_kernel and rlparity offer (rl_kernel.tiers, rlparity.cell.workloads): tier name ->
    # {platforms, operators, ...}, workload name -> {params, needs, ...}. None: not reported (an inventory
    # file of an older probe): an image of that age offers the exact tier and does not say its workloads.
    tiers: dict[str, dict] | None = None
    workloads: dict[str, dict] | None = None

    def offered_tiers(self) -> dict[str, dict]:
        return self.tiers if self.tiers is not None else LEGACY_TIERS

    def matching(self, platform: str, arch: str) -> list[Device]:
        return [d for d in self.devices if d.platform == platform and d.arch == arch]

    def to_dict(self) -> dict:
        """Plain data; tiers and workloads only when reported (an inventory file of an older probe lacks them)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k not in ("tiers", "workloads")}

    @classmethod
    def from_dict(cls, d: dict) -> Inventory:
        return cls(
            tuple(Device(**x) for x in d.get("devices", ())),
            tuple(tuple(p) for p in d.get("die_pairs", ())),
            bool(d.get("rl_kernel_gpu", False)),
            d.get("error", ""),
            tuple(PackagePartitions.from_dict(p) for p in d.get("partitions", ())),
            d.get("tiers"),
            d.get("workloads"),
        )


def normalise_arch(gcn_arch_name: str) -> str:
    """'gfx942:sramecc+:xnack-' -> 'gfx942'."""
    return gcn_arch_name.split(":")[0]


def read_kfd_topology(root: Path = KFD_NODES) -> list[dict]:
    """GPU nodes of the KFD topology: [{'node': n, 'location_id': .., 'domain': .., 'num_xcc': ..,
    'links': {node: (type, weight)}}]."""
    nodes = []
    if not root.is_dir():
        return nodes
    for node_dir in sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        props = _kv(node_dir / "properties")
        if props.get("simd_count", 0) == 0:  # a CPU node
            continue
        links = {}
        for link in sorted((node_dir / "io_links").glob("*")):
            lp = _kv(link / "properties")
            links[lp.get("node_to", -1)] = (lp.get("type", 0), lp.get("weight", 0))
        nodes.append(
            {
                "node": int(node_dir.name),
                "location_id": props.get("location_id", 0),
                "domain": props.get("domain", 0),
                "num_xcc": props.get("num_xcc", 0),
                "links": links,
            }
        )
    return nodes


def _kv(path: Path) -> dict[str, int]:
    out = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().lstrip("-").isdigit():
                out[key] = int(value)
    except OSError:
        pass
    return out


def die_pairs(
    gpu_nodes: list[dict], multi_die_product: bool = False, partitions: tuple[PackagePartitions, ...] = ()
) -> list[tuple[int, int]]:
    """Pairs of GPU indices (in KFD order) on one package: partitions of one package, then xGMI pairs.

    A package in a compute mode other than SPX (MI300X DPX/CPX) is several KFD nodes with one PCI address;
    its partitions pair in KFD order, (0,1), (2,3), ... The other GPUs pair by xGMI (xgmi_pairs)."""
    pairs = partition_pairs(gpu_nodes, partitions)
    used = {i for p in pairs for i in p}
    rest = [n for i, n in enumerate(gpu_nodes) if i not in used]
    index_of = {n["node"]: i for i, n in enumerate(gpu_nodes)}
    pairs += [(index_of[rest[a]["node"]], index_of[rest[b]["node"]]) for a, b in xgmi_pairs(rest, multi_die_product)]
    return sorted(pairs)


def partition_pairs(gpu_nodes: list[dict], partitions: tuple[PackagePartitions, ...] = ()) -> list[tuple[int, int]]:
    """Consecutive pairs (KFD order) of the nodes of one package whose compute mode is not SPX.

    KFD lists one node per compute partition, all at the package's PCI address. Both must agree: several
    nodes at one address and a DRM compute mode other than SPX ("" = unknown: no pairs, the cell is
    skipped rather than placed on a guess). A partition left over (odd count) pairs with none."""
    mode_of = {p.bdf: p.compute for p in partitions}
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(gpu_nodes):
        groups.setdefault(kfd_package_bdf(n), []).append(i)
    pairs = []
    for bdf, idx in groups.items():
        if len(idx) < 2 or mode_of.get(bdf, "") in UNPARTITIONED:
            continue
        pairs += [(idx[k], idx[k + 1]) for k in range(0, len(idx) - 1, 2)]
    return pairs


def xgmi_pairs(gpu_nodes: list[dict], multi_die_product: bool = False) -> list[tuple[int, int]]:
    """Pairs of GPU indices (in KFD order) joined by the lightest xGMI link.

    Two GCDs of one MI250X package share the lightest (in-package) xGMI link; links between packages are
    heavier. That reading is trusted only when the topology shows two weight levels, or the devices are a
    known multi-die product (one MI250X alone has only in-package links); a hive of single-die GPUs whose
    links all weigh the same (8x MI300X) has no pairs. GPUs without xGMI (Radeon, PCIe-only) pair with none.
    """
    index_of = {n["node"]: i for i, n in enumerate(gpu_nodes)}
    candidates = []
    for n in gpu_nodes:
        for to, (kind, weight) in n["links"].items():
            if kind == XGMI_LINK and to in index_of and index_of[to] > index_of[n["node"]]:
                candidates.append((weight, index_of[n["node"]], index_of[to]))
    if not candidates:
        return []
    weights = {w for w, _, _ in candidates}
    if len(weights) < 2 and not multi_die_product:
        return []
    lightest = min(weights)
    pairs, used = [], set()
    for w, a, b in sorted(candidates):
        if w == lightest and a not in used and b not in used:
            pairs.append((a, b))
            used |= {a, b}
    return pairs


def visible_kfd_indices(environ, n_gpus: int) -> list[int] | None:
    """The KFD GPU index behind each torch device 0, 1, ...: ROCR_VISIBLE_DEVICES, then HIP_ (or CUDA_)
    VISIBLE_DEVICES, each indexing into the previous. None when they use UUIDs (not mapped here)."""
    idx = list(range(n_gpus))
    for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        value = environ.get(var, "")
        if not value.strip():
            continue
        try:
            picks = [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            return None
        idx = [idx[p] for p in picks if 0 <= p < len(idx)]
    return idx


def map_pairs(pairs: list[tuple[int, int]], visible: list[int]) -> list[tuple[int, int]]:
    """KFD-index pairs as torch device indices; a pair with a member this job cannot see is dropped."""
    pos = {k: i for i, k in enumerate(visible)}
    return [(pos[a], pos[b]) for a, b in pairs if a in pos and b in pos]


# ---- partition modes -------------------------------------------------------------------------------------
def kfd_package_bdf(node: dict) -> str:
    """The PCI address of a KFD node's package, the partition id cleared: '0000:c1:00.0'."""
    return _bdf(node.get("domain", 0), node.get("location_id", 0) & ~PARTITION_ID_BITS)


def _bdf(domain: int, location_id: int) -> str:
    # location_id is pci_dev_id(): bus << 8 | device << 3 | function (bits above 15 are not the address)
    return f"{domain:04x}:{(location_id >> 8) & 0xFF:02x}:{(location_id >> 3) & 0x1F:02x}.{location_id & 0x7}"


def _package_bdf(pci_name: str) -> str:
    """'0000:c1:00.0' as kfd_package_bdf would write it (function cleared, as there), or '' if not PCI."""
    try:
        domain, bus, rest = pci_name.split(":")
        device, function = rest.split(".")
        location_id = int(bus, 16) << 8 | int(device, 16) << 3 | int(function, 16)
        return _bdf(int(domain, 16), location_id & ~PARTITION_ID_BITS)
    except ValueError:
        return ""


def read_partitions(drm_root: Path = DRM_ROOT, kfd_root: Path = KFD_NODES) -> tuple[PackagePartitions, ...]:
    """Every AMD GPU package: its partition modes (DRM sysfs) and its KFD nodes with their XCC counts.

    A package the KFD lists but the DRM sysfs does not (or the reverse) is still recorded, with what is
    known. Ordered by first KFD node, then PCI address."""
    cards = _drm_packages(drm_root)
    nodes: dict[str, list[dict]] = {}
    for n in read_kfd_topology(kfd_root):
        nodes.setdefault(kfd_package_bdf(n), []).append(n)
    out = []
    for bdf in set(cards) | set(nodes):
        mine = nodes.get(bdf, [])
        kfd = {"kfd_nodes": tuple(n["node"] for n in mine), "num_xcc": tuple(n["num_xcc"] for n in mine)}
        out.append(replace(cards.get(bdf, PackagePartitions(bdf)), **kfd))
    return tuple(sorted(out, key=lambda p: (p.kfd_nodes[0] if p.kfd_nodes else 1 << 30, p.bdf)))


def _drm_packages(drm_root: Path) -> dict[str, PackagePartitions]:
    """{package bdf: modes} for every AMD PCI GPU under drm_root (cardN; connectors and the partitions'
    own platform devices, which have no PCI vendor file, are not packages)."""
    out: dict[str, PackagePartitions] = {}
    if not drm_root.is_dir():
        return out
    for card in sorted(drm_root.glob("card*")):
        if not card.name[4:].isdigit():  # card0-DP-1: a connector
            continue
        dev = card / "device"
        if _text(dev / "vendor") != AMD_VENDOR:
            continue
        key = _package_bdf(dev.resolve().name)
        if not key or key in out:
            continue
        out[key] = PackagePartitions(
            bdf=key,  # as KFD's side spells it: the two are joined on it
            compute=_text(dev / "current_compute_partition"),
            memory=_text(dev / "current_memory_partition"),
            compute_modes=_modes(_text(dev / "available_compute_partition")),
            memory_modes=_modes(_text(dev / "available_memory_partition")),
        )
    return out


def _modes(text: str) -> tuple[str, ...]:
    """'SPX, DPX, QPX, CPX' -> ('SPX', 'DPX', 'QPX', 'CPX'); kept verbatim otherwise."""
    return tuple(m.strip() for m in text.replace(",", " ").split() if m.strip())


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""
