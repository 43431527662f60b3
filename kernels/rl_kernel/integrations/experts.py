"""A mixture of experts under patch(): transformers' MoE blocks (Qwen3-MoE, OLMoE: a top-k router and gated SiLU
experts in 3-d weights, at the default experts implementation) in the tier, forward and backward, so a token's rows
have the same bits whatever tokens share its experts, in generate() and in the training forward.

- The router (`...TopKRouter`): logits by the tier's linear; probabilities by the mode's fp32 softmax
  (aten.ops.softmax: exp(x - max) over the row's tree sum); the top k with ties to the lower expert (a stable
  sort); with norm_topk_prob each divided by the tree sum of the k; returned as the installed transformers' router
  returns them (probe_router: 5.25 the logits and weights in their dtype, 5.0 the probabilities and fp32 weights).
- The experts (`...Experts`): the (token, slot) pairs sorted by expert, stably, so an expert's tokens stay in token
  order; gate_up and down by the tier's grouped product (`GroupedMM`: each row the tier linear's bits whatever
  rows, and however many, its expert received; dX the same product by the transposed weights; dW each expert's sum
  over its tokens in token order, the tier's dW chain); silu(gate) * up by the tier's silu_mul; times the routing
  weight; a token's k rows summed in fp32 by the tree in slot order and rounded once (the mode's sum). A token's
  input gradient is its k rows' gradients summed the same way: torch's index backward adds them atomically on a
  GPU, in any order. A routing weight's gradient (and the norm's) sums its row by the tree too, where autograd's
  would be torch's sum.
- No token is dropped: there is no capacity limit, every token reaches its k experts.
- Under torch.compile (the compiled rollout) both run eagerly, a graph break each: inductor's exp would round the
  softmax unlike the eager forward's.
Not claimed: CPU == GPU bits for these families. The router's exp and the experts' elementwise products are torch's
(each device's libm), as under rl_kernel.mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from rl_kernel.aten.ops import Product, grouped_mm, reduce, softmax, softmax_backward, tier_product, topk

# What patch() serves of transformers' experts (use_experts_implementation's flags, with its defaults).
EXPERT_FLAGS = {"has_gate": True, "is_concatenated": True, "has_bias": False, "has_post_expert_norm": False,
                "_is_expert_parallel": False}  # fmt: skip


# Routers that take the top k of their logits and softmax those k (the others softmax every logit, then take the top k).
SOFTMAX_OF_TOP = ("GptOssTopKRouter",)


def own_gate(module: nn.Module) -> bool:
    """GPT-OSS's experts: biases, gate and up interleaved, and their own activation (_apply_gate: clamped SwiGLU)."""
    return callable(getattr(module, "_apply_gate", None)) and isinstance(
        getattr(module, "gate_up_proj_bias", None), torch.Tensor
    )


def check_experts(module: nn.Module) -> None:
    """A ValueError naming what patch() does not serve in an experts module (biases or interleaved gate/up outside
    GPT-OSS's form, experts without a gate, a norm after each expert, expert parallelism)."""
    gpt_oss = own_gate(module)  # biases and interleaved gate/up, through its own _apply_gate
    if gpt_oss and not isinstance(getattr(module, "down_proj_bias", None), torch.Tensor):
        raise ValueError(f"rl_kernel: {type(module).__name__} has a gate_up bias but no down_proj_bias")
    for flag, served in EXPERT_FLAGS.items():
        if gpt_oss and flag in ("has_bias", "is_concatenated"):
            continue
        if getattr(module, flag, served) != served:
            raise ValueError(
                f"rl_kernel: {type(module).__name__} with {flag}={getattr(module, flag)!r} is not supported (patch() "
                "serves gated SiLU experts, gate and up concatenated, without biases, norms after the experts or "
                "expert parallelism; rl_kernel.mode serves the others)"
            )
    for weight in ("gate_up_proj", "down_proj"):
        if not isinstance(getattr(module, weight, None), torch.Tensor) or getattr(module, weight).dim() != 3:
            raise ValueError(f"rl_kernel: {type(module).__name__} has no 3-d {weight}: not transformers' experts")


def probe_router(module: nn.Module) -> None:
    """What this transformers' router returns, read once from its own forward on a zero row: as the first output the
    logits (transformers 5.25) or the probabilities (5.0); the weights in the logits' dtype (5.25) or in fp32 (5.0).
    GPT-OSS's router (SOFTMAX_OF_TOP) returns the logits and weights in their dtype in both: nothing to read."""
    if type(module).__name__ in SOFTMAX_OF_TOP:
        return
    with torch.no_grad():
        zero = module.weight.new_zeros((1, module.hidden_dim))
        first, weights, _ = type(module).forward(module, zero)
    module.__dict__["_rl_router"] = (bool((first != 0).any()), weights.dtype == zero.dtype)


# ---- the swapped forwards ------------------------------------------------------------------------------------------
# Eager inside a compiled model (a graph break each): inductor's own exp would round the router's softmax unlike the
# eager forward's, and the exact tier's grouped product reads its groups on the host.
@torch.compiler.disable
def router_forward(self: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, the top k's weights, their experts), as this transformers' TopKRouter returns them (probe_router);
    GPT-OSS's (SOFTMAX_OF_TOP): the logits with its bias, the top k of the logits, their softmax in the logits'
    dtype."""
    if getattr(type(self), "_rl_original", type(self)).__name__ in SOFTMAX_OF_TOP:
        logits = self._rl_layers.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight, self.bias)
        top, experts = topk(logits, self.top_k)
        return logits, _Softmax.apply(top).to(logits.dtype), experts
    probabilities_first, weights_in_dtype = self.__dict__.get("_rl_router", (False, True))
    logits = self._rl_layers.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight, None)
    probabilities = _Softmax.apply(logits)
    top, experts = topk(probabilities, self.top_k)  # a sort's values: gradients by its scatter (exact)
    if self.norm_topk_prob:
        top = _ByRow.apply(top, _Sum.apply(top, -1, True), True)
    first = probabilities if probabilities_first else logits
    return first, top.to(logits.dtype) if weights_in_dtype else top, experts


@torch.compiler.disable
def experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The experts' output [tokens, hidden] for each token's k experts and weights."""
    L = self._rl_layers
    product, grouped = tier_product(L.linear, getattr(L, "mm", None)), getattr(L, "grouped_mm", None)
    tokens, k = top_k_index.shape
    experts, order = torch.sort(top_k_index.reshape(-1), stable=True)  # pairs by expert, each in token order
    following = torch.arange(1, self.num_experts + 1, device=experts.device, dtype=experts.dtype)
    ends = torch.searchsorted(experts, following, right=False).to(torch.int32)  # each expert's end row, on the device
    back = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    gate_up, down = self.gate_up_proj, self.down_proj
    gpt_oss = own_gate(self)  # [E, in, out] and no flag in transformers 5.0, is_transposed=True in 5.25
    if not getattr(
        self, "is_transposed", gpt_oss
    ):  # [E, out, in] as nn.Linear keeps them: the products take [E, in, out]
        gate_up, down = gate_up.transpose(-2, -1), down.transpose(-2, -1)
    x = _Spread.apply(hidden_states, order, back, k)
    h = GroupedMM.apply(x, gate_up, ends, product, grouped)
    if gpt_oss:  # x @ W + b, then the module's own activation over interleaved gate / up (torch's elementwise)
        h = self._apply_gate(_Bias.apply(h, self.gate_up_proj_bias, experts, ends, product, grouped))
    else:
        gate, up = h.chunk(2, dim=-1)
        h = L.silu_mul(gate.contiguous(), up.contiguous())
    rows = GroupedMM.apply(h.contiguous(), down, ends, product, grouped)
    if gpt_oss:
        rows = _Bias.apply(rows, self.down_proj_bias, experts, ends, product, grouped)
    weighted = _ByRow.apply(rows, top_k_weights.reshape(-1)[order].unsqueeze(-1), False)
    return _Sum.apply(weighted[back].view(tokens, k, -1), 1, False).to(hidden_states.dtype)


# ---- the autograd functions: the forward's fixed order, and the backward's --------------------------------------
class GroupedMM(torch.autograd.Function):
    """a [S, K] (rows sorted by expert, `ends` [E] each expert's end row) @ b [E, K, N] -> [S, N] by the tier's
    grouped product (aten.ops.grouped_mm); dA = grad @ b^T the same way; dB [E, K, N] each expert's a^T @ grad over
    its rows in row order (the dW form)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor, product: Product, grouped: Any):
        ctx.save_for_backward(a, b, ends)
        ctx.product, ctx.grouped = product, grouped
        return grouped_mm(a, b, ends, product, grouped, trusted=True)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor):
        a, b, ends = ctx.saved_tensors
        grad = grad.contiguous()
        run = lambda x, y: grouped_mm(x, y, ends, ctx.product, ctx.grouped, trusted=True)  # noqa: E731
        da = run(grad, b.transpose(-2, -1)) if ctx.needs_input_grad[0] else None
        db = None
        if ctx.needs_input_grad[1] and _transposed(b):  # the parameter is [E, N, K]: its gradient in that layout
            db = run(grad.t(), a).transpose(-2, -1)
        elif ctx.needs_input_grad[1]:
            db = run(a.t(), grad)
        return da, db, None, None, None


ONES = 16  # _Bias's column of ones as 16 columns: the grouped kernels' smallest aligned width (one is used)


class _Bias(torch.autograd.Function):
    """rows [S, N] (sorted by expert; `experts` [S] theirs) plus each row's expert's bias, one add in the rows' dtype
    as transformers' `x @ W + b`; the bias's gradient is each expert's sum of its rows' gradients in row order by the
    tier's grouped dW of a column of ones (the tier linear's own bias gradient: db = linear(dy^T, 1)), where
    autograd's index backward would add them atomically on a GPU."""

    @staticmethod
    def forward(ctx: Any, rows, bias, experts, ends, product: Product, grouped: Any) -> torch.Tensor:
        ctx.save_for_backward(ends)
        ctx.product, ctx.grouped = product, grouped
        return rows + bias.index_select(0, experts)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor):
        (ends,) = ctx.saved_tensors
        grad = grad.contiguous()
        ones = grad.new_ones((grad.shape[0], ONES))
        db = grouped_mm(ones.t(), grad, ends, ctx.product, ctx.grouped, trusted=True)[:, 0]
        return grad, db, None, None, None, None


def _transposed(b: torch.Tensor) -> bool:
    """b [E, K, N] a transposed view of a contiguous [E, N, K] (transformers' experts' weights). Its gradient is then
    made as [E, N, K] (each expert's grad^T @ a: the same sums over its rows, the tier linear's own dW form), so that
    autograd hands the parameter a gradient in its own layout: another layout costs a strided copy of every expert's
    weights per step (AccumulateGrad; 10 ms of a 4-layer OLMoE step on an H200)."""
    return not b.is_contiguous() and b.transpose(-2, -1).is_contiguous()


class _Softmax(torch.autograd.Function):
    """The mode's fp32 softmax over the last dim (aten.ops.softmax), its gradient the mode's (softmax_backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = softmax(x.float())
        ctx.save_for_backward(y)
        ctx.dtype = x.dtype
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return softmax_backward(grad, y, -1, ctx.dtype)


class _Sum(torch.autograd.Function):
    """x summed over dim by the mode's tree (aten.ops.reduce: fp32, rounded once to x's dtype); each term's gradient
    is the sum's (exact)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
        ctx.shape, ctx.dim, ctx.keepdim, ctx.dtype = x.shape, dim, keepdim, x.dtype
        return reduce(x, [dim], keepdim, None, mean=False)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor):
        grad = grad if ctx.keepdim else grad.unsqueeze(ctx.dim)
        return grad.to(ctx.dtype).expand(ctx.shape), None, None


class _ByRow(torch.autograd.Function):
    """x [..., n] times (or, divide=True, over) a per-row factor f [..., 1], elementwise as torch's; f's gradient is
    the tree's sum over the row (aten.ops.reduce) of autograd's own terms (g * x; -g * (x / f / f)), where autograd
    would reduce them with torch's sum, whose order on a GPU may change with the number of rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, f: torch.Tensor, divide: bool) -> torch.Tensor:
        ctx.save_for_backward(x, f)
        ctx.divide = divide
        return x / f if divide else x * f

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor):
        x, f = ctx.saved_tensors
        dx = (grad / f if ctx.divide else grad * f).to(x.dtype)
        terms = -grad * (x / f / f) if ctx.divide else grad * x
        return dx, reduce(terms, [-1], True, None, mean=False).to(f.dtype), None


class _Spread(torch.autograd.Function):
    """x [tokens, H] -> its rows in pair order (rows[i] = x[order[i] // k]); a token's gradient is its k rows'
    gradients summed by the tree in slot order (_Sum's forward), not added atomically in any order."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, order: torch.Tensor, back: torch.Tensor, k: int) -> torch.Tensor:
        ctx.save_for_backward(back)
        ctx.k = k
        return x.index_select(0, order // k)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor):
        (back,) = ctx.saved_tensors
        per_token = grad[back].view(-1, ctx.k, grad.shape[-1])
        return reduce(per_token, [1], False, None, mean=False), None, None, None
