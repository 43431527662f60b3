"""TRL's GRPOTrainer (rl_kernel.integrations.trl) on rl_kernel.models' tiny random Qwen3, one step on the CPU at TRL's
defaults (bf16 autocast, gradient checkpointing): patched, the rollout's per-token log-probs (generate()'s logits,
the trainer's temperature, TRL's selective_log_softmax as installed) equal the log-probs the training forward
computes for the same completions, bit for bit, and two runs give identical weights; stock GRPOTrainer (its fused
LM head) differs, and the test says by how much. With TRL's continuous batching (transformers' generate_batch, paged
cache), the engine's log-probs of the sampled tokens equal those of the training forward's logit rows. Skipped where
TRL is not installed (requirements-trl.txt)."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

if os.environ.get("RLPARITY_REQUIRE_TRL"):  # make test's TRL passes: TRL must be there
    import trl
trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
tokenizers = pytest.importorskip("tokenizers")

from rl_kernel.bitwise import bits_equal, diff  # noqa: E402
from rl_kernel.integrations import paged as _paged  # noqa: E402
from rl_kernel.integrations import transformers as rl_hf  # noqa: E402
from rl_kernel.integrations import trl as rl_trl  # noqa: E402
from rl_kernel.models import PAD, tiny_weights  # noqa: E402

VOCAB, EOS = 96, 2  # EOS: the tokenizer's eos_token, t2 (PAD, t0, is rl_kernel.models')
PROMPTS, GENERATIONS, BATCH, NEW = 8, 4, 8, 6  # one step: 2 prompts x 4 completions of <= 6 tokens
TRL_OWN = trl.trainer.utils.selective_log_softmax
TEMPERATURE = 0.7  # not 1: the division is on the path


def tokenizer():
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t1"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    out = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", unk_token="t1", eos_token="t2")
    out.padding_side = "left"
    return out


def model(seed: int = 0):
    """rl_kernel.models' tiny Qwen3 (fp32 on the CPU, as TRL's trainer takes it), ending sequences at EOS."""
    m = tiny_weights("qwen3", VOCAB, seed)
    m.config.eos_token_id = m.generation_config.eos_token_id = EOS
    return m


def dataset():
    g = torch.Generator().manual_seed(5)
    prompts = []
    for i in range(PROMPTS):
        n = 2 + i % 5
        prompts.append(" ".join(f"t{int(t)}" for t in torch.randint(3, VOCAB, (n,), generator=g)))
    # (an explicit fingerprint: datasets 5.2 cannot hash pyarrow 26's tables with dill)
    return datasets.Dataset(datasets.table.InMemoryTable.from_pydict({"prompt": prompts}), fingerprint="prompts")


def reward(completions, **_):
    return [float(len(c)) / 10 for c in completions]


@pytest.fixture(autouse=True)
def _trl_as_shipped():
    yield
    rl_trl.uninstall()
    assert trl.trainer.utils.selective_log_softmax is TRL_OWN


def run(tmp_path, patched: bool, stock_trainer: bool = False) -> dict:
    """One GRPO step; what generate() and the training forward saw, and the weights after. patched: the model in the
    exact tier and install(); stock_trainer: TRL's own GRPOTrainer even then (rl_kernel's fused head installed)."""
    if patched:
        rl_trl.install()
    base = rl_trl.ExactGRPOTrainer if patched and not stock_trainer else trl.GRPOTrainer
    seen: dict = {"generate": [], "train": []}

    class Recording(base):
        def _get_per_token_logps_and_entropies(self, mdl, input_ids, attention_mask, logits_to_keep, *a, **kw):
            out = super()._get_per_token_logps_and_entropies(mdl, input_ids, attention_mask, logits_to_keep, *a, **kw)
            if torch.is_grad_enabled():  # the loss's forward
                seen["train"].append((input_ids.detach().clone(), attention_mask.clone(), logits_to_keep,
                                      out[0].detach().clone()))  # fmt: skip
            return out

    m = model()
    if patched:
        m = rl_hf.patch(m, tier="exact")
    original = m.generate

    def generate(*args, **kwargs):
        out = original(*args, **kwargs, output_logits=True, return_dict_in_generate=True)
        seen["generate"].append((out.sequences.clone(), torch.stack(out.logits, 1).clone()))
        return out.sequences

    m.generate = generate
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / f"out-{patched}"), per_device_train_batch_size=BATCH,
        num_generations=GENERATIONS, max_completion_length=NEW, max_steps=1, temperature=TEMPERATURE,
        learning_rate=1e-3, report_to="none", save_strategy="no", use_cpu=True, seed=0, logging_steps=1,
    )  # fmt: skip
    trainer = Recording(model=m, reward_funcs=reward, args=args, train_dataset=dataset(), processing_class=tokenizer())
    trainer.train()
    seen["args"], seen["mixed_precision"] = args, trainer.accelerator.mixed_precision
    seen["checkpointing"] = m.is_gradient_checkpointing
    seen["weights"] = {k: v.detach().clone() for k, v in m.state_dict().items()}
    return seen


def as_trl_applies(fn):
    """TRL's selective_log_softmax as its trainer applies the temperature: 1.16's takes it, 1.10's trainer divides
    the logits by it first."""
    if "temperature" in inspect.signature(fn).parameters:
        return lambda logits, ids, t: fn(logits, ids, t)
    return lambda logits, ids, t: fn(logits / t, ids)


def rollout_vs_train(seen: dict, log_softmax) -> tuple[torch.Tensor, torch.Tensor]:
    """The rollout's log-probs (generate()'s logits / temperature, log_softmax: TRL's function) and the training
    forward's, at every completion token the loss saw, matched row by row through the token ids."""
    rollout, train = [], []
    rows = {}
    for seqs, logits in seen["generate"]:
        new = logits.shape[1]
        lp = as_trl_applies(log_softmax)(logits, seqs[:, -new:], TEMPERATURE)
        for b in range(seqs.shape[0]):
            rows.setdefault(tuple(seqs[b].tolist()), (lp[b], new))
    for ids, mask, keep, logps in seen["train"]:
        for b in range(ids.shape[0]):
            valid = mask[b, -keep:].bool()
            key = next(k for k in rows if _same(k, ids[b], mask[b]))
            lp, new = rows[key]
            rollout.append(lp[:keep][valid])
            train.append(logps[b][valid])
    return torch.cat(rollout), torch.cat(train)


def _same(gen_row: tuple, ids: torch.Tensor, mask: torch.Tensor) -> bool:
    """A generated row (prompt left padded, completion padded after EOS) is the training row's tokens under its mask."""
    want = ids[mask.bool()].tolist()
    got = [t for t in gen_row if t != PAD]
    return got[: len(want)] == want and all(t in (PAD, EOS) for t in got[len(want) :])


def test_exact_grpo_trainer_rollout_equals_training_and_runs_repeat(tmp_path):
    first = run(tmp_path / "a", patched=True)
    assert first["args"].bf16 and first["args"].gradient_checkpointing  # TRL's defaults, kept
    rollout, train = rollout_vs_train(first, trl.trainer.utils.selective_log_softmax)
    assert trl.trainer.utils.selective_log_softmax is rl_trl.selective_log_softmax
    assert rollout.numel() >= BATCH
    d = diff(rollout, train)
    assert d.equal, d.summary()
    again = run(tmp_path / "b", patched=True)
    differ = [k for k in first["weights"] if not bits_equal(first["weights"][k], again["weights"][k])]
    assert not differ, differ
    moved = model().state_dict()
    assert any(not bits_equal(moved[k], first["weights"][k]) for k in moved)  # the step changed the weights


TRL_HAS_FUSED_HEAD = hasattr(trl.trainer.utils, "add_fused_lm_head")  # TRL >= 1.16


def test_stock_grpo_trainer_with_the_installed_head_is_exact(tmp_path):
    """TRL's own GRPOTrainer after install(): TRL >= 1.16 scores through add_fused_lm_head, which install() replaced
    with rl_kernel's; TRL 1.10 scores logits with the installed selective_log_softmax. Either way a patched model's
    rollout log-probs equal the training forward's."""
    seen = run(tmp_path, patched=True, stock_trainer=True)
    if TRL_HAS_FUSED_HEAD:
        assert trl.trainer.grpo_trainer.add_fused_lm_head is rl_trl.add_fused_lm_head
    rollout, train = rollout_vs_train(seen, trl.trainer.utils.selective_log_softmax)
    assert rollout.numel() >= BATCH
    d = diff(rollout, train)
    assert d.equal, d.summary()


def test_an_unpatched_model_keeps_trls_head(tmp_path):
    """install() changes nothing for a model that is not patched: TRL's own head scores it (the control). Before
    TRL 1.16 there is no TRL head to keep: a clear error, never a silent fallback."""
    rl_trl.install()
    m = model()
    if not TRL_HAS_FUSED_HEAD:
        with pytest.raises(NotImplementedError, match=r"has no fused LM head \(TRL >= 1.16\)"):
            rl_trl.add_fused_lm_head(m, temperature=TEMPERATURE)
        return
    rl_trl.add_fused_lm_head(m, temperature=TEMPERATURE)
    ids = torch.randint(3, VOCAB, (2, 7))
    got = m(input_ids=ids, labels=ids, fused_lm_head=True).log_probs
    want = TRL_OWN(m(input_ids=ids).logits[:, :-1], ids[:, 1:], TEMPERATURE)
    assert float((got - want).abs().max()) < 1e-4  # TRL's own chunked head: close, not claimed equal
    with pytest.raises(NotImplementedError, match="is_top1"):
        rl_trl.add_fused_lm_head(rl_hf.patch(model()), outputs=("log_probs", "is_top1"))


def test_stock_grpo_trainer_differs(tmp_path):
    seen = run(tmp_path, patched=False)
    assert trl.trainer.utils.selective_log_softmax is TRL_OWN
    rollout, train = rollout_vs_train(seen, TRL_OWN)
    d = diff(rollout, train)
    print(f"{rollout.numel()} tokens, mixed precision {seen['mixed_precision']}, checkpointing {seen['checkpointing']}")
    print(f"stock TRL {trl.__version__}: {d.summary()}, max |dlogp| {float((rollout - train).abs().max()):.3g}")
    assert not d.equal, "the stock control must show the mismatch the adapter removes"


def run_continuous_batching(tmp_path, patched: bool) -> dict:
    """One GRPO step with TRL's continuous batching (`use_transformers_continuous_batching`: the model's
    generate_batch, paged cache, the trainer's sampling at its temperature). What the rollout returned (each request's
    tokens and the engine's log-probs) and, right after it, the engine-form log-probs of the teacher-forced forward of
    each sequence through the same model (same weights and dtype, as the rollout left it)."""
    if patched:
        rl_trl.install()
    m = rl_hf.patch(model(), tier="exact") if patched else model()
    seen: dict = {"rollout": [], "forward": [], "requests": []}
    original = m.generate_batch

    def generate_batch(inputs, **kwargs):
        out = original(inputs, **kwargs)
        for o in out.values():
            if not o.generated_tokens:
                continue
            ids = torch.tensor([o.prompt_ids + o.generated_tokens])
            with torch.no_grad():
                logits = m(input_ids=ids).logits[0, len(o.prompt_ids) - 1 : -1]
            forward = _paged.engine_logprobs(logits, torch.tensor(o.generated_tokens), TEMPERATURE)
            seen["rollout"].append(torch.tensor(o.logprobs, dtype=torch.float32))
            seen["forward"].append(forward)
            seen["requests"].append((o.prompt_ids, o.generated_tokens, seen["rollout"][-1]))
        return out

    m.generate_batch = generate_batch
    base = rl_trl.ExactGRPOTrainer if patched else trl.GRPOTrainer
    seen["train"] = []

    class Recording(base):
        def _get_per_token_logps_and_entropies(self, mdl, input_ids, attention_mask, logits_to_keep, *a, **kw):
            if torch.is_grad_enabled():  # the loss's forward: its logits, as the training step computes them
                with torch.no_grad():
                    logits = mdl(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1 : -1]
                seen["train"].append((input_ids.clone(), attention_mask.clone(), logits_to_keep, logits.float()))
            return super()._get_per_token_logps_and_entropies(mdl, input_ids, attention_mask, logits_to_keep, *a, **kw)

    args = trl.GRPOConfig(
        output_dir=str(tmp_path / f"cb-{patched}"), per_device_train_batch_size=BATCH,
        num_generations=GENERATIONS, max_completion_length=NEW, max_steps=1, temperature=TEMPERATURE,
        learning_rate=1e-3, report_to="none", save_strategy="no", use_cpu=True, seed=0, logging_steps=1,
        use_transformers_continuous_batching=True,
        transformers_continuous_batching_config={"page_size": 16, "num_blocks": 64, "max_batch_tokens": 32,
                                                 "return_logprobs": True, "auto_switch_to_flash": False},
    )  # fmt: skip
    Recording(model=m, reward_funcs=reward, args=args, train_dataset=dataset(), processing_class=tokenizer()).train()
    return seen


def train_vs_rollout(seen: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The rollout's log-probs and the engine-form log-probs of the training forward's logit rows for the same
    completion tokens (each training row matched to its request by its prompt and completion tokens)."""
    rollout, train = [], []
    for ids, mask, keep, logits in seen["train"]:
        width = ids.shape[1] - keep  # the left-padded prompts' width; completions follow, right padded
        for b in range(ids.shape[0]):
            prompt = ids[b, :width][mask[b, :width].bool()].tolist()
            completion = ids[b, width:].tolist()
            gen, lp = next((g, lp) for p, g, lp in seen["requests"] if p == prompt and completion[: len(g)] == g)
            rows = logits[b, : len(gen)]
            train.append(_paged.engine_logprobs(rows, torch.tensor(gen), TEMPERATURE))
            rollout.append(lp)
    return torch.cat(rollout), torch.cat(train)


@pytest.mark.skipif(not _paged.served(), reason=_paged.UNSERVED)
def test_continuous_batching_rollout_is_the_teacher_forced_forward(tmp_path):
    """TRL's paged rollout of a patched model: every sampled token's log-probability (the engine's, at the trainer's
    temperature) equals that of the teacher-forced forward of its sequence right after the rollout and that of the
    training step's forward (the same function of its logit rows), bit for bit; stock's engine differs."""
    seen = run_continuous_batching(tmp_path / "patched", patched=True)
    rollout, forward = torch.cat(seen["rollout"]), torch.cat(seen["forward"])
    assert rollout.numel() >= BATCH
    d = diff(rollout, forward)
    assert d.equal, d.summary()
    rollout, train = train_vs_rollout(seen)
    assert rollout.numel() >= BATCH
    d = diff(rollout, train)
    assert d.equal, f"the training forward's rows: {d.summary()}"
    stock = run_continuous_batching(tmp_path / "stock", patched=False)
    assert not diff(torch.cat(stock["rollout"]), torch.cat(stock["forward"])).equal, "the control must differ"
