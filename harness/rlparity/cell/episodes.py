"""The two paths an RL step takes over the same tokens, as pure torch functions of a log-prob function.

rollout: log-probs taken while generating, one decode step at a time; each step's batch holds the
sequences still running, in the scheduler's order for that step, mixed with other requests' rows.
training: teacher-forced log-probs of the whole batch in one call, with autograd on (a PPO-style
surrogate's backward). The bitwise suite requires the two to agree in every bit.

These workloads (plain, edges) start from logits (generated on the CPU from a seed, so every device sees the
same bits); the model workload (rlparity.cell.workloads.model) starts from token ids and runs a Hugging Face model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_kernel import inputs

IGNORE = -100
HEAD_ROWS = 8  # batch_views' small batch
LogprobFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits [N, V], tokens [N]) -> fp32 [N]
DTYPES = inputs.DTYPE_NAMES


@dataclass(frozen=True)
class Episode:
    """B sampled sequences of up to T tokens: the logits each step saw, the tokens, the lengths."""

    logits: torch.Tensor  # [B, T, V], the model's dtype, on the CPU
    tokens: torch.Tensor  # [B, T] int64; IGNORE past a sequence's end
    lengths: tuple[int, ...]
    advantages: torch.Tensor  # [B, T] fp32, the surrogate's weights

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.logits.shape)  # type: ignore[return-value]


def make_episode(batch: int, seq: int, vocab: int, dtype: str, seed: int = 0) -> Episode:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    logits = inputs.logits(batch * seq, vocab, DTYPES[dtype], seed).view(batch, seq, vocab)
    tokens = inputs.tokens(batch * seq, vocab, seed).view(batch, seq).clone()
    g = torch.Generator().manual_seed(seed + 7)
    # The first sequence runs to the end; the others stop somewhere in the second half (EOS).
    lengths = [seq] + [int(x) for x in torch.randint(max(1, seq // 2), seq + 1, (batch - 1,), generator=g)]
    for b, n in enumerate(lengths):
        tokens[b, n:] = IGNORE
    advantages = torch.randn(batch, seq, generator=g)
    return Episode(logits, tokens, tuple(lengths), advantages)


# ---- the edges workload: every code path of every kernel ------------------------------------------
# A plain episode (vocabularies that are multiples of 8, contiguous 16-byte aligned rows, finite values)
# reaches only the GPU kernels' vectorised path over full chunks. The edges episode adds what the plain
# one never shows a kernel: an odd vocabulary (the shape set's, e.g. 4099: a partial last chunk), every
# row EDGE_OFFSET elements into a slot of vocab + EDGE_PAD (odd element offsets: the scalar path for
# misaligned rows), the edge rows of rl_kernel.inputs plus a few more, and edge rows past a sequence's
# end (ignored: they must give 0 whatever they hold).
EDGE_OFFSET = 1
EDGE_PAD = 2


def extra_edge_rows(vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows the kernels' own edge rows lack: 0 exp(x - max) ramping through the subnormals to 0 (the
    flush boundary: an FTZ build loses those probabilities and their gradient); 1 two equal finite
    values among -inf (p = 1/2 exactly: with the tie advantages below, the gradient lands on a rounding
    tie of fp16/bf16); 2 the row's maximum in the partial last chunk."""
    rows = inputs.logits(3, vocab, torch.float32, seed=vocab)
    rows[0] = torch.linspace(0.0, -120.0, vocab)
    rows[1] = float("-inf")
    rows[1, 3] = rows[1, vocab - 2] = 0.5
    rows[2, vocab - 1] = 40.0
    return rows.to(dtype)


# Advantages that put the gradient at a rounding tie: grad = adv * (1 - 1/2) = 1 + 2^-(mantissa + 1).
TIE_ADVANTAGE = {"fp32": 3.0, "bf16": 2.0 + 2.0**-7, "fp16": 2.0 + 2.0**-10}


def edge_tokens(n_kernel_edges: int, vocab: int) -> list[int]:
    """A token per edge row: the finite value of the one-finite row (logprob 0), a -inf position of the
    all -inf row, the subnormal end of the ramp, one of the two tied values."""
    toks = [int(t) for t in inputs.tokens(n_kernel_edges, vocab, seed=vocab)]
    toks[2], toks[8] = 0, vocab - 1  # inputs.edge_rows: 2 all -inf, 8 one finite value at vocab - 1
    return [*toks, vocab - 1, 3, vocab - 1]


def make_edge_episode(batch: int, seq: int, vocab: int, dtype: str, seed: int = 0) -> Episode:
    """A plain episode whose first sequence carries every edge row at odd positions (each also once
    past the last sequence's end), its rows at odd element offsets in a wider buffer."""
    plain = make_episode(batch, seq, vocab, dtype, seed)
    edges = torch.cat([inputs.edge_rows(vocab, DTYPES[dtype]), extra_edge_rows(vocab, DTYPES[dtype])])
    n = edges.shape[0]
    if seq < 2 * n or vocab < 8:
        raise ValueError(f"the edges workload needs seq >= {2 * n} and vocab >= 8, got seq={seq}, vocab={vocab}")
    rows = plain.logits.reshape(batch * seq, vocab).clone()
    tokens = plain.tokens.clone().reshape(-1)
    advantages = plain.advantages.clone().reshape(-1)
    at = torch.arange(1, 2 * n, 2)  # odd positions of sequence 0, which runs to the end
    rows[at], tokens[at] = edges, torch.tensor(edge_tokens(n - 3, vocab))
    advantages[at[-2]] = TIE_ADVANTAGE[dtype]
    lengths = list(plain.lengths)
    if batch > 1:  # the last sequence ends early and its ignored tail holds edge rows too
        lengths[-1] = min(lengths[-1], seq - n)
        tail = (batch - 1) * seq + lengths[-1]
        rows[tail : tail + n], tokens[(batch - 1) * seq + lengths[-1] :] = edges, IGNORE
    buffer = torch.zeros(batch, seq, vocab + EDGE_PAD, dtype=rows.dtype)
    buffer[..., EDGE_OFFSET : EDGE_OFFSET + vocab] = rows.view(batch, seq, vocab)
    logits = buffer[..., EDGE_OFFSET : EDGE_OFFSET + vocab]  # a view: rows at odd element offsets
    return Episode(logits, tokens.view(batch, seq), tuple(lengths), advantages.view(batch, seq))


BUILDERS: dict[str, Callable[..., Episode]] = {"plain": make_episode, "edges": make_edge_episode}


def build_episode(workload: str, batch: int, seq: int, vocab: int, dtype: str, seed: int = 0) -> Episode:
    """The episode of a cell's workload (rlparity.cells.WORKLOADS names them) for one shape."""
    if workload not in BUILDERS:
        raise ValueError(f"unknown workload {workload!r} (known: {', '.join(BUILDERS)})")
    return BUILDERS[workload](batch, seq, vocab, dtype, seed)


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """t on device with its layout kept: a view into a wider buffer stays one (Tensor.to would make it
    contiguous on another device, and the kernel would never see a misaligned row)."""
    if t.device == torch.device(device) or t.is_contiguous():
        return t.to(device)
    size = t.untyped_storage().nbytes() // t.element_size()
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (size,), (1,)).to(device)
    return whole.as_strided(t.shape, t.stride(), t.storage_offset())


def _other_requests(step: int, vocab: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of unrelated requests that share a decode step (0, 1 or 2 of them, varying by step)."""
    n = step % 3
    return inputs.logits(n, vocab, dtype, seed + 1000 + step), inputs.tokens(n, vocab, seed + 1000 + step)


def rollout_logprobs(ep: Episode, lp: LogprobFn, device: torch.device | str = "cpu", seed: int = 0) -> torch.Tensor:
    """[B, T] fp32 log-probs as a decode loop takes them (0 past each sequence's end)."""
    batch, seq, vocab = ep.shape
    out = torch.zeros(batch, seq, dtype=torch.float32)
    for t in range(seq):
        running = [b for b in range(batch) if t < ep.lengths[b]]
        order = running[t % len(running) :] + running[: t % len(running)]  # the scheduler rotates slots
        extra_x, extra_tok = _other_requests(t, vocab, ep.logits.dtype, seed)
        x = torch.cat([ep.logits[order, t], extra_x]).to(device)
        tok = torch.cat([ep.tokens[order, t], extra_tok]).to(device)
        out[order, t] = lp(x, tok)[: len(order)].cpu()
    return out


def training_logprobs(
    ep: Episode, lp: LogprobFn, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced log-probs of the whole batch [B, T] and the surrogate's gradient w.r.t. the logits."""
    batch, seq, vocab = ep.shape
    leaf = to_device(ep.logits, device).requires_grad_()
    out = lp(leaf.view(batch * seq, vocab), ep.tokens.view(-1).to(device)).view(batch, seq)
    loss = (out * ep.advantages.to(device)).sum()
    loss.backward()
    return out.detach().cpu(), leaf.grad.detach().cpu()


def batch_views(ep: Episode) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The same rows presented five ways: (logits, tokens, index of each presented row in the flat batch).
    `head` (the first 8 rows as their own batch) checks more than one row at a small row count, where a
    kernel that picks its reduction by the batch size (split rows for small batches) shows."""
    batch, seq, vocab = ep.shape
    x = ep.logits.reshape(batch * seq, vocab)
    tok = ep.tokens.reshape(-1)
    n = x.shape[0]
    everything = torch.arange(n)
    reversed_ = everything.flip(0)
    wide = torch.cat([x, x], dim=1)[:, :vocab]  # a strided (non-contiguous) view of the same values
    alone = everything[:1]
    head = everything[: min(n, HEAD_ROWS)]
    return {
        "alone": (x[:1], tok[:1], alone),
        "head": (x[: len(head)], tok[: len(head)], head),
        "batch": (x, tok, everything),
        "reversed": (x[reversed_], tok[reversed_], reversed_),
        "strided": (wide, tok, everything),
    }
