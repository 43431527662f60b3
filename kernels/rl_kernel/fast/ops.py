"""The fast tier's operators (rl_kernel.fast's public functions, found there on first use): argument checks, the
decode step's plans, then the Triton kernels of decoder/."""

from __future__ import annotations

import torch

from rl_kernel.fast import NAME
from rl_kernel.fast.decoder import attention as attention_kernels
from rl_kernel.fast.decoder import group as group_kernels
from rl_kernel.fast.decoder import grouped as grouped_kernels
from rl_kernel.fast.decoder import linear as linear_kernels
from rl_kernel.fast.decoder import plan as plans
from rl_kernel.fast.decoder.norm import rms_norm
from rl_kernel.triton_tier import check_tensors, require_triton


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) in the fast tier: y = x W^T (+ bias after the K loop, in fp32), fp32
    accumulation on the matrix cores, rounded once to x's dtype. x [..., K], weight [N, K], bias [N].
    A row of y has the same bits at every batch size; the backward (dX, dW, db) is deterministic."""
    planned = plans.run(x, (weight,), (bias,))  # a layout checked and launched before, no gradient (a decode step)
    if planned is not None:
        return planned[0]
    check_tensors(NAME, "linear", x=x, weight=weight, bias=bias)
    require_triton(NAME)
    return linear_kernels.linear(x, weight, bias)


def linear_group(
    x: torch.Tensor, weights: tuple[torch.Tensor, ...], biases: tuple[torch.Tensor | None, ...]
) -> tuple[torch.Tensor, ...]:
    """(linear(x, w, b) for each weight and bias) with their bits, in one launch for two or three where no gradient
    can flow: an attention's q/k/v or an MLP's gate/up projections at a decode step. The group form of `linear`
    (linear.group): a patched model takes it only from the linear it would call (a control's linear has none, and
    its modules call it once each)."""
    planned = plans.run(x, weights, biases)
    if planned is not None:
        return planned
    check_tensors(NAME, "linear", x=x, **{f"weight{i}": w for i, w in enumerate(weights)},
                  **{f"bias{i}": b for i, b in enumerate(biases)})  # fmt: skip
    require_triton(NAME)
    return group_kernels.linear_group(x, weights, biases)


linear_group.launches_once = group_kernels.launches_once  # no group is made for nothing (configs.toml)
linear.group = linear_group


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] (+ bias [N]) for rl_kernel.mode: the fast linear's forward, dX or dW kernel, chosen by the
    operands' layouts (linear_kernels.mm_form), so the products autograd makes of F.linear have fast.linear's bits.
    No autograd of its own (the mode serves it below autograd)."""
    check_tensors(NAME, "mm", a=a, b=b, bias=bias)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"rl_kernel.fast.mm: a [M, K] @ b [K, N], got {tuple(a.shape)} @ {tuple(b.shape)}")
    if bias is not None and tuple(bias.shape) != (b.shape[1],):
        raise ValueError(f"rl_kernel.fast.mm: bias must be [{b.shape[1]}], got {tuple(bias.shape)}")
    require_triton(NAME)
    return linear_kernels.mm(a, b, bias)


def grouped_mm(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, *, validate: bool = True,
    flag: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """A mixture of experts' grouped GEMM in one launch (grouped_kernels), aten::_grouped_mm's three forms:
    - a [S, K] tokens sorted by expert, b [E, K, N], offs [E] (each expert's end row): out[rows of g] = a[rows of g]
      @ b[g], each row the bits of rl_kernel.fast.mm of its expert's rows (the experts' forward and dX);
    - a [M, S], b [S, N], offs [E] (each expert's end token): out [E, M, N], out[g] = a[:, tokens of g] @ b[tokens
      of g], the fast dW's order over each expert's tokens (their dW);
    - a [B, M, K], b [B, K, N], no offs: out[i] = a[i] @ b[i], each the bits of fast.mm(a[i], b[i]) (aten::bmm).
    validate=True checks offs first (a host read: a sync; a ValueError naming the problem). validate=False reads
    nothing on the host: the kernels find the groups on the device, safe for any offs (ends clamped into range, a
    decreasing end an empty group), and set flag (int32 [1] on a's device, if given) to 1 where offs are bad.
    No autograd of its own (the mode serves it below autograd: aten's formulas differentiate it)."""
    check_tensors(NAME, "grouped_mm", a=a, b=b)
    two = a.dim() == 2 and offs is not None and offs.dim() == 1
    rows = two and b.dim() == 3 and a.shape[1] == b.shape[1] and offs.shape[0] == b.shape[0]
    tokens = two and b.dim() == 2 and a.shape[1] == b.shape[0]
    batched = offs is None and a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]
    if not (rows or tokens or batched):
        raise ValueError(f"rl_kernel.fast.grouped_mm: a [S, K], b [E, K, N] and offs [E], or a [M, S], b [S, N] and "
                         f"offs [E], or a [B, M, K] and b [B, K, N] without offs, got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {None if offs is None else tuple(offs.shape)}")  # fmt: skip
    if offs is not None and (offs.device != a.device or offs.dtype.is_floating_point or offs.dtype == torch.bool):
        raise ValueError(f"rl_kernel.fast.grouped_mm: offs must be integers on {a.device}, got {offs.dtype} on "
                         f"{offs.device}")  # fmt: skip
    require_triton(NAME)
    if batched:
        return grouped_kernels.batched_mm(a, b)
    grouped = grouped_kernels.grouped_mm if rows else grouped_kernels.grouped_dw
    return grouped(a, b, offs, validate, flag)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_start: torch.Tensor,
    scale: float | None = None,
    *,
    validate: bool = True,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal GQA attention, rl_kernel.exact.attention's semantics: q [B, Hq, Tq, D]; k, v [B, Hkv, Tk, D]
    (the cache); q_pos [B, Tq] the absolute key index of each query row; k_start [B] the first valid key.
    Row t sees keys k_start[b] .. q_pos[b, t]; a row with q_pos < k_start outputs +0.0. Keys are tiled from
    k_start[b] with one fixed tile per (target, head dim): a row's bits do not depend on the batch, Tq, its
    tile neighbours or the cache's fill. window > 0: a sliding window, row t seeing keys max(k_start[b], q_pos[b, t] -
    window + 1) .. q_pos[b, t], its tiles counted from that first key (one query position per block).
    validate=True checks the key ranges (a host sync). sinks [Hq]: a logit per query head that joins each row's
    softmax first, with a zero value (GPT-OSS)."""
    if not validate and not window and sinks is None:  # a layout checked and launched before, no gradient: its plan
        planned = plans.run_attention(q, k, v, q_pos, k_start, scale)
        if planned is not None:
            return planned
    check_tensors(NAME, "attention", q=q, k=k, v=v, q_pos=q_pos, k_start=k_start)
    require_triton(NAME)
    return attention_kernels.attention(q, k, v, q_pos, k_start, scale, validate=validate, window=window, sinks=sinks)


__all__ = [
    "attention",
    "attention_kernels",
    "group_kernels",
    "grouped_kernels",
    "grouped_mm",
    "linear",
    "linear_group",
    "linear_kernels",
    "mm",
    "rms_norm",
]
