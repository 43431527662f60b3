"""The fused LM head against the unfused one and the libraries a user would pick, one process, one GPU.

    python bench/bench_fused_head.py [--tokens 8192] [--hidden 2048] [--vocab 151936] [--json out.json]

At the RL step's training size (8 x 1024 tokens, Qwen3-1.7B's hidden 2048 and vocabulary 151936, bf16), a
training head = forward (token log-probs and entropy) + backward (dHidden, dWeight), timed two ways (queued:
CUDA events, one sync at the end; synced: a host sync around every call, wall clock), medians; and the peak of
memory allocated during one call above what was allocated before it (torch.cuda.max_memory_allocated).
Contenders: rl_kernel.lm_head_logprobs (exact and fast tiers) and each tier's unfused path (head.unfused:
the logits materialised), stock PyTorch (F.linear + log_softmax + gather + entropy), and Liger's fused linear
cross-entropy (where liger-kernel is installed; it gives the loss, not per-token log-probs, and no entropy).
Before timing, the bit checks the head promises: fused == unfused log-probs, entropy and dWeight, per tier,
and dHidden run to run (integer views of the bits).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from bench_row import queued, synced

import rl_kernel
from rl_kernel import head
from rl_kernel.bitwise import bits_equal


def inputs(tokens: int, hidden: int, vocab: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda", generator=g) * hidden**-0.5 * 3).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    return h, w, t


def stock(h, w, t):
    logits = F.linear(h, w).float()
    lsm = torch.log_softmax(logits, -1)
    return lsm.gather(-1, t[:, None]).squeeze(-1), -(lsm.exp() * lsm).sum(-1)


def liger():
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except Exception as exc:
        print(f"liger-kernel not available: {exc}", file=sys.stderr)
        return None
    loss = LigerFusedLinearCrossEntropyLoss(reduction="sum")
    return lambda h, w, t: (-loss(w, h, t), None)


def step(fn, h, w, t):
    """One training head: forward, then backward of sum(logp) + sum(entropy)."""

    def call():
        h.grad = w.grad = None
        logp, ent = fn(h, w, t)
        (logp.sum() + (ent.sum() if ent is not None else 0)).backward()

    return call


def peak_bytes(call) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def bit_checks(h, w, t) -> dict[str, bool]:
    out = {}
    for tier in ("exact", "fast"):
        got = []
        for fn in (head.lm_head_logprobs, head.unfused):
            h.grad = w.grad = None
            logp, ent = fn(h, w, t, tier=tier, entropy=True)
            (logp.sum() + ent.sum()).backward()
            got.append((logp.detach(), ent.detach(), h.grad.clone(), w.grad.clone()))
        out[f"{tier}: fused == unfused log-probs"] = bits_equal(got[0][0], got[1][0])
        out[f"{tier}: fused == unfused entropy"] = bits_equal(got[0][1], got[1][1])
        out[f"{tier}: fused == unfused dWeight"] = bits_equal(got[0][3], got[1][3])
        h.grad = w.grad = None
        lp, en = head.lm_head_logprobs(h, w, t, tier=tier, entropy=True)
        (lp.sum() + en.sum()).backward()
        out[f"{tier}: fused dHidden run to run"] = bits_equal(h.grad, got[0][2])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_fused_head: needs a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    h, w, t = inputs(args.tokens, args.hidden, args.vocab)
    checks = bit_checks(h, w, t)
    for k, v in checks.items():
        print(f"{k}: {v}")
    fns = {
        "exact fused": lambda h, w, t: head.lm_head_logprobs(h, w, t, tier="exact", entropy=True),
        "exact unfused": lambda h, w, t: head.unfused(h, w, t, tier="exact", entropy=True),
        "fast fused": lambda h, w, t: head.lm_head_logprobs(h, w, t, tier="fast", entropy=True),
        "fast unfused": lambda h, w, t: head.unfused(h, w, t, tier="fast", entropy=True),
        "stock F.linear+log_softmax": stock,
    }
    lig = liger()
    if lig is not None:
        fns["liger fused linear CE (loss only)"] = lig
    calls = {k: step(fn, h, w, t) for k, fn in fns.items()}
    for call in calls.values():
        call()
    peaks = {k: peak_bytes(c) for k, c in calls.items()}
    q, s = queued(calls, args.reps), synced(calls, args.reps)
    logits_gb = args.tokens * args.vocab * 2 / 1e9
    rows = []
    print(f"{args.tokens} tokens x {args.vocab} vocab x {args.hidden} hidden, bf16 (logits {logits_gb:.2f} GB)")
    print(f"{'contender':38s} {'queued ms':>10s} {'synced ms':>10s} {'peak GB':>8s} {'x stock':>8s}")
    for k in fns:
        row = {"contender": k, "queued_ms": q[k] * 1e3, "synced_ms": s[k] * 1e3, "peak_gb": peaks[k] / 1e9,
               "vs_stock_synced": s[k] / s["stock F.linear+log_softmax"]}  # fmt: skip
        rows.append(row)
        print(f"{k:38s} {row['queued_ms']:10.2f} {row['synced_ms']:10.2f} {row['peak_gb']:8.2f} "
              f"{row['vs_stock_synced']:8.2f}")  # fmt: skip
    if args.json:
        meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rl_kernel": rl_kernel.__name__}
        args.json.write_text(json.dumps({"meta": meta, "checks": checks, "rows": rows}, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
