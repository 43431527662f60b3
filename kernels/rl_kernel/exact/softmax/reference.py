"""The softmax family's reference in numpy: row statistics, log_softmax, token log-probs, entropy and
their gradients, on the shared contract (reference/contract.py). Transcribes docs/numerics.md
sections 5-7 and kernels/rl_kernel/csrc/softmax/softmax.cuh's comments."""

from __future__ import annotations

import numpy as np
import torch

from rl_kernel.exact.common.contract import (
    CANONICAL_NAN,
    F32,
    FLT_MAX,
    ONE,
    ZERO,
    _f32,
    _quiet,
    canonical,
    chunk_sum,
    exp_flushed,
    flush,
    leaf_stats,
    log_pos,
    row_sum,
    store_bits,
    tree_stats,
)


# ---- row statistics and the forward operations ---------------------------------------------
@_quiet
def finish(m, s) -> tuple[np.float32, np.float32, np.float32]:
    """ "The row's result (m, s) is good iff m is finite (not NaN, not +inf) and s >= 1. Then
    log_s = log_pos(s), and the statistics are (flush(m), s, log_s)"; a bad row gives the canonical
    NaN three times."""
    m, s = _f32(m), _f32(s)
    if bool(m <= FLT_MAX) and bool(s >= ONE):
        return flush(m)[()], s[()], log_pos(s)[()]
    return CANONICAL_NAN, CANONICAL_NAN, CANONICAL_NAN


@_quiet
def row_stats(x_row, chunk_sum_fn=chunk_sum, tree=tree_stats) -> tuple[np.float32, np.float32, np.float32]:
    """row_stats(x) = (m, s, log_s) of one row (float32 array): the root of the tree over its leaves."""
    return finish(*tree(*leaf_stats(x_row, chunk_sum_fn)))


@_quiet
def logprob(x, stats) -> np.ndarray:
    """ "log_softmax(x)_i = flush((x_i - m) - log_s)"; the canonical NaN for a bad row (s is NaN)."""
    m, s, log_s = stats
    x = _f32(x)
    if not bool(s >= ONE):
        return np.full(x.shape, CANONICAL_NAN, dtype=F32)
    return flush((x - m) - log_s)


@_quiet
def log_softmax(x_row, **variant) -> np.ndarray:
    """log_softmax of one row, fp32."""
    return logprob(x_row, row_stats(x_row, **variant))


@_quiet
def token_logprob(x_row, tok: int, ignore_index: int, stats=None) -> np.float32:
    """ "token_logprobs(x, tok) = log_softmax(x)_tok ... 0 (+0.0) where tok == ignore_index";
    NaN (canonical) for an id outside [0, V)."""
    x_row = _f32(x_row)
    if tok == ignore_index:
        return ZERO
    if tok < 0 or tok >= x_row.shape[0]:
        return CANONICAL_NAN
    stats = row_stats(x_row) if stats is None else stats
    return logprob(x_row[tok : tok + 1], stats)[0]


@_quiet
def entropy_term(lp) -> np.ndarray:
    """ "term(lp) = 0 if p == 0 else flush(p * (0 - lp)), p = exp_flushed(lp)"."""
    p = exp_flushed(lp)
    return np.where(p == ZERO, ZERO, flush(p * (ZERO - lp)))


@_quiet
def entropy(x_row, stats=None, **variant) -> np.float32:
    """ "entropy(x) = sum_i term(lp_i) ... summed in the order of section 2 (a second pass over the
    row)"; the canonical NaN for a bad row. (variant: chunk_sum_fn / tree of row_sum, for tests.)"""
    stats = row_stats(x_row) if stats is None else stats
    if not bool(stats[1] >= ONE):
        return CANONICAL_NAN
    return row_sum(entropy_term(logprob(x_row, stats)), **variant)[()]


# ---- backward ----------------------------------------------------------------------------------
@_quiet
def log_softmax_backward(g_row, out_row, dtype: torch.dtype, **variant) -> np.ndarray:
    """ "G = sum_i flush(g_i) (section 2's order); grad_i = flush(flush(g_i) - flush(exp_flushed(out_i) * G))",
    NaN canonical, stored in dtype (returned as integer bits). (variant: as for entropy.)"""
    g, out = _f32(g_row), _f32(out_row)
    gsum = row_sum(flush(g), **variant)
    grad = canonical(flush(flush(g) - flush(exp_flushed(out) * gsum)))
    return store_bits(grad, dtype)


@_quiet
def token_logprob_backward(g, x_row, tok: int, stats, ignore_index: int, dtype: torch.dtype) -> np.ndarray:
    """ "grad_i = flush(g * ([i == tok] - exp_flushed(lp_i))); all +0.0 for an ignored row"; an id
    outside [0, V) gives a NaN gradient row (canonical)."""
    g, x_row = _f32(g), _f32(x_row)
    v = x_row.shape[0]
    if tok == ignore_index:
        grad = np.zeros(v, dtype=F32)
    elif tok < 0 or tok >= v:
        grad = np.full(v, CANONICAL_NAN, dtype=F32)
    else:
        onehot = np.where(np.arange(v) == tok, ONE, ZERO).astype(F32)
        lp = logprob(x_row, stats)
        grad = canonical(flush(g * (onehot - exp_flushed(lp))))
    return store_bits(grad, dtype)


@_quiet
def entropy_backward(g, x_row, stats, h, dtype: torch.dtype) -> np.ndarray:
    """ "w_i = 0 if p_i == 0 else flush(p_i * (0 - (lp_i + H))), grad_i = flush(g * w_i)", NaN canonical."""
    g, h = _f32(g), _f32(h)
    lp = logprob(x_row, stats)
    p = exp_flushed(lp)
    w = np.where(p == ZERO, ZERO, flush(p * (ZERO - (lp + h))))
    return store_bits(canonical(flush(g * w)), dtype)
