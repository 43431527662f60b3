"""The fast tier's attention: a Triton flash attention (forward + FA2-style backward), causal GQA with the
exact tier's q_pos / k_start semantics (left padding, KV cache; a decode step is a prefill row).

Why a row's bits depend on nothing but its own inputs:
- ONE tile (BLOCK_M, BLOCK_N, warps, stages) per (target, head dim) for every call: nothing is chosen from
  Tq, the batch or the longest sequence.
- Keys are tiled from k_start[b]: tile j holds keys k_start[b] + j*BLOCK_N ..; every row of a sequence
  walks the same tiles from its first valid key, so a decode row (Tq = 1) and the same row of a prefill
  see the same tiles, the same scores and the same online-softmax updates. Tiles past a row's last key
  (its block neighbours' keys) are fully masked: the max stays, alpha = exp2(0) = 1 and p = 0, a no-op.
- With a sliding window a row's tiles are counted from its own first key, max(k_start, q - window + 1), so that a
  decode step over a cache cut to the window (whose first slot is that key) walks them too. A block then holds
  query positions a key tile apart (their first keys alike within a tile once the window cuts) and takes its rows
  class by class, a class being the rows whose first keys share a tile grid; a tile before a row's first key, or
  of another class, is fully masked for it: a no-op as above (with m = -inf: l = 0 and acc = 0 stay).
- Rows are independent in the matrix instruction, so packing (query rows x the group's query heads) into
  the M dimension, or any neighbour, changes no row.
- A full tile (every key <= every row's q_pos) skips the causal mask; the masked path computes the same
  values for it, so which path a tile takes does not change the bits either.
The backward is fast.decoder.attention_backward's; the helpers both share, fast.decoder.attention_tiles'.
"""

from __future__ import annotations

import math

import torch

from rl_kernel._triton import jit as _jit  # Triton where installed: rl_kernel.fast reports it missing on a call
from rl_kernel._triton import tl, triton
from rl_kernel._validate import compiling, needs_autograd
from rl_kernel.exact.decoder.ops import check_sinks, check_window
from rl_kernel.fast.decoder import plan as plans
from rl_kernel.fast.decoder.attention_backward import backward
from rl_kernel.fast.decoder.attention_tiles import (
    LOG2E,
    _cfg,
    _check_group,
    _query_block,
    _window_class,
    spaced_blocks,
)
from rl_kernel.triton_tier import launch, launch_replay

# ---- forward --------------------------------------------------------------------------------------------
# The masks of a key tile: none (every row sees every key), causal (a row sees keys up to its q_pos), rows (a
# windowed block's class: its rows see every key, the others none), window (a row sees first .. q_pos).
_constexpr = tl.constexpr if tl is not None else int  # globals a kernel reads; plain ints where Triton is missing
NONE, CAUSAL, ROWS, WINDOW = _constexpr(0), _constexpr(1), _constexpr(2), _constexpr(3)
SINK_SCALE = _constexpr(LOG2E)  # a sink's logit in the kernel's log2 units


@_jit
def _fwd_tile(
    acc,
    m_i,
    l_i,
    q,
    k_base,
    v_base,
    k_tile0,
    qlo,
    qp,
    hi,
    Tk,
    stride_kt,
    stride_vt,
    offs_d,
    qk_scale,
    HEAD_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK: tl.constexpr,
):
    """One key tile's online-softmax update of the block's rows (qlo: each row's first key, WINDOW only; qp: its last,
    -1 for a row outside a windowed class). A tile a row sees none of is a no-op for it: its max stays (or stays -inf
    with l = 0 and acc = 0), alpha = 1 (or 0 times 0) and p = 0."""
    kidx = k_tile0 + tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_D
    kt = tl.load(
        k_base + kidx.to(tl.int64)[None, :] * stride_kt + offs_d[:, None],
        mask=(kidx[None, :] < Tk) & d_ok[:, None],
        other=0.0,
    )
    s = tl.dot(q, kt) * qk_scale
    v_ok = kidx < Tk
    if MASK == CAUSAL:
        s = tl.where(kidx[None, :] <= qp[:, None], s, float("-inf"))
        v_ok = v_ok & (kidx <= hi)  # never read unwritten cache slots: 0 * NaN would poison the sum
    if MASK == ROWS:
        s = tl.where(qp[:, None] >= 0, s, float("-inf"))
    if MASK == WINDOW:
        s = tl.where((kidx[None, :] >= qlo[:, None]) & (kidx[None, :] <= qp[:, None]), s, float("-inf"))
        v_ok = v_ok & (kidx <= hi)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: no -inf - -inf
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = tl.load(
        v_base + kidx.to(tl.int64)[:, None] * stride_vt + offs_d[None, :], mask=v_ok[:, None] & d_ok[None, :], other=0.0
    )
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@_jit(do_not_specialize=["Tq", "Tk"])
def _attn_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    qpos_ptr,
    kstart_ptr,
    sinks_ptr,
    qk_scale,
    Tq,
    Tk,
    Hkv,
    sq_b,
    sq_h,
    sq_t,
    sk_b,
    sk_h,
    sk_t,
    sv_b,
    sv_h,
    sv_t,
    so_b,
    so_h,
    so_t,
    sl_b,
    sl_h,
    sp_b,
    window,
    lanes,
    G: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS_T: tl.constexpr,
    WINDOWED: tl.constexpr,
    HAS_SINK: tl.constexpr,
):
    b, hkv, t64, h, valid, ks, qp, on = _query_block(
        qpos_ptr, kstart_ptr, Tq, Hkv, sp_b, lanes, window, G, BLOCK_M, ROWS_T, BLOCK_N, WINDOWED
    )
    h64 = h.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_D
    q = tl.load(
        q_ptr + b * sq_b + h64[:, None] * sq_h + t64[:, None] * sq_t + offs_d[None, :],
        mask=valid[:, None] & d_ok[None, :],
        other=0.0,
    )
    k_base = k_ptr + b * sk_b + hkv.to(tl.int64) * sk_h
    v_base = v_ptr + b * sv_b + hkv.to(tl.int64) * sv_h
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    if HAS_SINK:  # the head's sink joins the row's softmax first, as a key with a zero value: m = sink, l = 1
        m_i = tl.load(sinks_ptr + h, mask=valid, other=float("-inf")).to(tl.float32) * SINK_SCALE
        l_i = tl.where(valid, 1.0, 0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    if WINDOWED:
        first = tl.maximum(qp - window + 1, ks)
        todo = on
        while tl.max(todo.to(tl.int32), 0) > 0:  # a class of rows on one grid of key tiles at a time
            mine, base, latest, lo, hi = _window_class(todo, first, qp, BLOCK_N)
            qc = tl.where(mine, qp, -1)
            n_tiles = (hi - base + BLOCK_N) // BLOCK_N
            j_lo = tl.minimum((latest - base + BLOCK_N - 1) // BLOCK_N, n_tiles)  # from here every row sees every key
            j_hi = tl.maximum(tl.minimum((lo - base + 1) // BLOCK_N, n_tiles), j_lo)  # up to here
            for j in range(0, j_lo):
                acc, m_i, l_i = _fwd_tile(
                    acc, m_i, l_i, q, k_base, v_base, base + j * BLOCK_N, first, qc, hi, Tk, sk_t, sv_t, offs_d,
                    qk_scale, HEAD_D, BLOCK_N, WINDOW,
                )  # fmt: skip
            for j in range(j_lo, j_hi):
                acc, m_i, l_i = _fwd_tile(
                    acc, m_i, l_i, q, k_base, v_base, base + j * BLOCK_N, first, qc, hi, Tk, sk_t, sv_t, offs_d,
                    qk_scale, HEAD_D, BLOCK_N, ROWS,
                )  # fmt: skip
            for j in range(j_hi, n_tiles):
                acc, m_i, l_i = _fwd_tile(
                    acc, m_i, l_i, q, k_base, v_base, base + j * BLOCK_N, first, qc, hi, Tk, sk_t, sv_t, offs_d,
                    qk_scale, HEAD_D, BLOCK_N, WINDOW,
                )  # fmt: skip
            todo = todo & ~mine
    else:
        hi = tl.max(tl.where(on, qp, ks - 1), 0)  # the block's last key
        lo = tl.min(tl.where(on, qp, 2**62), 0)  # every row sees keys up to lo
        n_tiles = tl.maximum(hi - ks + BLOCK_N, 0) // BLOCK_N  # tiles are counted from k_start
        n_full = tl.minimum(tl.maximum(lo - ks + 1, 0) // BLOCK_N, n_tiles)
        for j in range(0, n_full):
            acc, m_i, l_i = _fwd_tile(
                acc, m_i, l_i, q, k_base, v_base, ks + j * BLOCK_N, qp, qp, hi, Tk, sk_t, sv_t, offs_d, qk_scale,
                HEAD_D, BLOCK_N, NONE,
            )  # fmt: skip
        for j in range(n_full, n_tiles):
            acc, m_i, l_i = _fwd_tile(
                acc, m_i, l_i, q, k_base, v_base, ks + j * BLOCK_N, qp, qp, hi, Tk, sk_t, sv_t, offs_d, qk_scale,
                HEAD_D, BLOCK_N, CAUSAL,
            )  # fmt: skip
    l_safe = tl.where(on, l_i, 1.0)
    out = tl.where(on[:, None], acc / l_safe[:, None], 0.0)
    tl.store(
        o_ptr + b * so_b + h64[:, None] * so_h + t64[:, None] * so_t + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=valid[:, None] & d_ok[None, :],
    )
    # The row's log2-sum-exp2 of its scaled scores (0 for a row that sees no key: backward masks it).
    lse = tl.where(on, m_i + tl.math.log2(l_safe), 0.0)
    tl.store(lse_ptr + b * sl_b + h64 * sl_h + t64, lse, mask=valid)


# ---- launch -----------------------------------------------------------------------------------------
def forward(
    q, k, v, q_pos, k_start, scale: float, cfg: dict | None = None, plan: tuple | None = None, window: int = 0,
    sinks: torch.Tensor | None = None,
):  # fmt: skip
    """(out [B, Hq, Tq, D] in q's dtype, lse [B, Hq, Tq] fp32: log2-sum-exp2 of the scaled scores, the sink's
    included). cfg overrides the pinned config (the tuning sweep of bench/fast_tier.py (python -m bench fast_tier)
    only); plan: the call's plan key (fast.decoder.plan; the pinned config's calls only); window: a sliding window of
    that many keys (0: none), each block then ROWS_T query positions a key tile apart (_spaced_rows), taken class by
    class (_window_class): each row's tiles are counted from its own first key. sinks: fp32 [Hq], a logit per query
    head that starts each row's softmax (m = sink, l = 1)."""
    bsz, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if cfg is not None or window or sinks is not None:
        plan = None
    cfg = _cfg(q, cfg)
    g = _check_group(hq, hkv, cfg["block_m"])
    out = torch.empty_like(q)
    lse = torch.empty((bsz, hq, tq), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse.zero_()
    rows_t = cfg["block_m"] // g
    blocks, lanes = spaced_blocks(tq, rows_t, cfg["block_n"]) if window else (triton.cdiv(tq, rows_t), 1)
    grid = (blocks, bsz * hkv)
    replay = (launch if plan is None else launch_replay)(
        _attn_fwd_kernel, grid, *forward_operands(q, k, v, q_pos, k_start, out, lse, sinks), scale * LOG2E, tq, tk, hkv,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], *lse.stride()[:2], q_pos.stride(0),
        window, lanes, G=g, HEAD_D=d, BLOCK_D=cfg["block_d"], BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
        ROWS_T=rows_t, WINDOWED=window > 0, HAS_SINK=sinks is not None, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **cfg["launch"],
    )  # fmt: skip
    if plan is not None and replay is not None:  # None: a launch that cannot be replayed
        plans.keep_attention(plan, replay.taking(_fresh_positions()), forward_operands)
    return out, lse


def forward_operands(q, k, v, q_pos, k_start, out, lse, sinks=None) -> tuple[torch.Tensor, ...]:
    """The forward kernel's tensor arguments, in its order (the launch and its plan, which has no sinks: lse stands in
    for them, unread)."""
    return q, k, v, out, lse, q_pos, k_start, lse if sinks is None else sinks


# The forward kernel's parameters for plan.cache_ints (in its order): its plan takes them anew.
_FRESH = ("Tk", "sk_b", "sk_h", "sv_b", "sv_h")


def _fresh_positions() -> tuple[int, ...]:
    """_FRESH's positions among the forward kernel's arguments after its tensors (from qk_scale on)."""
    names = _attn_fwd_kernel.arg_names
    return tuple(names.index(n) - names.index("qk_scale") for n in _FRESH)


# ---- torch.library ops --------------------------------------------------------------------------------
@torch.library.custom_op(
    "rl_kernel_fast::attention",
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor q_pos, Tensor k_start, float scale, int window, Tensor? sinks) -> "
    "(Tensor, Tensor)",
)
def _attention_op(q, k, v, q_pos, k_start, scale, window, sinks):
    return forward(q, k, v, q_pos, k_start, scale, window=window, sinks=sinks)


@_attention_op.register_fake
def _(q, k, v, q_pos, k_start, scale, window, sinks):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op(
    "rl_kernel_fast::attention_backward",
    mutates_args=(),
    schema="(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor q_pos, Tensor k_start, "
    "float scale, int window, Tensor? sinks) -> (Tensor, Tensor, Tensor, Tensor)",
)
def _attention_backward_op(grad, q, k, v, out, lse, q_pos, k_start, scale, window, sinks):
    return backward(grad, q, k, v, out, lse, q_pos, k_start, scale, window=window, sinks=sinks)


@_attention_backward_op.register_fake
def _(grad, q, k, v, out, lse, q_pos, k_start, scale, window, sinks):
    dsinks = q.new_empty((0,), dtype=torch.float32) if sinks is None else torch.empty_like(sinks)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


def _setup_context(ctx, inputs, output):
    q, k, v, q_pos, k_start, scale, window, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_pos, k_start, sinks)
    ctx.scale, ctx.window = scale, window


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, q_pos, k_start, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = _attention_backward_op(grad_out.contiguous(), q, k, v, out, lse, q_pos, k_start, ctx.scale,
                                                ctx.window, sinks)  # fmt: skip
    return dq, dk, dv, None, None, None, None, (dsinks if sinks is not None else None)


_attention_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the public entry -----------------------------------------------------------------------------------
def attention(
    q, k, v, q_pos, k_start, scale: float | None = None, *, validate: bool = True, window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """rl_kernel.fast.attention after its device/dtype checks: shapes and key ranges, then the kernels."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(
            "rl_kernel.fast.attention: q must be [B, Hq, Tq, D] and k, v [B, Hkv, Tk, D], got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    bsz, _, tq, d = q.shape
    if k.shape[0] != bsz or k.shape[3] != d:
        raise ValueError(f"rl_kernel.fast.attention: k/v {tuple(k.shape)} do not match q {tuple(q.shape)}")
    if tuple(q_pos.shape) != (bsz, tq) or tuple(k_start.shape) != (bsz,):
        raise ValueError(
            f"rl_kernel.fast.attention: q_pos must be [{bsz}, {tq}] and k_start [{bsz}], got "
            f"{tuple(q_pos.shape)}, {tuple(k_start.shape)}"
        )
    if q_pos.device != q.device or k_start.device != q.device:
        raise ValueError(
            f"rl_kernel.fast.attention: q_pos ({q_pos.device}) and k_start ({k_start.device}) must be on {q.device}"
        )
    if q_pos.dtype.is_floating_point or k_start.dtype.is_floating_point:
        raise TypeError("rl_kernel.fast.attention: q_pos and k_start must be integer tensors")
    if validate and not compiling():
        if k_start.numel() and int(k_start.min()) < 0:
            raise ValueError(f"rl_kernel.fast.attention: k_start must be >= 0, got {int(k_start.min())}")
        if q_pos.numel() and int(q_pos.max()) >= k.shape[2]:
            raise ValueError(f"rl_kernel.fast.attention: q_pos {int(q_pos.max())} is past the {k.shape[2]} keys")
    window = check_window(window)
    sinks = check_sinks(sinks, q)
    scale = d**-0.5 if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"rl_kernel.fast.attention: scale must be finite, got {scale}")
    if q_pos.dtype != torch.int64 or k_start.dtype != torch.int64:  # a cast only where needed: each is host time
        q_pos, k_start = q_pos.to(torch.int64), k_start.to(torch.int64)
    q_pos, k_start = q_pos.contiguous(), k_start.contiguous()
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if not needs_autograd(q, k, v, sinks):
        plan = None if validate or window else plans.attention_key(q, k, v, q_pos, k_start, scale)  # a decode step's
        return forward(q, k, v, q_pos, k_start, scale, plan=plan, window=window, sinks=sinks)[0]
    return _attention_op(q, k, v, q_pos, k_start, scale, window, sinks)[0]
