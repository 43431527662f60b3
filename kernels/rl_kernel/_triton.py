"""Triton, where it is installed: `triton`, `tl` and `jit` (triton.jit), else None, None and a `jit` that returns the
function as it is, so that a module of Triton kernels imports without Triton; its callers report the missing Triton
when a kernel is called (triton_tier.require_triton). TRITON_INTERPRET must be set before this is first imported."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl

    jit = triton.jit
except ImportError:
    triton = tl = None

    def jit(fn=None, **_kw):
        return fn if fn is not None else (lambda f: f)


__all__ = ["jit", "tl", "triton"]
