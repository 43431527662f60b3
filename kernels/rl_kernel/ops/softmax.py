"""The softmax family: row_stats, log_softmax (and its backward), token_logprobs and entropy.

Autograd Functions over torch.ops.rl_kernel.*, the public functions, fake implementations (so the
operators trace under torch.compile and meta tensors) and SPECS, the family's operators as the tests,
selfcheck and golden digests see them. The kernels are in csrc/softmax/, the numpy transcription of
the contract in rl_kernel/reference/softmax.py.
"""

from __future__ import annotations

import torch

from rl_kernel import inputs
from rl_kernel._library import ops, register_fake
from rl_kernel._validate import (
    DTYPES,
    check_dtype,
    check_logits,
    check_same_device,
    check_tensor,
    check_token_range,
    check_tokens,
)
from rl_kernel.ops.spec import Case, OpSpec

FAMILY = "softmax"
IGNORE = -100


# ---- fake implementations: output shapes and dtypes only -------------------------------------
def _per_row(logits: torch.Tensor) -> torch.Tensor:
    return logits.new_empty(logits.shape[:-1], dtype=torch.float32)


def _stats(logits: torch.Tensor) -> torch.Tensor:
    return logits.new_empty((*logits.shape[:-1], 3), dtype=torch.float32)


def _full(logits: torch.Tensor) -> torch.Tensor:
    return logits.new_empty(logits.shape, dtype=torch.float32)


@register_fake("rl_kernel::row_stats")
def _row_stats_fake(logits):
    return _stats(logits)


@register_fake("rl_kernel::log_softmax")
def _log_softmax_fake(logits):
    return _full(logits)


@register_fake("rl_kernel::log_softmax_backward")
def _log_softmax_backward_fake(grad_output, output, input_dtype):
    return output.new_empty(output.shape, dtype=input_dtype)


@register_fake("rl_kernel::token_logprobs")
def _token_logprobs_fake(logits, tokens, ignore_index):
    return _per_row(logits), _stats(logits)


@register_fake("rl_kernel::token_logprobs_backward")
def _token_logprobs_backward_fake(grad, logits, tokens, stats, ignore_index):
    return torch.empty_like(logits)


@register_fake("rl_kernel::entropy")
def _entropy_fake(logits):
    return _per_row(logits), _stats(logits)


@register_fake("rl_kernel::entropy_backward")
def _entropy_backward_fake(grad, logits, stats, entropy):
    return torch.empty_like(logits)


@register_fake("rl_kernel::node_stats")
def _node_stats_fake(logits, chunk0, valid, levels, indices):
    return logits.new_empty((*logits.shape[:-1], len(levels), 2), dtype=torch.float32)


@register_fake("rl_kernel::node_entropy")
def _node_entropy_fake(logits, stats, chunk0, valid, levels, indices):
    return logits.new_empty((*logits.shape[:-1], len(levels)), dtype=torch.float32)


@register_fake("rl_kernel::join_stats")
def _join_stats_fake(partials, levels, indices):
    return partials.new_empty((*partials.shape[:-2], 3))


@register_fake("rl_kernel::join_sum")
def _join_sum_fake(partials, stats, levels, indices):
    return partials.new_empty(partials.shape[:-1])


@register_fake("rl_kernel::token_logprobs_backward_slice")
def _token_logprobs_backward_slice_fake(grad, logits, tokens, stats, ignore_index, valid):
    return torch.empty_like(logits)


@register_fake("rl_kernel::entropy_backward_slice")
def _entropy_backward_slice_fake(grad, logits, stats, entropy, valid):
    return torch.empty_like(logits)


# ---- autograd and the public functions ---------------------------------------------------------
class BitwiseLogSoftmax(torch.autograd.Function):
    """Drop-in for F.log_softmax(logits, dim) in a policy's forward; fp32 output."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
        check_logits(logits)
        dim = dim % logits.dim()
        out = ops.log_softmax(logits.movedim(dim, -1)).movedim(-1, dim)
        ctx.save_for_backward(out)
        ctx.dim = dim
        ctx.in_dtype = logits.dtype
        return out

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (out,) = ctx.saved_tensors
        return log_softmax_backward(grad_output, out, ctx.dim, ctx.in_dtype), None


def log_softmax(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log_softmax over `dim` in fp32, bitwise reproducible; differentiable."""
    return BitwiseLogSoftmax.apply(logits, dim)


def log_softmax_backward(
    grad_output: torch.Tensor, output: torch.Tensor, dim: int = -1, input_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Gradient of log_softmax, grad_output - exp(output) * sum(grad_output), in input_dtype
    (rounded to nearest even with a canonical NaN, identically on every device)."""
    check_tensor(grad_output, "grad_output", DTYPES)
    check_tensor(output, "output", DTYPES)
    check_same_device({"output": output, "grad_output": grad_output})
    if grad_output.shape != output.shape:
        raise ValueError(
            f"rl_kernel: grad_output shape {tuple(grad_output.shape)} must equal output shape {tuple(output.shape)}"
        )
    check_dtype(input_dtype, "input_dtype")
    dim = dim % output.dim()
    grad = ops.log_softmax_backward(grad_output.movedim(dim, -1), output.movedim(dim, -1), input_dtype)
    return grad.movedim(-1, dim)


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, ignore_index: int) -> torch.Tensor:
        out, stats = ops.token_logprobs(logits, tokens, ignore_index)
        ctx.save_for_backward(logits, tokens, stats)
        ctx.ignore_index = ignore_index
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, tokens, stats = ctx.saved_tensors
        return ops.token_logprobs_backward(grad.contiguous(), logits, tokens, stats, ctx.ignore_index), None, None


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, ignore_index: int = IGNORE, *, validate: bool = True
) -> torch.Tensor:
    """log p(tokens) under softmax(logits) in fp32, without materialising the log-softmax.

    Equal bit for bit to log_softmax(logits).gather(-1, tokens). Positions whose
    token is ignore_index give 0 (and zero gradient). Differentiable.
    validate=True raises ValueError on a token id outside [0, V); on a GPU that
    waits for the kernel. validate=False (for hot loops) skips the wait, and an
    out-of-range id then gives NaN at its position.
    """
    check_logits(logits)
    tokens = check_tokens(logits, tokens)
    out = _TokenLogprobs.apply(logits, tokens, int(ignore_index))
    if validate:
        check_token_range(tokens, logits.shape[-1], ignore_index)
    return out


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor) -> torch.Tensor:
        out, stats = ops.entropy(logits)
        ctx.save_for_backward(logits, stats, out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, stats, out = ctx.saved_tensors
        return ops.entropy_backward(grad.contiguous(), logits, stats, out)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy -sum p log p of softmax(logits) over the last dim, fp32; differentiable."""
    check_logits(logits)
    return _Entropy.apply(logits)


def row_stats(logits: torch.Tensor) -> torch.Tensor:
    """Per-row [max, sum of exp(x - max), log of that sum] in fp32: the intermediates of
    every kernel here, for finding which reduction diverged."""
    check_logits(logits)
    return ops.row_stats(logits)


# ---- the family's cases ---------------------------------------------------------------------
GOLDEN_VOCABS = (7, 257, 32000, 151936)


def golden_case(vocab: int, dtype: torch.dtype) -> Case:
    """The fixed inputs whose output digests are committed (golden/exact/softmax.json): a few random
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
    (rl_kernel.selfcheck)."""
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
