"""One RL step of a Hugging Face model: stock, the fast tier and the exact tier side by side, same weights.

    python -m bench model_step [--model qwen3-1.7b|qwen3-8b|tiny] [--tiers stock,fast,exact,mode-fast]
                               [--skip check,rollout,train] [--layers 28 ...] [--json out.json]

The model (bench.model_shapes, random weights from a seed): by default Qwen3-1.7B's shape, bf16 (28 layers,
hidden 2048, 16 query / 8 KV heads of 128, MLP 6144, vocabulary 151936); --model qwen3-8b for Qwen3-8B's; the
shape flags override one dimension. On a machine without a GPU it runs on the CPU (use --model tiny and small
sizes: a run that checks the script, without the fast tier).
- rollout: generate() of --new (64) tokens for --batch (32) prompts of 64..256 tokens, left padded, greedy;
- training step: one forward over --train-batch x --train-len (8 x 1024) tokens with autograd, token
  log-probs (rl_kernel.token_logprobs patched; log_softmax + gather stock), the GRPO clipped loss, backward,
  AdamW (torch.optim.AdamW for stock and fast, whose promise is one architecture; ExactAdamW for exact); and,
  patched, the same step with the log-probs from the fused head (rl_kernel.lm_head_logprobs over the decoder's
  hidden states: train_fused_head) and, where the tier chains dW, through rl_kernel.lm_head_loss (the GRPO loss
  with its head gradients computed in the forward: train_fused_loss), each with its peak memory;
- check: generate() of --check-new (48) tokens for --check-batch (16) prompts keeping its logits, then the
  training forward (autograd on, right padded) over the same sequences: the logits compared bit for bit, and
  the first step's importance ratios exp(new - old) over the completion tokens (all exactly 1.0 when equal);
  the stock model's drift (mean/max |dlogp|, the share of ratios outside the clip range).
A tier named mode-TIER runs the unpatched model under rl_kernel.mode(TIER) instead of patch(model, tier=TIER): the
same step, the aten operators served by the tier (its fused head: rl_kernel.lm_head_logprobs with that tier).
Each timing is synced and queued (bench.timing, median of --reps after one warm-up); the exact tier runs
--exact-reps (its training step takes seconds). --interleave N then times the rollout N more rounds, every tier once
per round in turn on the same weights (synced): the median per tier and the median of each round's ratio to stock's,
a paired figure that a host whose speed drifts between the tiers' runs moves less (the eager rollout is host-bound);
and the training step alike, each tier on its own copy of the weights with its own optimizer (the patched tiers'
fused-loss step too), so it takes one model's memory per tier more.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Callable

import torch

import rl_kernel
from bench import contenders, environment, model_shapes, parser, rollout, timing
from rl_kernel.aten import mode as aten_mode
from rl_kernel.head import loss as head_loss
from rl_kernel.optim import ExactAdamW

CLIP = 0.2  # the surrogate's clip range: ratios outside [1 - CLIP, 1 + CLIP] are clipped
STAGES = ("rollout", "train", "train_fused_head", "train_fused_loss")


def logits_scorer(logprobs):
    """Token log-probs of the next tokens through the materialised logits (logprobs: stock or rl_kernel's)."""

    def score(model, ids: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, :-1]
        return logprobs(logits, ids[:, 1:])

    return score


def fused_scorer(tier: str):
    """The same log-probs through the tier's fused head: the decoder's hidden states, no logits."""

    def score(model, ids: torch.Tensor) -> torch.Tensor:
        hidden = model.get_decoder()(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        w = model.get_output_embeddings().weight
        return rl_kernel.lm_head_logprobs(hidden[:, :-1], w, ids[:, 1:], tier=tier)

    return score


def grpo_token_loss(clip: float) -> Callable[..., torch.Tensor]:
    """The clipped surrogate of each token (elementwise: rl_kernel.lm_head_loss's token_loss)."""

    def token_loss(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        ratio = torch.exp(lp - old)
        return -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)

    return token_loss


def advantages(ids: torch.Tensor) -> torch.Tensor:
    return torch.linspace(-1, 1, ids.shape[0], device=ids.device)[:, None]


def scored_loss(score) -> Callable[..., torch.Tensor]:
    """The GRPO loss from token log-probs (score): the first step's, old log-probs = the new ones."""

    def loss_of(model, ids: torch.Tensor, clip: float) -> torch.Tensor:
        lp = score(model, ids)
        return grpo_token_loss(clip)(lp, lp.detach(), advantages(ids)).mean()

    return loss_of


def fused_loss(tier: str) -> Callable[..., torch.Tensor]:
    """The same GRPO loss through rl_kernel.lm_head_loss (its gradients computed in the forward), the old log-probs
    those of the first call's weights (taken once, outside the gradient)."""
    old: dict[str, torch.Tensor] = {}

    def loss_of(model, ids: torch.Tensor, clip: float) -> torch.Tensor:
        hidden = model.get_decoder()(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[:, :-1]
        w, tokens = model.get_output_embeddings().weight, ids[:, 1:]
        if "lp" not in old:
            with torch.no_grad():
                old["lp"] = rl_kernel.lm_head_logprobs(hidden, w, tokens, tier=tier)
        adv = advantages(ids).expand(tokens.shape)
        return rl_kernel.lm_head_loss(hidden, w, tokens, grpo_token_loss(clip), torch.mean, (old["lp"], adv),
                                      tier=tier).loss  # fmt: skip

    return loss_of


def train_step(model, ids: torch.Tensor, opt, loss_of, clip: float = CLIP) -> None:
    """Forward over ids [B, T] (every token real) to the GRPO loss (loss_of), backward, step."""
    opt.zero_grad(set_to_none=True)
    loss_of(model, ids, clip).backward()
    opt.step()


def check(model, ids: torch.Tensor, mask: torch.Tensor, new: int) -> dict:
    """generate()'s logits against the training forward's (autograd on; called as TRL calls it, no position_ids) at
    every completion position, the batch right padded and each sequence alone."""
    sequences, logits = rollout.generate(model, ids, mask, new)
    completions = sequences[:, ids.shape[1] :]
    seqs = rollout.unpadded(sequences, mask)
    forward = rollout.completion_logits(model, seqs, new, right=True)
    alone = torch.cat([rollout.completion_logits(model, [s], new, right=True, grad=False) for s in seqs])
    ratios = torch.exp(rl_kernel.token_logprobs(forward, completions) - rl_kernel.token_logprobs(logits, completions))
    differ = forward.view(torch.int32) != logits.view(torch.int32)
    out = {
        "logits_compared": logits.numel(),
        "logits_differ": int(differ.sum()),
        "logits_differ_alone": int((alone.view(torch.int32) != logits.view(torch.int32)).sum()),
        "tokens": completions.numel(),
        "tokens_differing_logits": int(differ.any(-1).sum()),
        "ratios_exactly_one": int((ratios.view(torch.int32) == torch.tensor(1.0).view(torch.int32)).sum()),
    }
    out |= outside_mode(lambda: rollout.drift(logits, forward, completions, CLIP))  # float64, which no tier has
    out["generate_equals_forward"] = out["logits_differ"] == 0 == out["logits_differ_alone"]
    return out


def outside_mode(fn: Callable[[], dict]) -> dict:
    """fn() with rl_kernel.mode's innermost tier (if one is on) paused: the stock model's drift metrics are float64."""
    tier = aten_mode.active()
    if tier is None:
        return fn()
    aten_mode.disable()
    try:
        return fn()
    finally:
        aten_mode.enable(tier)


def peak_gb() -> float | None:
    return torch.cuda.max_memory_allocated() / 1e9 if timing.gpu() else None


def run_tier(model, tier: str, args, check_p, rollout_p, train_ids: torch.Tensor) -> dict:
    """The check, the rollout and the training step of one tier (stock: unpatched; mode-TIER: under the mode) on the
    model's weights."""
    with model_shapes.in_tier(model, tier) as serving:
        return _run(model, tier, serving, args, check_p, rollout_p, train_ids)


def optimizer(model, serving: str):
    """torch.optim.AdamW for stock and fast (whose promise is one architecture); ExactAdamW for exact."""
    return (ExactAdamW if serving == "exact" else torch.optim.AdamW)(model.parameters(), lr=1e-6)


def training_losses(tier: str, serving: str) -> dict[str, Callable[..., torch.Tensor]]:
    """The training step's losses by stage: through the logits (stock's or rl_kernel's token log-probs); patched or
    under a mode, through the fused head; where the tier chains dW, through rl_kernel.lm_head_loss."""
    logprobs = contenders.stock_token_logprobs if tier == "stock" else rl_kernel.token_logprobs
    losses = {"train": scored_loss(logits_scorer(logprobs))}
    if tier != "stock":
        losses["train_fused_head"] = scored_loss(fused_scorer(serving))
        if head_loss.computes_in_forward(serving):
            losses["train_fused_loss"] = fused_loss(serving)
    return losses


def _run(model, tier: str, serving: str, args, check_p, rollout_p, train_ids: torch.Tensor) -> dict:
    reps = args.exact_reps if serving == "exact" else args.reps
    opt = optimizer(model, serving)
    res, stages = {}, {}
    if "check" not in args.skip:
        res["check"] = check(model.eval(), *check_p, args.check_new)
        print(f"{tier}: check {json.dumps(res['check'])}", flush=True)
    if "rollout" not in args.skip:
        stages["rollout"] = lambda: rollout.generate(model.eval(), *rollout_p, args.new, keep_logits=False)
        res["rollout"] = timing.both(stages, reps, warmup=1)["rollout"]
        print(f"{tier}: rollout {res['rollout']}", flush=True)
    model.train()
    heads = {} if "train" in args.skip else training_losses(tier, serving)
    for name, loss_of in heads.items():
        if timing.gpu():
            torch.cuda.reset_peak_memory_stats()
        step = {name: lambda loss_of=loss_of: train_step(model, train_ids, opt, loss_of)}
        res[name] = timing.both(step, reps, warmup=1)[name]
        res[f"{name}_peak_gb"] = peak_gb()
        print(f"{tier}: {name} {res[name]} peak {res[f'{name}_peak_gb']} GB", flush=True)
        stages |= step
    if args.syncs:
        res["syncs"] = {stage: timing.syncs(fn) for stage, fn in stages.items()}
        for stage, found in res["syncs"].items():
            for where, n in found.items():
                print(f"{tier}: {stage}: host sync x{n}: {where}", flush=True)
    model.eval()
    if timing.gpu():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return res


def arguments(argv: list[str] | None):
    ap = parser(__name__, __doc__)
    ap.add_argument("--model", default="qwen3-1.7b", choices=sorted(model_shapes.SHAPES))
    ap.add_argument("--tiers", default=None, help="default stock,fast,exact (stock,exact without a GPU)")
    for dim in ("layers", "hidden", "heads", "kv-heads", "intermediate", "vocab"):
        ap.add_argument(f"--{dim}", type=int, default=None, help=f"override the model's {dim}")
    sizes = {"batch": 32, "prompt-min": 64, "prompt-max": 256, "new": 64, "train-batch": 8, "train-len": 1024,
             "check-batch": 16, "check-new": 48, "reps": 3, "exact-reps": 1}  # fmt: skip
    for name, default in sizes.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--interleave", type=int, default=0, help="rounds of the tiers' rollouts and steps in turn (above)")
    ap.add_argument("--syncs", action="store_true", help="where each stage makes the host wait for the GPU")
    ap.add_argument("--skip", default="", help="comma-separated stages left out: check, rollout, train (e.g. a mode's "
                    "eager rollout, every aten op through Python dispatch, takes minutes at 1.7B)")  # fmt: skip
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.tiers = (args.tiers or ("stock,fast,exact" if timing.gpu() else "stock,exact")).split(",")
    args.skip = [s for s in args.skip.split(",") if s]
    if unknown := set(args.skip) - {"check", "rollout", "train"}:
        ap.error(f"--skip takes check, rollout and train, not {', '.join(sorted(unknown))}")
    return args


def interleaved_rollout(model, tiers: list[str], rounds: int, rollout_p, new: int) -> dict:
    """The rollout of every tier once per round, in turn (bench.timing.paired; one warm-up round), stock the
    baseline where it is among the tiers."""

    def in_tier(tier: str) -> Callable[[], None]:
        def run() -> None:
            with model_shapes.in_tier(model, tier):
                rollout.generate(model.eval(), *rollout_p, new, keep_logits=False)

        return run

    return timing.paired({t: in_tier(t) for t in tiers}, rounds, baseline="stock" if "stock" in tiers else tiers[0])


def interleaved_training(model, tiers: list[str], rounds: int, train_ids: torch.Tensor) -> dict:
    """The training step (and a patched tier's fused-loss step) of every tier once per round, in turn
    (bench.timing.paired), each tier on its own copy of the weights and its own optimizer, patched (or under its mode)
    for the whole run; stock the baseline where it is among the tiers."""
    fns: dict[str, Callable[[], None]] = {}
    with contextlib.ExitStack() as stack:
        for tier in tiers:
            mine = copy.deepcopy(model)
            mode = tier.startswith("mode-")
            serving = tier.removeprefix("mode-") if mode else stack.enter_context(model_shapes.in_tier(mine, tier))
            opt = optimizer(mine, serving)
            losses = training_losses(tier, serving)
            paired = {tier: losses["train"]} | ({} if mode or "train_fused_loss" not in losses
                                                else {f"{tier} fused-loss": losses["train_fused_loss"]})  # fmt: skip
            for name, loss_of in paired.items():
                fns[name] = _train_fn(mine.train(), train_ids, opt, loss_of, tier if mode else None)
        return timing.paired(fns, rounds, baseline="stock" if "stock" in tiers else tiers[0])


def _train_fn(model, ids: torch.Tensor, opt, loss_of, mode: str | None) -> Callable[[], None]:
    def run() -> None:
        with model_shapes.in_tier(model, mode) if mode else contextlib.nullcontext():
            train_step(model, ids, opt, loss_of)

    return run


def ratios_over_stock(record: dict) -> None:
    if "stock" not in record:
        return
    for tier in (t for t in record["args"]["tiers"] if t != "stock"):
        for what in (w for w in STAGES if w in record[tier]):
            for how in ("synced_s", "queued_s"):
                stock = record["stock"].get("rollout" if what == "rollout" else "train", {}).get(how)
                if stock is None:
                    continue
                record[tier][f"{what}_{how}_over_stock"] = record[tier][what][how] / stock


def table(record: dict, tiers: list[str]) -> None:
    print("\ntier   rollout s (x stock)   train s (x stock)   fused-head train s (x stock)   fused-loss train s "
          "(x stock)   generate == forward   ratios == 1")  # fmt: skip
    for tier in tiers:
        r = record[tier]
        times = [r[w]["synced_s"] if w in r else float("nan") for w in STAGES]
        x = [f" ({r.get(f'{w}_synced_s_over_stock', 1):.2f}x)" if w in r else "" for w in STAGES]
        c = r.get("check", {"logits_differ": "-", "ratios_exactly_one": "-", "tokens": "-"})
        print(f"{tier:6} {times[0]:8.3f}{x[0]:12} {times[1]:8.3f}{x[1]:12} {times[2]:8.3f}{x[2]:21} "
              f"{times[3]:8.3f}{x[3]:20} "
              f"{c['logits_differ']:>10} differ   {c['ratios_exactly_one']}/{c['tokens']}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    shape = model_shapes.shape(args.model, layers=args.layers, hidden=args.hidden, heads=args.heads,
                               kv_heads=args.kv_heads, intermediate=args.intermediate, vocab=args.vocab)  # fmt: skip
    device = "cuda" if timing.gpu() else "cpu"
    t0 = time.monotonic()  # progress only: the measurements are bench.timing's
    model = model_shapes.build(shape, args.dtype, 0, device)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.model} {shape}: {params / 1e9:.2f} B parameters, built in {time.monotonic() - t0:.0f} s; "
          f"{environment()}", flush=True)  # fmt: skip
    rollout_p = rollout.prompts(args.batch, args.prompt_min, args.prompt_max, shape.vocab, 1)
    check_p = rollout.prompts(args.check_batch, args.prompt_min, args.prompt_max, shape.vocab, 2)
    g = torch.Generator().manual_seed(3)
    train_ids = torch.randint(1, shape.vocab, (args.train_batch, args.train_len), generator=g).to(device)
    record: dict = {"shape": vars(shape) | {"parameters": params}, "env": environment(), "args": vars(args)}
    for tier in args.tiers:
        model.load_state_dict(initial)
        record[tier] = run_tier(model, tier, args, check_p, rollout_p, train_ids)
    ratios_over_stock(record)
    table(record, args.tiers)
    if args.interleave and "rollout" not in args.skip:
        model.load_state_dict(initial)
        record["interleaved_rollout"] = inter = interleaved_rollout(model, args.tiers, args.interleave, rollout_p,
                                                                    args.new)  # fmt: skip
        for tier in args.tiers:
            paired = next(v for k, v in inter.items() if k.startswith("paired_over_"))[tier]
            print(f"interleaved rollout, {args.interleave} rounds: {tier:6} median {inter['median_s'][tier]:.3f} s, "
                  f"paired x stock {paired:.3f}", flush=True)  # fmt: skip
    if args.interleave and "train" not in args.skip:
        model.load_state_dict(initial)
        record["interleaved_training"] = inter = interleaved_training(model, args.tiers, args.interleave, train_ids)
        paired = next(v for k, v in inter.items() if k.startswith("paired_over_"))
        for name, seconds in inter["median_s"].items():
            print(f"interleaved training, {args.interleave} rounds: {name:16} median {seconds:.3f} s, "
                  f"paired x stock {paired[name]:.3f}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0
