"""The fast tier's attention: a Triton flash attention (forward + FA2-style backward), causal GQA with the
exact tier's q_pos / k_start semantics (left padding, KV cache; a decode step is a prefill row).

Why a row's bits depend on nothing but its own inputs:
- ONE tile (BLOCK_M, BLOCK_N, warps, stages) per (target, head dim) for every call: nothing is chosen from
  Tq, the batch or the longest sequence.
- Keys are tiled from k_start[b]: tile j holds keys k_start[b] + j*BLOCK_N ..; every row of a sequence
  walks the same tiles from its first valid key, so a decode row (Tq = 1) and the same row of a prefill
  see the same tiles, the same scores and the same online-softmax updates. Tiles past a row's last key
  (its block neighbours' keys) are fully masked: the max stays, alpha = exp2(0) = 1 and p = 0, a no-op.
- Rows are independent in the matrix instruction, so packing (query rows x the group's query heads) into
  the M dimension, or any neighbour, changes no row.
- A full tile (every key <= every row's q_pos) skips the causal mask; the masked path computes the same
  values for it, so which path a tile takes does not change the bits either.
Backward: D = rowsum(dO * O); dK/dV one program per key tile looping over the query blocks (all of the
group's heads) in a fixed order; dQ one program per query block looping over key tiles. No atomics.
"""

from __future__ import annotations

import math

import torch

from rl_kernel._triton import jit as _jit  # Triton where installed: rl_kernel.fast reports it missing on a call
from rl_kernel._triton import tl, triton
from rl_kernel._validate import compiling, needs_autograd
from rl_kernel.exact.decoder.ops import check_window
from rl_kernel.fast.configs import config_for
from rl_kernel.fast.decoder import plan as plans
from rl_kernel.triton_tier import launch, launch_replay, target_of

LOG2E = 1.4426950408889634


# ---- forward --------------------------------------------------------------------------------------------
@_jit
def _rows(pid_m, hkv, Tq, G: tl.constexpr, BLOCK_M: tl.constexpr, ROWS_T: tl.constexpr):
    """Packed rows of a block: row r is query position pid_m * ROWS_T + r // G of head hkv*G + r % G (ROWS_T query
    positions, at most BLOCK_M // G; one with a sliding window, whose rows then share their first key)."""
    r = tl.arange(0, BLOCK_M)
    t = pid_m * ROWS_T + r // G
    h = hkv * G + r % G
    valid = (r < ROWS_T * G) & (t < Tq)
    return t, h, valid


@_jit
def _first_key(ks, qp, on, window, WINDOWED: tl.constexpr):
    """The block's first key, from which its tiles are counted: the sequence's (k_start), or with a window the one
    first key its rows share (one query position per block: max(k_start, q - window + 1))."""
    if WINDOWED:
        return tl.max(tl.where(on, tl.maximum(qp - window + 1, ks), ks), 0)
    return ks


@_jit
def _fwd_tile(
    acc,
    m_i,
    l_i,
    q,
    k_base,
    v_base,
    k_tile0,
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
    kidx = k_tile0 + tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_D
    kt = tl.load(
        k_base + kidx.to(tl.int64)[None, :] * stride_kt + offs_d[:, None],
        mask=(kidx[None, :] < Tk) & d_ok[:, None],
        other=0.0,
    )
    s = tl.dot(q, kt) * qk_scale
    if MASK:
        s = tl.where(kidx[None, :] <= qp[:, None], s, float("-inf"))
        v_ok = (kidx < Tk) & (kidx <= hi)  # never read unwritten cache slots: 0 * NaN would poison the sum
    else:
        v_ok = kidx < Tk
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
    G: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS_T: tl.constexpr,
    WINDOWED: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // Hkv).to(tl.int64)
    hkv = pid_bh % Hkv
    t, h, valid = _rows(pid_m, hkv, Tq, G, BLOCK_M, ROWS_T)
    t64 = t.to(tl.int64)
    h64 = h.to(tl.int64)
    ks = tl.load(kstart_ptr + b)
    qp = tl.load(qpos_ptr + b * sp_b + t64, mask=valid, other=-1)
    on = valid & (qp >= ks)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_D
    q = tl.load(
        q_ptr + b * sq_b + h64[:, None] * sq_h + t64[:, None] * sq_t + offs_d[None, :],
        mask=valid[:, None] & d_ok[None, :],
        other=0.0,
    )
    base = _first_key(ks, qp, on, window, WINDOWED)  # tiles are counted from it
    hi = tl.max(tl.where(on, qp, base - 1), 0)  # the block's last key
    lo = tl.min(tl.where(on, qp, 2**62), 0)  # every row sees keys up to lo
    n_tiles = tl.maximum(hi - base + BLOCK_N, 0) // BLOCK_N
    n_full = tl.minimum(tl.maximum(lo - base + 1, 0) // BLOCK_N, n_tiles)
    k_base = k_ptr + b * sk_b + hkv.to(tl.int64) * sk_h
    v_base = v_ptr + b * sv_b + hkv.to(tl.int64) * sv_h
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for j in range(0, n_full):
        acc, m_i, l_i = _fwd_tile(
            acc, m_i, l_i, q, k_base, v_base, base + j * BLOCK_N, qp, hi, Tk, sk_t, sv_t, offs_d, qk_scale,
            HEAD_D, BLOCK_N, False,
        )  # fmt: skip
    for j in range(n_full, n_tiles):
        acc, m_i, l_i = _fwd_tile(
            acc, m_i, l_i, q, k_base, v_base, base + j * BLOCK_N, qp, hi, Tk, sk_t, sv_t, offs_d, qk_scale,
            HEAD_D, BLOCK_N, True,
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


# ---- backward -------------------------------------------------------------------------------------------
@_jit(do_not_specialize=["R"])
def _bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, R, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """delta[row] = sum_d dO * O in fp32 (one fixed tree per row); rows of contiguous [R, HEAD_D]."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < R) & (offs_d[None, :] < HEAD_D)
    ptrs = rows.to(tl.int64)[:, None] * HEAD_D + offs_d[None, :]
    o = tl.load(o_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, 1), mask=rows < R)


@_jit(do_not_specialize=["Tq", "Tk"])
def _attn_bwd_dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    qpos_ptr,
    kstart_ptr,
    qk_scale,
    scale,
    Tq,
    Tk,
    Hkv,
    Hq,
    sp_b,
    window,
    G: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WINDOWED: tl.constexpr,
):
    """One key tile (counted from k_start) of one KV head; query blocks (all G heads packed) in order; with a window a
    row sees keys from max(k_start, q - window + 1) only.
    q, do [B, Hq, Tq, D], k, v, dk, dv [B, Hkv, Tk, D], lse, delta [B, Hq, Tq]: all contiguous."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // Hkv).to(tl.int64)
    hkv = pid_bh % Hkv
    ks = tl.load(kstart_ptr + b)
    k0 = ks + pid_n * BLOCK_N
    if k0 < Tk:
        kidx = k0 + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_D
        kv_off = (b * Hkv + hkv) * Tk * HEAD_D
        kv_ptrs = kv_off + kidx.to(tl.int64)[:, None] * HEAD_D + offs_d[None, :]
        kv_mask = (kidx[:, None] < Tk) & d_ok[None, :]
        k = tl.load(k_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        rows_t: tl.constexpr = BLOCK_M // G
        for mb in range(0, tl.cdiv(Tq, rows_t)):
            t, h, valid = _rows(mb, hkv, Tq, G, BLOCK_M, rows_t)
            t64 = t.to(tl.int64)
            qp = tl.load(qpos_ptr + b * sp_b + t64, mask=valid, other=-1)
            on = valid & (qp >= ks)
            first = tl.maximum(qp - window + 1, ks) if WINDOWED else ks + tl.zeros_like(qp)
            # a block that sees none of these keys adds nothing
            if (tl.max(tl.where(on, qp, -1), 0) >= k0) & (tl.min(tl.where(on, first, 2**62), 0) < k0 + BLOCK_N):
                row = (b * Hq + h.to(tl.int64)) * Tq + t64
                qd_ptrs = row[:, None] * HEAD_D + offs_d[None, :]
                qd_mask = valid[:, None] & d_ok[None, :]
                q = tl.load(q_ptr + qd_ptrs, mask=qd_mask, other=0.0)
                do = tl.load(do_ptr + qd_ptrs, mask=qd_mask, other=0.0)
                lse = tl.load(lse_ptr + row, mask=valid, other=0.0)
                delta = tl.load(delta_ptr + row, mask=valid, other=0.0)
                seen = on[:, None] & (kidx[None, :] <= qp[:, None]) & (kidx[None, :] < Tk)
                seen = seen & (kidx[None, :] >= first[:, None])
                s = tl.dot(q, tl.trans(k)) * qk_scale
                p = tl.where(seen, tl.math.exp2(s - lse[:, None]), 0.0)
                dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv)
                dp = tl.dot(do, tl.trans(v))
                ds = tl.where(seen, p * (dp - delta[:, None]), 0.0)
                dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk)
        tl.store(dk_ptr + kv_ptrs, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
        tl.store(dv_ptr + kv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@_jit(do_not_specialize=["Tq", "Tk"])
def _attn_bwd_dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    qpos_ptr,
    kstart_ptr,
    qk_scale,
    scale,
    Tq,
    Tk,
    Hkv,
    Hq,
    sp_b,
    window,
    G: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS_T: tl.constexpr,
    WINDOWED: tl.constexpr,
):
    """One packed query block of one KV head; its key tiles from its first key in order (all contiguous)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // Hkv).to(tl.int64)
    hkv = pid_bh % Hkv
    t, h, valid = _rows(pid_m, hkv, Tq, G, BLOCK_M, ROWS_T)
    t64 = t.to(tl.int64)
    ks = tl.load(kstart_ptr + b)
    qp = tl.load(qpos_ptr + b * sp_b + t64, mask=valid, other=-1)
    on = valid & (qp >= ks)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_D
    row = (b * Hq + h.to(tl.int64)) * Tq + t64
    qd_ptrs = row[:, None] * HEAD_D + offs_d[None, :]
    qd_mask = valid[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + qd_ptrs, mask=qd_mask, other=0.0)
    do = tl.load(do_ptr + qd_ptrs, mask=qd_mask, other=0.0)
    lse = tl.load(lse_ptr + row, mask=valid, other=0.0)
    delta = tl.load(delta_ptr + row, mask=valid, other=0.0)
    base = _first_key(ks, qp, on, window, WINDOWED)
    hi = tl.max(tl.where(on, qp, base - 1), 0)
    n_tiles = tl.maximum(hi - base + BLOCK_N, 0) // BLOCK_N
    kv_off = (b * Hkv + hkv) * Tk * HEAD_D
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for j in range(0, n_tiles):
        kidx = base + j * BLOCK_N + tl.arange(0, BLOCK_N)
        kv_ptrs = kv_off + kidx.to(tl.int64)[:, None] * HEAD_D + offs_d[None, :]
        kv_mask = (kidx[:, None] < Tk) & (kidx[:, None] <= hi) & d_ok[None, :]
        k = tl.load(k_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_ptrs, mask=kv_mask, other=0.0)
        seen = on[:, None] & (kidx[None, :] <= qp[:, None]) & (kidx[None, :] < Tk)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.where(seen, tl.math.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = tl.where(seen, p * (dp - delta[:, None]), 0.0)
        dq = tl.dot(ds.to(k.dtype), k, dq)
    tl.store(dq_ptr + qd_ptrs, (dq * scale).to(dq_ptr.dtype.element_ty), mask=qd_mask)


# ---- launches -------------------------------------------------------------------------------------------
def _cfg(q: torch.Tensor, cfg: dict | None) -> dict:
    return cfg or config_for("attention", target_of(q.device), head_dim=q.shape[-1])


def _check_group(hq: int, hkv: int, block_m: int) -> int:
    if hkv == 0 or hq % hkv:
        raise ValueError(f"rl_kernel.fast.attention: Hq = {hq} must be a multiple of Hkv = {hkv}")
    g = hq // hkv
    if g > block_m:
        raise ValueError(f"rl_kernel.fast.attention: a group of {g} query heads exceeds BLOCK_M = {block_m}")
    return g


def forward(q, k, v, q_pos, k_start, scale: float, cfg: dict | None = None, plan: tuple | None = None, window: int = 0):
    """(out [B, Hq, Tq, D] in q's dtype, lse [B, Hq, Tq] fp32: log2-sum-exp2 of the scaled scores).
    cfg overrides the pinned config (the tuning sweep of bench/fast_tier.py (python -m bench fast_tier) only);
    plan: the call's plan key (fast.decoder.plan; the pinned config's calls only); window: a sliding window of that
    many keys (0: none), each block then one query position (its rows' tiles counted from their first key)."""
    bsz, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if cfg is not None or window:
        plan = None
    cfg = _cfg(q, cfg)
    g = _check_group(hq, hkv, cfg["block_m"])
    out = torch.empty_like(q)
    lse = torch.empty((bsz, hq, tq), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse.zero_()
    rows_t = 1 if window else cfg["block_m"] // g
    grid = (triton.cdiv(tq, rows_t), bsz * hkv)
    replay = (launch if plan is None else launch_replay)(
        _attn_fwd_kernel, grid, *forward_operands(q, k, v, q_pos, k_start, out, lse), scale * LOG2E, tq, tk, hkv,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], *lse.stride()[:2], q_pos.stride(0),
        window, G=g, HEAD_D=d, BLOCK_D=cfg["block_d"], BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
        ROWS_T=rows_t, WINDOWED=window > 0, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **cfg["launch"],
    )  # fmt: skip
    if plan is not None and replay is not None:  # None: a launch that cannot be replayed
        plans.keep_attention(plan, replay.taking(_fresh_positions()), forward_operands)
    return out, lse


def forward_operands(q, k, v, q_pos, k_start, out, lse) -> tuple[torch.Tensor, ...]:
    """The forward kernel's tensor arguments, in its order (the launch and its plan)."""
    return q, k, v, out, lse, q_pos, k_start


# The forward kernel's parameters for plan.cache_ints (in its order): its plan takes them anew.
_FRESH = ("Tk", "sk_b", "sk_h", "sv_b", "sv_h")


def _fresh_positions() -> tuple[int, ...]:
    """_FRESH's positions among the forward kernel's arguments after its tensors (from qk_scale on)."""
    names = _attn_fwd_kernel.arg_names
    return tuple(names.index(n) - names.index("qk_scale") for n in _FRESH)


def backward(dout, q, k, v, out, lse, q_pos, k_start, scale: float, cfg: dict | None = None, window: int = 0):
    """(dq, dk, dv): deterministic (fixed loops, one writer per element, no atomics)."""
    bsz, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    cfg = _cfg(q, cfg)
    bm, bn = cfg["bwd_block_m"], cfg["bwd_block_n"]
    g = _check_group(hq, hkv, bm)
    q, k, v, dout, out = (t.contiguous() for t in (q, k, v, dout, out))
    dq = torch.empty_like(q)
    dk = torch.zeros_like(k)  # keys before k_start (padding) get no gradient
    dv = torch.zeros_like(v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk, dv
    options = dict(num_warps=cfg["bwd_num_warps"], num_stages=cfg["bwd_num_stages"], **cfg["launch"])
    delta = torch.empty((bsz, hq, tq), dtype=torch.float32, device=q.device)
    rows = bsz * hq * tq
    launch(
        _bwd_delta_kernel, (triton.cdiv(rows, 32),), out, dout, delta, rows, HEAD_D=d, BLOCK_D=cfg["block_d"],
        BLOCK_R=32, num_warps=4, **cfg["launch"],
    )  # fmt: skip
    common = dict(G=g, HEAD_D=d, BLOCK_D=cfg["block_d"], BLOCK_M=bm, BLOCK_N=bn, WINDOWED=window > 0, **options)
    args = (q_pos, k_start, scale * LOG2E, scale, tq, tk, hkv, hq, q_pos.stride(0), window)
    launch(_attn_bwd_dkdv_kernel, (triton.cdiv(tk, bn), bsz * hkv), q, k, v, dout, lse, delta, dk, dv, *args, **common)
    rows_t = 1 if window else bm // g
    launch(_attn_bwd_dq_kernel, (triton.cdiv(tq, rows_t), bsz * hkv), q, k, v, dout, lse, delta, dq, *args,
           ROWS_T=rows_t, **common)  # fmt: skip
    return dq, dk, dv


# ---- torch.library ops --------------------------------------------------------------------------------
@torch.library.custom_op(
    "rl_kernel_fast::attention",
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor q_pos, Tensor k_start, float scale, int window) -> (Tensor, Tensor)",
)
def _attention_op(q, k, v, q_pos, k_start, scale, window):
    return forward(q, k, v, q_pos, k_start, scale, window=window)


@_attention_op.register_fake
def _(q, k, v, q_pos, k_start, scale, window):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op(
    "rl_kernel_fast::attention_backward",
    mutates_args=(),
    schema="(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor q_pos, Tensor k_start, "
    "float scale, int window) -> (Tensor, Tensor, Tensor)",
)
def _attention_backward_op(grad, q, k, v, out, lse, q_pos, k_start, scale, window):
    return backward(grad, q, k, v, out, lse, q_pos, k_start, scale, window=window)


@_attention_backward_op.register_fake
def _(grad, q, k, v, out, lse, q_pos, k_start, scale, window):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, q_pos, k_start, scale, window = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_pos, k_start)
    ctx.scale, ctx.window = scale, window


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, q_pos, k_start = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(grad_out.contiguous(), q, k, v, out, lse, q_pos, k_start, ctx.scale,
                                        ctx.window)  # fmt: skip
    return dq, dk, dv, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the public entry -----------------------------------------------------------------------------------
def attention(
    q, k, v, q_pos, k_start, scale: float | None = None, *, validate: bool = True, window: int = 0
) -> torch.Tensor:
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
    scale = d**-0.5 if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"rl_kernel.fast.attention: scale must be finite, got {scale}")
    if q_pos.dtype != torch.int64 or k_start.dtype != torch.int64:  # a cast only where needed: each is host time
        q_pos, k_start = q_pos.to(torch.int64), k_start.to(torch.int64)
    q_pos, k_start = q_pos.contiguous(), k_start.contiguous()
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if not needs_autograd(q, k, v):
        plan = None if validate or window else plans.attention_key(q, k, v, q_pos, k_start, scale)  # a decode step's
        return forward(q, k, v, q_pos, k_start, scale, plan=plan, window=window)[0]
    return _attention_op(q, k, v, q_pos, k_start, scale, window)[0]
