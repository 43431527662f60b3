"""The fast tier on one NVIDIA H200: bitwise properties, accuracy, a tile sweep and speed against cuBLAS / SDPA.

    PYTHONPATH=kernels python3 bench/fast_h200.py [--sweep] [--quick]     # JSON to $OUT/fast.json when $OUT is set

Correctness (bits compared as int16 views):
- linear: forward and dX rows at M = 1, 16, 256, 4096, 16384 (different M buckets) equal the same rows of the
  largest call; every tile of the sweep gives the same bits (BLOCK_K fixed); 20 runs equal; dW and db run to
  run; error against float64 next to cuBLAS bf16's.
- attention: decode rows (Tq = 1 over a larger cache whose unwritten slots hold NaN) == the prefill rows;
  a chunk of 37 rows == the prefill rows; a sequence alone == in a batch with other left paddings; the same
  tokens shifted by another left padding; 20 runs equal; backward run to run; error against float64.
Speed: every contender in this process, median of a host-synced loop (wall clock per call) and of
triton.testing.do_bench (queued). --sweep times candidate tiles per (N, K, M) to choose configs.toml's buckets.
"""

# ruff: noqa: B023  (the timing lambdas run inside their loop iteration)
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def _import_fast():
    """rl_kernel.fast without rl_kernel/__init__ (which loads the exact tier's compiled extension)."""
    if "rl_kernel" not in sys.modules:
        try:
            importlib.import_module("rl_kernel")
        except ImportError:
            pkg = types.ModuleType("rl_kernel")
            pkg.__path__ = [str(ROOT / "kernels" / "rl_kernel")]
            sys.modules["rl_kernel"] = pkg
    return importlib.import_module("rl_kernel.fast")


fast = _import_fast()
lin = fast.linear_kernels
att = fast.attention_kernels
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

DEV = torch.device("cuda")
MS = (1, 16, 256, 4096, 16384)
SHAPES = ((4096, 4096), (12288, 4096), (4096, 12288))
RESULTS: dict = {"checks": {}, "timings": [], "sweep": []}
FAILED: list[str] = []


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16) if t.element_size() == 2 else t.contiguous().view(torch.int32)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS["checks"][name] = {"ok": bool(ok), "detail": detail}
    if not ok:
        FAILED.append(name)
    print(f"[{'ok' if ok else 'FAIL'}] {name} {detail}", flush=True)


def wall_median(fn, n: int = 30) -> float:
    """Median milliseconds of fn() with a host sync after every call."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def queued_median(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


GRAPH_ERRORS: list[str] = []


def graph_median(fn, n: int = 50) -> float | None:
    """GPU time alone: n calls of fn captured in one CUDA graph (no host launch overhead), replayed; the median
    of 20 replays / n. None (the error kept in RESULTS) if it cannot be captured."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm: compile and allocate outside the capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                fn()
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / n)
        return statistics.median(times)
    except Exception as exc:
        GRAPH_ERRORS.append(repr(exc)[:300])
        RESULTS["graph_errors"] = GRAPH_ERRORS[:5]
        return None


def timed(group: str, case: str, contenders: dict, flops: float | None = None, graph: bool = False) -> None:
    row = {"group": group, "case": case}
    for name, fn in contenders.items():
        row[name] = {"wall_ms": wall_median(fn), "queued_ms": queued_median(fn)}
        if graph:
            row[name]["graph_ms"] = graph_median(fn)
    names = list(contenders)
    ref, ours = row[names[0]], row[names[1]]
    row["speedup_wall"] = ref["wall_ms"] / ours["wall_ms"]
    row["speedup_queued"] = ref["queued_ms"] / ours["queued_ms"]
    if flops:
        row["tflops_ours"] = flops / ours["queued_ms"] / 1e9
    if graph and ref.get("graph_ms") and ours.get("graph_ms"):
        row["speedup_graph"] = ref["graph_ms"] / ours["graph_ms"]
    RESULTS["timings"].append(row)
    print(
        f"  {group:12} {case:34} {names[0]} {ref['queued_ms']:.4f} ms  ours {ours['queued_ms']:.4f} ms  "
        f"x{row['speedup_queued']:.2f} (wall x{row['speedup_wall']:.2f}, graph x{row.get('speedup_graph', 0):.2f})",
        flush=True,
    )


# ---- linear ------------------------------------------------------------------------------------------
def linear_correctness(dtype=torch.bfloat16, shapes=(*SHAPES, (1000, 1000))) -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    for n, k in shapes:
        w = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).to(dtype)
        b = torch.randn(n, device=DEV, generator=g).to(dtype)
        x = torch.randn(max(MS), k, device=DEV, generator=g).to(dtype)
        dy = torch.randn(max(MS), n, device=DEV, generator=g).to(dtype)
        full = fast.linear(x, w, b)
        full_dx = lin.grad_x_2d(dy, w)
        bad_fwd = [m for m in (*MS, 17, 300, 1000) if not same(fast.linear(x[:m], w, b), full[:m])]
        bad_dx = [m for m in (*MS, 17, 300, 1000) if not same(lin.grad_x_2d(dy[:m], w), full_dx[:m])]
        check(f"linear fwd batch-invariant N={n} K={k} {dtype}", not bad_fwd, f"M differing from M=16384: {bad_fwd}")
        check(f"linear dX batch-invariant N={n} K={k} {dtype}", not bad_dx, f"M differing: {bad_dx}")
        # the rows of a shuffled batch: the same bits in any order
        perm = torch.randperm(4096, device=DEV, generator=g)
        check(f"linear fwd batch order N={n} K={k}", same(fast.linear(x[:4096][perm], w, b), full[:4096][perm]))
        runs = [fast.linear(x[:4096], w, b) for _ in range(20)]
        check(f"linear fwd run-to-run x20 N={n} K={k}", all(same(r, runs[0]) for r in runs))
        dws = [lin.grad_w_2d(dy[:4096], x[:4096]) for _ in range(20)]
        dbs = [lin.grad_b_2d(dy[:4096]) for _ in range(20)]
        check(
            f"linear dW/db run-to-run x20 N={n} K={k}",
            all(same(d, dws[0]) for d in dws) and all(same(d, dbs[0]) for d in dbs),
        )
        # accuracy against float64, next to cuBLAS's bf16 GEMM
        m = 256
        ref = x[:m].double() @ w.double().t() + b.double()
        ours = (full[:m].double() - ref).abs()
        cublas = (F.linear(x[:m], w, b).double() - ref).abs()
        ref_dw = dy[:4096].double().t() @ x[:4096].double()
        e_dw = (dws[0].double() - ref_dw).abs().max().item()
        c_dw = ((dy[:4096].t() @ x[:4096]).double() - ref_dw).abs().max().item()
        ref_db = dy[:4096].double().sum(0)
        e_db = (dbs[0].double() - ref_db).abs().max().item()
        detail = (
            f"fwd max|err| ours {ours.max().item():.3e} cublas {cublas.max().item():.3e}; "
            f"mean ours {ours.mean().item():.3e} cublas {cublas.mean().item():.3e}; "
            f"dW ours {e_dw:.3e} cublas {c_dw:.3e}; db {e_db:.3e}"
        )
        check(f"linear accuracy N={n} K={k}", ours.max() <= 2 * cublas.max() + 1e-6 and e_dw <= 2 * c_dw + 1e-6, detail)


def linear_autograd_and_compile() -> None:
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(300, 512, device=DEV, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(384, 512, device=DEV, generator=g) * 0.05).bfloat16().requires_grad_()
    b = torch.randn(384, device=DEV, generator=g).bfloat16().requires_grad_()
    y = fast.linear(x.view(3, 100, 512), w, b)
    gy = torch.randn_like(y)
    y.backward(gy)
    dx, dw, db = (t.grad.double() for t in (x, w, b))
    gy2 = gy.view(300, 384).double()
    refs = (gy2 @ w.detach().double(), gy2.t() @ x.detach().double(), gy2.sum(0))
    errs = [((a - r).abs().max() / r.abs().max()).item() for a, r in zip((dx, dw, db), refs, strict=True)]
    check("linear autograd dX/dW/db vs float64 (max|err| / max|ref|)", max(errs) < 0.01, f"{errs}")
    try:
        comp = torch.compile(lambda a: fast.linear(a, w.detach(), b.detach()), dynamic=True, fullgraph=True)
        xs = x.detach()
        oks = [same(comp(xs[:m]), fast.linear(xs[:m], w.detach(), b.detach())) for m in (1, 17, 300)]
        check("linear under torch.compile(dynamic) == eager bits at M=1,17,300", all(oks), str(oks))
    except Exception as exc:  # report, do not stop the bench
        check("linear under torch.compile", False, repr(exc)[:300])


# ---- attention --------------------------------------------------------------------------------------------
def attn_inputs(b, hq, hkv, t, d, pads, seed=0, cache=None):
    g = torch.Generator(device=DEV).manual_seed(seed)
    cache = cache or t
    q = torch.randn(b, hq, t, d, device=DEV, generator=g).bfloat16()
    k = torch.randn(b, hkv, cache, d, device=DEV, generator=g).bfloat16()
    v = torch.randn(b, hkv, cache, d, device=DEV, generator=g).bfloat16()
    q_pos = torch.arange(t, device=DEV).repeat(b, 1)
    k_start = torch.tensor(pads, device=DEV)
    return q, k, v, q_pos, k_start


def attn_ref(q, k, v, q_pos, k_start, scale):
    grp = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(grp, 1), v.double().repeat_interleave(grp, 1)
    s = q.double() @ kk.transpose(-1, -2) * scale
    j = torch.arange(k.shape[2], device=q.device)
    seen = (j[None, None, :] >= k_start[:, None, None]) & (j[None, None, :] <= q_pos[:, :, None])
    s = s.masked_fill(~seen[:, None], float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ vv


def attention_correctness(cfg=None, tag="") -> bool:
    b, hq, hkv, t, d = 4, 16, 8, 700, 128
    pads = [0, 5, 64, 300]
    q, k, v, q_pos, k_start = attn_inputs(b, hq, hkv, t, d, pads)
    scale = d**-0.5

    def run(q_, k_, v_, qp, ks):
        return att.forward(q_.contiguous(), k_.contiguous(), v_.contiguous(), qp.contiguous(), ks, scale, cfg)[0]

    pre = run(q, k, v, q_pos, k_start)
    # decode rows over a larger cache: slots past the prefill hold NaN (unwritten)
    big = torch.full((b, hkv, t + 100, d), float("nan"), device=DEV, dtype=torch.bfloat16)
    kc, vc = big.clone(), big.clone()
    kc[:, :, :t], vc[:, :, :t] = k, v
    rows = [0, 1, 63, 64, 65, 127, 128, 299, 300, 301, 363, 364, 365, 511, 512, 699]
    bad = [
        r for r in rows if not same(run(q[:, :, r : r + 1], kc, vc, q_pos[:, r : r + 1], k_start), pre[:, :, r : r + 1])
    ]
    ok = not bad
    check(f"attention{tag} decode rows == prefill rows (NaN past the cache fill)", not bad, f"rows differing: {bad}")
    chunk = slice(333, 370)
    c = run(q[:, :, chunk], kc, vc, q_pos[:, chunk], k_start)
    ok &= same(c, pre[:, :, chunk])
    check(f"attention{tag} chunk of 37 rows == prefill rows", same(c, pre[:, :, chunk]))
    alone = [
        same(run(q[i : i + 1], k[i : i + 1], v[i : i + 1], q_pos[i : i + 1], k_start[i : i + 1]), pre[i : i + 1])
        for i in range(b)
    ]
    ok &= all(alone)
    check(f"attention{tag} sequence alone == in the batch", all(alone), str(alone))
    # the same tokens under another left padding: sequence 1 (pad 5) shifted to pad 5 + 77
    sh = 77
    q2, k2, v2 = (torch.zeros(1, x.shape[1], t + sh, d, device=DEV, dtype=x.dtype) for x in (q, k, v))
    q2[:, :, sh:], k2[:, :, sh:], v2[:, :, sh:] = q[1:2], k[1:2], v[1:2]
    o2 = run(q2, k2, v2, torch.arange(t + sh, device=DEV)[None], k_start[1:2] + sh)
    shifted = same(o2[:, :, sh + 5 :], pre[1:2, :, 5:])
    ok &= shifted
    check(f"attention{tag} same tokens under another left padding", shifted)
    if cfg is not None:
        return ok
    runs = [run(q, k, v, q_pos, k_start) for _ in range(20)]
    check("attention fwd run-to-run x20", all(same(r, pre) for r in runs))
    pad_rows = all(bool((pre[i, :, : pads[i]] == 0).all()) for i in range(b))
    check("attention padding rows are +0.0", pad_rows)
    ref = attn_ref(q, k, v, q_pos, k_start, scale)
    ours = (pre.double() - ref).abs().max().item()
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    j = torch.arange(t, device=DEV)
    mask = (j[None, None, :] >= k_start[:, None, None]) & (j[None, None, :] <= q_pos[:, :, None])
    sdpa = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask[:, None]).nan_to_num(0.0)
    live = mask.any(-1)[:, None, :, None]
    e_sdpa = ((sdpa.double() - ref).abs() * live).max().item()
    check(
        "attention fwd accuracy vs float64",
        ours <= 2 * e_sdpa + 1e-3,
        f"max|err| ours {ours:.3e} sdpa(bf16) {e_sdpa:.3e}",
    )
    # backward: deterministic and close to float64
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    o = fast.attention(qg, kg, vg, q_pos, k_start)
    go = torch.randn_like(o)
    grads = [torch.autograd.grad(o, (qg, kg, vg), go, retain_graph=True) for _ in range(5)]
    check(
        "attention backward run-to-run x5",
        all(all(same(a, b_) for a, b_ in zip(gr, grads[0], strict=True)) for gr in grads),
    )
    qr, kr, vr = (x.double().requires_grad_() for x in (q, k, v))
    rr = attn_ref(qr, kr, vr, q_pos, k_start, scale)
    rg = torch.autograd.grad(rr, (qr, kr, vr), go.double())
    errs = [((a.double() - r).abs().max() / r.abs().max()).item() for a, r in zip(grads[0], rg, strict=True)]
    check(
        "attention backward vs float64 (max|err| / max|ref|)",
        max(errs) < 0.03,
        f"dq dk dv {[f'{e:.2e}' for e in errs]}",
    )
    return ok


# ---- sweep: candidate tiles (bits must not change with the tile; speed per M) --------------------------------
LIN_TILES = [
    (64, 32, 4, 6),
    (64, 64, 4, 6),
    (64, 128, 4, 4),
    (64, 256, 4, 3),
    (128, 64, 4, 4),
    (128, 128, 4, 4),
    (128, 128, 8, 4),
    (128, 256, 8, 3),
    (256, 128, 8, 3),
]


def sweep_linear() -> None:
    g = torch.Generator(device=DEV).manual_seed(2)
    launch = fast.config_for("linear", "sm_90", m=1, n=1, k=1)["launch"]
    for n, k in SHAPES:
        w = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).bfloat16()
        x = torch.randn(16384, k, device=DEV, generator=g).bfloat16()
        dy = torch.randn(16384, n, device=DEV, generator=g).bfloat16()
        for m in (1, 16, 64, 256, 1024, 4096, 16384):
            base_f = base_d = None
            for bm, bn, nw, ns in LIN_TILES:
                cfg = dict(block_m=bm, block_n=bn, block_k=64, num_warps=nw, num_stages=ns, group_m=8, launch=launch)
                try:
                    yf = lin.forward_2d(x[:m], w, None, cfg)
                    yd = lin.grad_x_2d(dy[:m], w, cfg)
                except Exception as exc:  # e.g. out of shared memory
                    print(f"  sweep {n}x{k} M={m} {bm}x{bn} w{nw} s{ns}: {type(exc).__name__}", flush=True)
                    continue
                base_f = yf if base_f is None else base_f
                base_d = yd if base_d is None else base_d
                row = {
                    "n": n, "k": k, "m": m, "tile": [bm, bn, nw, ns],
                    "fwd_ms": queued_median(lambda c=cfg: lin.forward_2d(x[:m], w, None, c)),
                    "dx_ms": queued_median(lambda c=cfg: lin.grad_x_2d(dy[:m], w, c)),
                    "same_bits_fwd": same(yf, base_f), "same_bits_dx": same(yd, base_d),
                }  # fmt: skip
                RESULTS["sweep"].append(row)
            rows = [r for r in RESULTS["sweep"] if (r["n"], r["k"], r["m"]) == (n, k, m)]
            cub = queued_median(lambda: F.linear(x[:m], w))
            cub_dx = queued_median(lambda: dy[:m] @ w)
            bf = min(rows, key=lambda r: r["fwd_ms"])
            bd = min(rows, key=lambda r: r["dx_ms"])
            allsame = all(r["same_bits_fwd"] and r["same_bits_dx"] for r in rows)
            check(f"sweep {n}x{k} M={m}: every tile gives the same bits", allsame)
            print(
                f"  sweep {n}x{k} M={m}: fwd best {bf['tile']} {bf['fwd_ms']:.4f} ms (cuBLAS {cub:.4f}); "
                f"dX best {bd['tile']} {bd['dx_ms']:.4f} ms (cuBLAS {cub_dx:.4f})",
                flush=True,
            )
    for bm, bn, nw, ns in ((128, 128, 8, 4), (128, 256, 8, 3), (256, 128, 8, 3), (128, 128, 4, 4)):
        cfg = dict(block_m=bm, block_n=bn, block_k=64, num_warps=nw, num_stages=ns, group_m=8, launch=launch)
        n, k = 4096, 4096
        w = torch.randn(n, k, device=DEV).bfloat16()
        x = torch.randn(16384, k, device=DEV).bfloat16()
        dy = torch.randn(16384, n, device=DEV).bfloat16()
        try:
            ms = queued_median(lambda c=cfg: lin.grad_w_2d(dy, x, c))
        except Exception as exc:
            print(f"  sweep dW {bm}x{bn}: {type(exc).__name__}")
            continue
        RESULTS["sweep"].append({"op": "dw", "tile": [bm, bn, nw, ns], "ms": ms})
        cub = queued_median(lambda: dy.t() @ x)
        print(f"  sweep dW 4096x4096 M=16384 {[bm, bn, nw, ns]}: {ms:.4f} ms (cuBLAS {cub:.4f})")


FWD_EXPERIMENTS = [  # (block_m, block_n, block_k, warps, stages, group_m): BLOCK_K=128 would be pinned for all M
    (256, 128, 64, 8, 3, 8),
    (256, 128, 64, 8, 4, 8),
    (256, 128, 64, 8, 3, 16),
    (128, 256, 64, 8, 3, 8),
    (256, 128, 128, 8, 2, 8),
    (128, 256, 128, 8, 2, 8),
    (128, 128, 128, 8, 3, 8),
    (64, 64, 128, 4, 4, 8),
    (64, 32, 64, 4, 6, 8),
    (64, 32, 128, 4, 4, 8),
]
DW_TILES = [(256, 128, 8, 3), (128, 256, 8, 3), (128, 128, 8, 4), (64, 64, 4, 6), (128, 64, 4, 4)]


def sweep2() -> None:
    """Forward tiles at large and small M (BLOCK_K 64 vs 128), dW tiles, head dims 64 and 256."""
    launch = fast.config_for("linear", "sm_90", m=1, n=1, k=1)["launch"]
    g = torch.Generator(device=DEV).manual_seed(8)
    for n, k in SHAPES:
        w = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).bfloat16()
        x = torch.randn(16384, k, device=DEV, generator=g).bfloat16()
        dy = torch.randn(16384, n, device=DEV, generator=g).bfloat16()
        for m in (1, 16, 256, 4096, 16384):
            cub = queued_median(lambda: F.linear(x[:m], w))
            res = []
            for bm, bn, bk, nw, ns, gm in FWD_EXPERIMENTS:
                cfg = dict(block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, group_m=gm, launch=launch)
                try:
                    ms = queued_median(lambda c=cfg: lin.forward_2d(x[:m], w, None, c))
                except Exception as exc:
                    print(f"  fwd {[bm, bn, bk, nw, ns, gm]}: {type(exc).__name__}")
                    continue
                res.append((ms, [bm, bn, bk, nw, ns, gm]))
                RESULTS["sweep"].append(
                    {"op": "fwd2", "n": n, "k": k, "m": m, "tile": [bm, bn, bk, nw, ns, gm], "ms": ms}
                )
            res.sort()
            print(f"  sweep2 fwd {n}x{k} M={m}: cuBLAS {cub:.4f}; best {[(round(a, 4), t) for a, t in res[:3]]}")
        base = None
        for bm, bn, nw, ns in DW_TILES:
            cfg = dict(block_m=bm, block_n=bn, block_k=64, num_warps=nw, num_stages=ns, group_m=8, launch=launch)
            d = lin.grad_w_2d(dy[:4096], x[:4096], cfg)
            base = d if base is None else base
            ms = queued_median(lambda c=cfg: lin.grad_w_2d(dy, x, c))
            cub = queued_median(lambda: dy.t() @ x)
            RESULTS["sweep"].append(
                {"op": "dw2", "n": n, "k": k, "tile": [bm, bn, nw, ns], "ms": ms, "same": same(d, base)}
            )
            print(
                f"  sweep2 dW {n}x{k} M=16384 {[bm, bn, nw, ns]}: {ms:.4f} ms (cuBLAS {cub:.4f}) "
                f"same bits {same(d, base)}"
            )
    for d in (64, 256):
        q, k_, v, q_pos, k_start = attn_inputs(2, 8, 4, 300, d, [0, 37], seed=9)
        pre = fast.attention(q, k_, v, q_pos, k_start)
        dec = [
            same(fast.attention(q[:, :, r : r + 1], k_, v, q_pos[:, r : r + 1], k_start), pre[:, :, r : r + 1])
            for r in (0, 36, 37, 100, 299)
        ]
        ref = attn_ref(q, k_, v, q_pos, k_start, d**-0.5)
        err = (pre.double() - ref).abs().max().item()
        check(f"attention D={d} decode == prefill, accuracy", all(dec) and err < 0.05, f"{dec} max|err| {err:.2e}")
        qg = q.clone().requires_grad_()
        fast.attention(qg, k_, v, q_pos, k_start).sum().backward()
        check(f"attention D={d} backward runs", bool(torch.isfinite(qg.grad).all()))


ATT_TILES = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 2)]
BWD_TILES = [(64, 64, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (64, 64, 8, 2)]


def sweep_attention() -> None:
    base = fast.config_for("attention", "sm_90", head_dim=128)
    pre = attn_inputs(4, 16, 8, 2048, 128, [0, 0, 0, 0], seed=3)
    dec = attn_inputs(64, 16, 8, 1, 128, [0] * 64, seed=4, cache=2048)
    dec_pos = torch.full((64, 1), 2047, device=DEV)
    for bm, bn, nw, ns in ATT_TILES:
        cfg = base | dict(block_m=bm, block_n=bn, num_warps=nw, num_stages=ns)
        try:
            ok = attention_correctness(cfg, f" tile {[bm, bn, nw, ns]}")
            tp = queued_median(lambda c=cfg: att.forward(*pre, 128**-0.5, c))
            td = queued_median(lambda c=cfg: att.forward(dec[0], dec[1], dec[2], dec_pos, dec[4], 128**-0.5, c))
        except Exception as exc:
            print(f"  sweep attention {[bm, bn, nw, ns]}: {type(exc).__name__} {str(exc)[:200]}")
            continue
        RESULTS["sweep"].append(
            {"op": "attn_fwd", "tile": [bm, bn, nw, ns], "prefill_ms": tp, "decode_ms": td, "invariant": ok}
        )
        print(
            f"  sweep attention fwd {[bm, bn, nw, ns]}: prefill {tp:.4f} ms decode {td:.4f} ms invariant {ok}",
            flush=True,
        )
    out, lse = att.forward(*pre, 128**-0.5)
    go = torch.randn_like(out)
    for bm, bn, nw, ns in BWD_TILES:
        cfg = base | dict(bwd_block_m=bm, bwd_block_n=bn, bwd_num_warps=nw, bwd_num_stages=ns)
        try:
            tb = queued_median(lambda c=cfg: att.backward(go, *pre[:3], out, lse, pre[3], pre[4], 128**-0.5, c))
        except Exception as exc:
            print(f"  sweep attention bwd {[bm, bn, nw, ns]}: {type(exc).__name__} {str(exc)[:200]}")
            continue
        RESULTS["sweep"].append({"op": "attn_bwd", "tile": [bm, bn, nw, ns], "ms": tb})
        print(f"  sweep attention bwd {[bm, bn, nw, ns]}: {tb:.4f} ms", flush=True)


# ---- speed with the pinned configs ----------------------------------------------------------------------
def speed_linear(ms=MS) -> None:
    g = torch.Generator(device=DEV).manual_seed(5)
    for n, k in SHAPES:
        w = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).bfloat16()
        x = torch.randn(max(MS), k, device=DEV, generator=g).bfloat16()
        dy = torch.randn(max(MS), n, device=DEV, generator=g).bfloat16()
        for m in ms:
            xm, dym = x[:m], dy[:m]
            fl = 2 * m * n * k
            small = m <= 256  # also time a CUDA graph of 50 calls: GPU time without the host's launch cost
            timed("linear fwd", f"N={n} K={k} M={m}", {
                "cublas": lambda: F.linear(xm, w),
                "fast": lambda: fast.linear(xm, w),
                "fast_op": lambda: torch.ops.rl_kernel_fast.linear(xm, w, None),  # through the dispatcher
                "fast_kernel": lambda: lin.forward_2d(xm, w, None),  # the launch alone, no checks
            }, fl, graph=small)  # fmt: skip
            dx = {"cublas": lambda: dym @ w, "fast": lambda: lin.grad_x_2d(dym, w)}
            timed("linear dX", f"N={n} K={k} M={m}", dx, fl, graph=small)
            dw = {"cublas": lambda: dym.t() @ xm, "fast": lambda: lin.grad_w_2d(dym, xm)}
            timed("linear dW", f"N={n} K={k} M={m}", dw, fl, graph=small)


def _sdpa_flash(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def speed_attention() -> None:
    b, hq, hkv, t, d = 4, 16, 8, 2048, 128
    q, k, v, q_pos, k_start = attn_inputs(b, hq, hkv, t, d, [0] * b, seed=6)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)  # SDPA flash gets the expanded heads
    fl = 4 * b * hq * t * t * d / 2
    timed("attn prefill", "4x2048 Hq16 Hkv8 D128 causal", {
        "sdpa_flash": lambda: _sdpa_flash(q, kk, vv, True),
        "fast": lambda: fast.attention(q, k, v, q_pos, k_start, validate=False),
    }, fl)  # fmt: skip
    qd, kd, vd, _, ks = attn_inputs(64, hq, hkv, 1, d, [0] * 64, seed=7, cache=2048)
    kdd, vdd = kd.repeat_interleave(2, 1), vd.repeat_interleave(2, 1)
    pos = torch.full((64, 1), 2047, device=DEV)
    timed("attn decode", "64 seqs x cache 2048 Hq16 Hkv8 D128", {
        "sdpa_flash": lambda: _sdpa_flash(qd, kdd, vdd, False),
        "fast": lambda: fast.attention(qd, kd, vd, pos, ks, validate=False),
    }, graph=True)  # fmt: skip
    qs, ks_, vs = (x.clone().requires_grad_() for x in (q, kk, vv))
    o_s = _sdpa_flash(qs, ks_, vs, True)
    qf, kf, vf = (x.clone().requires_grad_() for x in (q, k, v))
    o_f = fast.attention(qf, kf, vf, q_pos, k_start)
    go = torch.randn_like(o_f)
    timed("attn backward", "4x2048 Hq16 Hkv8 D128 causal", {
        "sdpa_flash": lambda: torch.autograd.grad(o_s, (qs, ks_, vs), go, retain_graph=True),
        "fast": lambda: torch.autograd.grad(o_f, (qf, kf, vf), go, retain_graph=True),
    }, 2.5 * fl)  # fmt: skip


def table() -> str:
    lines = [
        f"{'group':14} {'case':36} {'ref ms':>9} {'fast ms':>9} {'x(q)':>6} {'x(wall)':>7} "
        f"{'x(graph)':>8} {'TFLOPS':>7}"
    ]
    for r in RESULTS["timings"]:
        ref = next(k for k in r if k not in ("group", "case", "fast") and isinstance(r[k], dict))
        lines.append(
            f"{r['group']:14} {r['case']:36} {r[ref]['queued_ms']:9.4f} {r['fast']['queued_ms']:9.4f} "
            f"{r['speedup_queued']:6.2f} {r['speedup_wall']:7.2f} {r.get('speedup_graph', 0):8.2f} "
            f"{r.get('tflops_ours', 0):7.1f}"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true", help="time candidate tiles (chooses configs.toml's buckets)")
    p.add_argument("--sweep2", action="store_true", help="forward BLOCK_K 64/128 tiles, dW tiles, D=64/256")
    p.add_argument("--no-speed", action="store_true")
    p.add_argument("--small", action="store_true", help="only the linear's speed at M = 1, 16, 256 (no checks)")
    args = p.parse_args()
    RESULTS["env"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "target": fast.target_of(DEV),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
    }
    print(RESULTS["env"], flush=True)
    t0 = time.time()
    if args.small:
        speed_linear((1, 16, 64, 256))
        print(table())
        print("graph errors:", GRAPH_ERRORS[:3])
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "fast_small.json").write_text(json.dumps(RESULTS, indent=1))
        return 0
    linear_correctness()
    linear_correctness(torch.float16, ((4096, 4096),))
    linear_autograd_and_compile()
    attention_correctness()
    print(f"correctness: {time.time() - t0:.0f} s", flush=True)
    if args.sweep:
        sweep_linear()
        sweep_attention()
        print(f"sweep done: {time.time() - t0:.0f} s", flush=True)
    if args.sweep2:
        sweep2()
        print(f"sweep2 done: {time.time() - t0:.0f} s", flush=True)
    if not args.no_speed:
        speed_linear()
        speed_attention()
    RESULTS["failed"] = FAILED
    print(table())
    print(f"FAILED checks: {FAILED}" if FAILED else "all checks passed", f"({time.time() - t0:.0f} s)")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "fast.json").write_text(json.dumps(RESULTS, indent=1))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
