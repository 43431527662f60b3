"""TRL's GRPOTrainer as an engine pair (needs trl: requirements-trl.txt): one GRPO step of a tiny random Qwen3 at
TRL's defaults (bf16 autocast, gradient checkpointing), the rollout being TRL's own generate() call and the trainer
TRL's own training forward of the same completions.

    rollout(shape=(B, T, V), ...)  runs the step; returns the completions [B, T] (PAD after EOS) and their log-probs
                                   from generate()'s logits with TRL's selective_log_softmax and temperature
    train(tokens, ...)             the log-probs the same step's training forward (the loss's) computed for them

Log-probs after a sequence's EOS are 0 on both sides. engine parameters: patched (default true: the model patched
with rl_kernel and rl_kernel.integrations.trl.install(): TRL's selective_log_softmax and (TRL >= 1.16) its fused
LM head replaced by the exact ones; false: stock GRPOTrainer and its own fused LM head), trainer (patched only:
"exact", the default, rl_kernel's ExactGRPOTrainer; "trl", TRL's own GRPOTrainer on the installed head),
temperature (default 0.7), generations (per prompt, default 2; B must be a multiple).
"""

from __future__ import annotations

import inspect
import tempfile

import torch

from rl_engines import hf
from rl_kernel.models import PAD

EOS = 2  # the tokenizer's eos_token, t2 (PAD, t0, is rl_kernel.models')
_STEPS: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tokens, the training forward's log-probs) of each step run


def _tokenizer(vocab: int):
    import tokenizers
    import transformers

    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t1"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="t0", unk_token="t1", eos_token="t2")
    tok.padding_side = "left"
    return tok


def _dataset(prompts: int, vocab: int, seed: int):
    import datasets

    g = torch.Generator().manual_seed(seed + 5)
    rows = [" ".join(f"t{int(t)}" for t in torch.randint(3, vocab, (2 + i % 5,), generator=g)) for i in range(prompts)]
    # an explicit fingerprint: datasets 5.2 cannot hash pyarrow 26's tables with dill
    return datasets.Dataset(datasets.table.InMemoryTable.from_pydict({"prompt": rows}), fingerprint=f"rl-{seed}")


def _reward(completions, **_):
    return [float(len(c)) / 10 for c in completions]


def _trl_log_softmax(logits, ids, temperature):
    """TRL's selective_log_softmax as its trainer applies the temperature (1.16 takes it; 1.10 divides first)."""
    from trl.trainer import utils

    fn = utils.selective_log_softmax
    if "temperature" in inspect.signature(fn).parameters:
        return fn(logits, ids, temperature)
    return fn(logits / temperature, ids)


TRAINERS = ("exact", "trl")


def _step(shape, seed, device, tier, patched, temperature, generations, trainer):
    import trl

    from rl_kernel.integrations import trl as rl_trl

    batch, new, vocab = shape
    if batch % generations:
        raise ValueError(f"B = {batch} must be a multiple of generations = {generations}")
    if trainer not in TRAINERS:
        raise ValueError(f"engine trainer must be one of {TRAINERS}, got {trainer!r}")
    if patched:
        rl_trl.install()
    else:
        rl_trl.uninstall()
    base = rl_trl.ExactGRPOTrainer if patched and trainer == "exact" else trl.GRPOTrainer
    seen: dict[str, list] = {"generate": [], "train": []}

    class Recording(base):
        def _get_per_token_logps_and_entropies(self, mdl, input_ids, attention_mask, logits_to_keep, *a, **kw):
            out = super()._get_per_token_logps_and_entropies(mdl, input_ids, attention_mask, logits_to_keep, *a, **kw)
            if torch.is_grad_enabled():  # the loss's forward
                seen["train"].append((input_ids.detach().cpu(), attention_mask.cpu(), logits_to_keep, out[0].detach()))
            return out

    # TRL's model: fp32 weights under its bf16 autocast (GRPOConfig's default), patched in place when asked
    model = hf.build(vocab, "fp32", seed, "cpu", tier, patched=patched)
    model.config.eos_token_id = EOS
    original = model.generate

    def generate(*args, **kwargs):
        out = original(*args, **kwargs, output_logits=True, return_dict_in_generate=True)
        seen["generate"].append((out.sequences.cpu(), torch.stack(out.logits, 1).float().cpu()))
        return out.sequences

    model.generate = generate
    with tempfile.TemporaryDirectory() as out_dir:
        args = trl.GRPOConfig(
            output_dir=out_dir, per_device_train_batch_size=batch, num_generations=generations,
            max_completion_length=new, max_steps=1, temperature=temperature, learning_rate=1e-3, report_to="none",
            save_strategy="no", use_cpu=device == "cpu", seed=seed, logging_steps=1,
        )  # fmt: skip
        trainer = Recording(
            model=model, reward_funcs=_reward, args=args, train_dataset=_dataset(batch // generations * 2, vocab, seed),
            processing_class=_tokenizer(vocab),
        )  # fmt: skip
        trainer.train()
    (seqs, logits), ((ids, mask, keep, train_lp),) = seen["generate"][0], seen["train"]
    width = logits.shape[1]
    tokens = torch.full((batch, new), PAD, dtype=torch.int64)
    rollout_lp = torch.zeros(batch, new)
    train_out = torch.zeros(batch, new)
    gen_lp = _trl_log_softmax(logits, seqs[:, -width:], temperature).float()
    used: set[int] = set()
    for row in range(ids.shape[0]):  # the trainer's rows are the generated ones, shuffled: matched by their tokens
        valid = mask[row, -keep:].bool()
        want = ids[row][mask[row].bool()].tolist()
        g = next(b for b in range(seqs.shape[0]) if b not in used and _same(seqs[b], want))
        used.add(g)
        n = int(valid.sum())
        tokens[row, :n] = ids[row, -keep:][valid]
        rollout_lp[row, :n] = gen_lp[g, :keep][valid]
        train_out[row, :n] = train_lp[row][valid.to(train_lp.device)].cpu()
    _STEPS.append((tokens, train_out))
    return tokens, rollout_lp


def _same(generated: torch.Tensor, want: list[int]) -> bool:
    got = [t for t in generated.tolist() if t != PAD]
    return got[: len(want)] == want and all(t in (PAD, EOS) for t in got[len(want) :])


def rollout(shape, dtype, seed, device, tier, patched=True, temperature=0.7, generations=2, trainer="exact") -> dict:
    tokens, logprobs = _step(tuple(shape), seed, device, tier, patched, temperature, generations, trainer)
    return {"tokens": tokens, "logprobs": logprobs}


def train(
    tokens, shape, dtype, seed, device, tier, patched=True, temperature=0.7, generations=2, trainer="exact"
) -> dict:
    """The training forward's log-probs of the step that produced `tokens` (the latest such step)."""
    tokens = tokens.cpu()
    for done, logprobs in reversed(_STEPS):
        if torch.equal(done, tokens):
            return {"logprobs": logprobs}
    raise LookupError("no GRPO step of this process produced these tokens: call rollout() first")
