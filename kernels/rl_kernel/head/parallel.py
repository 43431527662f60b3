"""Vocab-parallel token log-probs and entropy that give the single-device bits.

The drop-in for a vocab-parallel cross-entropy (Megatron's ``vocab_parallel_cross_entropy``): each rank
holds a contiguous slice of the vocabulary, ``local_logits[..., W]`` = columns ``[vocab_start,
vocab_start + W)`` of the full logits, and every rank gets the log-probs (or entropy) of the whole row,
bit for bit those of ``rl_kernel.token_logprobs`` / ``rl_kernel.entropy`` on one device::

    # Megatron: loss = vocab_parallel_cross_entropy(logits, target)   (logits: this rank's slice)
    logp = rl_kernel.head.parallel.token_logprobs(logits, target, tp_group,
                                             vocab_start=rank * logits.shape[-1], vocab_size=V)

Why it is exact: the contract's row reduction is one binary tree over the row's chunks of 8 elements
(docs/numerics.md section 2), and each node covers an aligned range. A rank computes the maximal nodes
inside its slice (at most about 2 log2(V/8) of them), the ranks all-gather those node values (the
bytes exchanged per row do not grow with the vocabulary, and never the logits), and every rank joins
the same nodes in the same tree. No SUM all-reduce, whose order changes with rank count, algorithm and
message size, is used: only all-gather, which copies bytes.

Slices must start on a multiple of 8 columns and end on one (or at/after ``vocab_size``), tile
``[0, vocab_size)`` in any order of ranks, and may be unequal. Columns at global index >= vocab_size are
padding whatever they hold: ignored, zero gradient. Each rank's gradient is exactly its slice of the
single-device gradient. gloo (CPU) and NCCL/RCCL (GPU) both work; ``group=None`` is the default group,
and without torch.distributed initialised a single rank holds the whole vocabulary.

``sum_allreduce_token_logprobs`` is the Megatron-style construction (a max and a SUM all-reduce of
stock PyTorch exps), kept as an informational control: it shows what such a path changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from rl_kernel._library import ops
from rl_kernel._validate import check_logits, check_token_range, check_tokens
from rl_kernel.head import vocab_parallel
from rl_kernel.head.rowtree import (
    CHUNK,
    IGNORE,
    Slice,
    all_gather_exchange,
    check_layout,
    check_on_one_device,
    exchanged_stats,
    join_entropy,
    join_stats,
    join_token_logprobs,
    layout,
    local_entropy,
    local_stats,
    local_token_logprobs,
    local_tokens,
    named,
    ordered,
    padded,
    world,
)

__all__ = [
    "CHUNK",
    "Slice",
    "check_layout",
    "entropy",
    "layout",
    "lm_head_logprobs",
    "megatron_widths",
    "rank_order_token_logprobs",
    "simulate",
    "simulate_entropy",
    "simulate_rank_order_token_logprobs",
    "simulate_stats",
    "simulate_token_logprobs",
    "sum_allreduce_token_logprobs",
    "token_logprobs",
]


# ---- autograd -----------------------------------------------------------------------------------
class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, tokens, slices, me, exchange, ignore_index):
        stats = exchanged_stats(local, slices, me, exchange)
        mine = local_token_logprobs(local, tokens, stats, slices[me])
        out = join_token_logprobs(exchange(mine.contiguous()), tokens, slices, ignore_index)
        ctx.save_for_backward(local, local_tokens(tokens, slices[me], local.shape[-1], ignore_index), stats)
        ctx.valid, ctx.ignore_index = slices[me].valid, ignore_index
        return out

    @staticmethod
    def backward(ctx, grad):
        local, tok, stats = ctx.saved_tensors
        gin = ops.token_logprobs_backward_slice(grad.contiguous(), local, tok, stats, ctx.ignore_index, ctx.valid)
        return gin, None, None, None, None, None


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, slices, me, exchange):
        stats = exchanged_stats(local, slices, me, exchange)
        h = join_entropy(exchange(padded(local_entropy(local, stats, slices[me]), slices, -1)), stats, slices)
        ctx.save_for_backward(local, stats, h)
        ctx.valid = slices[me].valid
        return h

    @staticmethod
    def backward(ctx, grad):
        local, stats, h = ctx.saved_tensors
        return ops.entropy_backward_slice(grad.contiguous(), local, stats, h, ctx.valid), None, None, None


def token_logprobs(
    local_logits: torch.Tensor,
    tokens: torch.Tensor,
    group=None,
    *,
    vocab_start: int,
    vocab_size: int,
    ignore_index: int = IGNORE,
    validate: bool = True,
) -> torch.Tensor:
    """log p(tokens) [...] in fp32 from this rank's vocabulary slice local_logits [..., W]; every rank gets
    the whole result, bit for bit rl_kernel.token_logprobs of the full logits. tokens are global ids (the
    same on every rank). Differentiable: the gradient is this rank's slice of the single-device one."""
    check_logits(local_logits, "local_logits")
    tokens = check_tokens(local_logits, tokens, "local_logits")
    slices, me = layout(local_logits, vocab_start, vocab_size, group)
    if validate:
        check_token_range(tokens, vocab_size, ignore_index)
    return _TokenLogprobs.apply(local_logits, tokens, slices, me, all_gather_exchange(group), int(ignore_index))


def entropy(local_logits: torch.Tensor, group=None, *, vocab_start: int, vocab_size: int) -> torch.Tensor:
    """Entropy [...] of the whole row from this rank's slice, bit for bit rl_kernel.entropy; differentiable."""
    check_logits(local_logits, "local_logits")
    slices, me = layout(local_logits, vocab_start, vocab_size, group)
    return _Entropy.apply(local_logits, slices, me, all_gather_exchange(group))


def lm_head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, group=None, **kw):
    """The fused LM head (rl_kernel.lm_head_logprobs) over a vocab-parallel lm_head: this rank holds rows
    [vocab_start, vocab_start + W) of the weight (keywords vocab_start, vocab_size; the others as
    lm_head_logprobs). hidden is the replicated activations. Every rank gets the log-probs (and entropy) of the
    whole vocabulary, bit for bit the single-device fused head's; this rank's dWeight/dBias are exactly its rows
    of the single-device ones. dHidden is complete on every rank (each rank's fp32 partial all-gathered and
    added in column order: never a SUM all-reduce; do not all-reduce it again): deterministic and the same on
    every rank, but summed by rank, so its last bits depend on the layout (docs/numerics.md 12.3)."""
    return vocab_parallel(hidden, weight, tokens, group, **kw)


# ---- one process: every rank's kernel on its slice, the exchange a concatenation ------------------
def simulate(
    logits: torch.Tensor, widths: Sequence[int], vocab_size: int | None = None
) -> tuple[list[torch.Tensor], list[Slice]]:
    """The full logits [..., V'] cut into slices of the given widths (in column order), as views: for
    checking the construction on one device (each slice's kernels, then a byte-copy exchange)."""
    vocab = logits.shape[-1] if vocab_size is None else vocab_size
    if sum(widths) != logits.shape[-1]:
        raise ValueError(
            f"rl_kernel.head.parallel.simulate: widths sum to {sum(widths)}, logits have {logits.shape[-1]}"
        )
    starts = [sum(widths[:k]) for k in range(len(widths))]
    slices = [Slice(s, w, vocab) for s, w in zip(starts, widths, strict=True)]
    check_layout(slices)
    return [logits[..., s : s + w] for s, w in zip(starts, widths, strict=True)], slices


def simulate_token_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    widths: Sequence[int],
    vocab_size: int | None = None,
    ignore_index: int = IGNORE,
) -> torch.Tensor:
    """Every rank's kernels on its slice of logits, in one process; the exchange is a concatenation."""
    return _simulated_token_logprobs(logits, tokens, widths, vocab_size, ignore_index, rank_order=False)


def _simulated_token_logprobs(logits, tokens, widths, vocab_size, ignore_index, rank_order: bool) -> torch.Tensor:
    check_logits(logits)
    tokens = check_tokens(logits, tokens)
    locals_, slices = simulate(logits, widths, vocab_size)
    stats = simulate_stats(logits, widths, vocab_size, rank_order=rank_order)
    parts = [local_token_logprobs(x, tokens, stats, s) for x, s in zip(locals_, slices, strict=True)]
    return join_token_logprobs(parts, tokens, slices, ignore_index)


def megatron_widths(vocab: int, tp: int) -> list[int]:
    """The cut a trainer makes: ceil(vocab / tp) rounded up to a multiple of 8 per rank, the last rank
    the rest (so slices are unequal unless tp * 8 divides vocab)."""
    per = -(-vocab // tp)  # ceil
    per = -(-per // CHUNK) * CHUNK
    widths = [per] * (tp - 1) + [vocab - per * (tp - 1)]
    if tp < 1 or widths[-1] < 1:
        raise ValueError(
            f"rl_kernel.head.parallel: a vocabulary of {vocab} cannot be cut into {tp} slices of 8-column chunks"
        )
    return widths


def simulate_stats(
    logits: torch.Tensor, widths: Sequence[int], vocab_size: int | None = None, rank_order: bool = False
) -> torch.Tensor:
    """The row statistics from slices of logits in one process; rank_order=True is the negative control (each
    slice reduced as a row of its own, the slices then merged in rank order)."""
    check_logits(logits)
    locals_, slices = simulate(logits, widths, vocab_size)
    if rank_order:
        return rank_order_stats([_whole_slice_stats(x, s) for x, s in zip(locals_, slices, strict=True)])
    return join_stats([local_stats(x, s) for x, s in zip(locals_, slices, strict=True)], slices)


def _whole_slice_stats(local: torch.Tensor, own: Slice) -> torch.Tensor:
    """(m, s) [..., 1, 2] of a slice reduced as a row of its own (the rank-order control's partial)."""
    return ops.node_stats(local, 0, own.valid, [max(0, (-(-own.valid // CHUNK) - 1).bit_length())], [0])


def simulate_entropy(logits: torch.Tensor, widths: Sequence[int], vocab_size: int | None = None) -> torch.Tensor:
    """The entropy of the whole row from slices of logits, in one process."""
    check_logits(logits)
    locals_, slices = simulate(logits, widths, vocab_size)
    stats = simulate_stats(logits, widths, vocab_size)
    return join_entropy([local_entropy(x, stats, s) for x, s in zip(locals_, slices, strict=True)], stats, slices)


# ---- informational and negative controls ----------------------------------------------------------
def sum_allreduce_token_logprobs(
    local_logits: torch.Tensor, tokens: torch.Tensor, group=None, *, vocab_start: int, vocab_size: int
) -> torch.Tensor:
    """The Megatron-style construction, as information only: a MAX all-reduce of the local maxima, a SUM
    all-reduce of stock torch sums of exp, x[token] all-reduced by SUM; log p = x - max - log(sum). The SUM
    all-reduce's order depends on rank count, algorithm and message size: it does not give rl_kernel's bits."""
    check_logits(local_logits, "local_logits")
    tokens = check_tokens(local_logits, tokens, "local_logits")
    slices, me = layout(local_logits, vocab_start, vocab_size, group)
    own = slices[me]
    x = local_logits.float()
    col = torch.arange(x.shape[-1], device=x.device)
    x = torch.where(col < own.valid, x, torch.full_like(x, float("-inf")))
    m = x.max(dim=-1).values
    picked = x.gather(-1, (tokens - own.start).clamp(0, x.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    picked = torch.where(own.owns(tokens), picked, torch.zeros_like(picked))
    distributed = world(group)[1] > 1
    if distributed:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    s = torch.exp(x - m.unsqueeze(-1)).sum(dim=-1)
    if distributed:
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
        dist.all_reduce(picked, op=dist.ReduceOp.SUM, group=group)
    return torch.where(tokens == IGNORE, torch.zeros_like(picked), (picked - m) - torch.log(s))


def rank_order_stats(parts_whole: Sequence[torch.Tensor]) -> torch.Tensor:
    """Wrong on purpose (a negative control): each rank's slice reduced as a row of its own, the ranks'
    (m, s) then joined in rank order. parts_whole[k] is [..., 1, 2]. Differs from the row's tree wherever a
    rank boundary is not a boundary of the tree's top nodes."""
    check_on_one_device(named("parts_whole", parts_whole), parts_whole=torch.float32)
    values = torch.cat(list(parts_whole), dim=-2)
    n = values.shape[-2]
    return ops.join_stats(values, [0] * n, [2 * k for k in range(n)])  # no two are siblings: a fold


def rank_order_token_logprobs(
    local_logits: torch.Tensor,
    tokens: torch.Tensor,
    group=None,
    *,
    vocab_start: int,
    vocab_size: int,
    ignore_index: int = IGNORE,
) -> torch.Tensor:
    """The negative control over torch.distributed: each rank's slice reduced as a row of its own and the
    ranks' statistics merged in rank order. Its values are wrong; its gradient is token_logprobs' (so a
    training step runs), which keeps the control to the one property it breaks."""
    right = token_logprobs(
        local_logits, tokens, group, vocab_start=vocab_start, vocab_size=vocab_size, ignore_index=ignore_index
    )
    slices, me = layout(local_logits, vocab_start, vocab_size, group)
    exchange = all_gather_exchange(group)
    with torch.no_grad():
        parts = exchange(_whole_slice_stats(local_logits.detach(), slices[me]))
        stats = rank_order_stats([parts[k] for k in ordered(slices)])
        mine = local_token_logprobs(local_logits.detach(), tokens, stats, slices[me])
        wrong = join_token_logprobs(exchange(mine.contiguous()), tokens, slices, ignore_index)
    return right + (wrong - right).detach()


def simulate_rank_order_token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, widths: Sequence[int], ignore_index: int = IGNORE
) -> torch.Tensor:
    """The rank-order merge of per-rank sums in one process (the negative control of the split)."""
    return _simulated_token_logprobs(logits, tokens, widths, None, ignore_index, rank_order=True)
