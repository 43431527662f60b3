"""A fused LM head: token log-probs (and entropy) straight from the hidden states, never the [tokens, vocab]
logits.

    logp = rl_kernel.lm_head_logprobs(hidden, lm_head.weight, tokens)                  # [...], fp32
    logp, ent = rl_kernel.lm_head_logprobs(hidden, weight, tokens, entropy=True, tier="fast")

What it computes, bit for bit: `unfused(...)` below, i.e. the tier's `linear` (rounded to the weight's dtype
as a model's lm_head rounds), divided by `temperature` as generate() divides them (cast to fp32, one correctly
rounded division per element: rl_kernel.exact.softmax.ops.divide_by_temperature), then `token_logprobs` / `entropy`
over the first `vocab_size` columns. It walks the vocabulary in chunks of `vocab_chunk` columns (a multiple of 8),
one call's chunks of logits alive at a time (one chunk, or as many as the tier's HeadGemms.call_elements allows for
the rows: fewer launches, the same bits), so the extra memory is about 4 x tokens x a call's columns, whatever the
vocabulary.

Why the forward is exact: the contract's row reduction is one binary tree over aligned 8-column chunks (docs/
numerics.md section 2), so a row cut into vocabulary chunks evaluates whole subtrees per chunk and joins the
nodes afterwards with the uncut row's bits: rl_kernel.head.rowtree's construction, with the chunks of one device in
place of ranks. Any chunk width gives the same log-probs and entropy. On one device the forward cuts the other
way (`_forward_rows`): blocks of whole rows, one GEMM over the vocabulary per block and the unfused row kernels on
it, the same bits with one GEMM pass where the walk needs two.

The backward (docs/numerics.md section 12): each chunk's logit gradient is exactly its slice of the unfused one
(token_logprobs_backward_slice / entropy_backward_slice), so dWeight and dBias are the unfused bits (each
element is one chain over the rows, as in `linear`'s backward). dHidden cannot be one chain over the whole
vocabulary without the whole gradient, so it is the sum of the chunks' fp32 partials (each the tier's dX
reduction over its columns, never rounded) in chunk order, rounded once: deterministic, batch invariant (a row
depends on its own row only) and, for the exact tier, the same on every device; its bits depend on
`vocab_chunk`, which is why that is a fixed argument and never chosen from the batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_kernel import tiers
from rl_kernel._validate import check_same_device, check_token_range, check_tokens
from rl_kernel.exact.softmax.ops import divide_by_temperature
from rl_kernel.head import rowtree
from rl_kernel.head.rowtree import IGNORE, Slice
from rl_kernel.tiers import HeadGemms

VOCAB_CHUNK = 2048  # columns per chunk: 1/74 of a 151936 vocabulary; dHidden's bits depend on it (fixed)
FORWARD_ELEMENTS = 1 << 28  # logits per row block of the one-device forward at most (512 MB in bf16)


# ---- the tier, resolved once per call ----------------------------------------------------------------
@dataclass(frozen=True)
class HeadTier:
    """A tier as the fused head uses it, resolved once per call (one HeadGemms) at the public function."""

    tier: tiers.Tier
    gemms: HeadGemms
    row_ops: Any  # Tier.row_ops

    @classmethod
    def of(cls, tier: str | tiers.Tier | HeadTier) -> HeadTier:
        if isinstance(tier, HeadTier):
            return tier
        t = tiers.resolve(tier)
        return cls(t, t.head_gemms(), t.row_ops())


# ---- the walk over vocabulary chunks ---------------------------------------------------------------
def _single(t: torch.Tensor) -> list[torch.Tensor]:
    return [t]


@dataclass(frozen=True)
class Plan:
    """What a call computes, and where: `ranks` are every rank's columns of the vocabulary (one rank, all of
    them, on one device), `me` this rank, `exchange` the all-gather between ranks (one device: none)."""

    tier: HeadTier = field(compare=False, repr=False)  # the call's tier: its GEMMs and row operators
    vocab_size: int
    chunk: int
    span: int  # columns per call of the walk: a multiple of chunk (HeadGemms.call_elements); no bit depends on it
    temperature: float | None
    ignore_index: int
    want_entropy: bool
    ranks: tuple[Slice, ...]
    me: int = 0
    exchange: rowtree.Exchange = field(default=_single, compare=False)

    @classmethod
    def of(cls, ht: HeadTier, vocab_size: int, chunk: int, ranks: tuple[Slice, ...], *, temperature: float | None,
           ignore_index: int, entropy: bool, me: int = 0, exchange: rowtree.Exchange = _single) -> Plan:  # fmt: skip
        """A call's plan: the call's tier (its GEMMs and row operators), the walk one chunk per call (_apply)."""
        return cls(ht, vocab_size, chunk, chunk, temperature, int(ignore_index), bool(entropy), tuple(ranks), me,
                   exchange)  # fmt: skip

    @property
    def rows(self) -> int:
        """The whole head's weight rows (its N: the fast tier's BLOCK_K is pinned per (N, K))."""
        return sum(r.width for r in self.ranks)

    def chunks(self, rank: int) -> list[Slice]:
        """A rank's columns in the walk's calls of `span` columns (global columns; the last may be narrower)."""
        own = self.ranks[rank]
        ends = range(own.start, own.start + own.width, self.span)
        return [Slice(s, min(self.span, own.start + own.width - s), self.vocab_size) for s in ends]

    def nodes(self, rank: int) -> tuple[list[int], list[int]]:
        """The (levels, indices) of a rank's chunks' maximal nodes, left to right."""
        found = [n for s in self.chunks(rank) for n in s.nodes]
        return [lv for lv, _ in found], [ix for _, ix in found]

    def ordered(self) -> list[int]:
        return sorted(range(len(self.ranks)), key=lambda k: self.ranks[k].start)


def _chunk_logits(g: HeadGemms, plan: Plan, h, weight, bias, s: Slice) -> torch.Tensor:
    """Chunk s's logits (divided by the temperature); weight/bias are this rank's rows."""
    at = s.start - plan.ranks[plan.me].start
    w = weight.narrow(0, at, s.width)
    b = None if bias is None else bias.narrow(0, at, s.width)
    z = g.logits(h, w, b, plan.rows)
    return z if plan.temperature is None else divide_by_temperature(z, plan.temperature)


def _joined(plan: Plan, mine: torch.Tensor, node_dim: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """Every rank's node values (this rank's: `mine`), exchanged and concatenated in column order, with their
    levels and indices."""
    counts = [len(plan.nodes(r)[0]) for r in range(len(plan.ranks))]
    shape = list(mine.shape)
    shape[node_dim] = max(counts) - mine.shape[node_dim]  # all-gather needs equal shapes
    parts = plan.exchange(torch.cat([mine, mine.new_zeros(shape)], dim=node_dim).contiguous())
    values, levels, indices = [], [], []
    for r in plan.ordered():
        values.append(parts[r].narrow(node_dim, 0, counts[r]))
        lv, ix = plan.nodes(r)
        levels += lv
        indices += ix
    return torch.cat(values, dim=node_dim), levels, indices


def _forward(plan: Plan, h, weight, bias, tokens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log-probs, the rows' statistics, entropy or None): whole rows in blocks on one device, else the walk."""
    if len(plan.ranks) == 1 and not _narrow():
        return _forward_rows(plan, h, weight, bias, tokens)
    return _forward_walk(plan, h, weight, bias, tokens)


def row_block(rows: int, cols: int, dtype: torch.dtype, temperature: float | None) -> int:
    """Rows per block of the one-device forward: its logits (and their fp32 copy under a temperature) at most a
    sixteenth of the whole logits' bytes (the head's promise is an eighth, dWeight and the backward's buffers
    included) and at most FORWARD_ELEMENTS, in whole 256-row tiles where 256 fit. No bit depends on it: a logit
    depends on its own row only, and the row kernels work row by row."""
    size = dtype.itemsize
    per_row = size + (4 if temperature is not None else 0)
    r = max(1, min(rows * size // (16 * per_row), FORWARD_ELEMENTS // max(1, cols)))
    return r - r % 256 if r >= 256 else r


def _forward_rows(plan: Plan, h, weight, bias, tokens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One GEMM over the whole vocabulary per block of rows, then the unfused path's row kernels on the block's
    logits (the entropy from token_logprobs' statistics): `unfused`'s bits by construction, with one pass of the
    GEMM where the walk needs two for the entropy (which wants the row's final statistics before it sums)."""
    g = plan.tier.gemms
    n = h.shape[0]
    logp = torch.empty(n, dtype=torch.float32, device=h.device)
    stats = torch.empty((n, 3), dtype=torch.float32, device=h.device)
    ent = torch.empty(n, dtype=torch.float32, device=h.device) if plan.want_entropy else None
    block = row_block(n, plan.rows, h.dtype, plan.temperature)
    for r0 in range(0, n, block):
        rows = slice(r0, min(n, r0 + block))
        z, logp[rows], stats[rows], e = whole_rows(g, plan, h[rows], weight, bias, tokens[rows])
        if ent is not None:
            ent[rows] = e
        del z
    return logp, stats, ent


def whole_rows(g: HeadGemms, plan: Plan, h, weight, bias, tokens) -> tuple[torch.Tensor, ...]:
    """(logits [rows, all weight rows], log-probs, statistics, entropy or None) of a block of whole rows: one GEMM
    over the vocabulary and the unfused row kernels on its first vocab_size columns."""
    z = _chunk_logits(g, plan, h, weight, bias, plan.ranks[0])
    zv = z[:, : plan.vocab_size]
    logp, stats = plan.tier.row_ops.token_logprobs(zv, tokens, plan.ignore_index)
    return z, logp, stats, _entropy_given(plan, zv, stats) if plan.want_entropy else None


def _entropy_given(plan: Plan, z: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """entropy(z) from the statistics token_logprobs gave for the same rows: the whole row's maximal nodes and
    their join (rowtree), the uncut row's bits without the entropy kernel's own pass for the statistics."""
    whole, row_ops = plan.ranks[0], plan.tier.row_ops
    return rowtree.join_entropy([rowtree.local_entropy(z, stats, whole, row_ops)], stats, [whole], row_ops)


def _forward_walk(plan: Plan, h, weight, bias, tokens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The vocabulary walk (numerics.md 12.3): every rank's chunks reduced to tree nodes, joined across chunks and
    ranks; the entropy recomputes each chunk's logits once the row's statistics are known."""
    g, row_ops = plan.tier.gemms, plan.tier.row_ops
    chunks = plan.chunks(plan.me)
    nodes, picked = [], torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
    for s in chunks:
        z = _chunk_logits(g, plan, h, weight, bias, s)
        nodes.append(rowtree.local_stats(z, s, row_ops))
        local = (tokens - s.start).clamp(0, s.width - 1)
        picked = torch.where(s.owns(tokens), z.gather(-1, local.unsqueeze(-1)).squeeze(-1).float(), picked)
    stats = row_ops.join_stats(*_joined(plan, torch.cat(nodes, dim=-2), -2))
    own = plan.ranks[plan.me]
    mine = torch.where(own.owns(tokens), rowtree.logprob(picked, stats), torch.zeros_like(picked))
    logp = rowtree.join_token_logprobs(plan.exchange(mine.contiguous()), tokens, plan.ranks, plan.ignore_index)
    ent = None
    if plan.want_entropy:
        parts = [rowtree.local_entropy(_chunk_logits(g, plan, h, weight, bias, s), stats, s, row_ops) for s in chunks]
        ent = row_ops.join_sum(*_with_stats(_joined(plan, torch.cat(parts, dim=-1), -1), stats))
    return logp, stats, ent


def _with_stats(joined: tuple, stats: torch.Tensor) -> tuple:
    values, levels, indices = joined
    return values, stats, levels, indices


def _backward(plan: Plan, saved, g_logp, g_ent, need: tuple[bool, bool, bool]):
    h, weight, bias, tokens, stats, ent = saved
    g = plan.tier.gemms
    dh = torch.zeros(h.shape, dtype=torch.float32, device=h.device) if need[0] else None
    # dWeight and dBias preallocated, each chunk's rows stored in place: no second copy of them at the end.
    dw = torch.empty_like(weight) if need[1] else None
    db = torch.empty_like(bias) if need[2] and bias is not None else None
    for s in plan.chunks(plan.me):
        at = s.start - plan.ranks[plan.me].start
        z = _chunk_logits(g, plan, h, weight, bias, s)
        d = logits_grad(plan, s, z, tokens, stats, ent, g_logp, g_ent, h.dtype)
        del z
        if dh is not None:
            add_dx(g, plan, d, weight.narrow(0, at, s.width), dh)
        if dw is not None:
            _dw_into(g, d, h, dw.narrow(0, at, s.width))
        if db is not None:
            db.narrow(0, at, s.width).copy_(g.db(d))
    return None if dh is None else round_to(_sum_ranks(plan, dh), h.dtype), dw, db


def _dw_into(g: HeadGemms, d: torch.Tensor, h: torch.Tensor, out: torch.Tensor) -> None:
    """A chunk's rows of dWeight stored into `out` (the tier's GEMM stores them there where it can)."""
    if g.dw_into is not None:
        g.dw_into(d, h, out)
    else:
        out.copy_(g.dw(d, h))


def logits_grad(plan: Plan, s: Slice, z, tokens, stats, ent, g_logp, g_ent, dtype: torch.dtype) -> torch.Tensor:
    """The gradient of chunk s's logits before the temperature (z: after it), in the model's dtype."""
    d = _logit_grad(plan, s, z, tokens, stats, ent, g_logp, g_ent)
    if d is None:
        d = torch.zeros(z.shape, dtype=z.dtype, device=z.device)
    if plan.temperature is not None:  # the backward of z.float() / temperature: / T, then rounded to the model's dtype
        d = (d / torch.full((), plan.temperature, dtype=torch.float32, device=d.device)).to(dtype)
    return d


def _logit_grad(plan: Plan, s: Slice, z, tokens, stats, ent, g_logp, g_ent) -> torch.Tensor | None:
    """The chunk's logit gradient: each used output's slice backward, summed as autograd sums the two uses of the
    logits (in one pass where the kernel's rounding is torch's add: fp32 and bf16, not fp16)."""
    tok = None if g_logp is None else rowtree.local_tokens(tokens, s, s.width, plan.ignore_index)
    row_ops = plan.tier.row_ops
    if g_logp is not None and g_ent is not None and z.dtype != torch.float16:
        return row_ops.logprobs_entropy_backward_slice(g_logp, g_ent, z, tok, stats, ent, plan.ignore_index, s.valid)
    d = None if g_logp is None else row_ops.token_logprobs_backward_slice(g_logp, z, tok, stats, plan.ignore_index,
                                                                          s.valid)  # fmt: skip
    if g_ent is not None:
        de = row_ops.entropy_backward_slice(g_ent, z, stats, ent, s.valid)
        d = de if d is None else d.add_(de)
    return d


_ONE_CHUNK_PER_CALL = threading.local()


@contextlib.contextmanager
def one_chunk_per_call() -> Iterator[None]:
    """The walk as numerics.md 12 states it, for checks of a tier's wider calls: one chunk per call."""
    before = getattr(_ONE_CHUNK_PER_CALL, "on", False)
    _ONE_CHUNK_PER_CALL.on = True
    try:
        yield
    finally:
        _ONE_CHUNK_PER_CALL.on = before


def _narrow() -> bool:
    return getattr(_ONE_CHUNK_PER_CALL, "on", False)


def add_dx(g: HeadGemms, plan: Plan, d: torch.Tensor, w: torch.Tensor, dh: torch.Tensor) -> None:
    """dh += the call's chunks' fp32 dX partials, left to right: `plan.chunk` columns is dHidden's grain whatever
    the call's width."""
    chunk = plan.chunk
    for at in range(0, d.shape[1], chunk):
        width = min(chunk, d.shape[1] - at)
        if g.dx_add is not None:
            g.dx_add(d.narrow(1, at, width), w.narrow(0, at, width), dh)
        else:
            dh += g.dx(d.narrow(1, at, width).contiguous(), w.narrow(0, at, width))


def span_of(g: HeadGemms, rows: int, chunk: int) -> int:
    """Columns per call of the walk: as many whole chunks as call_elements allows for `rows` (at least one)."""
    if not g.call_elements or _narrow():
        return chunk
    return chunk * max(1, g.call_elements // max(1, rows * chunk))


def _sum_ranks(plan: Plan, mine: torch.Tensor) -> torch.Tensor:
    """dHidden's fp32 partials of every rank (all-gathered, never a SUM all-reduce) added in column order."""
    if len(plan.ranks) == 1:
        return mine
    parts = plan.exchange(mine.contiguous())
    total = torch.zeros_like(mine)
    for r in plan.ordered():
        total += parts[r]
    return total


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 -> dtype, round to nearest even with the contract's canonical NaN (store_out)."""
    if dtype == torch.float32:
        return x
    y = x.to(dtype)
    return torch.where(torch.isnan(x), rowtree.canonical_nan(dtype, y.device), y)


class _Head(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, tokens, plan: Plan):
        logp, stats, ent = _forward(plan, h, weight, bias, tokens)
        ctx.set_materialize_grads(False)  # an unused output adds nothing to the logits' gradient
        ctx.save_for_backward(h, weight, bias, tokens, stats, ent)
        ctx.plan = plan
        return (logp, ent) if plan.want_entropy else logp

    @staticmethod
    def backward(ctx, g_logp, g_ent=None):
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        g_logp = None if g_logp is None else g_logp.contiguous()
        g_ent = None if g_ent is None else g_ent.contiguous()
        dh, dw, db = _backward(ctx.plan, ctx.saved_tensors, g_logp, g_ent, need)
        return dh, dw, db, None, None


# ---- the public functions ---------------------------------------------------------------------------
def check_args(hidden, weight, tokens, bias, vocab_size, vocab_chunk, temperature, ht: HeadTier,
               sliced: bool = False) -> int:  # fmt: skip
    """Clear errors naming the argument; returns the vocabulary size. sliced: weight is one rank's rows (its
    vocab_size is the whole vocabulary's, checked by the layout)."""
    for name, u in (("hidden", hidden), ("weight", weight)):
        if not isinstance(u, torch.Tensor):
            raise TypeError(f"rl_kernel: lm_head_logprobs: {name} must be a torch.Tensor, got {type(u).__name__}")
    t = ht.tier
    if hidden.dtype not in (torch.float32, torch.bfloat16, torch.float16) or (
        hidden.dtype == torch.float32 and "fp32" not in t.dtypes
    ):
        raise TypeError(f"rl_kernel: lm_head_logprobs: hidden is {hidden.dtype}; the {t.name} tier takes {t.dtypes}")
    if weight.dim() != 2:
        raise ValueError(f"rl_kernel: lm_head_logprobs: weight must be [vocab, hidden], got {tuple(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"rl_kernel: lm_head_logprobs: hidden's last dimension {tuple(hidden.shape)[-1:]} must equal the "
            f"weight's hidden size {weight.shape[1]} (weight is [vocab, hidden] = {tuple(weight.shape)})"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"rl_kernel: lm_head_logprobs: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    for name, u in (("weight", weight), ("bias", bias)):
        if u is not None and u.dtype != hidden.dtype:
            raise TypeError(
                f"rl_kernel: lm_head_logprobs: {name} is {u.dtype} but hidden is {hidden.dtype} (one dtype, as the "
                "model's lm_head computes)"
            )
    check_same_device({"hidden": hidden, "weight": weight, "bias": bias, "tokens": tokens})
    if ht.gemms.check is not None:
        ht.gemms.check(hidden, weight, bias)
    vocab = weight.shape[0] if vocab_size is None else int(vocab_size)
    if not 1 <= vocab <= (vocab if sliced else weight.shape[0]):
        raise ValueError(
            f"rl_kernel: lm_head_logprobs: vocab_size {vocab} must be in [1, {weight.shape[0]}] (the weight's rows; "
            "rows past vocab_size are padding)"
        )
    if not isinstance(vocab_chunk, int) or vocab_chunk < rowtree.CHUNK or vocab_chunk % rowtree.CHUNK:
        raise ValueError(f"rl_kernel: lm_head_logprobs: vocab_chunk must be a multiple of 8 (> 0), got {vocab_chunk}")
    if temperature is not None and not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"rl_kernel: lm_head_logprobs: temperature must be a positive number, got {temperature!r}")
    return vocab


def lm_head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    *,
    tier: str | tiers.Tier | HeadTier = "exact",
    bias: torch.Tensor | None = None,
    temperature: float | None = None,
    entropy: bool = False,
    vocab_size: int | None = None,
    ignore_index: int = IGNORE,
    vocab_chunk: int = VOCAB_CHUNK,
    validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log p(tokens) [...] in fp32 of softmax(hidden @ weight^T (+ bias), / temperature) over the first vocab_size
    columns, without materialising the logits; (logp, entropy) with entropy=True. Bit for bit `unfused(...)`;
    differentiable in hidden, weight and bias. ignore_index positions give 0 (and no gradient); with
    validate=True an id outside [0, vocab_size) is a ValueError (validate=False: NaN at that position)."""
    ht = HeadTier.of(tier)
    vocab = check_args(hidden, weight, tokens, bias, vocab_size, vocab_chunk, temperature, ht)
    whole = (Slice(0, weight.shape[0], vocab),)
    plan = Plan.of(ht, vocab, vocab_chunk, whole, temperature=temperature, ignore_index=ignore_index, entropy=entropy)
    return _apply(plan, hidden, weight, tokens, bias, validate)


def flat_tokens(plan: Plan, hidden: torch.Tensor, tokens: torch.Tensor, validate: bool) -> torch.Tensor:
    """tokens checked against hidden's leading dimensions (and, validate, the vocabulary), flattened."""
    tokens = check_tokens(hidden[..., :1].expand(*hidden.shape[:-1], 1), tokens, "hidden")
    if validate:
        check_token_range(tokens, plan.vocab_size, plan.ignore_index)
    return tokens.reshape(-1)


def _apply(plan: Plan, hidden, weight, tokens, bias, validate: bool):
    """Tokens checked, leading dimensions flattened, the autograd Function, the shapes restored."""
    tokens = flat_tokens(plan, hidden, tokens, validate)
    lead = hidden.shape[:-1]
    h = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    # The walk's width (read here, in the caller's thread: autograd runs a GPU backward in a thread of its own).
    span = span_of(plan.tier.gemms, h.shape[0], plan.chunk)
    plan = dataclasses.replace(plan, span=span)
    out = _Head.apply(h, weight.contiguous(), None if bias is None else bias.contiguous(), tokens, plan)
    if plan.want_entropy:
        return out[0].view(lead), out[1].view(lead)
    return out.view(lead)


def vocab_parallel(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    group=None,
    *,
    vocab_start: int,
    vocab_size: int,
    tier: str | tiers.Tier | HeadTier = "exact",
    bias: torch.Tensor | None = None,
    temperature: float | None = None,
    entropy: bool = False,
    ignore_index: int = IGNORE,
    vocab_chunk: int = VOCAB_CHUNK,
    validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The fused head over a vocab-parallel lm_head (rl_kernel.head.parallel.lm_head_logprobs documents it)."""
    ht = HeadTier.of(tier)
    vocab = check_args(hidden, weight, tokens, bias, vocab_size, vocab_chunk, temperature, ht, sliced=True)
    ranks, me = rowtree.layout(weight.t(), vocab_start, vocab, group)  # the weight's rows are the rank's columns
    exchange = rowtree.all_gather_exchange(group)
    chunks = [int(c) for c in exchange(torch.tensor([vocab_chunk], device=weight.device))]
    if len(set(chunks)) != 1:
        raise ValueError(f"rl_kernel.head.parallel.lm_head_logprobs: vocab_chunk differs between ranks: {chunks}")
    plan = Plan.of(ht, vocab, vocab_chunk, tuple(ranks), temperature=temperature, ignore_index=ignore_index,
                   entropy=entropy, me=me, exchange=exchange)  # fmt: skip
    return _apply(plan, hidden, weight, tokens, bias, validate)


def unfused(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    *,
    tier: str | tiers.Tier | HeadTier = "exact",
    bias: torch.Tensor | None = None,
    temperature: float | None = None,
    entropy: bool = False,
    vocab_size: int | None = None,
    ignore_index: int = IGNORE,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """What lm_head_logprobs computes, the plain way: the logits materialised (the reference its tests hold it
    to, and the unfused path of the benchmarks)."""
    ht = HeadTier.of(tier)
    vocab = check_args(hidden, weight, tokens, bias, vocab_size, VOCAB_CHUNK, temperature, ht)
    t = ht.tier
    logits = t.op("linear")(hidden, weight, bias)
    if temperature is not None:
        logits = divide_by_temperature(logits, temperature)
    logits = logits[..., :vocab]
    logp = t.op("token_logprobs")(logits, tokens, ignore_index)
    return (logp, t.op("entropy")(logits)) if entropy else logp
