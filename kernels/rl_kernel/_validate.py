"""Argument checks shared by the families: clear Python errors before a kernel runs."""

from __future__ import annotations

import torch

from rl_kernel._library import has_gpu_kernels
from rl_kernel.inputs import DTYPES


def compiling() -> bool:
    """True while torch.compile traces (no host syncs, no data-dependent checks then)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(is_compiling and is_compiling())


def needs_autograd(*tensors: torch.Tensor | None) -> bool:
    """An operator's autograd (its autograd.Function or custom op) is needed: tracing, or a gradient may flow. Else
    the kernel is called directly: the same kernel and bits, without 5-10 us of host time per call (a decode step
    makes hundreds of such calls)."""
    if compiling():
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def check_logits(logits: object, name: str = "logits") -> torch.Tensor:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"rl_kernel: {name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in DTYPES:
        raise TypeError(f"rl_kernel: {name} must be float32, bfloat16 or float16, got {logits.dtype}")
    if logits.dim() < 1:
        raise ValueError(f"rl_kernel: {name} must have at least one dimension (the vocabulary)")
    if logits.shape[-1] == 0:
        raise ValueError(f"rl_kernel: {name} has an empty vocabulary dimension (size 0)")
    if logits.device.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"rl_kernel: {name} is on {logits.device}; supported devices are cpu and cuda/hip")
    # Not while torch.compile traces: asking the dispatcher is a graph break ("torch.* op returned
    # non-Tensor"), and a build without GPU kernels still fails there, at the dispatch, by name.
    if logits.device.type == "cuda" and not compiling() and not has_gpu_kernels():
        raise RuntimeError(
            "rl_kernel was built without GPU kernels; rebuild on a machine with a CUDA or ROCm "
            "torch (`make build`) to use logits on " + str(logits.device)
        )
    return logits


def check_dtype(dtype: object, name: str) -> None:
    if dtype not in DTYPES:
        raise TypeError(f"rl_kernel: {name} must be float32, bfloat16 or float16, got {dtype}")


_DTYPE_NAMES = {torch.float32: "float32", torch.int64: "int64", DTYPES: "float32, bfloat16 or float16"}


def check_tensor(t: object, name: str, dtypes: torch.dtype | tuple[torch.dtype, ...] | None = None) -> torch.Tensor:
    """t is a torch.Tensor (TypeError naming it otherwise) of one of dtypes (a dtype or a tuple; None: any)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"rl_kernel: {name} must be a torch.Tensor, got {type(t).__name__}")
    allowed = (dtypes,) if isinstance(dtypes, torch.dtype) else dtypes
    if allowed is not None and t.dtype not in allowed:
        want = _DTYPE_NAMES.get(dtypes) or " or ".join(str(d).removeprefix("torch.") for d in allowed)
        raise TypeError(f"rl_kernel: {name} must be {want}, got {t.dtype}")
    return t


def check_same_device(tensors: dict[str, torch.Tensor | None], host_ok: tuple[str, ...] = ()) -> None:
    """Every tensor of {name: tensor} (None: an absent optional argument) is on the first one's device; a
    ValueError naming the first that is not. Names in host_ok may also be on the CPU (the operator copies
    those small host-made tables to the device itself). Devices are metadata: no host sync, and nothing
    to skip under torch.compile (the check runs once, at trace time). Without it a meta tensor among CPU
    ones dispatches to the fake implementation and returns uninitialised memory."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    ref_name, ref = items[0]
    for name, t in items[1:]:
        if t.device != ref.device and not (name in host_ok and t.device.type == "cpu"):
            raise ValueError(
                f"rl_kernel: {name} is on {t.device} but {ref_name} is on {ref.device}; "
                "every tensor argument must be on one device"
            )


def check_same_dtype(tensors: dict[str, torch.Tensor | None]) -> None:
    """Every tensor of {name: tensor} (None: absent) has the first one's dtype; a TypeError naming the first
    that has not."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    ref_name, ref = items[0]
    for name, t in items[1:]:
        if t.dtype != ref.dtype:
            raise TypeError(f"rl_kernel: {name} is {t.dtype} but {ref_name} is {ref.dtype} (they must have one dtype)")


def check_tokens(logits: torch.Tensor, tokens: object, name: str = "logits") -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"rl_kernel: tokens must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"rl_kernel: tokens must be an integer tensor, got {tokens.dtype}")
    if tokens.device != logits.device:
        raise ValueError(f"rl_kernel: tokens are on {tokens.device} but {name} are on {logits.device}")
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(
            f"rl_kernel: tokens shape {tuple(tokens.shape)} must equal {name} shape without the "
            f"vocabulary dimension {tuple(logits.shape[:-1])}"
        )
    return tokens.long()


def check_token_range(tokens: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Raise on ids outside [0, vocab). Called after the kernel is queued, so the
    host waits once for both (the kernel itself writes NaN for such ids)."""
    if compiling() or tokens.device.type == "meta" or tokens.numel() == 0:
        return
    bad = (tokens != ignore_index) & ((tokens < 0) | (tokens >= vocab))
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"rl_kernel: token id {int(tokens[first])} at index {first} is outside the vocabulary "
            f"[0, {vocab}) and is not ignore_index={ignore_index}"
        )


def clamped_groups(offs: torch.Tensor, total: int) -> tuple[list[tuple[int, int]], bool]:
    """[(start, end)] of each group of a grouped GEMM from aten's offs (each group's end, cumulative; one host read)
    as the fast tier's kernels take them (ends clamped into [0, total], a decreasing end an empty group), and whether
    offs were bad (not non-decreasing ends within [0, total])."""
    bounds, start, bad = [], 0, False
    for end in (int(e) for e in offs.tolist()):
        bad = bad or end < start or end > total
        clamped = max(start, min(end, total))
        bounds.append((start, clamped))
        start = clamped
    return bounds, bad


def group_bounds(offs: torch.Tensor, groups: int, total: int, what: str, where: str) -> list[tuple[int, int]]:
    """clamped_groups' bounds, or a ValueError naming `where` unless there are `groups` non-decreasing ends within
    `total` `what`."""
    bounds, bad = clamped_groups(offs, total)
    if bad or len(bounds) != groups:
        ends = offs.tolist()
        raise ValueError(f"{where} with offs {ends[:8]}{'...' if len(ends) > 8 else ''}: {groups} non-decreasing "
                         f"group ends within the {total} {what} are needed")  # fmt: skip
    return bounds
