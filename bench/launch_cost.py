"""What one call of each decoder operator costs the host at a decode size, stock against the tiers.

    python -m bench launch_cost [--batch 32] [--cache 300] [--reps 300] [--json out.json]

An eager decode step launches every layer's operators from Python, so its time is the host's when the device's
work is small (bench.profile_rollout says when). Here, at the Qwen3-1.7B shape's sizes for --batch sequences of one
token (--cache keys in the cache): for each operator, stock PyTorch (what transformers runs), the tier's public
operator (argument checks, autograd, the dispatcher; a fast linear or attention repeated with operands of one layout
takes its plan, fast.decoder.plan, and once more with every plan forgotten; the attention also with a cache a key
longer each call, as a DynamicCache gives it) and the bare kernel call under it (the exact
tier's registered op; the fast tier's launch without its wrapper), plus the launch paths' floors: an empty torch op
and an empty Triton kernel (Triton's launch, and rl_kernel's kept launch, triton_tier.launch). Each figure is
bench.timing's host time (a sync before each call, none after: the launch path alone) and its queued device time,
medians of --reps calls.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from bench import contenders as C
from bench import environment, gpu_missing, parser, timing


def _empty_triton() -> dict:
    """An empty Triton kernel (one program that stores one value): Triton's launch, and rl_kernel's kept launch."""
    import triton
    import triton.language as tl

    from rl_kernel.triton_tier import launch

    @triton.jit
    def _store_one(out_ptr):
        tl.store(out_ptr, 1.0)

    out = torch.empty(1, device="cuda")
    return {
        "empty Triton kernel": lambda: _store_one[(1,)](out),
        "empty Triton kernel, kept launch": lambda: launch(_store_one, (1,), out),
    }


def _cycle(items: list) -> Iterator:
    while True:
        yield from items


def _attend(attention: Any, q: torch.Tensor, kv_pos: tuple, k_start: torch.Tensor) -> Any:
    """attention(q, k, k, q_pos, k_start) with the next (cache, q_pos) of a growing cache."""
    k, q_pos = kv_pos
    return attention(q, k, k, q_pos, k_start)


def _stock_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers' Qwen3RMSNorm.forward."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _stock_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one tensor (rotate_half)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def contenders(batch: int, cache: int) -> dict[str, dict]:
    """operator -> {contender: call} at the 1.7B shape: hidden 2048, 16 / 8 heads of 128, MLP 6144."""
    from rl_kernel.fast.configs import config_for
    from rl_kernel.fast.decoder import attention as fast_attention
    from rl_kernel.fast.decoder import group as fast_group
    from rl_kernel.fast.decoder import linear as fast_linear
    from rl_kernel.fast.decoder import plan as fast_plan
    from rl_kernel.triton_tier import target_of

    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(batch, 1, 2048, device=dev, dtype=bf)
    w = torch.randn(2048, 2048, device=dev, dtype=bf) * 0.02
    norm_w = torch.ones(2048, device=dev, dtype=bf)
    q = torch.randn(batch, 16, 1, 128, device=dev, dtype=bf)
    k = torch.randn(batch, 8, cache, 128, device=dev, dtype=bf)
    v = torch.randn_like(k)
    q_pos = torch.full((batch, 1), cache - 1, device=dev, dtype=torch.long)
    k_start = torch.zeros(batch, device=dev, dtype=torch.long)
    cos32 = torch.rand(batch, 1, 64, device=dev)
    cos_hf = torch.cat([cos32, cos32], -1)[:, None].to(bf)
    gate, up = torch.randn(batch, 1, 6144, device=dev, dtype=bf), torch.randn(batch, 1, 6144, device=dev, dtype=bf)
    w_gate, w_up = (torch.randn(6144, 2048, device=dev, dtype=bf) * 0.02 for _ in range(2))
    x2, pair = x.view(batch, 2048), (w_gate, w_up)
    cfg = config_for("linear", target_of(x.device), m=batch, n=6144, k=2048)
    # A decode step's cache grows by one key per step: the attention called with the next key count each time.
    k_long = torch.randn(batch, 8, cache + 64, 128, device=dev, dtype=bf)
    steps = [(k_long[:, :, : cache + i], torch.full_like(q_pos, cache + i - 1)) for i in range(64)]
    growing = _cycle(steps)
    # ... and as a DynamicCache gives it: a new contiguous tensor each step (what an attention plan takes).
    cat = _cycle([(k.contiguous(), pos) for k, pos in steps])
    reg = {n: C.registered_op(n) for n in ("rms_norm", "rotary", "silu_mul")}
    fast = {n: C.tier_op("fast", n) for n in ("linear", "rms_norm", "rotary", "silu_mul", "attention")}
    forward = functools.partial(fast_attention.forward, scale=128**-0.5)
    public = functools.partial(fast["attention"], validate=False)
    return {
        "launch floor": {"empty torch op (zero_)": lambda: q_pos.zero_(), **_empty_triton()},
        "linear 2048x2048": {
            "stock F.linear": lambda: F.linear(x, w),
            "fast linear (public; its plan)": lambda: fast["linear"](x, w),
            "fast linear (public), no plan": lambda: (fast_plan.clear(), fast["linear"](x, w)),
            "fast forward_2d (no wrapper)": lambda: fast_linear.forward_2d(x.view(batch, 2048), w, None),
        },
        "gate + up 2048 -> 6144": {
            "stock: two F.linear": lambda: (F.linear(x, w_gate), F.linear(x, w_up)),
            "fast: two linears (public; their plans)": lambda: (fast["linear"](x, w_gate), fast["linear"](x, w_up)),
            "fast linear_group (public; configs.toml's group; its plan)": lambda: fast["linear"].group(
                x, pair, (None, None)
            ),
            "fast forward_group_2d, grouped": lambda: fast_group.forward_group_2d(x2, pair, (None, None), cfg=cfg),
        },
        "rms_norm 2048": {
            "stock (transformers)": lambda: _stock_rms_norm(x, norm_w),
            "fast rms_norm (public)": lambda: fast["rms_norm"](x, norm_w, 1e-6),
            "registered op": lambda: reg["rms_norm"](x, norm_w, 1e-6),
        },
        "rotary q": {
            "stock (rotate_half)": lambda: _stock_rotary(q, cos_hf, cos_hf),
            "fast rotary (public)": lambda: fast["rotary"](q, cos32, cos32),
            "registered op": lambda: reg["rotary"](q, cos32, cos32),
        },
        "silu_mul 6144": {
            "stock F.silu(g) * u": lambda: F.silu(gate) * up,
            "fast silu_mul (public)": lambda: fast["silu_mul"](gate, up),
            "registered op": lambda: reg["silu_mul"](gate, up),
        },
        f"attention decode ({cache} keys)": {
            "stock SDPA (GQA)": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            "fast attention (public; its plan)": lambda: fast["attention"](q, k, v, q_pos, k_start, validate=False),
            "fast attention (public), no plan": lambda: (
                fast_plan.clear(),
                fast["attention"](q, k, v, q_pos, k_start, validate=False),
            ),
            "fast attention (public; plans), one key more each call": lambda: _attend(public, q, next(cat), k_start),
            "fast forward (no wrapper)": lambda: fast_attention.forward(q, k, v, q_pos, k_start, 128**-0.5),
            "fast forward, one key more each call": lambda: _attend(forward, q, next(growing), k_start),
        },
    }


def linear_steps(batch: int) -> dict[str, dict]:
    """The fast linear's host path at a decode size, one step at a time: where its time over F.linear goes."""
    from rl_kernel import triton_tier
    from rl_kernel.fast.configs import config_for
    from rl_kernel.fast.decoder import linear as fast_linear

    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(batch, 2048, device=dev, dtype=bf)
    w = torch.randn(2048, 2048, device=dev, dtype=bf) * 0.02
    c = torch.empty(batch, 2048, device=dev, dtype=bf)
    cfg = config_for("linear", triton_tier.target_of(x.device), m=batch, n=2048, k=2048)
    grid = ((batch + cfg["block_m"] - 1) // cfg["block_m"] * (2048 // cfg["block_n"]),)
    args = (x, w, c, c, batch, 2048, 2048, 2048, 1, 1, 2048, 2048, 1)
    kw = dict(HAS_BIAS=False, ACCUMULATE=False, EVEN_K=True, BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"],
              BLOCK_K=cfg["block_k"], GROUP_M=cfg["group_m"], num_warps=cfg["num_warps"],
              num_stages=cfg["num_stages"], **cfg["launch"])  # fmt: skip
    kernel, target_of, n = fast_linear._gemm_kernel, triton_tier.target_of, 2048
    values = (*args, *(kw[n] for n in kernel.arg_names[len(args) :]))
    return {
        "fast linear, step by step": {
            "check_tensors": lambda: triton_tier.check_tensors("fast", "linear", x=x, weight=w, bias=None),
            "target_of + config_for": lambda: config_for("linear", target_of(x.device), m=batch, n=n, k=n),
            "torch.empty of the output": lambda: torch.empty((batch, 2048), dtype=bf, device=x.device),
            "the kept launch's key": lambda: triton_tier._flatten(values, triton_tier._constexprs(kernel)),
            "GEMM, Triton's launch": lambda: kernel[grid](*args, **kw),
            "GEMM, kept launch": lambda: triton_tier.launch(kernel, grid, *args, **kw),
            "forward_2d": lambda: fast_linear.forward_2d(x, w, None),
        }
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cache", type=int, default=300)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if gpu_missing("launch_cost"):
        return 2
    record: dict = {"args": vars(args), "environment": environment(), "ops": {}}
    print(f"{'operator':34} {'contender':32} {'host us':>8} {'device us':>10}")
    with torch.no_grad():
        for op, fns in (contenders(args.batch, args.cache) | linear_steps(args.batch)).items():
            host = timing.host(fns, args.reps)
            device = timing.queued(fns, args.reps)
            record["ops"][op] = {k: {"host_us": host[k] * 1e6, "device_us": device[k] * 1e6} for k in fns}
            for k, r in record["ops"][op].items():
                print(f"{op:34} {k:32} {r['host_us']:8.1f} {r['device_us']:10.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0
