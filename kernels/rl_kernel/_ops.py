"""Kept for callers that import rl_kernel._ops (the harness's fingerprint and inventory):
the loader now lives in rl_kernel._library."""

from __future__ import annotations

from rl_kernel._library import has_gpu_kernels, ops

__all__ = ["has_gpu_kernels", "ops"]
