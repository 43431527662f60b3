"""rl_kernel: deterministic log-prob kernels with one numerical contract.

The same inputs give the same bits on the CPU (the golden reference), CUDA and
HIP builds, at every batch size and on every run: the reduction order and the
arithmetic are fixed by docs/numerics.md. This is the `exact` tier.

    logp = rl_kernel.token_logprobs(logits, tokens)       # [...], fp32
    lsm  = rl_kernel.log_softmax(logits)                  # [..., V], fp32
    ent  = rl_kernel.entropy(logits)                      # [...], fp32
"""

from __future__ import annotations

import torch

from rl_kernel._ops import has_gpu_kernels, ops

__all__ = [
    "TIER",
    "BitwiseLogSoftmax",
    "entropy",
    "has_gpu_kernels",
    "log_softmax",
    "log_softmax_backward",
    "row_stats",
    "token_logprobs",
]

TIER = "exact"
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _compiling() -> bool:
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(is_compiling and is_compiling())


def _check_logits(logits: object, name: str = "logits") -> torch.Tensor:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"rl_kernel: {name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in _DTYPES:
        raise TypeError(f"rl_kernel: {name} must be float32, bfloat16 or float16, got {logits.dtype}")
    if logits.dim() < 1:
        raise ValueError(f"rl_kernel: {name} must have at least one dimension (the vocabulary)")
    if logits.shape[-1] == 0:
        raise ValueError(f"rl_kernel: {name} has an empty vocabulary dimension (size 0)")
    if logits.device.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"rl_kernel: {name} is on {logits.device}; supported devices are cpu and cuda/hip")
    if logits.device.type == "cuda" and not has_gpu_kernels():
        raise RuntimeError(
            "rl_kernel was built without GPU kernels; rebuild on a machine with a CUDA or ROCm "
            "torch (`make build`) to use logits on " + str(logits.device)
        )
    return logits


def _check_tokens(logits: torch.Tensor, tokens: object) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"rl_kernel: tokens must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"rl_kernel: tokens must be an integer tensor, got {tokens.dtype}")
    if tokens.device != logits.device:
        raise ValueError(f"rl_kernel: tokens are on {tokens.device} but logits are on {logits.device}")
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(
            f"rl_kernel: tokens shape {tuple(tokens.shape)} must equal logits shape without the "
            f"vocabulary dimension {tuple(logits.shape[:-1])}"
        )
    return tokens.long()


def _check_token_range(tokens: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Raise on ids outside [0, vocab). Called after the kernel is queued, so the
    host waits once for both (the kernel itself writes NaN for such ids)."""
    if _compiling() or tokens.device.type == "meta" or tokens.numel() == 0:
        return
    bad = (tokens != ignore_index) & ((tokens < 0) | (tokens >= vocab))
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"rl_kernel: token id {int(tokens[first])} at index {first} is outside the vocabulary "
            f"[0, {vocab}) and is not ignore_index={ignore_index}"
        )


class BitwiseLogSoftmax(torch.autograd.Function):
    """Drop-in for F.log_softmax(logits, dim) in a policy's forward; fp32 output."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
        _check_logits(logits)
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
    if grad_output.shape != output.shape:
        raise ValueError(
            f"rl_kernel: grad_output shape {tuple(grad_output.shape)} must equal output shape {tuple(output.shape)}"
        )
    if input_dtype not in _DTYPES:
        raise TypeError(f"rl_kernel: input_dtype must be float32, bfloat16 or float16, got {input_dtype}")
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
    logits: torch.Tensor, tokens: torch.Tensor, ignore_index: int = -100, *, validate: bool = True
) -> torch.Tensor:
    """log p(tokens) under softmax(logits) in fp32, without materialising the log-softmax.

    Equal bit for bit to log_softmax(logits).gather(-1, tokens). Positions whose
    token is ignore_index give 0 (and zero gradient). Differentiable.
    validate=True raises ValueError on a token id outside [0, V); on a GPU that
    waits for the kernel. validate=False (for hot loops) skips the wait, and an
    out-of-range id then gives NaN at its position.
    """
    _check_logits(logits)
    tokens = _check_tokens(logits, tokens)
    out = _TokenLogprobs.apply(logits, tokens, int(ignore_index))
    if validate:
        _check_token_range(tokens, logits.shape[-1], ignore_index)
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
    _check_logits(logits)
    return _Entropy.apply(logits)


def row_stats(logits: torch.Tensor) -> torch.Tensor:
    """Per-row [max, sum of exp(x - max), log of that sum] in fp32: the intermediates of
    every kernel here, for finding which reduction diverged."""
    _check_logits(logits)
    return ops.row_stats(logits)
