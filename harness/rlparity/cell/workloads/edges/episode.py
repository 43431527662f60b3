"""The edges workload's episode: every code path of every kernel.

A plain episode (vocabularies that are multiples of 8, contiguous 16-byte aligned rows, finite values) reaches only
the GPU kernels' vectorised path over full chunks. The edges episode adds what the plain one never shows a kernel:
an odd vocabulary (the shape set's, e.g. 4099: a partial last chunk), every row EDGE_OFFSET elements into a slot of
vocab + EDGE_PAD (odd element offsets: the scalar path for misaligned rows), the edge rows of rl_kernel.inputs plus a
few more, and edge rows past a sequence's end (ignored: they must give 0 whatever they hold).
"""

from __future__ import annotations

import torch

from rl_kernel import inputs
from rlparity.cell.episodes import IGNORE, Episode, make_episode

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
    torch_dtype = inputs.DTYPE_NAMES[dtype]
    edges = torch.cat([inputs.edge_rows(vocab, torch_dtype), extra_edge_rows(vocab, torch_dtype)])
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
