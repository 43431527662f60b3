"""Deterministic inputs for checks, benchmarks and golden digests.

Everything is generated on the CPU from a seed, then moved, so every device
sees the same bits.
"""

from __future__ import annotations

import torch

# Vocabulary sizes the project promises to cover: edge sizes around the chunk
# (8) and the GPU's warp tile (256 chunks), and real tokenizers (Llama-2, GPT-2, Llama-3, Qwen).
VOCABS = (1, 7, 255, 256, 257, 32000, 50257, 128256, 151936)
# The one map of the dtypes rl_kernel takes, by the names tiers, cells and matrix files use.
DTYPE_NAMES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPES = tuple(DTYPE_NAMES.values())


def dtype_name(dtype: torch.dtype) -> str:
    """fp32 / bf16 / fp16: the name cells, tiers and matrix files use for a dtype."""
    return next(name for name, d in DTYPE_NAMES.items() if d == dtype)


def logits(rows: int, vocab: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """LLM-like logits: a wide normal body with a few strongly preferred tokens."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 2.5
    if vocab > 1:
        hot = torch.randint(0, vocab, (rows, max(1, vocab // 1000)), generator=g)
        x.scatter_add_(1, hot, torch.full(hot.shape, 9.0))
    return x.to(dtype)


def tokens(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab, (rows,), generator=g)


def edge_rows(vocab: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows that exercise every edge case of docs/numerics.md (vocab >= 8).

    0 normal; 1 one NaN; 2 all -inf; 3 some -inf (masked vocabulary); 4 one +inf;
    5 signed zeros only; 6 subnormals and tiny values; 7 huge magnitudes;
    8 a single finite value among -inf; 9 constant row.
    """
    if vocab < 8:
        raise ValueError("edge_rows needs vocab >= 8")
    finfo = torch.finfo(dtype)
    x = logits(10, vocab, torch.float32, seed=123)
    x[1, vocab // 2] = float("nan")
    x[2] = float("-inf")
    x[3, ::3] = float("-inf")
    x[4, vocab // 3] = float("inf")
    x[5] = 0.0
    x[5, 1::2] = -0.0
    x[6] = finfo.tiny * 0.5 if dtype == torch.float32 else finfo.tiny
    x[6, ::2] = -finfo.smallest_normal * 0.25
    x[6, 3] = finfo.smallest_normal
    x[7] = torch.linspace(-1.0, 1.0, vocab) * finfo.max
    x[8] = float("-inf")
    x[8, vocab - 1] = 1.5
    x[9] = -3.25
    return x.to(dtype)
