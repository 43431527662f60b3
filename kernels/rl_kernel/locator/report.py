"""What the locator reports: each module's result on the two paths (ModuleResult), the share of differing
elements per decoder layer (LayerShare) and the whole Report (first divergent module, summary, JSON)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

ROOT = "(root)"  # the name of the model itself (named_modules' "")
LABELS = ("rollout", "training")


# ---- what one module did on both paths ------------------------------------------------------------------
@dataclass(frozen=True)
class ModuleResult:
    """One module's output on the two paths, aligned: its digests and, when the bits differ, by how much."""

    name: str  # qualified module name (ROOT for the model), "#k" appended for its k-th call (k >= 1) in one forward
    order: int  # position in forward call (output) order
    shape: tuple[int, ...]
    dtype: str
    digest_a: str  # rl_kernel.bitwise.digest of the aligned output on path a (rollout)
    digest_b: str  # ... on path b (training)
    count: int  # elements whose bits differ
    total: int
    max_abs: float
    max_ulp: int  # in the output dtype's own ulps
    first_index: tuple[int, ...] | None = None
    a: torch.Tensor | None = field(default=None, repr=False, compare=False)  # with keep_tensors
    b: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def equal(self) -> bool:
        return self.count == 0

    @property
    def share(self) -> float:
        return self.count / self.total if self.total else 0.0

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "order": self.order,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "equal": self.equal,
            "digest_a": self.digest_a,
            "digest_b": self.digest_b,
            "count": self.count,
            "total": self.total,
            "share": self.share,
            "max_abs": None if math.isinf(self.max_abs) else self.max_abs,
            "max_ulp": self.max_ulp,
            "first_index": None if self.first_index is None else list(self.first_index),
        }


@dataclass(frozen=True)
class LayerShare:
    """One decoder layer (an item of the model's layer list): the share of its output's elements that differ
    (over its modules' outputs when its own output was not comparable), and its first divergent module."""

    index: int
    name: str
    count: int
    total: int
    first: str | None  # the layer's first divergent module

    @property
    def share(self) -> float:
        return self.count / self.total if self.total else 0.0

    def to_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "count": self.count, "total": self.total,
                "share": self.share, "first": self.first}  # fmt: skip


@dataclass
class Report:
    """The locator's answer: every compared module in forward call order, the skipped ones with why, and the
    per-layer shares. `first` is the first module whose bits differ (None: the two paths agree)."""

    labels: tuple[str, str]
    modules: list[ModuleResult]
    skipped: list[tuple[str, str]]
    layers: list[LayerShare]
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def first(self) -> ModuleResult | None:
        return next((m for m in self.modules if not m.equal), None)

    @property
    def equal(self) -> bool:
        return self.first is None

    @property
    def divergent(self) -> list[ModuleResult]:
        return [m for m in self.modules if not m.equal]

    def module(self, name: str) -> ModuleResult:
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(f"no compared module named {name!r}")

    def layer_shares(self) -> dict[str, float]:
        return {layer.name: layer.share for layer in self.layers}

    def summary(self) -> str:
        a, b = self.labels
        ctx = ", ".join(f"{k} {v}" for k, v in self.context.items())
        lines = [f"{a} vs {b}" + (f" ({ctx})" if ctx else "") + f": {len(self.modules)} module outputs compared"]
        first = self.first
        if first is None:
            lines.append("  bitwise equal: every compared module output has the same bits on both paths")
        else:
            lines.append(
                f"  first divergent module: {first.name} (output {list(first.shape)} {first.dtype}): "
                f"{first.count}/{first.total} elements differ, max |a-b| {first.max_abs:.3e}, max {first.max_ulp} ulp"
            )
            lines.append(f"  {len(self.divergent)} of {len(self.modules)} module outputs differ")
        if self.layers:
            lines.append("  per layer, share of elements that differ (first divergent module):")
            for layer in self.layers:
                lines.append(f"    {layer.name:<28} {layer.share:8.2%}" + (f"  {layer.first}" if layer.first else ""))
        if self.skipped:
            lines.append(f"  skipped {len(self.skipped)} module output(s):")
            for name, why in self.skipped[:20]:
                lines.append(f"    {name}: {why}")
            if len(self.skipped) > 20:
                lines.append(f"    ... and {len(self.skipped) - 20} more")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        first = self.first
        return {
            "labels": list(self.labels),
            "equal": self.equal,
            "first": None if first is None else first.to_dict(),
            "modules": [m.to_dict() for m in self.modules],
            "layers": [layer.to_dict() for layer in self.layers],
            "skipped": [{"name": n, "reason": r} for n, r in self.skipped],
            "context": dict(self.context),
        }


# ---- recording --------------------------------------------------------------------------------------------
