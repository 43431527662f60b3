"""The fast tier's bitwise and accuracy checks (helpers of `python -m bench fast_tier`), bits as integer views:

- linear: forward and dX rows at M = 1, 16, 256, 4096, 16384 (different M buckets) equal the same rows of the
  largest call; shuffled batch order; 20 runs equal; dW and db run to run; error against float64 next to the
  vendor BLAS's bf16 GEMM; autograd against float64; torch.compile(dynamic) == eager bits.
- attention: decode rows (Tq = 1 over a larger cache whose unwritten slots hold NaN) == the prefill rows; a chunk
  of 37 rows == the prefill rows; a sequence alone == in a batch with other left paddings; the same tokens
  shifted by another left padding; 20 runs equal; backward run to run; error against float64.
Every check lands in RESULTS["checks"] (a failed one in FAILED too). The operators come from the fast tier
through rl_kernel.tiers (bench.contenders.tier_op); the kernels' own launchers (forward_2d, grad_x_2d, ...) from
rl_kernel.fast, which the tile sweep (bench.fast_sweep) calls with candidate configs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench import contenders as C
from bench import timing
from rl_kernel import fast
from rl_kernel.fast import configs
from rl_kernel.tiers import target_of

lin = fast.linear_kernels
att = fast.attention_kernels
DEV = torch.device("cuda")
MS = (1, 16, 256, 4096, 16384)
SHAPES = ((4096, 4096), (12288, 4096), (4096, 12288))
REPS = 50  # timed calls per contender (bench.timing medians)
RESULTS: dict = {"checks": {}, "timings": [], "sweep": []}
FAILED: list[str] = []


# The fast tier's operators through rl_kernel.tiers, looked up once (a control under $RL_KERNEL_CONTROL replaces
# them); the kernels' own launchers (lin, att) take a candidate config.
fast_linear = C.tier_op("fast", "linear")
fast_attention = C.tier_op("fast", "attention")


def target() -> str:
    """This GPU's target (sm_90, gfx942, ...): the key of the fast tier's pinned configs."""
    return target_of(DEV)


def config_for(op: str, **dims: int) -> dict:
    """The pinned launch config of one call on this GPU's target (rl_kernel.fast.configs.config_for), a copy."""
    return dict(configs.config_for(op, target(), **dims))


def queued_ms(fn) -> float:
    """bench.timing's queued median of fn, in milliseconds."""
    return timing.queued({"fn": fn}, REPS)["fn"] * 1e3


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16) if t.element_size() == 2 else t.contiguous().view(torch.int32)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS["checks"][name] = {"ok": bool(ok), "detail": detail}
    if not ok:
        FAILED.append(name)
    print(f"[{'ok' if ok else 'FAIL'}] {name} {detail}", flush=True)


# ---- linear ------------------------------------------------------------------------------------------
def linear_correctness(dtype=torch.bfloat16, shapes=(*SHAPES, (1000, 1000))) -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    for n, k in shapes:
        w = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).to(dtype)
        b = torch.randn(n, device=DEV, generator=g).to(dtype)
        x = torch.randn(max(MS), k, device=DEV, generator=g).to(dtype)
        dy = torch.randn(max(MS), n, device=DEV, generator=g).to(dtype)
        full = fast_linear(x, w, b)
        full_dx = lin.grad_x_2d(dy, w)
        bad_fwd = [m for m in (*MS, 17, 300, 1000) if not same(fast_linear(x[:m], w, b), full[:m])]
        bad_dx = [m for m in (*MS, 17, 300, 1000) if not same(lin.grad_x_2d(dy[:m], w), full_dx[:m])]
        check(f"linear fwd batch-invariant N={n} K={k} {dtype}", not bad_fwd, f"M differing from M=16384: {bad_fwd}")
        check(f"linear dX batch-invariant N={n} K={k} {dtype}", not bad_dx, f"M differing: {bad_dx}")
        # the rows of a shuffled batch: the same bits in any order
        perm = torch.randperm(4096, device=DEV, generator=g)
        check(f"linear fwd batch order N={n} K={k}", same(fast_linear(x[:4096][perm], w, b), full[:4096][perm]))
        runs = [fast_linear(x[:4096], w, b) for _ in range(20)]
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
    y = fast_linear(x.view(3, 100, 512), w, b)
    gy = torch.randn_like(y)
    y.backward(gy)
    dx, dw, db = (t.grad.double() for t in (x, w, b))
    gy2 = gy.view(300, 384).double()
    refs = (gy2 @ w.detach().double(), gy2.t() @ x.detach().double(), gy2.sum(0))
    errs = [((a - r).abs().max() / r.abs().max()).item() for a, r in zip((dx, dw, db), refs, strict=True)]
    check("linear autograd dX/dW/db vs float64 (max|err| / max|ref|)", max(errs) < 0.01, f"{errs}")
    try:
        comp = torch.compile(lambda a: fast_linear(a, w.detach(), b.detach()), dynamic=True, fullgraph=True)
        xs = x.detach()
        oks = [same(comp(xs[:m]), fast_linear(xs[:m], w.detach(), b.detach())) for m in (1, 17, 300)]
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
    o = fast_attention(qg, kg, vg, q_pos, k_start)
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
