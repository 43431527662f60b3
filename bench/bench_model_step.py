"""One RL step of a Hugging Face model on the GPU, at a Qwen3-1.7B shape: stock, the fast tier and the exact
tier side by side in one process, on the same weights.

    python bench/bench_model_step.py [--tiers stock,fast,exact] [--layers 28 ...] [--json out.json]

The model: Qwen3-shaped (rlparity.cell.workloads.model.build: random weights from a seed, bf16), by default
28 layers, hidden 2048, 16 query / 8 KV heads of 128, MLP 6144, vocabulary 151936 (1.7 B parameters).
- rollout: generate() of --new (64) tokens for --batch (32) prompts of 64..256 tokens, left padded, greedy;
- training step: one forward over --train-batch x --train-len (8 x 1024) tokens with autograd, token
  log-probs (rl_kernel.token_logprobs patched; log_softmax + gather stock), the GRPO clipped loss, backward,
  AdamW (torch.optim.AdamW for stock and fast, whose promise is one architecture; ExactAdamW for exact); and,
  patched, the same step with the log-probs from the fused head (rl_kernel.lm_head_logprobs over the decoder's
  hidden states: train_fused_head), each with its peak memory;
- check: generate() of --check-new (48) tokens for --check-batch (16) prompts keeping its logits, then the
  training forward (autograd on, right padded) over the same sequences: the logits compared bit for bit, and
  the first step's importance ratios exp(new - old) over the completion tokens (all exactly 1.0 when equal);
  the stock model's drift (mean/max |dlogp|, the share of ratios outside the clip range).
Each timing is synced (a host sync after every call, median of --reps) and queued (--reps back to back, one
sync); the exact tier runs --exact-reps (its training step takes seconds).
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
from rl_kernel.integrations import transformers as hf
from rl_kernel.optim import ExactAdamW
from rlparity.cell.workloads import model as M

PAD = M.PAD
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a small run that checks the script itself


def prompts(batch: int, lo: int, hi: int, vocab: int, seed: int) -> M.Prompts:
    """batch prompts of lo..hi random tokens, left padded."""
    g = torch.Generator().manual_seed(seed)
    lengths = [int(x) for x in torch.randint(lo, hi + 1, (batch,), generator=g)]
    width = max(lengths)
    ids = torch.full((batch, width), PAD, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, width - n :] = torch.randint(1, vocab, (n,), generator=g)
        mask[b, width - n :] = 1
    return M.Prompts(ids, mask, tuple(lengths))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timings(fn, reps: int) -> dict[str, float]:
    fn()  # warm-up (Triton's compiles, cuBLAS handles)
    sync()
    synced = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        synced.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return {"synced_s": statistics.median(synced), "queued_s": (time.perf_counter() - t0) / reps}


def rollout(model, p: M.Prompts, new: int) -> None:
    with torch.no_grad():
        model.generate(
            input_ids=p.ids.to(DEVICE), attention_mask=p.mask.to(DEVICE), max_new_tokens=new, min_new_tokens=new,
            do_sample=False, pad_token_id=PAD,
        )  # fmt: skip


def stock_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None])[..., 0]


def logits_scorer(logprobs):
    """Token log-probs of the next tokens through the materialised logits (logprobs: stock or rl_kernel's)."""

    def score(model, ids: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, :-1]
        return logprobs(logits, ids[:, 1:])

    return score


def fused_scorer(model, ids: torch.Tensor) -> torch.Tensor:
    """The same log-probs through the patched model's fused head: the decoder's hidden states, no logits."""
    hidden = model.get_decoder()(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    w = model.get_output_embeddings().weight
    return rl_kernel.lm_head_logprobs(hidden[:, :-1], w, ids[:, 1:], tier=hf.tier_of(model))


def train_step(model, ids: torch.Tensor, opt, score, clip: float = M.CLIP) -> None:
    """Forward over ids [B, T] (every token real), token log-probs of the next tokens, GRPO loss, backward, step."""
    opt.zero_grad(set_to_none=True)
    lp = score(model, ids)
    old = lp.detach()
    adv = torch.linspace(-1, 1, ids.shape[0], device=ids.device)[:, None]
    ratio = torch.exp(lp - old)
    loss = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()
    loss.backward()
    opt.step()


def check(model, p: M.Prompts, new: int) -> dict:
    """generate()'s logits against the training forward's (autograd on) at every completion position."""
    r = M.generate(model, p, new, None, DEVICE)
    seqs = [M.unpadded(r, p, b) for b in range(r.sequences.shape[0])]
    with torch.enable_grad():
        ids, mask = M.padded(seqs, right=True)
        logits = model(input_ids=ids.to(DEVICE), attention_mask=mask.to(DEVICE)).logits
        forward = torch.stack([logits[i, len(s) - new - 1 : len(s) - 1] for i, s in enumerate(seqs)]).float()
        new_lp = rl_kernel.token_logprobs(forward, r.completions.to(DEVICE)).detach().cpu()
    forward = forward.detach().cpu()
    old_lp = rl_kernel.token_logprobs(r.logits, r.completions)
    ratios = torch.exp(new_lp - old_lp)
    differ = int((forward.view(torch.int32) != r.logits.view(torch.int32)).sum())
    out = {
        "logits_compared": r.logits.numel(),
        "logits_differ": differ,
        "tokens": r.completions.numel(),
        "tokens_differing_logits": int((forward.view(torch.int32) != r.logits.view(torch.int32)).any(-1).sum()),
        "ratios_exactly_one": int((ratios.view(torch.int32) == torch.tensor(1.0).view(torch.int32)).sum()),
    }
    out |= M.drift(r.logits, forward, r.completions)
    out["generate_equals_forward"] = differ == 0
    return out


def run_tier(model, tier: str, args, check_p: M.Prompts, rollout_p: M.Prompts, train_ids: torch.Tensor) -> dict:
    """The check, the rollout and the training step of one tier (stock: unpatched) on the model's weights."""
    if tier != "stock":
        hf.patch(model, tier=tier)
    reps = args.exact_reps if tier == "exact" else args.reps
    optimizer = ExactAdamW if tier == "exact" else torch.optim.AdamW
    opt = optimizer(model.parameters(), lr=1e-6)
    res = {"check": check(model.eval(), check_p, args.check_new)}
    print(f"{tier}: check {json.dumps(res['check'])}", flush=True)
    res["rollout"] = timings(lambda: rollout(model.eval(), rollout_p, args.new), reps)
    print(f"{tier}: rollout {res['rollout']}", flush=True)
    model.train()
    heads = {"train": logits_scorer(stock_logprobs if tier == "stock" else rl_kernel.token_logprobs)}
    if tier != "stock":
        heads["train_fused_head"] = fused_scorer
    for name, score in heads.items():
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        res[name] = timings(lambda score=score: train_step(model, train_ids, opt, score), reps)
        res[f"{name}_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None
        print(f"{tier}: {name} {res[name]} peak {res[f'{name}_peak_gb']} GB", flush=True)
    model.eval()
    if tier != "stock":
        hf.unpatch(model)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiers", default="stock,fast,exact")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-min", type=int, default=64)
    ap.add_argument("--prompt-max", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-len", type=int, default=1024)
    ap.add_argument("--check-batch", type=int, default=16)
    ap.add_argument("--check-new", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--exact-reps", type=int, default=1)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    shape = dict(layers=args.layers, hidden=args.hidden, heads=args.heads, intermediate=args.intermediate)
    t0 = time.perf_counter()
    model = M.build("qwen3", args.vocab, args.dtype, 0, DEVICE, **shape).eval()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    params = sum(p.numel() for p in model.parameters())
    built, where = time.perf_counter() - t0, torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"model: qwen3 {shape} vocab {args.vocab}: {params / 1e9:.2f} B parameters, built in {built:.0f} s; "
          f"{where}, torch {torch.__version__}", flush=True)  # fmt: skip
    rollout_p = prompts(args.batch, args.prompt_min, args.prompt_max, args.vocab, 1)
    check_p = prompts(args.check_batch, args.prompt_min, args.prompt_max, args.vocab, 2)
    train_ids = torch.randint(
        1, args.vocab, (args.train_batch, args.train_len), generator=torch.Generator().manual_seed(3)
    )
    train_ids = train_ids.to(DEVICE)
    record: dict = {"shape": shape | {"vocab": args.vocab, "parameters": params}, "args": vars(args) | {"json": None}}
    for tier in args.tiers.split(","):
        model.load_state_dict(initial)
        record[tier] = run_tier(model, tier, args, check_p, rollout_p, train_ids)
    if "stock" in record:
        for tier in (t for t in ("fast", "exact") if t in record):
            for what in ("rollout", "train", "train_fused_head"):
                for how in ("synced_s", "queued_s"):
                    stock = record["stock"]["rollout" if what == "rollout" else "train"][how]
                    record[tier][f"{what}_{how}_over_stock"] = record[tier][what][how] / stock
    print("\ntier   rollout s (x stock)   train s (x stock)   fused-head train s (x stock)   generate == forward   "
          "ratios == 1")  # fmt: skip
    for tier in args.tiers.split(","):
        r = record[tier]
        times = [r[w]["synced_s"] if w in r else float("nan") for w in ("rollout", "train", "train_fused_head")]
        x = [f" ({r.get(f'{w}_synced_s_over_stock', 1):.2f}x)" for w in ("rollout", "train", "train_fused_head")]
        c = r["check"]
        print(f"{tier:6} {times[0]:8.3f}{x[0]:12} {times[1]:8.3f}{x[1]:12} {times[2]:8.3f}{x[2]:21} "
              f"{c['logits_differ']:>10} differ   {c['ratios_exactly_one']}/{c['tokens']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
