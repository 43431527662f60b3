"""The fused LM head against the unfused one and the libraries a user would pick, one process, one GPU.

    python -m bench fused_head [--tokens 8192] [--hidden 2048] [--vocab 151936] [--reps 10] [--tiers exact,fast]
                               [--kernels] [--json out.json]

At the RL step's training size (8 x 1024 tokens, Qwen3-1.7B's hidden 2048 and vocabulary 151936, bf16), a
training head = forward (token log-probs and entropy) + backward (dHidden, dWeight), timed synced and queued
(bench.timing, medians); and the peak of memory allocated during one call above what was allocated before it, its
gradients included (torch.cuda.max_memory_allocated). Contenders (bench.contenders): rl_kernel.lm_head_logprobs
(exact and fast tiers) and each tier's unfused path (head.unfused: the logits materialised), stock PyTorch (F.linear +
log_softmax + gather + entropy), and Liger's fused linear cross-entropy (where liger-kernel is installed; it
gives the loss, not per-token log-probs, and no entropy), and rl_kernel.lm_head_loss where the tier chains dW
(the fast tier: the loss sum(logp + entropy), its gradients computed in the forward, three head GEMMs where the
fused head takes four). Before timing, the bit checks the head promises: fused == unfused log-probs, entropy and
dWeight, per tier, dHidden run to run, and the fused loss == the fused head in all four (integer views of the bits).
--kernels also prints each contender's device time per kernel (bench.timing.kernels), the largest first: where a head's
time goes.
"""

from __future__ import annotations

import json

import torch

from bench import contenders as C
from bench import environment, gpu_missing, parser, timing
from rl_kernel import head
from rl_kernel.bitwise import bits_equal
from rl_kernel.head.loss import computes_in_forward, lm_head_loss

TIERS = ("exact", "fast")
STOCK = "stock F.linear+log_softmax"


def inputs(tokens: int, hidden: int, vocab: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda", generator=g) * hidden**-0.5 * 3).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    return h, w, t


def step(fn, h, w, t):
    """One training head: forward, then backward of sum(logp) + sum(entropy)."""

    def call():
        h.grad = w.grad = None
        logp, ent = fn(h, w, t)
        (logp.sum() + (ent.sum() if ent is not None else 0)).backward()

    return call


def peak_bytes(call, *params: torch.Tensor) -> int:
    """The peak of memory allocated during one call above what was allocated before it, the params' gradients
    of an earlier call freed first (the call frees them itself: counted in the base, they hid that much)."""
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def outputs(fn, h, w, t) -> tuple[torch.Tensor, ...]:
    """One training head's log-probs, entropy, dHidden and dWeight."""
    h.grad = w.grad = None
    logp, ent = fn(h, w, t)
    (logp.sum() + ent.sum()).backward()
    return logp.detach(), ent.detach(), h.grad.clone(), w.grad.clone()


def loss_outputs(tier: str, h, w, t) -> tuple[torch.Tensor, ...]:
    """The fused loss's log-probs, entropy, dHidden and dWeight (its gradients computed in the forward)."""
    h.grad = w.grad = None
    out = lm_head_loss(h, w, t, C.logp_plus_entropy, torch.sum, tier=tier, entropy=True)
    out.loss.backward()
    return out.logprobs, out.entropy, h.grad.clone(), w.grad.clone()


def bit_checks(h, w, t, tiers=TIERS) -> dict[str, bool]:
    out = {}
    for tier in tiers:
        fused, unfused = outputs(C.head(tier), h, w, t), outputs(C.head(tier, fused=False), h, w, t)
        if computes_in_forward(tier):
            loss = loss_outputs(tier, h, w, t)
            out[f"{tier}: fused loss == fused head (log-probs, entropy, dHidden, dWeight)"] = all(
                bits_equal(a, b) for a, b in zip(loss, fused, strict=True)
            )
        out[f"{tier}: fused == unfused log-probs"] = bits_equal(fused[0], unfused[0])
        out[f"{tier}: fused == unfused entropy"] = bits_equal(fused[1], unfused[1])
        out[f"{tier}: fused == unfused dWeight"] = bits_equal(fused[3], unfused[3])
        out[f"{tier}: fused dHidden run to run"] = bits_equal(outputs(C.head(tier), h, w, t)[2], fused[2])
        with head.one_chunk_per_call():  # the tier's wide calls against the plain walk
            narrow = outputs(C.head(tier), h, w, t)
        out[f"{tier}: fused == one chunk per call (log-probs, entropy, dHidden, dWeight)"] = all(
            bits_equal(a, b) for a, b in zip(fused, narrow, strict=True)
        )
    return out


def host_side_of(call) -> dict:
    """The host's time per call (no sync after it) and what it spends it on, for a synced time above the kernels'."""
    return {"launch_s": timing.host({"call": call}, reps=3)["call"], "ops": timing.host_ops(call, reps=2),
            "syncs": timing.syncs(call)}  # fmt: skip


def contenders(tiers=TIERS) -> dict:
    fns = {f"{tier} {kind}": C.head(tier, kind == "fused") for tier in tiers for kind in ("fused", "unfused")}
    fns |= {f"{tier} fused loss": C.head_loss(tier) for tier in tiers if computes_in_forward(tier)}
    fns[STOCK] = C.stock_head
    liger = C.liger_fused_linear_ce()
    if liger is not None:
        fns["liger fused linear CE (loss only)"] = liger
    return fns


def main(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--tiers", default=",".join(TIERS), help="the rl_kernel tiers among the contenders")
    ap.add_argument("--kernels", action="store_true", help="each contender's device time per kernel (profiler)")
    ap.add_argument("--host", action="store_true", help="each contender's host ops and runtime calls (profiler)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if gpu_missing("fused_head"):
        return 2
    tiers = tuple(args.tiers.split(","))
    h, w, t = inputs(args.tokens, args.hidden, args.vocab)
    checks = bit_checks(h, w, t, tiers)
    for k, v in checks.items():
        print(f"{k}: {v}")
    calls = {k: step(fn, h, w, t) for k, fn in contenders(tiers).items()}
    timing.warm(calls, 1)
    peaks = {k: peak_bytes(c, h, w) for k, c in calls.items()}
    times = timing.both(calls, args.reps, warmup=0)
    logits_gb = args.tokens * args.vocab * 2 / 1e9
    rows = []
    print(f"{args.tokens} tokens x {args.vocab} vocab x {args.hidden} hidden, bf16 (logits {logits_gb:.2f} GB)")
    print(f"{'contender':38s} {'queued ms':>10s} {'synced ms':>10s} {'peak GB':>8s} {'x stock':>8s}")
    for k, tk in times.items():
        row = {"contender": k, "queued_ms": tk["queued_s"] * 1e3, "synced_ms": tk["synced_s"] * 1e3,
               "peak_gb": peaks[k] / 1e9, "vs_stock_synced": tk["synced_s"] / times[STOCK]["synced_s"]}  # fmt: skip
        rows.append(row)
        print(f"{k:38s} {row['queued_ms']:10.2f} {row['synced_ms']:10.2f} {row['peak_gb']:8.2f} "
              f"{row['vs_stock_synced']:8.2f}")  # fmt: skip
    per_kernel = {k: timing.kernels(c, reps=3) for k, c in calls.items()} if args.kernels else {}
    for k, found in per_kernel.items():
        print(f"\n{k}: {sum(found.values()) * 1e3:.2f} ms of kernels")
        for name, s in sorted(found.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {s * 1e3:8.2f} ms  {name}")
    host_side = {k: host_side_of(c) for k, c in calls.items()} if args.host else {}
    for k, found in host_side.items():
        print(f"\n{k}: {found['launch_s'] * 1e3:.2f} ms of host time per call; self CPU ms (calls) per call:")
        for name, op in found["ops"].items():
            print(f"  {op['self_cpu_s'] * 1e3:8.2f} ms ({op['count']:6.0f})  {name}")
        for where, n in found["syncs"].items():
            print(f"  host sync x{n}: {where}")
    if args.json:
        record = {"meta": environment(), "skipped": C.SKIPPED, "checks": checks, "rows": rows, "kernels": per_kernel,
                  "host": host_side}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0 if all(checks.values()) else 1
