"""The softmax family's test inputs and helpers, shared by test_softmax.py and test_softmax_edges.py."""

from __future__ import annotations

import pytest
import torch
from bit_checks import dname

from rl_kernel import inputs
from rl_kernel.exact.softmax import checks as softmax
from rl_kernel.spec import Case

# The family's differentiable operators, from its OpSpecs (rl_kernel.exact.softmax.ops.SPECS).
SPECS = {s.name: s for s in softmax.SPECS if s.differentiable}
OPS = tuple(SPECS)
IGNORE = -100
CANONICAL_NAN = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}
NEG_ZERO = {torch.float32: -(2**31), torch.bfloat16: -(2**15), torch.float16: -(2**15)}
MIN_NORMAL = 2.0**-126
EDGE_VOCABS = tuple(v for v in inputs.VOCABS if v >= 8)
# Rows of edge_rows(), see its docstring.
NORMAL, ONE_NAN, ALL_NEG_INF, SOME_NEG_INF, POS_INF, SIGNED_ZEROS, SUBNORMALS, HUGE, SINGLE, CONSTANT = range(10)
BAD_ROWS = (ONE_NAN, ALL_NEG_INF, POS_INF)


def rows_for(vocab: int) -> int:
    """Batch size that keeps the whole file fast on 2 cores (even, for [B, T, V] reshapes)."""
    if vocab <= 257:
        return 12
    if vocab <= 50257:
        return 6
    return 4


def run(op: str, x: torch.Tensor, t: torch.Tensor, ignore_index: int = IGNORE) -> torch.Tensor:
    return SPECS[op].forward(x, Case(x, t, ignore_index=ignore_index))


def case(vocab: int, dtype: torch.dtype, device: str = "cpu", rows: int | None = None, seed: int = 0):
    """Logits [rows, vocab] and tokens [rows] with every 4th token (from the second) ignored."""
    n = rows_for(vocab) if rows is None else rows
    x = inputs.logits(n, vocab, dtype, seed=seed + vocab).to(device)
    t = inputs.tokens(n, vocab, seed=seed + vocab)
    t[1::4] = IGNORE
    return x, t.to(device)


def weights(shape: tuple[int, ...], seed: int, device: str = "cpu") -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device)


def grads(x: torch.Tensor, t: torch.Tensor, seed: int = 7) -> dict[str, torch.Tensor]:
    """Gradients of sum(op(x) * w) for each op, w fixed by the seed."""
    out = {}
    for op in OPS:
        leaf = x.detach().clone().requires_grad_()
        y = run(op, leaf, t)
        w = weights(tuple(y.shape), seed, str(x.device))
        (g,) = torch.autograd.grad((y * w).sum(), leaf)
        out[op] = g
    return out


def vd_params(vocabs: tuple[int, ...] = inputs.VOCABS) -> list:
    return [pytest.param(v, d, id=f"V{v}-{dname(d)}") for v in vocabs for d in inputs.DTYPES]


def views(x: torch.Tensor, t: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Non-contiguous views with the rows of x (or of a close relative) and matching tokens."""
    n, v = x.shape
    wide = x.repeat_interleave(2, dim=1)  # [n, 2v]: wide[:, ::2] == x
    padded = torch.cat([x[:, :1], x, x[:, :3]], dim=1)  # rows start 1 element in: not 16-byte aligned
    tall = x.repeat_interleave(2, dim=0)
    bt = torch.stack([x, x.flip(0), x], dim=1)  # [n, 3, v]
    tbt = torch.stack([t, t.flip(0), t], dim=1)
    return {
        "column_major": (x.t().contiguous().t(), t),
        "strided_vocab": (wide[:, ::2], t),
        "strided_rows": (tall[::2], t.repeat_interleave(2)[::2]),
        # GPU: rows off a 16-byte boundary take the scalar load path (test_misaligned_rows_gpu); on the
        # CPU (one load path) this is just another strided view.
        "misaligned_rows": (padded[:, 1 : v + 1], t),
        "bt_sliced": (bt[:, :-1], tbt[:, :-1]),
        "expanded": (x[:1].expand(n, v), t[:1].expand(n)),
    }


# ---- accuracy bounds against float64
# Measured on this build (x86-64 CPU, inputs as in test_softmax.py's _accuracy_input, all VOCABS x DTYPES):
#   max |log_softmax - float64| over finite rows: 2.2e-6 fp32, 2.2e-6 bf16, 2.3e-6 fp16 (all at
#   V=151936 or 256; about half an ulp of outputs near -35). torch's own fp32 log_softmax: 1.7e-5.
LSM_MAX_ABS = 5e-6
# Entropy: |H - H64| <= ENT_RTOL * H64 + ENT_ATOL. A pure relative bound cannot hold in fp32 for
# near-deterministic rows (H ~ 5e-6 when one p ~ 1 - 5e-6: the fp32 sum near 1 quantises that p, so
# the absolute error is ~1e-7 and the relative one 1e-2; torch's fp32 entropy is as far off there).
# Measured: absolute error <= 1.5e-7 on such rows, <= 7e-6 overall (H = log V = 11.9 rows);
# relative 5.9e-7 where H >= 0.3; max (|err| - 2.4e-7) / H = 5.9e-6 (V=151936, H = 0.063).
ENT_RTOL = 1e-5
ENT_ATOL = 3e-7
