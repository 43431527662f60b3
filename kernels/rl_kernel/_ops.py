"""Loads the compiled operators (torch.ops.rl_kernel.*) and gives them fake
implementations, so they trace under torch.compile and meta tensors."""

from __future__ import annotations

import os

import torch

# RL_KERNEL_LIBRARY loads another build of the same operators instead of _C: the harness's
# negative controls (rlparity selftest) use it to run a deliberately wrong build in a fresh process.
_library = os.environ.get("RL_KERNEL_LIBRARY")
if _library:
    if not os.path.isfile(_library):
        raise ImportError(f"RL_KERNEL_LIBRARY={_library!r} is not a file")
    torch.ops.load_library(_library)
else:
    try:
        from rl_kernel import _C  # noqa: F401  (registers torch.ops.rl_kernel)
    except ImportError as exc:  # pragma: no cover - exercised only on a broken install
        raise ImportError(
            "rl_kernel's compiled extension is missing. Build it from the repository root with "
            "`make build` (or `pip install --no-build-isolation -e .`)."
        ) from exc

ops = torch.ops.rl_kernel

_register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract


def _per_row(logits: torch.Tensor) -> torch.Tensor:
    return logits.new_empty(logits.shape[:-1], dtype=torch.float32)


def _stats(logits: torch.Tensor) -> torch.Tensor:
    return logits.new_empty((*logits.shape[:-1], 3), dtype=torch.float32)


def _full(logits: torch.Tensor) -> torch.Tensor:
    return logits.new_empty(logits.shape, dtype=torch.float32)


@_register_fake("rl_kernel::row_stats")
def _row_stats_fake(logits):
    return _stats(logits)


@_register_fake("rl_kernel::log_softmax")
def _log_softmax_fake(logits):
    return _full(logits)


@_register_fake("rl_kernel::log_softmax_backward")
def _log_softmax_backward_fake(grad_output, output, input_dtype):
    return output.new_empty(output.shape, dtype=input_dtype)


@_register_fake("rl_kernel::token_logprobs")
def _token_logprobs_fake(logits, tokens, ignore_index):
    return _per_row(logits), _stats(logits)


@_register_fake("rl_kernel::token_logprobs_backward")
def _token_logprobs_backward_fake(grad, logits, tokens, stats, ignore_index):
    return torch.empty_like(logits)


@_register_fake("rl_kernel::entropy")
def _entropy_fake(logits):
    return _per_row(logits), _stats(logits)


@_register_fake("rl_kernel::entropy_backward")
def _entropy_backward_fake(grad, logits, stats, entropy):
    return torch.empty_like(logits)


def has_gpu_kernels() -> bool:
    """True when this build carries the CUDA/HIP kernels (torch's CUDA key serves both)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("rl_kernel::log_softmax", "CUDA")
