"""Rollout as users run it: generated tokens per second of generate() in each cache/compile mode, stock against a tier.

    python -m bench rollout_modes [--model qwen3-1.7b] [--tiers stock,fast] [--modes eager,static,compiled]
                                  [--prompts 32,128,512] [--new 256] [--reps 3] [--json out.json]

Modes (transformers' generate() on the same weights, one process, greedy, prompts of 64..256 tokens left padded):
- eager: the dynamic cache, every op launched from Python (what `generate()` does by default);
- static: cache_implementation="static" with disable_compile (the static cache alone);
- compiled: cache_implementation="static" and the compiled decode step (torch.compile, CUDA graphs); stock takes
  transformers' default CompileConfig, a patched model the same config with rl_kernel's exact options
  (rl_kernel.integrations.generation.exact_compile_options);
- batched: transformers' continuous batching, `generate_batch` (paged KV cache, requests packed per step, the
  prompts unpadded); stock's engine on SDPA (auto_switch_to_flash off, as for a patched model, whose generate_batch is
  rl_kernel.integrations.paged's). Its bits are compared through the engine's log-probabilities of the chosen tokens
  (paged.engine_logprobs of the forward's logit rows): the engine keeps no logits.
Each figure is the median of --reps synced calls (a host sync before and after) after one warm-up call: the compiled
mode's compiles, at --new tokens; the other modes' loads their kernels, at --warmup-new (default 16). The bits: at
--check-at prompts (default the smallest count timed), each mode's generate() logits against the training forward
of the generated sequences (the batch left padded, and each sequence alone), elements that differ counted on integer
views. On a machine without a GPU, --model tiny checks the script
(compiled on the CPU too).
"""

from __future__ import annotations

import json
import time

import torch

from bench import environment, model_shapes, parser, rollout, timing
from rl_kernel.bitwise import int_view
from rl_kernel.integrations import generation, paged

BATCHED = "batched"  # transformers' continuous batching (generate_batch), not a generate() mode
MODES = (*generation.ROLLOUT_MODES, BATCHED)
WARMUP_NEW = 16  # new tokens of an uncompiled mode's warm-up call (warmup_tokens)


def mode_kwargs(mode: str) -> dict:
    """generate()'s arguments for a mode on this machine's device (rl_kernel's rollout_kwargs); none for batched."""
    return {} if mode == BATCHED else generation.rollout_kwargs(mode, "cuda" if timing.gpu() else "cpu")


def generate_batched(model, ids: torch.Tensor, mask: torch.Tensor, new: int, logprobs: bool = False) -> list:
    """The prompts (unpadded) through the model's generate_batch, greedy, exactly `new` tokens each (no token is an
    end of sequence): per prompt, in order, (generated tokens, their log-probs or [])."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=rollout.PAD)
    # On a GPU the engine sizes its cache from free memory; on the CPU (a check of the script) a small one, explicitly.
    sizes = {} if timing.gpu() else {"num_blocks": 64, "max_batch_tokens": 256}
    config = ContinuousBatchingConfig(return_logprobs=logprobs, auto_switch_to_flash=False, **sizes)
    with torch.no_grad():
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    done = {tuple(o.prompt_ids): o for o in out.values()}
    if len(done) != len(prompts) or any(o.error or len(o.generated_tokens) != new for o in done.values()):
        failed = [(o.request_id, o.error, len(o.generated_tokens)) for o in done.values()]
        raise RuntimeError(f"generate_batch: {len(done)} of {len(prompts)} distinct prompts came back: {failed[:4]}")
    return [(done[tuple(p)].generated_tokens, done[tuple(p)].logprobs) for p in prompts]


def batched_bits(model, ids: torch.Tensor, mask: torch.Tensor, new: int) -> dict[str, int]:
    """{view: log-probs that differ} between generate_batch's and those of the training forward's logit rows (the
    batch left padded, each sequence alone), and the greedy tokens that differ from those rows' argmax."""
    outs = generate_batched(model, ids, mask, new, logprobs=True)
    prompts = [row[m.bool()] for row, m in zip(ids, mask, strict=True)]
    tokens = torch.tensor([t for t, _ in outs])  # [B, new]
    seqs = [torch.cat([p, t]) for p, t in zip(prompts, tokens, strict=True)]
    left = rollout.completion_logits(model, seqs, new, right=False, grad=False, host=False)
    alone = torch.cat([rollout.completion_logits(model, [s], new, True, grad=False, host=False) for s in seqs])
    got = torch.tensor([lp for _, lp in outs], dtype=torch.float32, device=left.device)
    res = {}
    for view, logits in (("batch, left padded", left), ("each sequence alone", alone)):
        want = paged.engine_logprobs(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)).view(got.shape)
        res[view] = differing(got, want)
    res["tokens not the forward's argmax"] = int((left.argmax(-1).cpu() != tokens).sum())
    return res | {"elements": got.numel()}


def bits(model, ids: torch.Tensor, mask: torch.Tensor, new: int, mode: str) -> dict[str, int]:
    """{view: logits that differ} between the mode's generate() and the training forward's views (the batch left
    padded, each sequence alone), counted on the model's device (moving them to the host took minutes at 128
    prompts of a 151936 vocabulary)."""
    sequences, logits = rollout.generate(model, ids, mask, new, host=False, **mode_kwargs(mode))
    seqs = rollout.unpadded(sequences, mask)
    left = rollout.completion_logits(model, seqs, new, right=False, grad=False, host=False)
    alone = torch.cat([rollout.completion_logits(model, [s], new, True, grad=False, host=False) for s in seqs])
    return {"batch, left padded": differing(logits, left), "each sequence alone": differing(logits, alone),
            "elements": logits.numel()}  # fmt: skip


def differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (integer views, on the tensors' device)."""
    return int((int_view(a) != int_view(b)).sum())


def warmup_tokens(mode: str, new: int, asked: int | None) -> int:
    """New tokens of the warm-up call: the compiled mode's must be the timed call's (its static cache, and so its
    graphs, are sized by prompt + new tokens); the others only load their kernels, which a few tokens do: 16 steps, so
    that a key length divisible by 16 (a Triton specialization of an integer argument) comes up among them."""
    if mode == "compiled":
        return new
    return min(new, WARMUP_NEW if asked is None else asked)


def throughput(
    model, ids: torch.Tensor, mask: torch.Tensor, new: int, mode: str, reps: int, warmup_new: int | None = None
) -> dict[str, float]:
    kw = mode_kwargs(mode)

    def call(n: int = new) -> object:
        if mode == BATCHED:
            return generate_batched(model, ids, mask, n)
        return rollout.generate(model, ids, mask, n, keep_logits=False, **kw)

    warm = warmup_tokens(mode, new, warmup_new)
    t0 = time.monotonic()
    call(warm)  # the warm-up: the compile, in that mode
    first = time.monotonic() - t0
    s = timing.synced({mode: call}, reps, 0)[mode]
    return {"synced_s": s, "tokens_per_s": ids.shape[0] * new / s, "first_call_s": first, "warmup_new": warm}


def run_tier(model, tier: str, args, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict:
    res: dict = {}
    with model_shapes.in_tier(model, tier):
        for mode in args.modes:
            if args.check_at:
                check = batched_bits if mode == BATCHED else lambda *a, mode=mode: bits(*a, mode)
                res[f"{mode} bits"] = check(model, *batches[args.check_at], args.check_new)
                print(f"{tier} {mode}: bits at {args.check_at} prompts: {json.dumps(res[f'{mode} bits'])}", flush=True)
            for b, (ids, mask) in batches.items():
                if b not in args.counts:  # the bits check's batch only
                    continue
                res[f"{mode} {b}"] = throughput(model, ids, mask, args.new, mode, args.reps, args.warmup_new)
                print(f"{tier} {mode} {b} prompts: {json.dumps(res[f'{mode} {b}'])}", flush=True)
            torch.compiler.reset()  # the next mode or tier compiles afresh (cudagraph trees freed)
    return res


def table(record: dict) -> None:
    tiers = [t for t in record if t not in ("args", "environment")]
    print("\n| mode | prompts | " + " | ".join(f"{t} tokens/s" for t in tiers) + " | " +
          " | ".join(f"{t} / stock" for t in tiers if t != "stock") + " |")  # fmt: skip
    for key in record[tiers[0]]:
        if key.endswith(" bits"):
            continue
        mode, prompts = key.split()
        rates = [record[t][key]["tokens_per_s"] for t in tiers]
        ratios = [f"{record[t][key]['tokens_per_s'] / record['stock'][key]['tokens_per_s']:.2f}x"
                  for t in tiers if t != "stock" and "stock" in record]  # fmt: skip
        print(f"| {mode} | {prompts} | " + " | ".join(f"{r:,.0f}" for r in rates) + " | " + " | ".join(ratios) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--model", default="qwen3-1.7b", choices=sorted(model_shapes.SHAPES))
    ap.add_argument("--tiers", default="stock,fast")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--prompts", default="32,128,512", help="prompt counts timed")
    ap.add_argument("--check-at", type=int, default=None,
                    help="the prompt count of the bits check (default the smallest timed; 0: no check)")  # fmt: skip
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--check-new", type=int, default=None, help="new tokens of the bits check (default --new)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup-new", type=int, default=None,
                    help="new tokens of a warm-up call (default 16; the compiled mode's: --new)")  # fmt: skip
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.modes = args.modes.split(",")
    for mode in args.modes:
        mode_kwargs(mode)  # an unknown mode fails here, before the model is built
    args.check_new = args.check_new or args.new
    device = "cuda" if timing.gpu() else "cpu"
    shape = model_shapes.shape(args.model)
    model = model_shapes.build(shape, "bf16", 0, device)
    args.counts = sorted(int(b) for b in args.prompts.split(","))
    args.check_at = min(args.counts) if args.check_at is None else args.check_at
    counts = sorted({*args.counts, args.check_at} - {0})
    batches = {b: rollout.prompts(b, 64, 256, shape.vocab, seed=b) for b in counts}
    record: dict = {"args": vars(args), "environment": environment()}
    for tier in args.tiers.split(","):
        record[tier] = run_tier(model, tier, args, batches)
    table(record)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0
