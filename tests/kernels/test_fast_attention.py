"""rl_kernel.fast.attention in Triton's interpreter (a subprocess: TRITON_INTERPRET must be set before Triton is
imported): decode rows == prefill rows (a NaN-filled cache tail ignored), a chunk of rows == those prefill rows, a
sequence alone == in a batch with other left paddings, padding rows +0.0, fp16 as bf16, the backward against float64;
and with a sliding window shorter than the rows, decode over the full cache and over a cache cut to the window ==
prefill, alone == batch, near float64, the backward near float64 and run to run."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import interpret, serve

import rl_kernel.fast as fast
from rl_kernel.bitwise import bits_equal


@pytest.mark.slow
def test_interpreter_attention() -> None:
    r = interpret(__file__, "attention")
    failed = {k: v for k, v in r.items() if v is not True}
    assert not failed, failed


@pytest.mark.slow
def test_interpreter_sliding_window() -> None:
    r = interpret(__file__, "window")
    failed = {k: v for k, v in r.items() if v is not True}
    assert len(r) == 9 and not failed, failed


@pytest.mark.slow
def test_interpreter_window_chunks_packed_where_no_window_cuts() -> None:
    r = interpret(__file__, "chunks")
    failed = {k: v for k, v in r.items() if v is not True}
    assert len(r) == 4 and not failed, failed


@pytest.mark.slow
def test_interpreter_sinks() -> None:
    r = interpret(__file__, "sinks")
    failed = {k: v for k, v in r.items() if v is not True}
    assert len(r) == 7 and not failed, failed


# ---- what the subprocess runs --------------------------------------------------------------------------
def _attn_ref(q, k, v, q_pos, k_start, scale, window: int = 0, sinks=None):
    """float64 attention; with sinks, GPT-OSS's eager form: the sink joins the row's softmax, its column dropped."""
    grp = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(grp, 1), v.double().repeat_interleave(grp, 1)
    s = q.double() @ kk.transpose(-1, -2) * scale
    j = torch.arange(k.shape[2])
    first = k_start[:, None] if not window else torch.maximum(k_start[:, None], q_pos - window + 1)
    seen = (j[None, None, :] >= first[:, :, None]) & (j[None, None, :] <= q_pos[:, :, None])
    s = s.masked_fill(~seen[:, None], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)], -1)
        return (torch.softmax(s, -1)[..., :-1] @ vv).masked_fill(~seen.any(-1)[:, None, :, None], 0.0)
    return torch.softmax(s, -1).nan_to_num(0.0) @ vv


def _check_sinks() -> dict[str, bool]:
    """Attention sinks (a logit per query head) with a 64-key window over 130-key rows, left padding 0 and 30: near
    float64 (GPT-OSS's eager form), forward and backward (the sinks' gradient included); the sinks change the bits;
    decode rows == prefill rows; a sequence alone == in the batch; the backward run to run."""
    g = torch.Generator().manual_seed(6)
    b, hq, hkv, t, d, w = 2, 4, 2, 130, 16, 64
    q, k, v, go = (torch.randn(b, h, t, d, generator=g).bfloat16() for h in (hq, hkv, hkv, hq))
    q_pos, k_start = torch.arange(t).repeat(b, 1), torch.tensor([0, 30])
    sinks = torch.tensor([0.5, 3.0, -2.0, -30.0])
    pre = fast.attention(q, k, v, q_pos, k_start, window=w, sinks=sinks)
    res = {
        "vs float64": bool((pre.double() - _attn_ref(q, k, v, q_pos, k_start, d**-0.5, w, sinks)).abs().max() < 0.03)
    }
    res["the sinks change the bits"] = not bits_equal(pre, fast.attention(q, k, v, q_pos, k_start, window=w))
    res["decode rows == prefill rows"] = all(
        bits_equal(
            fast.attention(q[:, :, r : r + 1], k, v, q_pos[:, r : r + 1], k_start, window=w, sinks=sinks),
            pre[:, :, r : r + 1],
        )
        for r in (0, 30, 93, 129)
    )
    res["sequence alone == in the batch"] = bits_equal(
        fast.attention(q[1:, :, 30:], k[1:, :, 30:], v[1:, :, 30:], q_pos[1:, :100], k_start[1:] - 30, window=w,
                       sinks=sinks),
        pre[1:, :, 30:],
    )  # fmt: skip

    def grads():
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
        fast.attention(*leaves[:3], q_pos, k_start, window=w, sinks=leaves[3]).backward(go)
        return [x.grad for x in leaves]

    got = grads()
    refs = [x.double().requires_grad_() for x in (q, k, v, sinks)]
    _attn_ref(*refs[:3], q_pos, k_start, d**-0.5, w, refs[3]).backward(go.double())
    errs = [((a.double() - r.grad).abs().max() / r.grad.abs().max()).item() for a, r in zip(got, refs, strict=True)]
    res["backward vs float64, the sinks' gradient included (rel. max err < 3%)"] = max(errs) < 0.03
    res["backward run to run"] = all(bits_equal(a, b) for a, b in zip(grads(), got, strict=True))
    res["every sink has a gradient"] = bool((got[3] != 0).all())
    return res


def _check_window() -> dict[str, bool]:
    """A sliding window (100 keys: two tiles from a row's first key) over 200-key rows, left padding 0 and 30: near
    float64; a prefill row == the same row as a decode step over the full cache and over a cache cut to the window
    (transformers' sliding-window layers), and alone == in the batch; the backward near float64, run to run, alone
    == in the batch, and dq over the cut cache == prefill. (A prefill block holds rows the window cuts and rows it
    does not, whose tiles lie on two grids.)"""
    g = torch.Generator().manual_seed(5)
    b, hq, hkv, t, d, w = 2, 4, 2, 200, 32, 100
    q, k, v = (torch.randn(b, h, t, d, generator=g).bfloat16() for h in (hq, hkv, hkv))
    q_pos, k_start = torch.arange(t).repeat(b, 1), torch.tensor([0, 30])
    pre = fast.attention(q, k, v, q_pos, k_start, window=w)
    ref = _attn_ref(q, k, v, q_pos, k_start, d**-0.5, w)
    res = {"vs float64": bool((pre.double() - ref).abs().max() < 0.03)}
    res["the window cuts keys (unwindowed rows differ)"] = not bits_equal(pre, fast.attention(q, k, v, q_pos, k_start))
    rows = (0, 30, 99, 129, 130, 150, 199)
    res["decode rows over the full cache == prefill rows"] = all(
        bits_equal(
            fast.attention(q[:, :, r : r + 1], k, v, q_pos[:, r : r + 1], k_start, window=w), pre[:, :, r : r + 1]
        )
        for r in rows
    )
    cut = []
    for r in (150, 199):  # the cache keeps the window's keys: slot r - w + 1 is its first
        lo = r - w + 1
        cut.append(fast.attention(q[:, :, r : r + 1], k[:, :, lo : r + 1], v[:, :, lo : r + 1],
                                  torch.full((b, 1), w - 1), (k_start - lo).clamp(min=0), window=w))  # fmt: skip
    res["decode rows over a cache cut to the window == prefill rows"] = bits_equal(
        torch.cat(cut, 2), pre[:, :, [150, 199]]
    )
    res["sequence alone == in the batch"] = bits_equal(
        fast.attention(q[1:, :, 30:], k[1:, :, 30:], v[1:, :, 30:], q_pos[1:, :170], k_start[1:] - 30, window=w),
        pre[1:, :, 30:],
    )
    go = torch.randn(b, hq, t, d, generator=g).bfloat16()

    def grads():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        fast.attention(*leaves, q_pos, k_start, window=w).backward(go)
        return [x.grad for x in leaves]

    got = grads()
    leaves = [x[1:, :, 30:].clone().requires_grad_() for x in (q, k, v)]
    fast.attention(*leaves, q_pos[1:, :170], k_start[1:] - 30, window=w).backward(go[1:, :, 30:])
    res["backward: sequence alone == in the batch (dq, dk, dv)"] = all(
        bits_equal(x.grad, g_[1:, :, 30:]) for x, g_ in zip(leaves, got, strict=True)
    )
    # dq's tiles are counted from the row's first key too, which is slot 0 of a cache cut to the window: every row
    # the window cuts of sequence 0, each a decode step over its own cut cache (one batch), in fp16 (whose rounding
    # of dq hides fewer tile orders than bf16's) against the prefill's dq.
    qh, kh, vh, gh = (x[:1].half() for x in (q, k, v, go))
    leaves = [x.clone().requires_grad_() for x in (qh, kh, vh)]
    fast.attention(*leaves, q_pos[:1], k_start[:1], window=w).backward(gh)
    rows = range(w - 1, t)
    row = torch.stack([qh[0, :, r : r + 1] for r in rows]).requires_grad_()
    cut_k, cut_v = (torch.stack([x[0, :, r - w + 1 : r + 1] for r in rows]) for x in (kh, vh))
    fast.attention(row, cut_k, cut_v, torch.full((len(rows), 1), w - 1), torch.zeros(len(rows), dtype=torch.long),
                   window=w).backward(torch.stack([gh[0, :, r : r + 1] for r in rows]))  # fmt: skip
    res["backward: dq of decode rows over a cache cut to the window == prefill dq"] = bits_equal(
        row.grad[:, :, 0], leaves[0].grad[0, :, w - 1 :].transpose(0, 1)
    )
    refs = [x.double().requires_grad_() for x in (q, k, v)]
    _attn_ref(*refs, q_pos, k_start, d**-0.5, w).backward(go.double())
    errs = [((a.double() - r.grad).abs().max() / r.grad.abs().max()).item() for a, r in zip(got, refs, strict=True)]
    res["backward vs float64 (rel. max err < 3%)"] = max(errs) < 0.03
    res["backward run to run"] = all(bits_equal(a, b) for a, b in zip(grads(), got, strict=True))
    return res


def _check_chunks() -> dict[str, bool]:
    """A windowed prefill whose first chunk of positions no window cuts (its blocks take runs of positions) and whose
    later chunks it cuts (positions a key tile apart), small tiles so that 300 rows make three chunks: each sampled
    row (chunk edges, the first cut rows) == that row alone as a decode step, out and dq; near float64."""
    from rl_kernel.fast.decoder import attention as fa
    from rl_kernel.fast.decoder.attention_backward import backward

    g = torch.Generator().manual_seed(7)
    b, hq, hkv, t, d, w = 2, 4, 2, 300, 32, 150
    cfg = dict(fa._cfg(torch.empty(0), None), block_m=16, block_n=16, bwd_block_m=16, bwd_block_n=16)
    chunk = cfg["block_m"] // (hq // hkv) * cfg["block_n"]  # 128 positions
    q, k, v, go = (torch.randn(b, h, t, d, generator=g).bfloat16() for h in (hq, hkv, hkv, hq))
    q_pos, k_start = torch.arange(t).repeat(b, 1), torch.tensor([0, 30])
    scale = d**-0.5
    res = {"the case: chunk 0 uncut, chunks 1 and 2 cut, in both sequences": bool(
        ((chunk - 1 - k_start) < w).all() and ((2 * chunk - 1 - k_start) >= w).all())}  # fmt: skip
    out, lse = fa.forward(q, k, v, q_pos, k_start, scale, cfg=cfg, window=w)
    dq = backward(go, q, k, v, out, lse, q_pos, k_start, scale, cfg=cfg, window=w)[0]
    rows = [0, 7, 8, 127, 128, 129, 179, 180, 255, 256, 299]  # (seq 1's first key 30: row 179 its last uncut)
    pick = [(s_, r) for s_ in range(b) for r in rows]  # each as its own sequence of one query row
    qs, gs = (torch.stack([x[s_, :, r : r + 1] for s_, r in pick]) for x in (q, go))
    ks_, vs_ = (torch.stack([x[s_] for s_, _ in pick]) for x in (k, v))
    pos, start = torch.tensor([[r] for _, r in pick]), torch.stack([k_start[s_] for s_, _ in pick])
    one, one_lse = fa.forward(qs, ks_, vs_, pos, start, scale, cfg=cfg, window=w)
    one_dq = backward(gs, qs, ks_, vs_, one, one_lse, pos, start, scale, cfg=cfg, window=w)[0]
    res["every sampled row == itself alone (out)"] = bits_equal(
        one[:, :, 0], torch.stack([out[s_, :, r] for s_, r in pick])
    )
    res["every sampled row == itself alone (dq)"] = bits_equal(
        one_dq[:, :, 0], torch.stack([dq[s_, :, r] for s_, r in pick])
    )
    ref = _attn_ref(q, k, v, q_pos, k_start, scale, w)
    res["vs float64"] = bool((out.double() - ref).abs().max() < 0.03)
    return res


def _check_attention() -> dict[str, bool]:
    g = torch.Generator().manual_seed(1)
    b, hq, hkv, t, d = 3, 4, 2, 150, 32
    q = torch.randn(b, hq, t, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, t, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, t, d, generator=g).bfloat16()
    q_pos, k_start = torch.arange(t).repeat(b, 1), torch.tensor([0, 9, 140])
    pre = fast.attention(q, k, v, q_pos, k_start)
    res = {"vs float64": bool((pre.double() - _attn_ref(q, k, v, q_pos, k_start, d**-0.5)).abs().max() < 0.03)}
    res["padding rows are +0.0"] = bool((pre[1, :, :9] == 0).all() and (pre[2, :, :140] == 0).all())
    cache = torch.full((b, hkv, t + 40, d), float("nan")).bfloat16()
    kc, vc = cache.clone(), cache.clone()
    kc[:, :, :t], vc[:, :, :t] = k, v
    rows = (0, 8, 9, 10, 72, 73, 127, 128, 139, 140, 149)
    res["decode rows (Tq=1, NaN cache tail) == prefill rows"] = all(
        bits_equal(fast.attention(q[:, :, r : r + 1], kc, vc, q_pos[:, r : r + 1], k_start), pre[:, :, r : r + 1])
        for r in rows
    )
    res["chunk of 21 rows == prefill rows"] = bits_equal(
        fast.attention(q[:, :, 60:81], kc, vc, q_pos[:, 60:81], k_start), pre[:, :, 60:81]
    )
    res["sequence alone == in the batch"] = all(
        bits_equal(
            fast.attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], q_pos[i : i + 1], k_start[i : i + 1]),
            pre[i : i + 1],
        )
        for i in range(b)
    )
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    go = torch.randn(b, hq, t, d, generator=g).bfloat16()
    fast.attention(qg, kg, vg, q_pos, k_start).backward(go)
    qr, kr, vr = (x.double().requires_grad_() for x in (q, k, v))
    _attn_ref(qr, kr, vr, q_pos, k_start, d**-0.5).backward(go.double())
    pairs = ((qg, qr), (kg, kr), (vg, vr))
    errs = [((a.grad.double() - r.grad).abs().max() / r.grad.abs().max()).item() for a, r in pairs]
    res["backward vs float64 (rel. max err < 3%)"] = max(errs) < 0.03
    half = [x.half() for x in (q, k, v)]
    pre16 = fast.attention(*half, q_pos, k_start)
    res["fp16: decode rows == prefill rows"] = all(
        bits_equal(
            fast.attention(half[0][:, :, r : r + 1], *half[1:], q_pos[:, r : r + 1], k_start), pre16[:, :, r : r + 1]
        )
        for r in (9, 73, 149)
    )
    res["keys before k_start get no gradient"] = bool(
        (kg.grad[2, :, :140] == 0).all() and (vg.grad[2, :, :140] == 0).all()
    )
    return res


if __name__ == "__main__":
    serve({"attention": _check_attention, "window": _check_window, "chunks": _check_chunks, "sinks": _check_sinks})
