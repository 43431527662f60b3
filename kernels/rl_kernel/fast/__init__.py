"""rl_kernel.fast: the fast tier's own operators. Triton matrix-core kernels with the exact tier's Python signatures.

    y = rl_kernel.fast.linear(x, weight, bias)                # F.linear, bf16/fp16 on a GPU
    o = rl_kernel.fast.attention(q, k, v, q_pos, k_start)     # causal GQA, prefill and decode alike
    y = rl_kernel.fast.rms_norm(x, weight, eps)               # the exact forward, a parallel weight gradient

The fast tier is bitwise reproducible within one GPU target (sm_90, gfx942, ...), not across targets or
against the CPU: a row's bits do not depend on the batch size, on the other rows, on Tq or on how the KV
cache was filled, and every backward is deterministic run to run (no atomics, no split-K). Every knob that
changes the arithmetic is pinned per target in configs.toml (fast.configs). Every other operator of the tier is
the exact tier's (its fallback: tiers.get("fast").op("rotary")). The kernels live in the family folder decoder/.

Importing this package needs neither a GPU nor Triton: a missing Triton is reported when a kernel is called. Its
operators and kernel modules (fast.ops) are imported on first use, so finding the tiers, which every process of the
harness does, does not import Triton and the kernels (a quarter of a second of each start).
"""

from __future__ import annotations

import importlib
from typing import Any

NAME = "fast"  # the name its errors give (the descriptor, fast.tier.TIER, is the Tier)
OPERATORS = ("attention", "grouped_mm", "linear", "mm", "rms_norm")
_OPS = ("attention", "attention_kernels", "group_kernels", "grouped_kernels", "grouped_mm", "linear", "linear_group",
        "linear_kernels", "mm", "rms_norm")  # fmt: skip


def __getattr__(name: str) -> Any:
    """rl_kernel.fast.<operator or kernel module>, from fast.ops on first use (PEP 562)."""
    if name not in _OPS:
        raise AttributeError(f"module 'rl_kernel.fast' has no attribute {name!r}")
    value = getattr(importlib.import_module("rl_kernel.fast.ops"), name)
    globals()[name] = value  # later reads are plain attribute reads (dynamo's too)
    return value


__all__ = ["NAME", "OPERATORS", *_OPS]
