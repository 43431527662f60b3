"""patch() on mixtures of experts (issue 54): Qwen3-MoE (top-2 of 4, normalized) and OLMoE (top-4 of 8) built at
transformers' default experts implementation, their router and experts in the tier (rl_kernel.integrations.experts).
generate() in the eager, static and compiled modes == the teacher-forced forward seen four ways (called as TRL calls it,
without position_ids) and called as verl calls it; a GRPO step's first ratios are exactly 1 and two runs give the same
weights; the experts block == a token-by-token reference, its gradients those of each token alone and of each expert's
own tokens, the routing weights' gradients the tree's sums and the router's the mode's. The controls: stock's ratios;
the combine and the gradient spread in another order."""

from __future__ import annotations

import patched_views
import pytest
import torch

from rl_kernel import models, tiers
from rl_kernel.aten.ops import reduce
from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.integrations import experts as E
from rl_kernel.integrations.transformers import patch
from rlparity.cell.workloads import model as M

VOCAB, NEW = 211, 12


def mismatches(model, rollout: str, device: str) -> dict[str, str]:
    return patched_views.mismatches(model, VOCAB, NEW, rollout, device)


@pytest.mark.parametrize("rollout", ["eager", "static"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", models.MIXTURES)
def test_patched_experts_generate_equals_every_forward(family: str, dtype: str, rollout: str) -> None:
    model = models.tiny_model(family, VOCAB, dtype=dtype, tier="exact")
    assert type(model.model.layers[0].mlp.experts).forward is E.experts_forward
    mlp = model.model.layers[0].mlp
    assert type(getattr(mlp, "gate", None) or mlp.router).forward is E.router_forward  # GPT-OSS's: router
    assert not mismatches(model, rollout, "cpu")


def test_patched_experts_compiled_generate_equals_every_forward() -> None:
    """transformers' compiled decode step: the experts run eagerly inside it (a graph break each)."""
    assert not mismatches(models.tiny_model("olmoe", VOCAB, tier="exact"), "compiled", "cpu")


@pytest.mark.parametrize(("tier", "device"), [("exact", "cpu"), pytest.param("fast", "cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("family", models.MIXTURES)
def test_a_patched_grpo_step_has_ratios_of_one_and_repeats(family: str, tier: str, device: str) -> None:
    """Rollout then two GRPO steps (micro-batches of 3, right padded): the first step's ratios exactly 1, the same
    weights run to run, and every router and expert weight moved (their gradients flowed). The control: the same
    weights rolled out by stock and trained in the tier (two engines, as RL stacks run them) give ratios not all 1.
    (Stock against itself is no control on a GPU: at this size its decode and prefill kernels agree.)"""
    dtype = "fp32" if tier == "exact" else "bf16"

    def step(tier: str, rollout_tier: str | None = None) -> M.StepResult:
        def build(t: str):
            return models.tiny_model(family, VOCAB, dtype=dtype, device=device, tier=t)

        model, p = build(tier), M.prompts(5, VOCAB, 0)
        rollout = M.generate(build(rollout_tier) if rollout_tier else model, p, NEW, None, device)
        return M.train(model, rollout, p, device, seed=0)

    first, again, crossed = step(tier), step(tier), step(tier, rollout_tier="stock")
    assert bits_equal(first.ratios, torch.ones_like(first.ratios)), diff(first.ratios, torch.ones_like(first.ratios))
    assert all(bits_equal(first.weights[n], again.weights[n]) for n in first.weights)
    start = models.tiny_weights(family, VOCAB, 0).state_dict()
    moe = [n for n in first.weights if any(f".mlp.{part}." in n for part in ("gate", "router", "experts"))]
    moved = [not torch.equal(first.weights[n].cpu(), start[n].to(first.weights[n].dtype)) for n in moe]
    assert moe and all(moved), "a router or expert weight is unmoved"
    ones = torch.ones_like(crossed.ratios)
    assert not bits_equal(crossed.ratios, ones), "stock's rollout trained in the tier: ratios all 1, cannot fail"


def logits_gap(patched, stock, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """The largest |patched - stock| logit over a left-padded batch's real tokens, relative to stock's largest."""
    with torch.no_grad():
        got, want = (m(input_ids=ids, attention_mask=mask).logits for m in (patched, stock))
    real = mask.bool()
    return ((got - want)[real].abs().max() / want[real].abs().max()).item()


@pytest.mark.parametrize("family", models.MIXTURES)
def test_the_patched_mixtures_compute_their_models(family: str) -> None:
    """The patched model (exact tier, fp32) is its architecture: within fp32 rounding of stock's logits (GPT-OSS: its
    sinks, biased and interleaved experts with their own activation, softmax over the top k, half rotary tables).
    The control: stock with its sinks (GPT-OSS) or its router moved is far outside the bound."""
    ids, mask = models.sequences(3, 9, 4, VOCAB, seed=2)
    patched, stock = models.tiny_model(family, VOCAB, tier="exact"), models.tiny_model(family, VOCAB)
    assert logits_gap(patched, stock, ids, mask) < 1e-4
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in stock.named_parameters():
            if name.endswith("sinks") or ".mlp.gate." in name or ".mlp.router." in name:
                p.add_(torch.randn(p.shape, generator=g))
    assert logits_gap(patched, stock, ids, mask) > 1e-3


def test_gpt_oss_with_yarn_is_its_model_and_generate_equals_every_forward() -> None:
    """GPT-OSS's released rotary (YaRN, factor 32, here over 8 original positions so that it bends these short
    sequences' frequencies; attention_scaling 1.35): the patched model takes the module's own frequencies and scaling,
    within fp32 rounding of stock's logits, and generate() equals every forward."""
    import copy

    import transformers

    config = models.tiny_config("gpt_oss", VOCAB)
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                              "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 8}  # fmt: skip
    torch.manual_seed(0)
    stock = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert stock.model.rotary_emb.attention_scaling != 1.0
    patched = patch(copy.deepcopy(stock), tier="exact")
    ids, mask = models.sequences(3, 9, 4, VOCAB, seed=2)
    assert logits_gap(patched, stock, ids, mask) < 1e-4
    assert not mismatches(patched, "eager", "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_patched_router_is_the_routers_under_the_mode(dtype: torch.dtype) -> None:
    """Qwen3-MoE's router at 128 experts, top-8, normalized (Qwen3-30B-A3B's): the patched one's logits, weights and
    experts are those of transformers' own under rl_kernel.mode (its softmax, stable top-k and tree sums)."""
    import transformers

    import rl_kernel

    config = models.tiny_config("qwen3_moe", VOCAB, hidden=64)
    config.num_experts, config.num_experts_per_tok = 128, 8
    stock = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter(config)
    with torch.no_grad():
        stock.weight.copy_(torch.randn(stock.weight.shape, generator=torch.Generator().manual_seed(6)))
    stock = stock.to(dtype)
    h = torch.randn(200, 64, generator=torch.Generator().manual_seed(7)).to(dtype)
    patched = type(stock).__new__(type(stock))
    patched.__dict__ = dict(stock.__dict__, _rl_layers=tiers.get("exact").namespace())
    E.probe_router(patched)  # what this transformers' router returns (5.0: the probabilities, fp32 weights)
    with torch.no_grad():
        with rl_kernel.mode("exact"):
            want = stock(h)
        got = E.router_forward(patched, h)
    for name, w, g in zip(("logits", "weights", "experts"), want, got, strict=True):
        assert bits_equal(g, w), f"{name}: {diff(g.float(), w.float())}"


def router_gradients(router, h: torch.Tensor, forward) -> tuple[torch.Tensor, torch.Tensor]:
    """d(weights . G + logits . G')/d(hidden, router weight) through `forward`."""
    router.weight.grad = None
    h = h.detach().requires_grad_()
    logits, weights, _ = forward(h)
    g = torch.Generator().manual_seed(8)
    loss = (weights * torch.randn(weights.shape, generator=g).to(weights.dtype)).sum()
    (loss + (logits * torch.randn(logits.shape, generator=g).to(logits.dtype)).sum()).backward()
    return h.grad, router.weight.grad


def test_the_patched_routers_gradients_are_the_modes() -> None:
    """The norm's and the softmax's gradients (sums over the row by the tree, the mode's softmax backward) and the
    linear's: the patched router's hidden and weight gradients are those of transformers' own under the mode."""
    import transformers

    import rl_kernel

    config = models.tiny_config("qwen3_moe", VOCAB, hidden=64)
    config.num_experts, config.num_experts_per_tok = 128, 8
    router = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(6)))
    h = torch.randn(200, 64, generator=torch.Generator().manual_seed(7))
    with rl_kernel.mode("exact"):
        want = router_gradients(router, h, router.forward)
    router._rl_layers = tiers.get("exact").namespace()
    E.probe_router(router)
    got = router_gradients(router, h, lambda x: E.router_forward(router, x))
    for name, w, g in zip(("hidden", "weight"), want, got, strict=True):
        assert bits_equal(g, w), f"{name}: {diff(g, w)}"


# ---- the experts block alone: a token-by-token reference, and its gradients' invariances ---------------------------
class Block(torch.nn.Module):
    """transformers' experts layout ([E, 2I, H] gate_up, [E, H, I] down) with the patched forward of a tier."""

    forward = E.experts_forward

    def __init__(self, experts: int, hidden: int, inter: int, dtype: torch.dtype, tier: str = "exact") -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.num_experts, self._rl_layers = experts, tiers.get(tier).namespace()
        self.gate_up_proj = torch.nn.Parameter((torch.randn(experts, 2 * inter, hidden, generator=g) / 8).to(dtype))
        self.down_proj = torch.nn.Parameter((torch.randn(experts, hidden, inter, generator=g) / 8).to(dtype))


def routed(tokens: int, experts: int, k: int, hidden: int, dtype: torch.dtype, seed: int = 2):
    """hidden states, each token's k distinct experts (a random order, as a router's top-k) and their weights."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g).to(dtype).requires_grad_()
    index = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    return h, index, torch.rand(tokens, k, generator=g).to(dtype).requires_grad_()


def reference(block: Block, h: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Token by token, slot by slot: the tier's linear of the token's row alone by its expert's weights, silu_mul,
    the down linear, times the weight; the k rows summed by the tree in slot order (fp32, rounded once)."""
    L, rows = block._rl_layers, []
    with torch.no_grad():
        for t in range(h.shape[0]):
            for j, e in enumerate(index[t].tolist()):
                gate, up = L.linear(h[t : t + 1], block.gate_up_proj[e], None).chunk(2, dim=-1)
                down = L.linear(L.silu_mul(gate.contiguous(), up.contiguous()), block.down_proj[e], None)
                rows.append(down[0] * weights[t, j])
    return reduce(torch.stack(rows).view(h.shape[0], index.shape[1], -1), [1], False, None, mean=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_experts_block_is_the_token_by_token_reference(dtype: torch.dtype) -> None:
    block = Block(16, 32, 24, dtype)
    h, index, weights = routed(40, 16, 8, 32, dtype)
    with torch.no_grad():
        got = block(h, index, weights)
    assert bits_equal(got, reference(block, h, index, weights)), diff(got, reference(block, h, index, weights))


def gradients(block: Block, h, index, weights, upstream: torch.Tensor) -> dict[str, torch.Tensor]:
    block.zero_grad(set_to_none=True)
    h, weights = h.detach().requires_grad_(), weights.detach().requires_grad_()
    (block(h, index, weights) * upstream).sum().backward()
    return {"h": h.grad, "weights": weights.grad, "gate_up": block.gate_up_proj.grad, "down": block.down_proj.grad}


def test_a_tokens_gradient_is_its_own_and_an_experts_its_tokens() -> None:
    """dX and the routing weights' gradients of token t are the same in the batch as for t alone; expert e's dW is
    the same over the whole batch as over only the tokens routed to e (in the same order)."""
    block = Block(16, 32, 24, torch.float32)
    h, index, weights = routed(40, 16, 8, 32, torch.float32)
    upstream = torch.randn(40, 32, generator=torch.Generator().manual_seed(3))
    full = gradients(block, h, index, weights, upstream)
    for t in (0, 17, 39):
        alone = gradients(block, h[t : t + 1], index[t : t + 1], weights[t : t + 1], upstream[t : t + 1])
        assert bits_equal(full["h"][t : t + 1], alone["h"]), f"token {t}: {diff(full['h'][t : t + 1], alone['h'])}"
        assert bits_equal(full["weights"][t : t + 1], alone["weights"]), f"token {t}: routing weights"
    for e in (0, 5, 15):
        mine = (index == e).any(-1).nonzero()[:, 0]
        own = gradients(block, h[mine], index[mine], weights[mine], upstream[mine])
        for w in ("gate_up", "down"):
            assert bits_equal(full[w][e], own[w][e]), f"expert {e} {w}: {diff(full[w][e], own[w][e])}"


def grouped_against_the_tier_linear(tier: str, device: str, dtype: torch.dtype, transposed: bool = False) -> list[str]:
    """GroupedMM over 6 experts (one empty) against the tier's own linear (nn.Linear's [N, K] weights) of each
    expert's rows alone, forward and backward: the names of the tensors that differ. transposed: b [E, K, N] is a
    view of an [E, N, K] parameter (transformers' experts), whose gradient must come in the parameter's layout."""
    L, g = tiers.get(tier).namespace(), torch.Generator().manual_seed(5)
    counts = [7, 0, 300, 1, 40, 613]  # hundreds of rows: a BLAS would block dW's sum over them
    a = torch.randn(sum(counts), 48, generator=g).to(dtype).to(device).requires_grad_()
    b = (torch.randn(6, 48, 40, generator=g) / 7).to(dtype).to(device)
    b = (b.transpose(-2, -1).contiguous().transpose(-2, -1) if transposed else b).requires_grad_()
    grad = torch.randn(sum(counts), 40, generator=g).to(dtype).to(device)
    ends = torch.tensor(counts).cumsum(0).to(torch.int32).to(device)
    product = E.tier_product(L.linear, getattr(L, "mm", None))
    out = E.GroupedMM.apply(a, b, ends, product, getattr(L, "grouped_mm", None))
    (db,) = torch.autograd.grad(out, b, grad, retain_graph=True)  # as the backward made it (b.grad: after a copy)
    out.backward(grad)
    differ, start = [], 0
    if db.stride() != b.stride():
        differ.append(f"dB's layout {db.stride()} is not the weight's {b.stride()}")
    for e, n in enumerate(counts):
        if n == 0:  # an expert that received no row: no product, a zero dW
            differ += [] if bits_equal(b.grad[e], torch.zeros_like(b.grad[e])) else [f"expert {e} dB (empty)"]
            continue
        x = a[start : start + n].detach().requires_grad_()
        w = b[e].t().contiguous().detach().requires_grad_()
        y = L.linear(x, w, None)
        y.backward(grad[start : start + n])
        pairs = {
            "out": (out[start : start + n], y),
            "dA": (a.grad[start : start + n], x.grad),
            "dB": (b.grad[e], w.grad.t()),
        }
        differ += [f"expert {e} {name}" for name, (got, want) in pairs.items() if not bits_equal(got, want)]
        start += n
    return differ


def test_each_experts_rows_and_gradients_are_the_tier_linears() -> None:
    """The grouped product's rows, dX and dW are those of the tier's linear over the expert's rows alone: whatever
    rows, and however many, each expert received; dW over its rows in row order."""
    for dtype in (torch.float32, torch.bfloat16):
        for transposed in (False, True):
            assert not grouped_against_the_tier_linear("exact", "cpu", dtype, transposed)


def test_an_experts_bias_gradient_is_the_tier_linears() -> None:
    """GPT-OSS's expert biases: each row plus its expert's bias (one add in the rows' dtype); the bias's gradient is
    the tier linear's own over that expert's rows alone (db = linear(dy^T, 1): the rounded sum in row order), where
    autograd's index backward would add them atomically on a GPU (fp32 here: bf16's rounding would hide an order)."""
    L, g = tiers.get("exact").namespace(), torch.Generator().manual_seed(9)
    counts = [5, 0, 300, 41]
    ends = torch.tensor(counts).cumsum(0).to(torch.int32)
    experts = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    rows = torch.randn(sum(counts), 24, generator=g).requires_grad_()
    bias = torch.randn(len(counts), 24, generator=g).requires_grad_()
    grad = torch.randn(sum(counts), 24, generator=g)
    out = E._Bias.apply(rows, bias, experts, ends, E.tier_product(L.linear, getattr(L, "mm", None)), None)
    assert bits_equal(out, rows + bias[experts])
    out.backward(grad)
    assert bits_equal(rows.grad, grad)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:  # an expert that received no row: a zero gradient
            assert bits_equal(bias.grad[e], torch.zeros(24, dtype=torch.float32))
            continue
        b = torch.zeros(24, dtype=torch.float32, requires_grad=True)
        L.linear(torch.zeros(n, 8, dtype=torch.float32), torch.zeros(24, 8, dtype=torch.float32), b).backward(
            grad[start : start + n]
        )
        assert bits_equal(bias.grad[e], b.grad), f"expert {e}: {diff(bias.grad[e], b.grad)}"
        start += n
    summed = torch.stack([grad[experts == e].sum(0) for e in range(len(counts))])
    assert not bits_equal(summed, bias.grad), "the control: torch's sum over each expert's rows, in its own order"


def test_a_routing_weights_gradient_is_the_tree_over_its_row() -> None:
    """d out / d weight[t, j] = the tree's sum over the hidden dim of upstream[t] * the (t, j) row before weighting
    (written out token by token here), not torch's sum."""
    block = Block(16, 32, 24, torch.float32)
    h, index, weights = routed(40, 16, 8, 32, torch.float32)
    upstream = torch.randn(40, 32, generator=torch.Generator().manual_seed(3))
    got = gradients(block, h, index, weights, upstream)["weights"]
    ones = torch.ones_like(weights)  # weight 1: each slot's row before weighting, summed alone below
    rows = torch.stack([reference(block, h, index[:, j : j + 1], ones[:, j : j + 1]) for j in range(8)], dim=1)
    assert bits_equal(got, reduce(upstream[:, None, :] * rows, [-1], False, None, mean=False))


def test_a_tokens_gradient_sums_its_slots_by_the_tree_in_slot_order() -> None:
    """_Spread's backward against sums written out slot by slot: token t's gradient is the tree over its k rows'
    gradients taken in its top-k order (not the sorted pairs' order, nor atomics in any order)."""
    h, index, _ = routed(12, 16, 8, 32, torch.float32)
    order = torch.sort(index.reshape(-1), stable=True).indices
    back = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel()))
    rows = E._Spread.apply(h, order, back, 8)
    grad = torch.randn(rows.shape, generator=torch.Generator().manual_seed(4))
    rows.backward(grad)
    position = {int(pair): i for i, pair in enumerate(order)}  # where pair (t, j) = t * k + j went
    slots = torch.stack([torch.stack([grad[position[t * 8 + j]] for j in range(8)]) for t in range(12)])
    assert bits_equal(h.grad, reduce(slots, [1], False, None, mean=False))


def test_the_combine_and_spread_orders_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative controls: the k rows combined by torch's sum (its order, not the tree's) and a token's gradient
    spread back by index_select's own backward (index_add in the sorted pairs' order)."""
    block = Block(16, 32, 24, torch.float32)
    h, index, weights = routed(40, 16, 8, 32, torch.float32)
    expected = reference(block, h, index, weights)
    monkeypatch.setattr(E._Sum, "apply", lambda x, dim, keepdim: x.sum(dim, keepdim=keepdim))
    with torch.no_grad():
        assert not bits_equal(block(h, index, weights), expected), "torch's sum gave the tree's bits: cannot fail"
    monkeypatch.undo()
    upstream = torch.randn(40, 32, generator=torch.Generator().manual_seed(3))
    tree = gradients(block, h, index, weights, upstream)["h"]
    monkeypatch.setattr(E._Spread, "apply", lambda x, order, back, k: x.index_select(0, order // k))
    assert not bits_equal(gradients(block, h, index, weights, upstream)["h"], tree), "index_add gave the tree's bits"


def test_experts_patch_does_not_serve_are_refused() -> None:
    """Biases, interleaved gate/up, expert parallelism: refused by name outside GPT-OSS's form (biases, interleaved
    gate/up and its own activation), and there expert parallelism or a missing down_proj bias."""
    block = Block(4, 8, 8, torch.float32)
    E.check_experts(block)
    for flag, value in (("has_bias", True), ("is_concatenated", False), ("_is_expert_parallel", True)):
        setattr(block, flag, value)
        with pytest.raises(ValueError, match=flag):
            E.check_experts(block)
        setattr(block, flag, E.EXPERT_FLAGS[flag])
    gpt_oss = models.tiny_model("gpt_oss", VOCAB).model.layers[0].mlp.experts  # biases, interleaved: served
    E.check_experts(gpt_oss)
    gpt_oss._is_expert_parallel = True
    with pytest.raises(ValueError, match="_is_expert_parallel"):
        E.check_experts(gpt_oss)
    gpt_oss._is_expert_parallel, gpt_oss.down_proj_bias = False, None
    with pytest.raises(ValueError, match="down_proj_bias"):
        E.check_experts(gpt_oss)


@pytest.mark.gpu
@pytest.mark.parametrize("rollout", ["eager", "static", "compiled"])
@pytest.mark.parametrize("family", models.MIXTURES)
def test_the_fast_tier_experts_generate_equals_every_forward(family: str, rollout: str) -> None:
    """The fast tier: the experts' products in fast.grouped_mm's one launch."""
    model = models.tiny_model(family, VOCAB, dtype="bf16", device="cuda", tier="fast")
    assert not mismatches(model, rollout, "cuda")


@pytest.mark.gpu
def test_the_fast_tier_experts_rows_and_gradients_are_the_fast_linears() -> None:
    for transposed in (False, True):
        assert not grouped_against_the_tier_linear("fast", "cuda", torch.bfloat16, transposed)


@pytest.mark.gpu
def test_the_fast_tier_experts_gradients_are_their_tokens() -> None:
    block = Block(16, 64, 32, torch.bfloat16, tier="fast").cuda()
    h, index, weights = (t.cuda() for t in routed(300, 16, 8, 64, torch.bfloat16))
    upstream = torch.randn(300, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).cuda()
    full, again = gradients(block, h, index, weights, upstream), gradients(block, h, index, weights, upstream)
    assert all(bits_equal(full[n], again[n]) for n in full), "run to run"
    for e in (0, 9):
        mine = (index == e).any(-1).nonzero()[:, 0]
        own = gradients(block, h[mine], index[mine], weights[mine], upstream[mine])
        assert bits_equal(full["gate_up"][e], own["gate_up"][e]) and bits_equal(full["down"][e], own["down"][e])
    alone = gradients(block, h[7:8], index[7:8], weights[7:8], upstream[7:8])
    assert bits_equal(full["h"][7:8], alone["h"]) and bits_equal(full["weights"][7:8], alone["weights"])
