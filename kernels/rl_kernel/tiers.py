"""Tiers: which arithmetic rl_kernel promises, as descriptors.

A tier is one promise about bits, declared once as a `Tier` in the folder (package) that holds everything the
tier brings, and read by everything that depends on it: the golden digests, selfcheck, kernels_check (the tier's
own scan), the Hugging Face patch, the fused LM head (the tier's GEMMs), the harness's device probe and selftest
(the tier's negative controls).

    exact     portable arithmetic: the same bits on the CPU, NVIDIA and AMD (golden digests for all devices)
    fast      matrix cores in a fixed order: the same bits within one architecture (digests per target)

A tier's folder: `tier.py` (TIER), an `__init__.py` whose attributes are the tier's own operators, and one
subfolder per operator family, each with `checks.py` (cases, SPECS) and its golden digests (`golden.json`, or
`golden/<target>.json` for a per-target tier); the exact tier's families also hold their C++/CUDA/HIP sources and
numpy reference. Operators a tier lacks come from its `fallback` tier (as Liger's backend registry falls back).

A tier is found without editing any list: a folder `rl_kernel/<name>/` with `tier.py`, or a distribution's entry
point in the group `rl_kernel.tiers` whose value is an import string of a `Tier` (`pkg.module:TIER`), so that a
package outside this repository can add one.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from rl_kernel.inputs import DTYPE_NAMES
from rl_kernel.plugins import Registry

ENTRY_POINT_GROUP = "rl_kernel.tiers"
SCOPES = ("all-devices", "per-target")
PLATFORMS = ("cpu", "cuda", "rocm")
DTYPES = tuple(DTYPE_NAMES)
# A negative control of a tier, chosen per process: its module's operators replace the tier's own (the gate must
# catch the difference). Read when an operator is looked up (Tier.op), so it is set before the cell starts.
CONTROL_VAR = "RL_KERNEL_CONTROL"


class TierError(LookupError):
    """An unknown tier, a tier without an operator, or a descriptor that does not hold together."""


@dataclass(frozen=True)
class HeadGemms:
    """The GEMMs the fused LM head (rl_kernel.head) needs from a tier, each the tier's own kernel with the
    configuration of its unfused `linear`, so that the fused head gives the unfused bits:

    logits(h, w_chunk, b_chunk, rows) -> [N, C] in h's dtype (rows: the whole head's weight rows)
    dx(d, w_chunk) -> fp32 [N, H], the chunk's partial of dHidden, never rounded
    dx_add(d, w_chunk, dh): dh += dx(d, w_chunk) in place, with the bits of that fp32 add (one kernel: the GEMM adds
        its result to dh as it stores it); None: the head adds dx's result itself
    dw(d, h) -> [C, H];  db(d) -> [C]
    dw_into(d, h, out): dw's result stored into out (a [C, H] row range of dWeight) by the GEMM itself; None: the
        head copies dw's result there
    check(hidden, weight, bias): the tier's own argument checks (device, dtype, toolchain), or None
    call_elements: how many logits one call of the head's walk may hold (rows x columns); the walk then takes
        several vocabulary chunks per call (fewer launches, the same bits); 0: one chunk per call
    dw_chain(d, h, acc, out): acc (fp32 [C, H]) continues dw's sum over these rows, stored back in acc or (out,
        the last rows) rounded into out as dw stores it (rl_kernel.head.loss: dWeight over row blocks with dw's
        bits); None: the tier cannot, and the fused policy loss computes its composition
    dw_rows(device): the rows of one step of dw's sum; dw_chain's blocks are multiples of it but the last
    """

    logits: Callable[..., Any]
    dx: Callable[..., Any]
    dw: Callable[..., Any]
    db: Callable[..., Any]
    check: Callable[..., None] | None = None
    call_elements: int = 0
    dx_add: Callable[..., None] | None = None
    dw_into: Callable[..., None] | None = None
    dw_chain: Callable[..., None] | None = None
    dw_rows: Callable[..., int] | None = None


@dataclass(frozen=True)
class Tier:
    """One tier.

    name         what cells, the patch and the golden files call it
    scope        "all-devices": one golden set every device must reproduce; "per-target": bits equal within
                 one architecture only, so golden digests are recorded per target (sm_90, gfx942, ...)
    cpu_reference  the CPU build is this tier's golden reference (selfcheck compares CPU == GPU); without
                 one selfcheck checks run to run, batch invariance and accuracy against float64
    platforms    the device types it has kernels for ("cpu", "cuda", "rocm")
    package      import path of the tier's package: its attributes are the tier's own `operators`, its
                 subpackages with a `checks` module are its operator families
    operators    the operators the package itself provides (linear, attention, token_logprobs, ...)
    fallback     the tier whose operators (and fused-head GEMMs, with its linear) serve the ones this lacks
    head         import string `module:function` -> HeadGemms: the fused head's GEMMs (None: the fallback's)
    rows         import string `module:attribute` -> the fused head's row operators over logits it holds (node_stats,
                 node_entropy, join_stats, join_sum, token_logprobs with its statistics, and the slices' backward:
                 token_logprobs_backward_slice, entropy_backward_slice, logprobs_entropy_backward_slice); None:
                 the fallback's (a tier with its own softmax names its own here, or the fused head bypasses it)
    controls     negative controls, name -> import path of a module whose attributes replace operators while
                 $RL_KERNEL_CONTROL names the control; selftest and the gate must catch each
    compiled     its family folders hold C++/CUDA/HIP sources (built into rl_kernel._C; build_flags finds them)
    scan         import string `module:function` of the tier's static scan for kernels_check (None: none);
                 the function takes a list of target names (empty: every target) and returns a list of
                 problems; "compiled" is the C++/HIP/CUDA contract scan of kernels/check
    build        the flags the tier's code is built with (what the fingerprint records)
    details      import string `module:function` of what else the fingerprint records (the fast tier: the
                 pinned configuration and matrix instruction of this machine's target)
    folder       the tier's folder (set where it is found): families and golden digests live under it
    """

    name: str
    scope: str
    cpu_reference: bool
    platforms: tuple[str, ...]
    package: str
    operators: tuple[str, ...]
    dtypes: tuple[str, ...] = DTYPES
    fallback: str | None = None
    head: str | None = None
    rows: str | None = None
    controls: dict[str, str] = field(default_factory=dict)
    compiled: bool = False
    scan: str | None = None
    build: tuple[str, ...] = ()
    description: str = ""
    details: str | None = None  # `module:function` -> dict: what the fingerprint adds (per-target configuration)
    folder: Path | None = field(default=None, compare=False)
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
        if self.fallback == self.name:
            raise TierError(f"tier {self.name!r} cannot fall back to itself")

    @property
    def per_target(self) -> bool:
        return self.scope == "per-target"

    # ---- operators -----------------------------------------------------------------------------------
    def api(self) -> ModuleType:
        return importlib.import_module(self.package)

    def below(self) -> Tier | None:
        """The fallback tier's descriptor (None: the tier has none)."""
        return get(self.fallback) if self.fallback else None

    def all_operators(self) -> tuple[str, ...]:
        """Its own operators and those its fallback serves, sorted."""
        below = self.below()
        return tuple(sorted({*self.operators, *(below.all_operators() if below else ())}))

    def op(self, name: str) -> Any:
        """The operator `name`: the control's while $RL_KERNEL_CONTROL names one of this tier's controls, else
        the tier's own, else its fallback's (a clear error when none has it)."""
        control = self.control()
        if control is not None and hasattr(control, name):
            return getattr(control, name)
        return self._served(name)

    def _served(self, name: str) -> Any:
        if name in self.operators:
            return getattr(self.api(), name)
        below = self.below()
        if below is None or name not in below.all_operators():
            raise TierError(
                f"rl_kernel: the {self.name} tier provides no operator {name!r} "
                f"(it provides: {', '.join(self.all_operators())})"
            )
        return below._served(name)

    def namespace(self) -> SimpleNamespace:
        """Every operator of the tier (own, control's and fallback's) as attributes: what the patch calls."""
        return SimpleNamespace(**{n: self.op(n) for n in self.all_operators()})

    def control(self) -> ModuleType | None:
        """The module of the control $RL_KERNEL_CONTROL names, if it is one of this tier's; None when unset. A
        name this tier does not define is an error (a control meant for another tier must not pass silently)."""
        chosen = os.environ.get(CONTROL_VAR)
        if not chosen:
            return None
        if chosen not in self.controls:
            known = ", ".join(self.controls) or "none"
            raise TierError(f"rl_kernel: {CONTROL_VAR}={chosen!r} is not a control of the {self.name} tier ({known})")
        return importlib.import_module(self.controls[chosen])

    def head_gemms(self) -> HeadGemms:
        """The fused head's GEMMs: the tier's own, else (when its linear is the fallback's) the fallback's."""
        if self.head is not None:
            return _load(self.head)()
        below = self.below()
        if below is None or "linear" in self.operators:
            raise TierError(f"rl_kernel: the {self.name} tier has no fused-head GEMMs (its descriptor names no head)")
        return below.head_gemms()

    def row_ops(self) -> Any:
        """The fused head's row operators: the tier's own, else its fallback's (a clear error when none has them)."""
        if self.rows is not None:
            return _load(self.rows)
        below = self.below()
        if below is None:
            raise TierError(f"rl_kernel: the {self.name} tier has no row operators for the fused head (its "
                            "descriptor names no rows and no fallback)")  # fmt: skip
        return below.row_ops()

    # ---- families and golden digests ------------------------------------------------------------------
    def families(self) -> dict[str, ModuleType]:
        """The tier's operator families, name -> checks module (cases, SPECS, invariance_checks), in name order:
        every subpackage of its package that has a `checks` module."""
        pkg = self.api()
        found = {}
        for m in sorted(pkgutil.iter_modules(getattr(pkg, "__path__", [])), key=lambda m: m.name):
            if m.ispkg and (Path(pkg.__path__[0]) / m.name / "checks.py").exists():
                found[m.name] = importlib.import_module(f"{self.package}.{m.name}.checks")
        return found

    def golden_path(self, family: str, target: str | None = None, root: Path | None = None) -> Path:
        """Where the digests of one family live: <family>/golden.json, or <family>/golden/<target>.json for a
        per-target tier (target required); under `root` instead of the tier's folder when given."""
        base = Path(root) if root is not None else self.folder
        if base is None:
            raise TierError(f"the {self.name} tier has no folder (it was not found through rl_kernel.tiers)")
        if self.per_target:
            if not target:
                raise TierError(f"the {self.name} tier's digests are per target: name the target (sm_90, gfx942, ...)")
            return base / family / "golden" / f"{target}.json"
        return base / family / "golden.json"

    # ---- what the probe and the fingerprint record ------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """describe() plus the tier's own details (the fast tier: the target's pinned configuration)."""
        found = self.describe()
        if self.details:
            found["details"] = _load(self.details)()
        return found

    def describe(self) -> dict[str, Any]:
        """Plain data for the device probe and the fingerprint."""
        return {
            "scope": self.scope,
            "cpu_reference": self.cpu_reference,
            "platforms": list(self.platforms),
            "dtypes": list(self.dtypes),
            "operators": list(self.all_operators()),
            "fallback": self.fallback,
            "controls": sorted(self.controls),
            "control_var": CONTROL_VAR,
            "build": list(self.build),
            "origin": self.origin,
        }


def _load(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def _placed(tier: Tier, origin: str) -> Tier:
    """The tier with where it was found: its origin, and its folder (its package's, or its module's folder)."""
    folder = tier.folder or Path(importlib.import_module(tier.package).__file__).parent
    return replace(tier, origin=origin, folder=folder)


def tiers() -> dict[str, Tier]:
    """Every tier this installation offers, by name, in name order (folders first, then entry points; a
    name given twice is an error naming both places). Found once per process (the installation does not change
    under a running process; a test that installs a tier runs its own)."""
    return dict(_discovered())


@functools.cache
def _discovered() -> tuple[tuple[str, Tier], ...]:
    found = Registry("tier", "rl_kernel", Path(__file__).parent, "tier", "TIER", ENTRY_POINT_GROUP, Tier, TierError,
                     _placed).found()  # fmt: skip
    for tier in found.values():
        if tier.fallback and tier.fallback not in found:
            raise TierError(f"tier {tier.name!r} falls back to {tier.fallback!r}, which is not available")
    return tuple(sorted(found.items()))


def get(name: str) -> Tier:
    """The tier called name, or a clear error listing the tiers there are."""
    known = tiers()
    if name not in known:
        raise TierError(f"rl_kernel: tier {name!r} is not available (available: {', '.join(known)})")
    return known[name]


def resolve(tier: str | Tier) -> Tier:
    """A tier as an entry point takes it (a name, or the descriptor already resolved): the descriptor, looked up
    only for a name. Entry points (patch, the mode, the fused head, a cell) resolve once and pass the Tier down."""
    return tier if isinstance(tier, Tier) else get(tier)


def target_of(device: Any) -> str:
    """The target name of a torch device, as per-target golden files name it: 'cpu', 'sm_90', 'gfx942'."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    return _gpu_target(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=64)
def _gpu_target(index: int) -> str:
    import torch

    p = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        return str(getattr(p, "gcnArchName", "")).split(":")[0]
    return f"sm_{p.major}{p.minor}"
