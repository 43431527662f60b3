"""Tiers: which arithmetic rl_kernel promises, as descriptors.

A tier is one promise about bits, declared once as a `Tier` and read by everything that depends on it: the
golden digests (where they live, whether they are one set for every device or one per target), selfcheck
(CPU == GPU only where the tier has a CPU reference), kernels_check (the tier's own scan), the layout test,
the Hugging Face patch (`patch(model, tier=...)`: the tier's layers) and the harness's device probe.

    exact     portable arithmetic: the same bits on the CPU, NVIDIA and AMD (golden digests for all devices)
    fast      matrix cores in a fixed order: the same bits within one architecture (digests per target)

A tier is found without editing any list: a folder `rl_kernel/<name>/` with a module `tier.py` that defines
`TIER`, or a distribution's entry point in the group `rl_kernel.tiers` whose value is an import string of a
`Tier` (`pkg.module:TIER`), so that a package outside this repository can add one.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from rl_kernel.inputs import DTYPE_NAMES

ENTRY_POINT_GROUP = "rl_kernel.tiers"
SCOPES = ("all-devices", "per-target")
PLATFORMS = ("cpu", "cuda", "rocm")
DTYPES = tuple(DTYPE_NAMES)


class TierError(LookupError):
    """An unknown tier, a tier without an operator, or a descriptor that does not hold together."""


@dataclass(frozen=True)
class Tier:
    """One tier.

    name         what cells, the patch and the golden files call it
    scope        "all-devices": one golden set every device must reproduce; "per-target": bits equal within
                 one architecture only, so golden digests are recorded per target (sm_90, gfx942, ...)
    cpu_reference  the CPU build is this tier's golden reference (selfcheck compares CPU == GPU); without
                 one selfcheck checks run to run, batch invariance and accuracy against float64
    platforms    the device types it has kernels for ("cpu", "cuda", "rocm")
    dtypes       the input dtypes it takes
    module       import path of the module whose attributes are the tier's operators
    operators    the operators that module provides (linear, attention, token_logprobs, ...)
    layers       import path of the module the Hugging Face patch takes a decoder's layers from (linear,
                 embedding, rms_norm, rope_inv_freq, rope_table, silu_mul, attention, positions_from_mask)
    checks       import path of the package of check modules (one per family: cases, SPECS,
                 invariance_checks); rl_kernel.checks walks it
    golden_dir   the kernel digests: <dir>/<family>.json (all-devices) or <dir>/<target>/<family>.json
    scan         import string `module:function` of the tier's static scan for kernels_check (None: none);
                 the function takes a list of target names (empty: every target) and returns a list of
                 problems; "csrc" is the exact tier's C++/HIP/CUDA contract scan in kernels/check
    build        the flags the tier's code is built with (what the fingerprint records)
    details      import string `module:function` of what else the fingerprint records (the fast tier: the
                 pinned configuration and matrix instruction of this machine's target)
    """

    name: str
    scope: str
    cpu_reference: bool
    platforms: tuple[str, ...]
    module: str
    operators: tuple[str, ...]
    layers: str
    checks: str
    golden_dir: Path
    dtypes: tuple[str, ...] = DTYPES
    scan: str | None = None
    build: tuple[str, ...] = ()
    description: str = ""
    details: str | None = None  # `module:function` -> dict: what the fingerprint adds (per-target configuration)
    origin: str = field(default="", compare=False)  # where it was found (folder or entry point)

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise TierError(f"tier {self.name!r}: scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        for p in self.platforms:
            if p not in PLATFORMS:
                raise TierError(f"tier {self.name!r}: unknown platform {p!r} (known: {', '.join(PLATFORMS)})")
        if self.cpu_reference and "cpu" not in self.platforms:
            raise TierError(f"tier {self.name!r}: a CPU reference needs 'cpu' among its platforms")
        for d in self.dtypes:
            if d not in DTYPES:
                raise TierError(f"tier {self.name!r}: unknown dtype {d!r} (known: {', '.join(DTYPES)})")

    @property
    def per_target(self) -> bool:
        return self.scope == "per-target"

    def api(self) -> ModuleType:
        return importlib.import_module(self.module)

    def op(self, name: str) -> Any:
        """The tier's operator `name` (a clear error when the tier lacks it)."""
        if name not in self.operators:
            raise TierError(
                f"rl_kernel: the {self.name} tier provides no operator {name!r} "
                f"(it provides: {', '.join(self.operators)})"
            )
        return getattr(self.api(), name)

    def layer_module(self) -> ModuleType:
        return importlib.import_module(self.layers)

    def golden_path(self, family: str, target: str | None = None, root: Path | None = None) -> Path:
        """Where the digests of one family live: per target for a per-target tier (target required)."""
        base = self.golden_dir if root is None else Path(root)
        if self.per_target:
            if not target:
                raise TierError(f"the {self.name} tier's digests are per target: name the target (sm_90, gfx942, ...)")
            base = base / target
        return base / f"{family}.json"

    def fingerprint(self) -> dict[str, Any]:
        """describe() plus the tier's own details (the fast tier: the target's pinned configuration)."""
        found = self.describe()
        if self.details:
            module, _, func = self.details.partition(":")
            found["details"] = getattr(importlib.import_module(module), func)()
        return found

    def describe(self) -> dict[str, Any]:
        """Plain data for the device probe and the fingerprint."""
        return {
            "scope": self.scope,
            "cpu_reference": self.cpu_reference,
            "platforms": list(self.platforms),
            "dtypes": list(self.dtypes),
            "operators": list(self.operators),
            "build": list(self.build),
            "origin": self.origin,
        }


def _folder_tiers() -> dict[str, Tier]:
    """Tiers declared in a folder of this package: rl_kernel/<name>/tier.py with TIER."""
    found = {}
    root = Path(__file__).parent
    for m in pkgutil.iter_modules([str(root)]):
        if m.ispkg and (root / m.name / "tier.py").exists():
            tier = importlib.import_module(f"rl_kernel.{m.name}.tier").TIER
            found[tier.name] = _placed(tier, f"rl_kernel/{m.name}/tier.py")
    return found


def _entry_point_tiers() -> dict[str, Tier]:
    """Tiers of other distributions: entry points in the group rl_kernel.tiers."""
    found = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            tier = ep.load()
        except Exception as exc:  # a broken plug-in names itself instead of breaking every tier
            raise TierError(
                f"entry point {ep.name} = {ep.value!r} ({ENTRY_POINT_GROUP}) failed to load: {exc}"
            ) from exc
        if not isinstance(tier, Tier):
            raise TierError(f"entry point {ep.name} = {ep.value!r} ({ENTRY_POINT_GROUP}) is not a rl_kernel.tiers.Tier")
        found[tier.name] = _placed(tier, f"entry point {ep.value}")
    return found


def _placed(tier: Tier, origin: str) -> Tier:
    return replace(tier, origin=origin)


def tiers() -> dict[str, Tier]:
    """Every tier this installation offers, by name, in name order (folders first, then entry points; a
    name given twice is an error naming both places). Found once per process (the installation does not change
    under a running process; a test that installs a tier runs its own)."""
    return dict(_discovered())


@functools.cache
def _discovered() -> tuple[tuple[str, Tier], ...]:
    found = _folder_tiers()
    for name, tier in _entry_point_tiers().items():
        if name in found:
            raise TierError(f"tier {name!r} is declared twice: {found[name].origin} and {tier.origin}")
        found[name] = tier
    return tuple(sorted(found.items()))


def get(name: str) -> Tier:
    """The tier called name, or a clear error listing the tiers there are."""
    known = tiers()
    if name not in known:
        raise TierError(f"rl_kernel: tier {name!r} is not available (available: {', '.join(known)})")
    return known[name]


def target_of(device: Any) -> str:
    """The target name of a torch device, as per-target golden files name it: 'cpu', 'sm_90', 'gfx942'."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    p = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        return str(getattr(p, "gcnArchName", "")).split(":")[0]
    return f"sm_{p.major}{p.minor}"
