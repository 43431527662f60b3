"""Plans: a decode step's linear (or group of linears) and attention launched again with none of the host's
per-call work.

A decode step calls every linear of the model with operands whose layouts repeat step after step. The first call
of a layout runs every check, picks its config and launches through Triton (or the kept launch); where no gradient
can flow and the operands are contiguous, it also keeps the launch's Replay under the operands' layouts. A later
call whose operands have the same layouts (shape, strides, dtype, device, the current GPU) and 16-byte aligned
pointers takes that Replay: the same compiled kernel, grid and arguments as the first call would have taken again,
so the same bits, for a fraction of the host time (bench launch_cost). The layouts imply everything the skipped
checks and config read: the configs are pinned per process (fast.configs, like config_for's cache).

A decode step's attention reads a cache that grows by a key every step: its key count and the cache's strides over
batch and head change, so its plan is keyed by every other layout and those five ints' classes (what Triton
specializes an int on: triton_tier.int_class), and takes the ints themselves anew (triton_tier.Replay.taking).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_kernel._validate import needs_autograd
from rl_kernel.triton_tier import Replay, int_class

# (x, weights, biases, outputs) -> the tensor arguments of the launch, in the kernel's order
Operands = Callable[[torch.Tensor, tuple, tuple, tuple], tuple[torch.Tensor, ...]]
_PLANS: dict[tuple, tuple] = {}  # key -> (Replay, widths, Operands) for a linear, (Replay, operands) for attention
_KEPT = 1024  # plans before the table starts over (a decode step's layouts are a few dozen)


def _layout(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _key(x: torch.Tensor, weights: tuple, biases: tuple) -> tuple:
    gpu = torch.cuda.current_device() if x.is_cuda else -1
    return gpu, _layout(x), tuple(map(_layout, weights)), tuple(map(_layout, biases))


def key(x: torch.Tensor, weights: tuple, biases: tuple) -> tuple | None:
    """The plan's key of these operands, or None where no plan may be kept for them (an operand not contiguous:
    the launch reads a contiguous copy, not the tensor a later call would give)."""
    if not all(t is None or t.is_contiguous() for t in (x, *weights, *biases)):
        return None
    return _key(x, weights, biases)


def _store(plan_key: tuple, kept: tuple) -> None:
    if len(_PLANS) >= _KEPT:
        _PLANS.clear()
    _PLANS[plan_key] = kept


def keep(plan_key: tuple, replay: Replay | None, widths: tuple[int, ...], operands: Operands) -> None:
    """Keep a call's Replay (None: its launch cannot be replayed) under its key; `widths`: each output's last
    dimension; `operands`: how the kernel takes x, the weights, the biases and the outputs."""
    if replay is not None:
        _store(plan_key, (replay, widths, operands))


def run(x: torch.Tensor, weights: tuple, biases: tuple) -> tuple[torch.Tensor, ...] | None:
    """(linear(x, w, b) for each weight and bias) through the plan kept for these operands' layouts, or None where
    there is none, a gradient can flow or a pointer is not 16-byte aligned (the caller then takes its full path)."""
    try:
        if needs_autograd(x, *weights, *biases):
            return None
        kept = _PLANS.get(_key(x, weights, biases))
    except AttributeError:  # not tensors: the full path's checks name them
        return None
    if kept is None:
        return None
    replay, widths, operands = kept
    outs = tuple(x.new_empty((*x.shape[:-1], n)) for n in widths)
    return outs if replay(*operands(x, weights, biases, outs)) else None


# ---- attention -------------------------------------------------------------------------------------------
def cache_ints(k: torch.Tensor, v: torch.Tensor) -> tuple[int, ...]:
    """The ints a decode step's growing cache changes: the key count and k's and v's strides over batch and head."""
    return k.shape[2], k.stride(0), k.stride(1), v.stride(0), v.stride(1)


def _cache_layout(t: torch.Tensor) -> tuple:
    """A KV cache's layout but its key count (dim 2) and its strides over batch and head: a decode step's cache."""
    return t.shape[0], t.shape[1], t.shape[3], t.stride(2), t.stride(3), t.dtype, t.device


def attention_key(q, k, v, q_pos, k_start, scale: float, ints: tuple[int, ...] | None = None) -> tuple | None:
    """The plan's key of a forward attention call (scale: the one the kernel takes; ints: cache_ints(k, v) where
    the caller has them), or None where no plan may be kept for it (an operand not contiguous)."""
    if not all(t.is_contiguous() for t in (q, k, v, q_pos, k_start)):
        return None
    gpu = torch.cuda.current_device() if q.is_cuda else -1
    classes = tuple(map(int_class, cache_ints(k, v) if ints is None else ints))
    layouts = _layout(q), _cache_layout(k), _cache_layout(v), _layout(q_pos), _layout(k_start)
    return "attention", gpu, *layouts, scale, classes


def keep_attention(plan_key: tuple, replay: Replay, operands: Callable) -> None:
    """Keep an attention call's Replay (taking cache_ints(k, v) anew); `operands(q, k, v, q_pos, k_start, out, lse)`:
    the kernel's tensor arguments in its order."""
    _store(plan_key, (replay, operands))


def run_attention(q, k, v, q_pos, k_start, scale: float | None) -> torch.Tensor | None:
    """The attention's output through the plan kept for these operands' layouts, or None where there is none, a
    gradient can flow, k and v differ in key count, an operand is not contiguous, a pointer is not 16-byte aligned
    or a key count or stride is not of its kept class (the caller then takes its full path)."""
    try:
        if needs_autograd(q, k, v) or v.shape[2] != k.shape[2]:
            return None
        ints = cache_ints(k, v)
        s = q.shape[-1] ** -0.5 if scale is None else float(scale)
        plan_key = attention_key(q, k, v, q_pos, k_start, s, ints)
    except (AttributeError, IndexError, TypeError, ValueError):  # not tensors, not 4-D: the full path names them
        return None
    kept = None if plan_key is None else _PLANS.get(plan_key)
    if kept is None:
        return None
    replay, operands = kept
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)
    return out if replay(*operands(q, k, v, q_pos, k_start, out, lse), ints=ints) else None


def clear() -> None:
    """Forget every plan (a test that changes the pinned configs in-process)."""
    _PLANS.clear()
