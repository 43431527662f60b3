"""The model workload's suite (rlparity.cell.workloads.model): a Hugging Face model's rollout against its training
forward, and an RL step, for every family. Every equality is on integer views of the bits."""

from __future__ import annotations

import pytest
import torch

import rl_kernel
from rl_kernel.integrations import transformers as hf
from rlparity import golden
from rlparity.cell.placement import devices
from rlparity.cell.suite.plugin import check_committed
from rlparity.cell.workloads import model as M

ONE = torch.tensor(1.0)
MIN_ENTROPY = 1.0  # nats: the tiny models have about 5 at vocabulary 256 .. 512


@pytest.fixture(params=M.FAMILIES)
def family(request) -> str:
    return request.param


def _sid(shape, family: str) -> str:
    """model:8x6x512 llama (never ':llama:', which rich prints as an emoji)."""
    return f"model:{'x'.join(map(str, shape))} {family}"


_FIRST_STEPS: dict[tuple, tuple[M.Rollout, M.StepResult]] = {}


def _first_rl_step(family: str, shape, cell, tier, device, params, keep=False) -> tuple[M.Rollout, M.StepResult]:
    """M.rl_step once for test_rl_step's first run and the golden digests (the same call: a fresh model from the
    seed); the repeats still run their own. keep=False hands the result over and forgets it."""
    key = (family, tuple(shape), cell.dtype, cell.seed, cell.tier, str(device), tuple(sorted(params.items())))
    found = _FIRST_STEPS.pop(key, None) or M.rl_step(family, shape, cell.dtype, cell.seed, device, tier, **params)
    if keep:
        _FIRST_STEPS[key] = found
    return found


def _patched(family: str, shape, cell, tier, device, params):
    return M.patched(family, shape[2], cell.dtype, cell.seed, device, tier, **params)


@pytest.mark.parametrize("sampler", ["greedy", "gumbel"])
def test_generate_matches_forward(cell, tier, record, shape, family, sampler, params):
    """generate()'s logits at every completion position == a teacher-forced forward's, whether that forward sees
    the batch left padded, right padded, shuffled, or each sequence alone; and == a continuous-batching replay."""
    rollout_dev, train_dev = devices(cell.platform, cell.placement)
    p = M.prompts(shape[0], shape[2], cell.seed)
    seed = None if sampler == "greedy" else cell.seed + 1
    model = _patched(family, shape, cell, tier, rollout_dev, params)
    if params["rollout"] == M.BATCHED:  # params: resolved, the defaults included
        return _engine_matches_forward(cell, tier, record, shape, family, sampler, params, model, p)
    r = M.generate(model, p, shape[1], seed, rollout_dev, params["rollout"])
    record.output(f"{_sid(shape, family)}/{sampler}/sequences", r.sequences)
    trainer = _patched(family, shape, cell, tier, train_dev, params)
    views = M.forward_views(trainer, r, p, train_dev)
    views["continuous batching"] = M.continuous_batching(trainer, r, p, train_dev)
    failures = []
    for name, logits in views.items():
        d = record.compare(
            f"{_sid(shape, family)} {sampler} generate ({rollout_dev}) vs {name} ({train_dev})", r.logits, logits
        )
        if not d.equal:
            failures.append(f"{name}: {d.summary()}")
    assert not failures, "; ".join(failures)


def _engine_matches_forward(cell, tier, record, shape, family, sampler, params, model, p) -> None:
    """The rollout mode "batched": transformers' continuous batching (model.generate_batch: packed steps, a paged
    cache, chunked prefill) of the prompts, greedy; the engine's log-probability of each chosen token == that of the
    training forward's logit row (paged.engine_logprobs) in every view, bit for bit."""
    from rl_kernel.integrations import paged

    if sampler != "greedy":
        pytest.skip("transformers' engine samples with its own generator, not rl_kernel's Gumbel sampler: the "
                    "batched rollout is checked greedy")  # fmt: skip
    if not paged.served():
        pytest.skip(f"{paged.UNSERVED} (this is {paged.transformers.__version__})")
    train_dev = devices(cell.platform, cell.placement)[1]
    r = M.engine_rollout(model, p, shape[1])
    record.output(f"{_sid(shape, family)}/batched/sequences", r.sequences)
    trainer = _patched(family, shape, cell, tier, train_dev, params)
    failures = []
    for name, logits in M.forward_views(trainer, r, p, train_dev).items():
        want = paged.engine_logprobs(logits.reshape(-1, logits.shape[-1]), r.completions.reshape(-1))
        d = record.compare(f"{_sid(shape, family)} generate_batch log-probs vs {name}", r.logprobs,
                           want.view(r.logprobs.shape).cpu())  # fmt: skip
        if not d.equal:
            failures.append(f"{name}: {d.summary()}")
    assert not failures, "; ".join(failures)


def test_sampling_differs_from_greedy(cell, tier, record, shape, family, params):
    """The Gumbel sampler really samples: the model's next-token distributions are not near one-hot (mean entropy
    >= MIN_ENTROPY nats) and the sampled sequences differ from the greedy ones. A near-greedy model (Qwen2's
    tied embedding at std 1 had 0.007 nats) would make the sampled checks and digests repeat the greedy ones."""
    dev = devices(cell.platform, cell.placement)[0]
    p = M.prompts(shape[0], shape[2], cell.seed)
    model = _patched(family, shape, cell, tier, dev, params)
    greedy = M.generate(model, p, shape[1], None, dev)
    sampled = M.generate(model, p, shape[1], cell.seed + 1, dev)
    sid = _sid(shape, family)
    entropy = float(rl_kernel.entropy(sampled.logits).mean())
    record.metric(f"{sid} mean next-token entropy (nats)", entropy)
    same = torch.tensor([torch.equal(a, b) for a, b in zip(sampled.completions, greedy.completions, strict=True)])
    record.metric(f"{sid} sampled sequences equal to greedy", int(same.sum()))
    assert entropy >= MIN_ENTROPY, f"{sid}: mean next-token entropy {entropy:.4f} nats: the model is near greedy"
    assert not bool(same.all()), f"{sid}: every sampled sequence equals the greedy one"


def test_rl_step(cell, tier, record, shape, family, params):
    """A GRPO step after the rollout: every importance ratio of the first step is exactly 1.0; two runs of two
    steps (each from a fresh model) give the same weights, bit for bit."""
    dev = devices(cell.platform, cell.placement)[1]
    _, first = _first_rl_step(family, shape, cell, tier, dev, params, keep=True)
    sid = _sid(shape, family)
    failures = []
    d = record.compare(f"{sid} first-step ratios == 1.0", first.ratios, ONE.expand_as(first.ratios))
    if not d.equal:
        failures.append(f"ratios: {d.summary()}")
    nans = torch.tensor([int(w.isnan().sum()) for w in first.first_weights.values()])
    d = record.compare(f"{sid} first-step weights hold no NaN", nans, torch.zeros_like(nans))
    if not d.equal:
        failures.append(f"NaN weights: {d.summary()}")
    for i in range(1, cell.repeats):
        _, again = M.rl_step(family, shape, cell.dtype, cell.seed, dev, tier, **params)
        for name in first.weights:
            d = record.compare(f"{sid} repeat {i} weights {name}", again.weights[name], first.weights[name])
            if not d.equal:
                failures.append(f"repeat {i} {name}: {d.summary()}")
    assert not failures, "; ".join(failures[:5])


def test_model_golden_digests(cell, tier, record, shape, family, params):
    """The exact tier's committed digests of the sampled sequences, the first step's log-probs and the weights
    after two steps: the same on every target."""
    dev = devices(cell.platform, cell.placement)[1]
    r, step = _first_rl_step(family, shape, cell, tier, dev, params)
    outputs = M.golden_outputs(r, step)
    keys = {what: golden.key(cell.dtype, shape, cell.seed, f"{family}/{what}", cell.workload) for what in outputs}
    check_committed(cell, record, _sid(shape, family), keys, outputs)


def test_stock_model_control(cell, record, shape, family, params):
    """Informational, never gated: the unpatched model's generate() vs its forward (mean/max |dlogp| and the
    share of ratios the clip would cut, in the cell's metrics), so the report shows what the patch buys."""
    dev = devices(cell.platform, cell.placement)[1]
    p = M.prompts(shape[0], shape[2], cell.seed)
    model = M.stock(family, shape[2], cell.dtype, cell.seed, dev, **params)
    r = M.generate(model, p, shape[1], None, dev)
    forward = M.forward_views(model, r, p, dev)["batch, left padded"]
    sid = _sid(shape, family)
    d = record.compare(f"{sid} stock generate vs forward logits", r.logits, forward, informational=True)
    for name, value in M.drift(r.logits, forward, r.completions).items():
        record.metric(f"{sid} stock {name}", value)
    assert d.total == r.logits.numel()


def test_unpatch_restores_stock(cell, tier, record, shape, family, params):
    """unpatch() gives back the stock model: its forward's bits equal a never-patched model's."""
    dev = devices(cell.platform, cell.placement)[1]
    p = M.prompts(shape[0], shape[2], cell.seed)
    ids, mask = p.ids.to(dev), p.mask.to(dev)
    stock = M.stock(family, shape[2], cell.dtype, cell.seed, dev, **params)
    restored = hf.unpatch(_patched(family, shape, cell, tier, dev, params))
    with torch.no_grad():
        want, got = (
            stock(input_ids=ids, attention_mask=mask).logits,
            restored(input_ids=ids, attention_mask=mask).logits,
        )
    d = record.compare(f"{_sid(shape, family)} unpatched vs stock forward", got.cpu(), want.cpu())
    assert d.equal, d.summary()
