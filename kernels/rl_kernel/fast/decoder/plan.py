"""Plans: a decode step's linear (or group of linears) launched again with none of the host's per-call work.

A decode step calls every linear of the model with operands whose layouts repeat step after step. The first call
of a layout runs every check, picks its config and launches through Triton (or the kept launch); where no gradient
can flow and the operands are contiguous, it also keeps the launch's Replay under the operands' layouts. A later
call whose operands have the same layouts (shape, strides, dtype, device, the current GPU) and 16-byte aligned
pointers takes that Replay: the same compiled kernel, grid and arguments as the first call would have taken again,
so the same bits, for a fraction of the host time (bench launch_cost). The layouts imply everything the skipped
checks and config read: the configs are pinned per process (fast.configs, like config_for's cache).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_kernel._validate import needs_autograd
from rl_kernel.triton_tier import Replay

# (x, weights, biases, outputs) -> the tensor arguments of the launch, in the kernel's order
Operands = Callable[[torch.Tensor, tuple, tuple, tuple], tuple[torch.Tensor, ...]]
_PLANS: dict[tuple, tuple[Replay, tuple[int, ...], Operands]] = {}
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


def keep(plan_key: tuple, replay: Replay | None, widths: tuple[int, ...], operands: Operands) -> None:
    """Keep a call's Replay (None: its launch cannot be replayed) under its key; `widths`: each output's last
    dimension; `operands`: how the kernel takes x, the weights, the biases and the outputs."""
    if replay is None:
        return
    if len(_PLANS) >= _KEPT:
        _PLANS.clear()
    _PLANS[plan_key] = (replay, widths, operands)


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


def clear() -> None:
    """Forget every plan (a test that changes the pinned configs in-process)."""
    _PLANS.clear()
