"""The fast tier's tile sweep (helpers of `python -m bench fast_tier --sweep / --sweep2`): candidate tiles timed
per (N, K, M) against the vendor BLAS, to choose configs.toml's buckets; every tile must give the same bits (BLOCK_K
fixed), and the attention tiles must keep the attention checks. Rows land in RESULTS["sweep"].
"""

# ruff: noqa: B023  (the timing lambdas run inside their loop iteration)
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.fast_checks import (
    DEV,
    RESULTS,
    SHAPES,
    att,
    attention_correctness,
    attn_inputs,
    attn_ref,
    check,
    config_for,
    fast_attention,
    lin,
    queued_ms,
    same,
)

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
    launch = config_for("linear", m=1, n=1, k=1)["launch"]
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
                    "fwd_ms": queued_ms(lambda c=cfg: lin.forward_2d(x[:m], w, None, c)),
                    "dx_ms": queued_ms(lambda c=cfg: lin.grad_x_2d(dy[:m], w, c)),
                    "same_bits_fwd": same(yf, base_f), "same_bits_dx": same(yd, base_d),
                }  # fmt: skip
                RESULTS["sweep"].append(row)
            rows = [r for r in RESULTS["sweep"] if (r["n"], r["k"], r["m"]) == (n, k, m)]
            cub = queued_ms(lambda: F.linear(x[:m], w))
            cub_dx = queued_ms(lambda: dy[:m] @ w)
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
            ms = queued_ms(lambda c=cfg: lin.grad_w_2d(dy, x, c))
        except Exception as exc:
            print(f"  sweep dW {bm}x{bn}: {type(exc).__name__}")
            continue
        RESULTS["sweep"].append({"op": "dw", "tile": [bm, bn, nw, ns], "ms": ms})
        cub = queued_ms(lambda: dy.t() @ x)
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
    launch = config_for("linear", m=1, n=1, k=1)["launch"]
    g = torch.Generator(device=DEV).manual_seed(8)
    for n, k in SHAPES:
        w = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).bfloat16()
        x = torch.randn(16384, k, device=DEV, generator=g).bfloat16()
        dy = torch.randn(16384, n, device=DEV, generator=g).bfloat16()
        for m in (1, 16, 256, 4096, 16384):
            cub = queued_ms(lambda: F.linear(x[:m], w))
            res = []
            for bm, bn, bk, nw, ns, gm in FWD_EXPERIMENTS:
                cfg = dict(block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, group_m=gm, launch=launch)
                try:
                    ms = queued_ms(lambda c=cfg: lin.forward_2d(x[:m], w, None, c))
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
            ms = queued_ms(lambda c=cfg: lin.grad_w_2d(dy, x, c))
            cub = queued_ms(lambda: dy.t() @ x)
            RESULTS["sweep"].append(
                {"op": "dw2", "n": n, "k": k, "tile": [bm, bn, nw, ns], "ms": ms, "same": same(d, base)}
            )
            print(
                f"  sweep2 dW {n}x{k} M=16384 {[bm, bn, nw, ns]}: {ms:.4f} ms (cuBLAS {cub:.4f}) "
                f"same bits {same(d, base)}"
            )
    for d in (64, 256):
        q, k_, v, q_pos, k_start = attn_inputs(2, 8, 4, 300, d, [0, 37], seed=9)
        pre = fast_attention(q, k_, v, q_pos, k_start)
        dec = [
            same(fast_attention(q[:, :, r : r + 1], k_, v, q_pos[:, r : r + 1], k_start), pre[:, :, r : r + 1])
            for r in (0, 36, 37, 100, 299)
        ]
        ref = attn_ref(q, k_, v, q_pos, k_start, d**-0.5)
        err = (pre.double() - ref).abs().max().item()
        check(f"attention D={d} decode == prefill, accuracy", all(dec) and err < 0.05, f"{dec} max|err| {err:.2e}")
        qg = q.clone().requires_grad_()
        fast_attention(qg, k_, v, q_pos, k_start).sum().backward()
        check(f"attention D={d} backward runs", bool(torch.isfinite(qg.grad).all()))


ATT_TILES = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 2)]
BWD_TILES = [(64, 64, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (64, 64, 8, 2)]


def sweep_attention() -> None:
    base = config_for("attention", head_dim=128)
    pre = attn_inputs(4, 16, 8, 2048, 128, [0, 0, 0, 0], seed=3)
    dec = attn_inputs(64, 16, 8, 1, 128, [0] * 64, seed=4, cache=2048)
    dec_pos = torch.full((64, 1), 2047, device=DEV)
    for bm, bn, nw, ns in ATT_TILES:
        cfg = base | dict(block_m=bm, block_n=bn, num_warps=nw, num_stages=ns)
        try:
            ok = attention_correctness(cfg, f" tile {[bm, bn, nw, ns]}")
            tp = queued_ms(lambda c=cfg: att.forward(*pre, 128**-0.5, c))
            td = queued_ms(lambda c=cfg: att.forward(dec[0], dec[1], dec[2], dec_pos, dec[4], 128**-0.5, c))
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
            tb = queued_ms(lambda c=cfg: att.backward(go, *pre[:3], out, lse, pre[3], pre[4], 128**-0.5, c))
        except Exception as exc:
            print(f"  sweep attention bwd {[bm, bn, nw, ns]}: {type(exc).__name__} {str(exc)[:200]}")
            continue
        RESULTS["sweep"].append({"op": "attn_bwd", "tile": [bm, bn, nw, ns], "ms": tb})
        print(f"  sweep attention bwd {[bm, bn, nw, ns]}: {tb:.4f} ms", flush=True)


# ---- the persistent TMA-fed GEMM (configs.toml's tma = true) against the pointer kernel and cuBLAS ------------------
TMA_SHAPES = (
    (2048, 2048),
    (1024, 2048),
    (6144, 2048),
    (2048, 6144),
    (151936, 2048),
    (4096, 4096),
    (12288, 4096),
    (4096, 12288),
)  # fmt: skip  (Qwen3-1.7B's projections and head, then 8B's)
TMA_TILES = [(128, 256, 8, 3), (256, 128, 8, 3), (128, 256, 8, 4), (128, 128, 8, 4), (256, 128, 8, 4)]


def _tma_row(op: str, n: int, k: int, m: int, run, pinned: dict, cub: float) -> None:
    """Time the pinned config, then TMA at the pinned tile and at TMA_TILES; every variant's bits == the pinned's."""
    base = run(pinned)
    times = {"pinned": queued_ms(lambda: run(pinned))}
    ok = True
    for bm, bn, nw, ns in [(pinned["block_m"], pinned["block_n"], pinned["num_warps"], pinned["num_stages"]),
                           *TMA_TILES]:  # fmt: skip
        cfg = dict(pinned, block_m=bm, block_n=bn, num_warps=nw, num_stages=ns, tma=True)
        name = f"tma {bm}x{bn} w{nw} s{ns}"
        try:
            ok &= same(run(cfg), base)
            times[name] = queued_ms(lambda c=cfg: run(c))
        except Exception as exc:  # e.g. out of shared memory
            print(f"  {op} {n}x{k} {name}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    if len(times) == 1:
        return
    best = min((v, key) for key, v in times.items() if key != "pinned")
    RESULTS["sweep"].append({"op": f"tma {op}", "n": n, "k": k, "m": m, "ms": times, "cublas_ms": cub, "same": ok})
    check(f"tma {op} {n}x{k} M={m}: every TMA tile gives the pinned bits", ok)
    pinned_x, best_x = cub / times["pinned"], cub / best[0]
    print(f"  tma {op} {n}x{k} M={m}: cuBLAS {cub:.3f} ms; pinned {times['pinned']:.3f} ({pinned_x:.2f}x); "
          f"best {best[1]} {best[0]:.3f} ({best_x:.2f}x)", flush=True)  # fmt: skip


def sweep_tma(m: int = 8192) -> None:
    """Forward, dX and dW at the RL step's token count: the persistent TMA kernel against the pinned pointer kernel."""
    g = torch.Generator(device=DEV).manual_seed(9)
    for n, k in TMA_SHAPES:
        w = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).bfloat16()
        x = torch.randn(m, k, device=DEV, generator=g).bfloat16()
        dy = torch.randn(m, n, device=DEV, generator=g).bfloat16()
        fwd, dx = config_for("linear", m=m, n=n, k=k), config_for("linear_dx", m=m, n=k, k=n)
        _tma_row("fwd", n, k, m, lambda c: lin.forward_2d(x, w, None, c), fwd, queued_ms(lambda: F.linear(x, w)))
        _tma_row("dX", n, k, m, lambda c: lin.grad_x_2d(dy, w, c), dx, queued_ms(lambda: dy @ w))
        _tma_row("dW", n, k, m, lambda c: lin.grad_w_2d(dy, x, c), config_for("linear_dw"),
                 queued_ms(lambda: dy.t() @ x))  # fmt: skip
