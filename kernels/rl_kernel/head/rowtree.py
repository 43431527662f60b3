"""The row tree's primitives (docs/numerics.md section 2), as every cut of a row uses them.

The contract's row reduction is one binary tree over aligned 8-element chunks of the row, so a row cut into
column slices (vocab-parallel ranks, the fused head's vocabulary chunks) evaluates whole subtrees per slice and
joins the nodes afterwards with the uncut row's bits. This module holds that construction once: the layout
(`Slice`, `decompose`, `check_layout`, `layout`), a slice's maximal nodes (`local_*`), their exchange
(`all_gather_exchange`: an all-gather, a byte copy, never a SUM all-reduce) and the join (`join_*`).
rl_kernel.head.parallel (vocab-parallel ranks) and rl_kernel.head (the fused LM head) are built on it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rl_kernel._library import ops
from rl_kernel._validate import check_logits, check_same_device, check_tensor

CHUNK = 8  # elements per leaf of the row tree (docs/numerics.md section 2)
IGNORE = -100  # the ignore_index of every log-prob operator
_MIN_NORMAL = 2.0**-126
_NAN_BITS = {torch.float32: (0x7FC00000, torch.int32), torch.bfloat16: (0x7FC0, torch.int16),
             torch.float16: (0x7E00, torch.int16)}  # fmt: skip


@functools.cache
def canonical_nan(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The contract's canonical NaN, a 0-dim tensor of dtype on device, made once per (dtype, device): a CPU
    constant moved to a GPU at every call is a host synchronisation each time (the fused head had three per call)."""
    bits, as_int = _NAN_BITS[dtype]
    return torch.tensor(bits, dtype=as_int, device=device).view(dtype)


# exchange(t) -> [t of rank 0, t of rank 1, ...]: all-gather of equal-shaped tensors.
Exchange = Callable[[torch.Tensor], list[torch.Tensor]]


# ---- the layout: who holds which columns -----------------------------------------------------------
def decompose(c0: int, c1: int) -> list[tuple[int, int]]:
    """The maximal aligned nodes (level L, index i) of chunks [c0, c1), left to right; node (L, i) covers
    chunks [i * 2^L, (i + 1) * 2^L)."""
    if not 0 <= c0 <= c1:
        raise ValueError(f"rl_kernel.head.parallel: bad chunk range [{c0}, {c1})")
    nodes = []
    c = c0
    while c < c1:
        level = (c & -c).bit_length() - 1 if c else 40
        while (1 << level) > c1 - c:
            level -= 1
        nodes.append((level, c >> level))
        c += 1 << level
    return nodes


@dataclass(frozen=True)
class Slice:
    """One rank's columns: [start, start + width) of a vocabulary of vocab_size (padding past it)."""

    start: int
    width: int
    vocab_size: int

    @property
    def valid(self) -> int:
        """Columns of the true vocabulary this rank holds."""
        return max(0, min(self.width, self.vocab_size - self.start))

    @property
    def chunk0(self) -> int:
        return self.start // CHUNK

    @property
    def nodes(self) -> list[tuple[int, int]]:
        return decompose(self.chunk0, self.chunk0 + -(-self.valid // CHUNK))

    def owns(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens >= self.start) & (tokens < self.start + self.valid)


def check_layout(slices: Sequence[Slice]) -> None:
    """Slices tile [0, vocab_size) on chunk boundaries; raise ValueError naming the first that does not."""
    if not slices:
        raise ValueError("rl_kernel.head.parallel: no slices")
    vocab = slices[0].vocab_size
    if vocab < 1 or any(s.vocab_size != vocab for s in slices):
        raise ValueError(
            f"rl_kernel.head.parallel: vocab_size differs between ranks or is < 1: {[s.vocab_size for s in slices]}"
        )
    at = 0
    for rank, s in sorted(enumerate(slices), key=lambda rs: rs[1].start):
        end = s.start + s.width
        if s.width < 1:
            raise ValueError(f"rl_kernel.head.parallel: rank {rank} holds no columns")
        if s.start % CHUNK or (end % CHUNK and end < vocab):
            raise ValueError(
                f"rl_kernel.head.parallel: rank {rank} holds columns [{s.start}, {end}): a slice must start and end "
                f"on a multiple of {CHUNK} (or end at/after vocab_size {vocab})"
            )
        if s.start != at:
            raise ValueError(
                f"rl_kernel.head.parallel: rank {rank} starts at column {s.start}, expected {at}: slices must tile "
                f"[0, {vocab}) without gaps or overlaps"
            )
        at = end
    if at < vocab:
        raise ValueError(f"rl_kernel.head.parallel: the slices end at column {at}, before vocab_size {vocab}")


def ordered(slices: Sequence[Slice]) -> list[int]:
    """The ranks in column order."""
    return sorted(range(len(slices)), key=lambda k: slices[k].start)


# ---- the construction: a rank's nodes, the exchange, the join ----------------------------------
def node_levels(own: Slice) -> tuple[list[int], list[int]]:
    return [lv for lv, _ in own.nodes], [ix for _, ix in own.nodes]


def local_stats(local: torch.Tensor, own: Slice, row_ops: Any = ops) -> torch.Tensor:
    """The statistics (m, s) [..., n, 2] of the maximal nodes of this rank's slice (row_ops: a tier's row
    operators, Tier.row_ops; the exact tier's by default)."""
    check_logits(local, "local")
    return row_ops.node_stats(local, own.chunk0, own.valid, *node_levels(own))


def local_entropy(local: torch.Tensor, stats: torch.Tensor, own: Slice, row_ops: Any = ops) -> torch.Tensor:
    """The entropy sums [..., n] of the maximal nodes of this rank's slice, given the row's statistics."""
    check_logits(local, "local")
    check_on_one_device({"local": local, "stats": stats}, stats=torch.float32)
    return row_ops.node_entropy(local, stats, own.chunk0, own.valid, *node_levels(own))


def local_token_logprobs(local: torch.Tensor, tokens: torch.Tensor, stats: torch.Tensor, own: Slice) -> torch.Tensor:
    """log p of the tokens this rank holds, +0.0 where another rank holds them."""
    check_logits(local, "local")
    check_on_one_device({"local": local, "tokens": tokens, "stats": stats}, stats=torch.float32)
    local_tok = (tokens - own.start).clamp(0, local.shape[-1] - 1)
    mine = logprob(local.gather(-1, local_tok.unsqueeze(-1)).squeeze(-1), stats)
    return torch.where(own.owns(tokens), mine, torch.zeros_like(mine))


def joined(parts: Sequence[torch.Tensor], slices: Sequence[Slice], node_dim: int):
    """Every rank's nodes, left to right: (values concatenated along node_dim, levels, indices)."""
    values, levels, indices = [], [], []
    for k in ordered(slices):
        lv, ix = node_levels(slices[k])
        values.append(parts[k].narrow(node_dim, 0, len(lv)))
        levels += lv
        indices += ix
    return torch.cat(values, dim=node_dim), levels, indices


def join_stats(parts: Sequence[torch.Tensor], slices: Sequence[Slice]) -> torch.Tensor:
    """The row statistics [..., 3] (those of rl_kernel.row_stats on the whole row) from every rank's nodes."""
    check_on_one_device(named("parts", parts), parts=torch.float32)
    return ops.join_stats(*joined(parts, slices, -2))


def join_entropy(
    parts: Sequence[torch.Tensor], stats: torch.Tensor, slices: Sequence[Slice], row_ops: Any = ops
) -> torch.Tensor:
    check_on_one_device({**named("parts", parts), "stats": stats}, parts=torch.float32, stats=torch.float32)
    values, levels, indices = joined(parts, slices, -1)
    return row_ops.join_sum(values, stats, levels, indices)


def join_token_logprobs(
    parts: Sequence[torch.Tensor], tokens: torch.Tensor, slices: Sequence[Slice], ignore_index: int = IGNORE
) -> torch.Tensor:
    """Each token's log-prob from the rank that holds it; NaN for an id outside [0, vocab_size) (as on one
    device with validate=False), +0.0 for ignore_index."""
    check_on_one_device({**named("parts", parts), "tokens": tokens}, parts=torch.float32)
    out = torch.zeros_like(parts[0])
    for k, s in enumerate(slices):
        out = torch.where(s.owns(tokens), parts[k], out)
    vocab = slices[0].vocab_size
    out = torch.where((tokens < 0) | (tokens >= vocab), canonical_nan(out.dtype, out.device), out)
    return torch.where(tokens == ignore_index, torch.zeros_like(out), out)


def named(name: str, parts: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{name}[{k}]": t for k, t in enumerate(parts)}


def check_on_one_device(tensors: dict[str, torch.Tensor], **dtypes: torch.dtype) -> None:
    """Every named tensor is a tensor (of dtypes[name], or dtypes[prefix] for "prefix[k]") on one device."""
    if not tensors:
        raise ValueError("rl_kernel.head.parallel: no tensors (an empty list of parts?)")
    for name, t in tensors.items():
        check_tensor(t, name, dtypes.get(name.split("[")[0]))
    check_same_device(tensors)


def logprob(x: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """The contract's log p = flush((x - m) - log_s), the canonical NaN for a bad row (s < 1)."""
    m, s, log_s = stats.unbind(-1)
    v = (x.float() - m) - log_s
    v = torch.where(v.abs() < _MIN_NORMAL, torch.zeros_like(v), v)
    return torch.where(s >= 1.0, v, canonical_nan(v.dtype, v.device))


def padded(part: torch.Tensor, slices: Sequence[Slice], node_dim: int) -> torch.Tensor:
    """part padded along node_dim to the most nodes any rank has (all-gather needs equal shapes)."""
    nmax = max(len(s.nodes) for s in slices)
    shape = list(part.shape)
    shape[node_dim] = nmax - part.shape[node_dim]
    return torch.cat([part, part.new_zeros(shape)], dim=node_dim).contiguous()


def exchanged_stats(local: torch.Tensor, slices: Sequence[Slice], me: int, exchange: Exchange) -> torch.Tensor:
    return join_stats(exchange(padded(local_stats(local, slices[me]), slices, -2)), slices)


def local_tokens(tokens: torch.Tensor, own: Slice, width: int, ignore_index: int) -> torch.Tensor:
    """Token ids as this slice's column indices; another rank's token becomes an index no column has."""
    elsewhere = width if ignore_index != width else width + 1
    local = torch.where(own.owns(tokens), tokens - own.start, torch.full_like(tokens, elsewhere))
    return torch.where(tokens == ignore_index, torch.full_like(tokens, ignore_index), local)


# ---- torch.distributed ------------------------------------------------------------------------
def world(group) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def all_gather_exchange(group=None) -> Exchange:
    """The exchange over torch.distributed: all_gather (a byte copy on gloo, NCCL and RCCL)."""

    def exchange(t: torch.Tensor) -> list[torch.Tensor]:
        _, size = world(group)
        if size == 1:
            return [t]
        out = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(out, t.contiguous(), group=group)
        return out

    return exchange


def layout(local: torch.Tensor, vocab_start: int, vocab_size: int, group=None) -> tuple[list[Slice], int]:
    """Every rank's slice (all-gathered) and this rank's index in the group; checked by check_layout."""
    me, _ = world(group)
    mine = torch.tensor([int(vocab_start), int(local.shape[-1]), int(vocab_size)], dtype=torch.int64)
    rows = all_gather_exchange(group)(mine.to(local.device))
    slices = [Slice(*(int(v) for v in r.cpu().tolist())) for r in rows]
    check_layout(slices)
    return slices, me
