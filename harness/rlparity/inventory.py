"""What devices this host (or container) has: probed once, in a fresh process, before cells are scheduled.

`python -m rlparity.cell.inventory` probes and prints it as JSON; the local backend runs it with a clean
env, the docker backend inside the image. This module is the data and the topology logic (host side).
Die pairs (two dies of one package, e.g. the two GCDs of an MI250X) come from the KFD topology, not from
device indices.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
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
class Inventory:
    devices: tuple[Device, ...] = ()
    die_pairs: tuple[tuple[int, int], ...] = ()  # device indices sharing a package
    rl_kernel_gpu: bool = False  # the rl_kernel build carries GPU kernels
    error: str = ""  # why probing failed, if it did

    def matching(self, platform: str, arch: str) -> list[Device]:
        return [d for d in self.devices if d.platform == platform and d.arch == arch]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Inventory:
        return cls(
            tuple(Device(**x) for x in d.get("devices", ())),
            tuple(tuple(p) for p in d.get("die_pairs", ())),
            bool(d.get("rl_kernel_gpu", False)),
            d.get("error", ""),
        )


def normalise_arch(gcn_arch_name: str) -> str:
    """'gfx942:sramecc+:xnack-' -> 'gfx942'."""
    return gcn_arch_name.split(":")[0]


def read_kfd_topology(root: Path = KFD_NODES) -> list[dict]:
    """GPU nodes of the KFD topology: [{'node': n, 'location_id': .., 'links': {node: (type, weight)}}]."""
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
        nodes.append({"node": int(node_dir.name), "location_id": props.get("location_id", 0), "links": links})
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


def die_pairs(gpu_nodes: list[dict], multi_die_product: bool = False) -> list[tuple[int, int]]:
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
