"""The softmax family: row_stats, log_softmax (and its backward), token_logprobs and entropy.

Autograd Functions over torch.ops.rl_kernel.*, the public functions, fake implementations (so the
operators trace under torch.compile and meta tensors) and SPECS, the family's operators as the tests,
selfcheck and golden digests see them. The kernels are in csrc/softmax/, the numpy transcription of
the contract in rl_kernel/reference/softmax.py.
"""

from __future__ import annotations

import torch

from rl_kernel._library import ops, register_fake
from rl_kernel._validate import (
    DTYPES,
    check_dtype,
    check_logits,
    check_same_device,
    check_tensor,
    check_token_range,
    check_tokens,
    needs_autograd,
)

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


@register_fake("rl_kernel::logprobs_entropy_backward_slice")
def _logprobs_entropy_backward_slice_fake(grad_logprobs, grad_entropy, logits, tokens, stats, entropy, ignore_index,
                                          valid):  # fmt: skip
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
    if needs_autograd(logits):
        out = _TokenLogprobs.apply(logits, tokens, int(ignore_index))
    else:  # a rollout's decode step: the same kernel, without autograd.Function's host time
        out = ops.token_logprobs(logits, tokens, int(ignore_index))[0]
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
    return _Entropy.apply(logits) if needs_autograd(logits) else ops.entropy(logits)[0]


def row_stats(logits: torch.Tensor) -> torch.Tensor:
    """Per-row [max, sum of exp(x - max), log of that sum] in fp32: the intermediates of
    every kernel here, for finding which reduction diverged."""
    check_logits(logits)
    return ops.row_stats(logits)


def divide_by_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 logits / temperature, one correctly rounded division per element on every device. (torch's
    CUDA divide by a Python number multiplies by the number's float reciprocal, its CPU divide divides: the
    frameworks' `logits / T` differs in the last bit between them. Dividing by a float32 tensor on the
    logits' device is a true division on both.)"""
    if not temperature > 0:
        raise ValueError(f"rl_kernel: temperature must be > 0, got {temperature}")
    return logits.float() / torch.full((), temperature, dtype=torch.float32, device=logits.device)
