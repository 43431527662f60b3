"""The softmax family's checks: the golden and self-check cases and SPECS (rl_kernel.exact.softmax.ops's operators
as the tests, selfcheck and golden digests see them)."""

from __future__ import annotations

import torch

from rl_kernel import inputs
from rl_kernel.exact.softmax.ops import IGNORE, entropy, log_softmax, row_stats, token_logprobs
from rl_kernel.spec import Case, OpSpec

FAMILY = "softmax"


# ---- the family's cases ---------------------------------------------------------------------
GOLDEN_VOCABS = (7, 257, 32000, 151936)


def golden_case(vocab: int, dtype: torch.dtype) -> Case:
    """The fixed inputs whose output digests are committed (golden.json): a few random
    rows plus the edge rows, every third token ignored, exact binary upstream gradients."""
    x = inputs.logits(2 if vocab == 151936 else 4, vocab, dtype, seed=vocab)
    if vocab >= 8:
        x = torch.cat([x, inputs.edge_rows(vocab, dtype)])
    t = inputs.tokens(x.shape[0], vocab, seed=vocab)
    t[::3] = IGNORE
    n = x.shape[0]
    row = (torch.arange(n) % 7).to(torch.float32) * 0.25 - 0.75
    elem = ((torch.arange(n * vocab) % 13).to(torch.float32) * 0.125 - 0.75).view(n, vocab)
    return Case(x, t, row, elem, IGNORE)


def check_case(vocab: int, dtype: torch.dtype, seed: int) -> Case:
    """Random rows plus the edge rows, every fifth token ignored, random upstream gradients
    (rl_kernel.contract.selfcheck)."""
    n = 64 if vocab <= 32000 else 16
    x = inputs.logits(n, vocab, dtype, seed)
    if vocab >= 8:
        x = torch.cat([x, inputs.edge_rows(vocab, dtype)])
    tok = inputs.tokens(x.shape[0], vocab, seed)
    tok[::5] = IGNORE
    g = torch.Generator().manual_seed(seed + 7)
    elem = torch.randn(x.shape, generator=g)
    row = torch.randn(x.shape[:-1], generator=g)
    return Case(x, tok, row, elem, IGNORE)


# Upstream gradients at the contract's boundaries: 2^-126 itself (flush keeps it), a subnormal (flushed),
# exact ties of bf16 (1 + 2^-8: even is down) and fp16 (1 + 2^-11), and multiples of 2^-127 of both
# signs whose partial sums cross 2^-126.
_BOUNDARY_GRADS = (
    2.0**-126,
    -(2.0**-126),
    1.0 + 2.0**-8,
    -(1.0 + 2.0**-8),
    1.0 + 2.0**-11,
    -(1.0 + 2.0**-11),
    3 * 2.0**-127,
    2.0**-127,
    -(2.0**-126),
    5 * 2.0**-127,
    -(3 * 2.0**-126),
    2.0**-126,
    4 + 2.0**-6,
)


def boundary_case(vocab: int, dtype: torch.dtype) -> Case:
    """Golden inputs at the flush boundary, on exact fp16/bf16 ties and across 2^-126 (docs/numerics.md
    section 7). Row 0 has one 0 among -1000 (p = 1 there, p = 0 elsewhere), so the log_softmax gradient is
    the flushed upstream value itself off the peak and the token gradient is +-g: boundary values reach the
    output unchanged. Row 1 is subnormals and normals near 2^-126 of both signs; row 2 a random row."""
    peak = vocab // 2
    x0 = torch.full((vocab,), -1000.0)
    x0[peak] = 0.0
    k = torch.arange(vocab)
    near = ((k * 7) % 33 - 16).to(torch.float32) * 2.0**-128
    sub = ((k * 2654435761) % (2**23) - 2**22).to(torch.float32) * 2.0**-149
    x1 = torch.where(k % 2 == 0, sub, near)
    x2 = inputs.logits(1, vocab, torch.float32, seed=vocab + 5)[0]
    x = torch.stack([x0, x1, x2]).to(dtype)
    t = torch.tensor([(peak + 1) % vocab, 0, IGNORE])
    if vocab == 1:
        t[0] = 0
    elem = torch.tensor(_BOUNDARY_GRADS, dtype=torch.float32).repeat(3 * vocab // len(_BOUNDARY_GRADS) + 1)
    elem = elem[: 3 * vocab].view(3, vocab)
    row = torch.tensor([1.0 + 2.0**-8, 2.0**-126, 1.0 + 2.0**-11], dtype=torch.float32)
    return Case(x, t, row, elem, IGNORE)


def _spec(name: str, forward, upstream: str | None, in_golden: bool = True) -> OpSpec:
    extra = (("boundary", boundary_case),)
    return OpSpec(name, FAMILY, forward, upstream, golden_case, check_case, GOLDEN_VOCABS, in_golden, extra)


SPECS = (
    _spec("log_softmax", lambda x, c: log_softmax(x), "elem"),
    _spec("token_logprobs", lambda x, c: token_logprobs(x, c.tokens, c.ignore_index), "row"),
    _spec("entropy", lambda x, c: entropy(x), "row"),
    _spec("row_stats", lambda x, c: row_stats(x), None, in_golden=False),
)
