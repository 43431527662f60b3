"""Bitwise comparison of tensors: the only notion of equality this project uses.

Two tensors are equal when their integer views are equal (so -0.0 != +0.0 and a
NaN equals only the same NaN bits). On mismatch, `diff` reports what a person
needs to find the divergent reduction.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import torch

_INT_VIEW = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def int_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as a same-width integer tensor (integer tensors pass through)."""
    if t.dtype in _INT_VIEW:
        return t.contiguous().view(_INT_VIEW[t.dtype])
    if t.dtype.is_floating_point or t.dtype.is_complex:
        raise TypeError(f"no integer view for dtype {t.dtype}")
    return t


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True iff a and b have the same shape, dtype and bits."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(int_view(a.detach().cpu()), int_view(b.detach().cpu()))


def digest(t: torch.Tensor) -> str:
    """SHA-256 of dtype, shape and the little-endian bytes of the tensor."""
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(int_view(t).numpy().tobytes())
    return h.hexdigest()


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """Map float32 bits to integers whose difference is the distance in ulps (+0 == -0)."""
    v = bits.to(torch.int64)
    return torch.where(v < 0, -(2**31) - v, v)


@dataclass(frozen=True)
class Diff:
    """What differs between two tensors of the same shape."""

    equal: bool
    count: int  # elements whose bits differ
    total: int
    max_abs: float  # over elements where both are finite
    max_ulp: int  # float32 distance in units in the last place
    first_index: tuple[int, ...] | None
    first_a: float | None
    first_b: float | None

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        if self.equal:
            return f"bitwise equal ({self.total} elements)"
        return (
            f"{self.count}/{self.total} elements differ; max |a-b| {self.max_abs:.3e}, max {self.max_ulp} ulp; "
            f"first at {self.first_index}: {self.first_a!r} vs {self.first_b!r}"
        )


def diff(a: torch.Tensor, b: torch.Tensor) -> Diff:
    """Bitwise comparison with diagnostics (count, max abs diff, max ulp, first mismatch)."""
    if a.shape != b.shape:
        raise ValueError(f"cannot compare tensors of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise ValueError(f"cannot compare tensors of dtypes {a.dtype} and {b.dtype}")
    a = a.detach().cpu()
    b = b.detach().cpu()
    mism = int_view(a) != int_view(b)
    count = int(mism.sum())
    if count == 0:
        return Diff(True, 0, a.numel(), 0.0, 0, None, None, None)
    a32, b32 = a.float(), b.float()
    finite = torch.isfinite(a32) & torch.isfinite(b32) & mism
    max_abs = float((a32 - b32).abs()[finite].max()) if bool(finite.any()) else float("inf")
    ulp = (_ordered(int_view(a32)) - _ordered(int_view(b32))).abs()
    max_ulp = int(ulp[mism].max())
    first = tuple(int(i) for i in mism.nonzero()[0])
    return Diff(False, count, a.numel(), max_abs, max_ulp, first, float(a32[first]), float(b32[first]))
