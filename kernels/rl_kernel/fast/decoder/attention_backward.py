"""The fast tier's attention backward (fast.decoder.attention's forward, its custom op's backward): D = rowsum(dO * O);
dK/dV one program per key tile (counted from k_start) looping over the query blocks (all of the group's heads) in a
fixed order; dQ one program per query block looping over its key tiles from the block's first key, as the forward
walks them. With a window a row sees keys from max(k_start, q - window + 1) only. No atomics: one writer per element,
the same bits run to run."""

from __future__ import annotations

import torch

from rl_kernel._triton import jit as _jit  # Triton where installed: rl_kernel.fast reports it missing on a call
from rl_kernel._triton import tl, triton
from rl_kernel.aten.ops import tree_sum
from rl_kernel.fast.decoder.attention_tiles import (
    LOG2E,
    _cfg,
    _check_group,
    _query_block,
    _rows,
    _window_class,
    spaced_blocks,
)
from rl_kernel.triton_tier import launch


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


@_jit
def _dq_tile(dq, q, do, lse, delta, k_ptr, v_ptr, kv_off, kidx, seen, hi, Tk, offs_d, d_ok, qk_scale,
             HEAD_D: tl.constexpr):  # fmt: skip
    """dq += dS @ K over one key tile (`seen`: the pairs the forward scored; a tile a row sees none of adds +0)."""
    kv_ptrs = kv_off + kidx.to(tl.int64)[:, None] * HEAD_D + offs_d[None, :]
    kv_mask = (kidx[:, None] < Tk) & (kidx[:, None] <= hi) & d_ok[None, :]
    k = tl.load(k_ptr + kv_ptrs, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + kv_ptrs, mask=kv_mask, other=0.0)
    seen = seen & (kidx[None, :] < Tk)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    p = tl.where(seen, tl.math.exp2(s - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v))
    ds = tl.where(seen, p * (dp - delta[:, None]), 0.0)
    return tl.dot(ds.to(k.dtype), k, dq)


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
    lanes,
    G: tl.constexpr,
    HEAD_D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS_T: tl.constexpr,
    WINDOWED: tl.constexpr,
):
    """One packed query block of one KV head; its key tiles from its first key in order (all contiguous); with a
    window, class by class as the forward walks them (fast.decoder.attention)."""
    b, hkv, t64, h, valid, ks, qp, on = _query_block(
        qpos_ptr, kstart_ptr, Tq, Hkv, sp_b, lanes, window, G, BLOCK_M, ROWS_T, BLOCK_N, WINDOWED
    )
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_D
    row = (b * Hq + h.to(tl.int64)) * Tq + t64
    qd_ptrs = row[:, None] * HEAD_D + offs_d[None, :]
    qd_mask = valid[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + qd_ptrs, mask=qd_mask, other=0.0)
    do = tl.load(do_ptr + qd_ptrs, mask=qd_mask, other=0.0)
    lse = tl.load(lse_ptr + row, mask=valid, other=0.0)
    delta = tl.load(delta_ptr + row, mask=valid, other=0.0)
    kv_off = (b * Hkv + hkv) * Tk * HEAD_D
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    if WINDOWED:
        first = tl.maximum(qp - window + 1, ks)
        todo = on
        while tl.max(todo.to(tl.int32), 0) > 0:  # a class of rows on one grid of key tiles at a time
            mine, base, _, _, hi = _window_class(todo, first, qp, BLOCK_N)
            for j in range(0, (hi - base + BLOCK_N) // BLOCK_N):
                kidx = base + j * BLOCK_N + tl.arange(0, BLOCK_N)
                seen = mine[:, None] & (kidx[None, :] >= first[:, None]) & (kidx[None, :] <= qp[:, None])
                dq = _dq_tile(dq, q, do, lse, delta, k_ptr, v_ptr, kv_off, kidx, seen, hi, Tk, offs_d, d_ok, qk_scale,
                              HEAD_D)  # fmt: skip
            todo = todo & ~mine
    else:
        hi = tl.max(tl.where(on, qp, ks - 1), 0)
        for j in range(0, tl.maximum(hi - ks + BLOCK_N, 0) // BLOCK_N):
            kidx = ks + j * BLOCK_N + tl.arange(0, BLOCK_N)
            seen = on[:, None] & (kidx[None, :] <= qp[:, None])
            dq = _dq_tile(dq, q, do, lse, delta, k_ptr, v_ptr, kv_off, kidx, seen, hi, Tk, offs_d, d_ok, qk_scale,
                          HEAD_D)  # fmt: skip
    tl.store(dq_ptr + qd_ptrs, (dq * scale).to(dq_ptr.dtype.element_ty), mask=qd_mask)


def backward(
    dout, q, k, v, out, lse, q_pos, k_start, scale: float, cfg: dict | None = None, window: int = 0,
    sinks: torch.Tensor | None = None,
):  # fmt: skip
    """(dq, dk, dv, dsinks): deterministic (fixed loops, one writer per element, no atomics); dsinks fp32 [Hq] (empty
    without sinks): per head, the tree over its rows of p_sink * (0 - D), p_sink = exp2(sink * log2(e) - lse)."""
    bsz, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    cfg = _cfg(q, cfg)
    bm, bn = cfg["bwd_block_m"], cfg["bwd_block_n"]
    g = _check_group(hq, hkv, bm)
    q, k, v, dout, out = (t.contiguous() for t in (q, k, v, dout, out))
    dq = torch.empty_like(q)
    dk = torch.zeros_like(k)  # keys before k_start (padding) get no gradient
    dv = torch.zeros_like(v)
    none = q.new_empty((0,), dtype=torch.float32) if sinks is None else torch.zeros_like(sinks)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk, dv, none
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
    rows_t = bm // g
    blocks, lanes = spaced_blocks(tq, rows_t, bn) if window else (triton.cdiv(tq, rows_t), 1)
    launch(_attn_bwd_dq_kernel, (blocks, bsz * hkv), q, k, v, dout, lse, delta, dq, *args, lanes, ROWS_T=rows_t,
           **common)  # fmt: skip
    return dq, dk, dv, none if sinks is None else sink_grad(sinks, lse, delta, q_pos >= k_start[:, None])


def sink_grad(sinks: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """The sinks' gradient: a sink is a key with a zero value, so each row's term is p * (0 - D) with p = exp2(sink *
    log2(e) - lse); a row that sees no key (on [B, Tq] false) has none. Per head, the tree over its rows (b, then t):
    elementwise torch and the tree's adds, the same bits run to run."""
    p = torch.exp2(sinks[None, :, None] * LOG2E - lse)
    terms = torch.where(on[:, None, :], p * (0.0 - delta), 0.0)
    return tree_sum(terms.transpose(0, 1).reshape(sinks.shape[0], -1))
