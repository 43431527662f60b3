"""rl_kernel.integrations.transformers on real transformers models (tiny, random weights, no download):
generate() == the teacher-forced forward bit for bit for Llama, Qwen2 and Qwen3, the RL step's ratios are
exactly 1.0, two runs give the same weights, the stock model differs, unpatch restores it, and what the patch
cannot honour is refused by name. CI runs this file at the lowest and the highest supported transformers.

Tests that take `device` run on the CPU and, where there is one, on the GPU; `cpu == gpu` tests need a GPU.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from transformers import LogitsProcessorList

from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.integrations import transformers as hf
from rlparity.cell.workloads import model as M

FAMILIES = M.FAMILIES
DTYPES = ("fp32", "bf16")
VOCAB, NEW = 211, 5


def patched(family: str, dtype: str, device: str, vocab: int = VOCAB):
    return hf.patch(M.build(family, vocab, dtype, 0, device).eval())


def assert_views_equal(r: M.Rollout, views: dict[str, torch.Tensor]) -> None:
    bad = {name: diff(v, r.logits).summary() for name, v in views.items() if not bits_equal(v, r.logits)}
    assert not bad, bad


def test_the_range_under_test_is_the_pinned_one() -> None:
    """The installed transformers is inside the range the requirements pin (the lowest or the highest in CI)."""
    from packaging.specifiers import SpecifierSet

    assert transformers.__version__ in SpecifierSet(hf.TRANSFORMERS_RANGE), transformers.__version__


@pytest.mark.parametrize("sampler", ["greedy", "gumbel"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_generate_equals_every_forward(family: str, dtype: str, sampler: str, device: str) -> None:
    """Left-padded prompts of mixed lengths: generate()'s logits == the forward over prompt + completion seen
    as the batch (left or right padded), shuffled, each sequence alone, and a continuous-batching replay."""
    model = patched(family, dtype, device)
    p = M.prompts(5, VOCAB, 0)
    r = M.generate(model, p, NEW, None if sampler == "greedy" else 7, device)
    views = M.forward_views(model, r, p, device)
    views["continuous batching"] = M.continuous_batching(model, r, p, device)
    assert_views_equal(r, views)


@pytest.mark.parametrize("batch", range(1, 9))
def test_every_batch_size(batch: int) -> None:
    model = patched("qwen3", "bf16", "cpu")
    p = M.prompts(batch, VOCAB, batch)
    for seed in (None, 3):
        r = M.generate(model, p, NEW, seed, "cpu")
        assert_views_equal(r, M.forward_views(model, r, p, "cpu"))


def test_a_sequence_samples_the_same_tokens_in_any_batch() -> None:
    """GumbelSampler with a key per prompt and the pad id: a sequence generated alone or in a batch of others
    draws the same tokens (its step is its own length, its stream its key's)."""
    model = patched("llama", "fp32", "cpu")
    p = M.prompts(6, VOCAB, 4)
    batched = M.generate(model, p, NEW, 11, "cpu").completions
    for b in (0, 3, 5):
        alone = M.Prompts(p.ids[b : b + 1, -p.lengths[b] :], p.mask[b : b + 1, -p.lengths[b] :], (p.lengths[b],))
        keys = torch.tensor([b * 7 + 1])  # M.generate's key for prompt b
        procs = LogitsProcessorList([hf.GumbelSampler(11, keys=keys, pad_token_id=M.PAD)])
        with torch.no_grad():
            out = model.generate(
                alone.ids,
                attention_mask=alone.mask,
                max_new_tokens=NEW,
                min_new_tokens=NEW,
                do_sample=False,
                logits_processor=procs,
                pad_token_id=M.PAD,
            )
        assert torch.equal(out[0, -NEW:], batched[b]), b


@pytest.mark.parametrize("family", FAMILIES)
def test_rl_step_ratios_are_one_and_steps_repeat(family: str) -> None:
    """The GRPO step's first ratios exp(new - old) are all exactly 1.0 (bits of 1.0f); two runs of two steps
    give the same weights; the second step moved them (the check is not vacuous)."""
    for dtype in DTYPES:
        _, first = M.rl_step(family, (6, NEW, VOCAB), dtype, 0, "cpu")
        one = torch.ones_like(first.ratios)
        assert bits_equal(first.ratios, one), diff(first.ratios, one)
        _, again = M.rl_step(family, (6, NEW, VOCAB), dtype, 0, "cpu")
        assert all(bits_equal(first.weights[k], again.weights[k]) for k in first.weights)
        start = M.build(family, VOCAB, dtype, 0)
        moved = [k for k, w in start.named_parameters() if not bits_equal(w.detach(), first.weights[k])]
        assert len(moved) > len(first.weights) // 2, moved


@pytest.mark.parametrize("family", FAMILIES)
def test_the_stock_model_differs(family: str) -> None:
    """The control: the unpatched model's generate() and forward disagree at some positions (CPU fp32)."""
    model = M.build(family, VOCAB, "fp32", 0).eval()
    p = M.prompts(5, VOCAB, 0)
    r = M.generate(model, p, NEW, None, "cpu")
    d = diff(M.forward_views(model, r, p, "cpu")["batch, left padded"], r.logits)
    assert d.count > 0, "the stock model agreed bit for bit: the control shows nothing"
    assert M.drift(r.logits, r.logits, r.completions)["max_abs_dlogp"] == 0.0


@pytest.mark.parametrize("family", FAMILIES)
def test_unpatch_restores_stock_behaviour(family: str) -> None:
    p = M.prompts(4, VOCAB, 2)
    stock = M.build(family, VOCAB, "bf16", 0).eval()
    model = patched(family, "bf16", "cpu")
    with torch.no_grad():
        want = stock(input_ids=p.ids, attention_mask=p.mask).logits
        exact = model(input_ids=p.ids, attention_mask=p.mask).logits
        got = hf.unpatch(model)(input_ids=p.ids, attention_mask=p.mask).logits
    assert bits_equal(got, want)
    assert not bits_equal(exact, want)  # the patch did change the arithmetic
    assert not hf.is_patched(model) and type(model.lm_head) is torch.nn.Linear


# ---- the fused head: log-probs from the hidden states --------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_completion_logprobs_equal_generates_scores(family: str, dtype: str, device: str) -> None:
    """completion_logprobs (the decoder's hidden states through rl_kernel.lm_head_logprobs, no logits) == the
    log-probs of generate()'s own scores, with and without a temperature; entropy too; an untied lm_head's weight
    gradient == the one through the materialised logits."""
    from rl_kernel.exact.softmax.ops import entropy, token_logprobs
    from rl_kernel.integrations.frameworks import divide_by_temperature

    model = patched(family, dtype, device)
    p = M.prompts(4, VOCAB, 5)
    r = M.generate(model, p, NEW, 3, device)
    ids, mask = r.sequences.to(device), M.full_mask(p, NEW).to(device)
    for temperature in (None, 0.6):
        scores = r.logits if temperature is None else divide_by_temperature(r.logits, temperature)
        want_lp, want_ent = token_logprobs(scores, r.completions), entropy(scores)
        lp, ent = hf.completion_logprobs(model, ids, mask, NEW, temperature=temperature, entropy=True, vocab_chunk=64)
        assert bits_equal(lp.cpu(), want_lp), diff(lp.cpu(), want_lp).summary()
        assert bits_equal(ent.cpu(), want_ent), diff(ent.cpu(), want_ent).summary()
    if model.lm_head.weight is model.get_input_embeddings().weight:
        return  # tied (the tiny Qwen2): the embedding's share of the gradient comes through dHidden's other order
    model.zero_grad()
    hf.completion_logprobs(model, ids, mask, NEW, vocab_chunk=64).sum().backward()
    fused = model.lm_head.weight.grad.clone()
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -NEW - 1 : -1]
    token_logprobs(logits.float(), ids[:, -NEW:]).sum().backward()
    assert bits_equal(fused, model.lm_head.weight.grad), diff(fused, model.lm_head.weight.grad).summary()


def test_completion_logprobs_needs_a_patched_model() -> None:
    stock = M.build("qwen3", VOCAB, "fp32", 0)
    ids = torch.ones(1, 6, dtype=torch.long)
    with pytest.raises(ValueError, match="patched with rl_kernel"):
        hf.completion_logprobs(stock, ids, None, 2)
    with pytest.raises(ValueError, match="logits_to_keep must be in"):
        hf.completion_logprobs(patched("qwen3", "fp32", "cpu"), ids, None, 6)


# ---- what the patch refuses ------------------------------------------------------------------------------
def _tiny(cls, **kw):
    base = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    return cls(**(base | kw))


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (
            lambda: transformers.Phi3ForCausalLM(_tiny(transformers.Phi3Config, pad_token_id=0)),
            TypeError,
            "supports LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Qwen3MoeForCausalLM, "
            "OlmoeForCausalLM, GptOssForCausalLM; got Phi3ForCausalLM",
        ),
        (
            lambda: transformers.MistralForCausalLM(_tiny(transformers.MistralConfig, sliding_window=0)),
            ValueError,
            "a sliding window must be a positive number of keys, got 0",
        ),
        (
            lambda: transformers.Qwen3ForCausalLM(_tiny(transformers.Qwen3Config, layer_types=["chunked_attention"])),
            ValueError,
            r"layer types \['chunked_attention'\] are not supported",
        ),
        (
            lambda: transformers.LlamaForCausalLM(
                _tiny(
                    transformers.LlamaConfig,
                    rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                )
            ),
            ValueError,
            "rope scaling 'linear'",
        ),
        (
            lambda: transformers.LlamaForCausalLM(_tiny(transformers.LlamaConfig, hidden_act="gelu")),
            ValueError,
            "hidden_act 'gelu'",
        ),
        (
            lambda: transformers.LlamaForCausalLM(_tiny(transformers.LlamaConfig, attention_dropout=0.1)),
            ValueError,
            "attention_dropout",
        ),
    ],
    ids=["architecture", "sliding-window", "layer-types", "rope-scaling", "activation", "dropout"],
)
def test_unsupported_models_are_named(build, error, match) -> None:
    with pytest.raises(error, match=match):
        hf.patch(build())


def test_the_fast_tier_on_the_cpu_names_the_exact_tier() -> None:
    """patch(model, tier="fast") swaps in the fast tier's layers; with no GPU kernels for the CPU, the first call
    says so and names the exact tier (no silent fallback)."""
    model = hf.patch(M.build("qwen3", VOCAB, "bf16", 0).eval(), tier="fast")
    assert hf.tier_of(model) == "fast" and hf.is_patched(model)
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"fast tier has no CPU kernels.*tier='exact'"):
        model(input_ids=ids)
    assert hf.tier_of(hf.unpatch(model)) is None


def test_bad_calls_are_named() -> None:
    model = patched("llama", "fp32", "cpu")
    with pytest.raises(ValueError, match="already patched"):
        hf.patch(model)
    with pytest.raises(ValueError, match=r"tier 'nope' is not available \(available: exact, fast\)"):
        hf.patch(M.build("llama", VOCAB, "fp32", 0), tier="nope")
    with pytest.raises(ValueError, match="the fast tier needs parameters that share one of bfloat16/float16"):
        hf.patch(M.build("llama", VOCAB, "fp32", 0), tier="fast")
    with pytest.raises(ValueError, match="not patched"):
        hf.unpatch(M.build("llama", VOCAB, "fp32", 0))
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="2-d attention_mask"):
        model(input_ids=ids, attention_mask=torch.ones(2, 4, 4))
    with pytest.raises(ValueError, match="pass the 2-d mask"):  # additive +1 everywhere: no key is seen
        model(input_ids=ids, attention_mask=torch.ones(2, 1, 4, 4))
    with pytest.raises(ValueError, match="one run of 1s"):
        model(input_ids=ids, attention_mask=torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="position_ids differ"):
        model(input_ids=ids, attention_mask=torch.ones(2, 4, dtype=torch.long), position_ids=torch.zeros(2, 4).long())
    with pytest.raises(ValueError, match="one run of 1s"):  # both checks in one read: the mask's is named first
        model(input_ids=ids, attention_mask=torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]), position_ids=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        hf.GumbelSampler(0, temperature=0.0)


@pytest.mark.gpu
def test_a_patched_forward_reads_its_checks_in_one_host_sync() -> None:
    """The checks of a forward (the mask's runs, the caller's position_ids) are read in one host sync: passing
    position_ids adds none (eager generate() is host-bound, and each sync drains the queue)."""
    model = patched("llama", "bf16", "cuda")
    ids, mask = torch.ones(2, 4, dtype=torch.long, device="cuda"), torch.ones(2, 4, dtype=torch.long, device="cuda")

    def syncs(**kw: torch.Tensor) -> int:
        model(input_ids=ids, attention_mask=mask, **kw)  # the kernels load, the tables are copied
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model(input_ids=ids, attention_mask=mask, **kw)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    alone = syncs()
    assert alone >= 1  # the control: the counter sees the mask check's read
    assert syncs(position_ids=mask.cumsum(-1) - 1) == alone


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_equals_gpu(family: str) -> None:
    """Both paths on both devices: the same sequences and the same logits bits (bf16)."""
    p = M.prompts(6, VOCAB, 1)
    cpu_model, gpu_model = patched(family, "bf16", "cpu"), patched(family, "bf16", "cuda")
    r_cpu, r_gpu = M.generate(cpu_model, p, NEW, 5, "cpu"), M.generate(gpu_model, p, NEW, 5, "cuda")
    assert torch.equal(r_cpu.sequences, r_gpu.sequences)
    assert bits_equal(r_gpu.logits, r_cpu.logits), diff(r_gpu.logits, r_cpu.logits)
    f_cpu = M.forward_views(cpu_model, r_cpu, p, "cpu")["batch, right padded"]
    f_gpu = M.forward_views(gpu_model, r_gpu, p, "cuda")["batch, right padded"]
    assert bits_equal(f_gpu, f_cpu), diff(f_gpu, f_cpu)


def test_projections_are_grouped_only_through_plain_swapped_linears() -> None:
    """A tier linear with a group form (the fast tier's: one launch for q/k/v, one for gate/up) computes an
    attention's or an MLP's projections together where they are the patch's own linears with no hook and no
    gradient can flow, with the bits of the calls they replace; a hook (the module's or a global one), an adapter
    in place of one, a gradient, a group form that would not launch them once on the input's device (configs.toml's
    linear.group off), or a linear without a group form (the exact tier's, a control's) gets the calls it would
    see."""
    import torch.nn.functional as F

    model = patched("qwen3", "bf16", "cpu")
    layer = model.model.layers[0]
    L = layer.mlp._rl_layers
    assert not hasattr(L.linear, "group")  # the exact tier: the calls as before
    grouped: list[int] = []
    launches_once = [True]

    def group(x, weights, biases):
        grouped.append(len(weights))
        return tuple(F.linear(x, w, b) for w, b in zip(weights, biases, strict=True))

    group.launches_once = lambda x: launches_once[0]

    layer.self_attn._rl_layers = layer.mlp._rl_layers = type(L)(**{**vars(L), "linear": L.linear})
    layer.self_attn._rl_layers.linear = layer.mlp._rl_layers.linear = _with_group(L.linear, group)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = patched("qwen3", "bf16", "cpu")(input_ids=ids).logits

    def run() -> list[int]:
        grouped.clear()
        with torch.no_grad():
            got = model(input_ids=ids).logits
        assert bits_equal(got, want)
        return sorted(set(grouped))

    assert run() == [2, 3]  # the control: q/k/v and gate/up each grouped
    handle = layer.self_attn.k_proj.register_forward_hook(lambda *a: None)
    assert run() == [2]
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda *a: None)
    assert run() == []
    handle.remove()
    original = layer.mlp.up_proj
    layer.mlp.up_proj = torch.nn.Linear(original.in_features, original.out_features, bias=False).bfloat16()
    layer.mlp.up_proj.weight.data.copy_(original.weight)
    assert run() == [3]
    layer.mlp.up_proj = original
    assert run() == [2, 3]
    launches_once[0] = False  # the target does not group: no group is made, and no projection is computed early
    assert run() == []
    launches_once[0] = True
    assert all("_rl_ready" not in p.__dict__ for p in (layer.self_attn.q_proj, layer.self_attn.k_proj))
    grouped.clear()
    model(input_ids=ids).logits.sum().backward()  # a gradient: the attention's projections are called one by one
    assert 3 not in grouped


def _with_group(linear, group):
    """The exact tier's linear with a group form attached (what the fast tier's linear carries)."""

    def wrapped(*args, **kwargs):
        return linear(*args, **kwargs)

    wrapped.group = group
    return wrapped


def test_the_fast_linears_group_form_is_its_own_and_a_controls_linear_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group form travels with the linear it groups: under the split-K control, the fast tier's linear is the
    control's, which has none, so the control reaches every projection."""
    from rl_kernel import tiers

    fast = tiers.get("fast")
    assert fast.op("linear").group is fast.api().linear_group
    monkeypatch.setenv(tiers.CONTROL_VAR, "split-k")
    assert not hasattr(fast.op("linear"), "group")


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_the_fast_tier_generate_equals_every_forward_grouped_or_not(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast tier on the GPU: generate() (q/k/v and gate/up each in one launch, the group kernel) == every
    forward, and == a forward whose modules make one linear call each (the linear's group form taken away)."""
    import rl_kernel.fast as fast

    model = hf.patch(M.build(family, VOCAB, "bf16", 0, "cuda").eval(), tier="fast")
    p = M.prompts(5, VOCAB, 0)
    kernels: list[str] = []

    def counting(real):
        def counted(kernel, *args, **kwargs):
            kernels.append(kernel.fn.__name__)
            return real(kernel, *args, **kwargs)

        return counted

    for module in (fast.linear_kernels, fast.group_kernels):  # a launch, or the first of a plan (fast.decoder.plan)
        for name in ("launch", "launch_replay"):
            monkeypatch.setattr(module, name, counting(getattr(fast.linear_kernels, name)))
    monkeypatch.setattr(fast.group_kernels, "grouped_launches", lambda target: True)  # whatever configs.toml pins
    fast.group_kernels.plans.clear()
    r = M.generate(model, p, NEW, 7, "cuda")
    assert "_gemm_group_kernel" in kernels  # the control: the group ran
    views = M.forward_views(model, r, p, "cuda")
    monkeypatch.delattr(fast.linear, "group")
    fast.group_kernels.plans.clear()
    kernels.clear()
    views["one linear call each"] = M.forward_views(model, r, p, "cuda")["batch, right padded"]
    assert kernels and "_gemm_group_kernel" not in kernels
    assert_views_equal(r, views)


def test_a_projection_returns_its_grouped_output_for_that_input_only() -> None:
    """During a grouped attention call each projection returns the output computed for the call's input; called
    with any other tensor it computes its own."""
    model = patched("qwen3", "bf16", "cpu")
    q_proj = model.model.layers[0].self_attn.q_proj
    x, other = torch.randn(1, 2, q_proj.in_features).bfloat16(), torch.randn(1, 2, q_proj.in_features).bfloat16()
    kept = torch.zeros(1, 2, q_proj.out_features).bfloat16()
    q_proj.__dict__["_rl_ready"] = (x, kept)
    try:
        assert q_proj(x) is kept
        assert bits_equal(q_proj(other), q_proj._rl_layers.linear(other, q_proj.weight, None))
    finally:
        del q_proj.__dict__["_rl_ready"]
