"""One RL step of a Hugging Face model on the GPU, patched (rl_kernel's exact tier) against stock, side by side.

    python bench/bench_model_step.py [--layers 8 --hidden 2048 --vocab 151936] [--json out.json]

The model: a Qwen3-shaped decoder (rlparity.cell.model.build: random weights from a seed, bf16), 16 query
heads over 8 KV heads of 128, MLP 3 x hidden. The step: a rollout, generate() of --new tokens for --batch
prompts of mixed lengths (left padded, greedy), then a training step: one teacher-forced forward over prompt
+ completion (right padded), rl_kernel.token_logprobs, the GRPO clipped loss, backward, and AdamW
(rl_kernel.optim.ExactAdamW patched; torch.optim.AdamW, its default foreach path, stock). Each is
timed synced (a host sync around every call, median of --reps) and queued (--reps back to back, one sync).
The same run checks the patched model's generate() logits against its forward, bit for bit, and reports
the stock model's drift (mean/max |dlogp|, the share of ratios outside the clip range).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "harness"))
import rl_kernel
from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.integrations import transformers as hf
from rl_kernel.optim import ExactAdamW
from rlparity.cell import model as M


def train_step(model, r: M.Rollout, p: M.Prompts, opt) -> None:
    seqs = [M.unpadded(r, p, b) for b in range(r.sequences.shape[0])]
    new = r.completions.shape[1]
    old = rl_kernel.token_logprobs(r.logits, r.completions).cuda()
    opt.zero_grad(set_to_none=True)
    lp = M.micro_logprobs(model, seqs, r.completions, "cuda")
    adv = M.advantages(len(seqs), 0).cuda()[:, None]
    keep = torch.ones(len(seqs), new, device="cuda")
    loss, _ = M.grpo_loss(lp, old, adv, keep, keep.sum())
    loss.backward()
    opt.step()


def timings(fn, reps: int) -> dict[str, float]:
    fn()  # warm-up
    torch.cuda.synchronize()
    synced = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        synced.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return {"synced_ms": statistics.median(synced) * 1e3, "queued_ms": (time.perf_counter() - t0) / reps * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    shape = dict(layers=a.layers, hidden=a.hidden, heads=a.hidden // 128, intermediate=3 * a.hidden)
    p = M.prompts(a.batch, a.vocab, 0)
    out: dict = {"config": vars(a) | {"json": None}, "device": torch.cuda.get_device_name()}
    for name in ("stock", "patched"):
        model = M.build("qwen3", a.vocab, "bf16", 0, "cuda", **shape).eval()
        if name == "patched":
            hf.patch(model)
        r = M.generate(model, p, a.new, None, "cuda")
        forward = M.forward_views(model, r, p, "cuda")["batch, right padded"]
        optimizer = ExactAdamW if name == "patched" else torch.optim.AdamW
        opt = optimizer(model.parameters(), lr=1e-5)
        out[name] = {
            "rollout": timings(lambda m=model: M.generate(m, p, a.new, None, "cuda"), a.reps),
            "train_step": timings(lambda m=model, r=r, o=opt: train_step(m, r, p, o), a.reps),
            "generate_equals_forward": bits_equal(forward, r.logits),
            "differing_logits": diff(forward, r.logits).count,
            "drift": M.drift(r.logits, forward, r.completions),
            "params": sum(t.numel() for t in model.parameters()),
        }
        print(name, json.dumps(out[name]), flush=True)
        del model, opt
        torch.cuda.empty_cache()
    for what in ("rollout", "train_step"):
        out[f"{what}_patched_over_stock"] = out["patched"][what]["synced_ms"] / out["stock"][what]["synced_ms"]
    print(json.dumps({k: v for k, v in out.items() if k.endswith("_over_stock")}))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0 if out["patched"]["generate_equals_forward"] else 1


if __name__ == "__main__":
    sys.exit(main())
