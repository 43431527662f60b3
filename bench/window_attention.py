"""The fast tier's windowed attention alone, at a Mistral-7B layer's shape: stock SDPA with the window's mask against
the fast kernels, forward and forward + backward, and the fast kernels at other block heights (BLOCK_M, a speed
choice: rows never meet, so no block height moves a bit; each is checked bit for bit against the pinned one).

    python -m bench window_attention [--batch 1] [--heads 32] [--kv-heads 8] [--len 8192] [--dim 128]
                                     [--window 4096] [--pad 0] [--block-m 128,64] [--reps 10] [--json out.json]

Stock is what transformers runs for Mistral at its default (sdpa): the keys and values repeated to the query heads
and torch's scaled_dot_product_attention under a boolean [len, len] mask of the causal window. The fast kernels
take the window itself (rl_kernel.fast.decoder.attention: blocks of positions a key tile apart, class by class).
Figures: stock's time over each contender's (synced and queued medians, bench.timing); bits: each block height's
out, lse, dq, dk, dv against the pinned config's (integer views), and the pinned run against itself.
"""

from __future__ import annotations

import torch

from bench import environment, gpu_missing, parser, publish, timing
from rl_kernel.bitwise import int_view


def _differ(xs: tuple, ys: tuple) -> int:
    """Elements of the tensors xs that differ from ys's, by their bits."""
    return sum(int((int_view(a) != int_view(b)).sum()) for a, b in zip(xs, ys, strict=True))


def _inputs(args) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    b, h, kv, t, d = args.batch, args.heads, args.kv_heads, args.len, args.dim

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cuda").bfloat16()

    pos = torch.arange(t, device="cuda")
    q_pos = pos.expand(b, t).contiguous()  # each row's own key; left padding: rows before k_start see none
    k_start = torch.full((b,), args.pad, device="cuda", dtype=torch.int64)
    keys = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - args.window) & (pos[None, :] >= args.pad)
    return {"q": draw(b, h, t, d), "k": draw(b, kv, t, d), "v": draw(b, kv, t, d), "grad": draw(b, h, t, d),
            "q_pos": q_pos, "k_start": k_start, "mask": keys[None, None]}  # fmt: skip


def _stock(x: dict, rep: int, backward: bool):
    def call():
        q, k, v = (x[n].requires_grad_(backward) for n in ("q", "k", "v"))
        k2, v2 = (t.repeat_interleave(rep, dim=1) for t in (k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k2, v2, attn_mask=x["mask"])
        if backward:
            torch.autograd.grad(out, (q, k, v), x["grad"])
        return out

    return call


def _fast(x: dict, window: int, cfg: dict | None, backward: bool):
    from rl_kernel.fast.decoder import attention as fa

    scale = x["q"].shape[-1] ** -0.5
    q, k, v = (x[n].detach() for n in ("q", "k", "v"))

    def call():
        out, lse = fa.forward(q, k, v, x["q_pos"], x["k_start"], scale, cfg=cfg, window=window)
        if not backward:
            return out, lse
        return (out, lse, *fa.backward(x["grad"], q, k, v, out, lse, x["q_pos"], x["k_start"], scale, cfg=cfg,
                                       window=window))  # fmt: skip

    return call


def _height(pinned: dict, m: int) -> dict:
    """The pinned attention config at block height m (forward and dq), 4 warps below 128 rows."""
    bwd = min(m, pinned["bwd_block_m"])
    return dict(pinned, block_m=m, num_warps=pinned["num_warps"] if m >= 128 else 4, bwd_block_m=bwd,
                bwd_num_warps=pinned["bwd_num_warps"] if bwd >= 128 else 4)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = parser(__name__, __doc__)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--len", type=int, default=8192)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--pad", type=int, default=0)
    p.add_argument("--block-m", default="128,64", help="block heights of the fast forward to time (comma list)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json")
    args = p.parse_args(argv)
    if gpu_missing("window_attention"):
        return 2
    from rl_kernel.fast.configs import config_for
    from rl_kernel.triton_tier import target_of

    x = _inputs(args)
    pinned = config_for("attention", target_of(x["q"].device), head_dim=args.dim)
    heights = [int(m) for m in args.block_m.split(",")]
    cfgs = {m: _height(pinned, m) for m in heights}
    rep = args.heads // args.kv_heads
    rows, bits = [], {}
    reference = _fast(x, args.window, None, True)()
    bits["pinned run to run"] = _differ(reference, _fast(x, args.window, None, True)())
    for m, cfg in cfgs.items():
        got = _fast(x, args.window, cfg, True)()
        bits[f"block_m {m} against the pinned"] = _differ(reference, got)
    for backward in (False, True):
        fns = {"stock": _stock(x, rep, backward)} | {
            f"fast block_m {m}": _fast(x, args.window, cfg, backward) for m, cfg in cfgs.items()
        }
        times = timing.both(fns, args.reps)
        for name, t in times.items():
            rows.append({"pass": "fwd+bwd" if backward else "fwd", "contender": name, **t,
                         "speed_synced": times["stock"]["synced_s"] / t["synced_s"],
                         "speed_queued": times["stock"]["queued_s"] / t["queued_s"]})  # fmt: skip
    lines = [f"window_attention: {args.batch} x {args.heads}/{args.kv_heads} heads x {args.len} x {args.dim}, "
             f"window {args.window}, pad {args.pad} (pinned block_m {pinned['block_m']})",
             "| pass | contender | synced ms | queued ms | stock / it (synced, queued) |",
             "|---|---|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['pass']} | {r['contender']} | {r['synced_s'] * 1e3:.3f} | {r['queued_s'] * 1e3:.3f} | "
                     f"{r['speed_synced']:.2f}x, {r['speed_queued']:.2f}x |")  # fmt: skip
    lines += [f"bits: {k}: {v} differ" for k, v in bits.items()]
    publish("\n".join(lines), {"args": vars(args), "env": environment(), "rows": rows, "bits": bits}, args.json)
    return 0 if all(v == 0 for v in bits.values()) else 1
