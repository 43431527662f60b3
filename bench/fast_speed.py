"""The fast tier's speed with its pinned configs against the vendor BLAS and SDPA's flash backend (helpers of
`python -m bench fast_tier`): bench.timing's synced ("wall") and queued medians per contender and, for
decode-sized calls, a CUDA/HIP graph of 50 calls (the device's time without the host's launch path). Rows land in
RESULTS["timings"]; table() prints them, the first contender of each row being the reference.
"""

# ruff: noqa: B023  (the timing lambdas run inside their loop iteration)
from __future__ import annotations

import torch

from bench import contenders as C
from bench import timing
from bench.fast_checks import DEV, MS, REPS, RESULTS, SHAPES, attn_inputs, fast_attention, fast_linear, lin

GRAPH_CALLS = 50


def graph_ms(name: str, fn) -> float | None:
    """Milliseconds per call of a graph of GRAPH_CALLS calls of fn, replayed (queued median); None (the reason
    kept in RESULTS["graph_errors"]) when fn cannot be captured."""
    replay, why = timing.captured(fn, GRAPH_CALLS)
    if replay is None:
        RESULTS.setdefault("graph_errors", {})[name] = why
        return None
    return timing.queued({"graph": replay}, 20, warmup=1)["graph"] * 1e3 / GRAPH_CALLS


def timed(group: str, case: str, contenders: dict, flops: float | None = None, graph: bool = False) -> None:
    row: dict = {"group": group, "case": case}
    times = timing.both(contenders, REPS)
    for name, fn in contenders.items():
        row[name] = {"wall_ms": times[name]["synced_s"] * 1e3, "queued_ms": times[name]["queued_s"] * 1e3}
        if graph:
            row[name]["graph_ms"] = graph_ms(f"{group} {case} {name}", fn)
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


def speed_linear(ms=MS) -> None:
    g = torch.Generator(device=DEV).manual_seed(5)
    for n, k in SHAPES:
        w = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).bfloat16()
        x = torch.randn(max(MS), k, device=DEV, generator=g).bfloat16()
        dy = torch.randn(max(MS), n, device=DEV, generator=g).bfloat16()
        for m in ms:
            xm, dym = x[:m], dy[:m]
            fl = 2 * m * n * k
            small = m <= 256  # also time a graph of 50 calls: the device's time without the host's launch cost
            timed("linear fwd", f"N={n} K={k} M={m}", {
                "cublas": lambda: C.stock_linear(xm, w),
                "fast": lambda: fast_linear(xm, w),
                "fast_op": lambda: torch.ops.rl_kernel_fast.linear(xm, w, None),  # through the dispatcher
                "fast_kernel": lambda: lin.forward_2d(xm, w, None),  # the launch alone, no checks
            }, fl, graph=small)  # fmt: skip
            dx = {"cublas": lambda: dym @ w, "fast": lambda: lin.grad_x_2d(dym, w)}
            timed("linear dX", f"N={n} K={k} M={m}", dx, fl, graph=small)
            dw = {"cublas": lambda: dym.t() @ xm, "fast": lambda: lin.grad_w_2d(dym, xm)}
            timed("linear dW", f"N={n} K={k} M={m}", dw, fl, graph=small)


def speed_attention() -> None:
    b, hq, hkv, t, d = 4, 16, 8, 2048, 128
    q, k, v, q_pos, k_start = attn_inputs(b, hq, hkv, t, d, [0] * b, seed=6)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)  # SDPA flash gets the expanded heads
    fl = 4 * b * hq * t * t * d / 2
    timed("attn prefill", "4x2048 Hq16 Hkv8 D128 causal", {
        "sdpa_flash": lambda: C.sdpa_flash(q, kk, vv, True),
        "fast": lambda: fast_attention(q, k, v, q_pos, k_start, validate=False),
    }, fl)  # fmt: skip
    qd, kd, vd, _, ks = attn_inputs(64, hq, hkv, 1, d, [0] * 64, seed=7, cache=2048)
    kdd, vdd = kd.repeat_interleave(2, 1), vd.repeat_interleave(2, 1)
    pos = torch.full((64, 1), 2047, device=DEV)
    timed("attn decode", "64 seqs x cache 2048 Hq16 Hkv8 D128", {
        "sdpa_flash": lambda: C.sdpa_flash(qd, kdd, vdd, False),
        "fast": lambda: fast_attention(qd, kd, vd, pos, ks, validate=False),
    }, graph=True)  # fmt: skip
    qs, ks_, vs = (x.clone().requires_grad_() for x in (q, kk, vv))
    o_s = C.sdpa_flash(qs, ks_, vs, True)
    qf, kf, vf = (x.clone().requires_grad_() for x in (q, k, v))
    o_f = fast_attention(qf, kf, vf, q_pos, k_start)
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
