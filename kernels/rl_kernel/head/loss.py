"""A fused policy loss: an RL step's loss straight from the hidden states, its gradients computed in the forward,
three head-size GEMMs where lm_head_logprobs and its backward take four.

    def clipped(logp, old, adv):                               # a token's loss from that token's values only
        ratio = torch.exp(logp - old)
        return -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)

    def per_sequence(per_token):                               # linear in the per-token losses (GRPO's mean)
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()

    out = rl_kernel.lm_head_loss(hidden, lm_head.weight, tokens, clipped, per_sequence, inputs=(old, adv), tier="fast")
    out.loss.backward()                                        # out.logprobs, out.entropy: detached, for logging

What it computes, bit for bit (the tests hold it to this, `composed` below):

    logp = lm_head_logprobs(hidden, weight, tokens, ...)       # logp, ent = ... with entropy=True
    loss = reduce(token_loss(logp, *inputs).view(lead))        # token_loss(logp, ent, *inputs) with entropy=True

with autograd's gradients of that composition in hidden and weight. token_loss receives 1-D blocks of tokens (the
flattened rows and the inputs' matching elements) and must be elementwise: a token's loss from its own log-prob,
entropy and inputs, as every PPO / GRPO per-token objective is. reduce must be linear in the per-token losses (a
weighted sum: the GRPO, BNPO, Dr. GRPO and DAPO normalisations); that is checked, its gradient at the losses must
be its gradient at zero, bit for bit. The backward takes the upstream gradient 1 (loss.backward()): a scale such
as 1 / accumulation steps belongs inside reduce.

How (docs/numerics.md 12.4): whole rows in blocks of a multiple of dW's K step; per block one GEMM for the logits,
the head's row kernels (head.whole_rows), the per-token gradient (autograd of token_loss on the block, fed reduce's
token weights), the logit gradient (head.logits_grad), dHidden as the fused head's backward makes it (the
vocabulary chunks' fp32 partials in order, rounded once) and dWeight's sum over the rows continued into one fp32
buffer (HeadGemms.dw_chain), rounded once by the last block's GEMM: the one chain over the rows of the unfused
linear's dW, stored as its kernel stores it. Memory: a block's logits and their gradient (about 2 x
BLOCK_ELEMENTS elements), dWeight's fp32 sum (4 bytes a weight element) and the gradients themselves.

Where a tier has no chained dW (the exact tier), with a bias, or where an input needs a gradient, it computes the
composition itself: the same results, through lm_head_logprobs' four GEMMs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from rl_kernel import head, tiers
from rl_kernel.bitwise import bits_equal
from rl_kernel.head.rowtree import IGNORE, Slice

BLOCK_ELEMENTS = 1 << 29  # logits per row block at most (1 GB in bf16): dWeight's fp32 sum is read and written
# once a block, about 5% of a block's three GEMMs at 3500 rows of a 151936 x 2048 head on the H200.


class HeadLoss(NamedTuple):
    loss: torch.Tensor  # the scalar reduce gave; differentiable in hidden and weight
    logprobs: torch.Tensor  # fp32, tokens' shape, detached
    entropy: torch.Tensor | None  # fp32, tokens' shape, detached; None without entropy=True


TokenLoss = Callable[..., torch.Tensor]
Reduce = Callable[[torch.Tensor], torch.Tensor]


def lm_head_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    token_loss: TokenLoss,
    reduce: Reduce,
    inputs: Sequence[torch.Tensor] = (),
    *,
    tier: str | tiers.Tier | head.HeadTier = "exact",
    bias: torch.Tensor | None = None,
    temperature: float | None = None,
    entropy: bool = False,
    vocab_size: int | None = None,
    ignore_index: int = IGNORE,
    vocab_chunk: int = head.VOCAB_CHUNK,
    validate: bool = True,
) -> HeadLoss:
    """reduce(token_loss(log p(tokens) [, entropy], *inputs)) from the hidden states, bit for bit `composed(...)`
    with its gradients; the module's docstring states what token_loss and reduce must be."""
    ht = head.HeadTier.of(tier)
    vocab = head.check_args(hidden, weight, tokens, bias, vocab_size, vocab_chunk, temperature, ht)
    inputs = _check_inputs(tokens, inputs, token_loss, reduce)
    if not computes_in_forward(ht) or bias is not None or hidden.numel() == 0 or any(t.requires_grad for t in inputs):
        return composed(hidden, weight, tokens, token_loss, reduce, inputs, tier=ht, bias=bias,
                        temperature=temperature, entropy=entropy, vocab_size=vocab_size, ignore_index=ignore_index,
                        vocab_chunk=vocab_chunk, validate=validate)  # fmt: skip
    plan = head.Plan.of(ht, vocab, vocab_chunk, (Slice(0, weight.shape[0], vocab),), temperature=temperature,
                        ignore_index=ignore_index, entropy=entropy)  # fmt: skip
    tok = head.flat_tokens(plan, hidden, tokens, validate)
    lead = hidden.shape[:-1]
    h = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    flat = [t.reshape(-1) for t in inputs]
    fn = _Step(plan, token_loss, reduce, lead)
    loss, logp, ent = _FusedLoss.apply(h, weight.contiguous(), tok, fn, *flat)
    return HeadLoss(loss, logp.view(lead), ent.view(lead) if entropy else None)


def computes_in_forward(tier: str | tiers.Tier | head.HeadTier) -> bool:
    """Whether the tier's lm_head_loss computes the gradients in its forward (the tier chains dW), not the
    composition."""
    return head.HeadTier.of(tier).gemms.dw_chain is not None


def composed(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    token_loss: TokenLoss,
    reduce: Reduce,
    inputs: Sequence[torch.Tensor] = (),
    **head_kw,
) -> HeadLoss:
    """What lm_head_loss computes, as a composition autograd differentiates: the fused head, then the loss."""
    out = head.lm_head_logprobs(hidden, weight, tokens, **head_kw)
    logp, ent = out if head_kw.get("entropy") else (out, None)
    lead = logp.shape
    flat = None if ent is None else ent.reshape(-1)
    per_token = token_loss(*_loss_args(logp.reshape(-1), flat, [t.reshape(-1) for t in inputs]))
    _check_per_token(per_token, logp.numel())
    loss = reduce(per_token.view(lead))
    _check_loss(loss)
    return HeadLoss(loss, logp.detach(), None if ent is None else ent.detach())


# ---- the forward that computes the gradients ---------------------------------------------------------------
class _Step:
    """token_loss and reduce as the blocks use them: reduce's token weights (its gradient, the same at every
    point for a linear reduce), the per-token losses and log-prob / entropy gradients of a block."""

    def __init__(self, plan: head.Plan, token_loss: TokenLoss, reduce: Reduce, lead: torch.Size) -> None:
        self.plan, self.token_loss, self.reduce, self.lead = plan, token_loss, reduce, lead
        self.weights: torch.Tensor | None = None

    def block(self, logp: torch.Tensor, ent: torch.Tensor | None, inputs: list[torch.Tensor], rows: slice):
        """(per-token losses, d loss / d logp, d loss / d entropy or None) of the block's rows."""
        lp = logp.detach().requires_grad_()
        en = None if ent is None else ent.detach().requires_grad_()
        with torch.enable_grad():
            per_token = self.token_loss(*_loss_args(lp, en, [t[rows] for t in inputs]))
            _check_per_token(per_token, lp.numel())
            if self.weights is None:
                self.weights = self._token_weights(per_token.dtype, per_token.device)
            wanted = [lp] if en is None else [lp, en]
            grads = torch.autograd.grad(per_token, wanted, self.weights[rows], allow_unused=True)
        g_ent = grads[1] if en is not None else None
        # An unused output has no gradient (None), as autograd hands the fused head's backward.
        return per_token.detach(), _detached(grads[0]), _detached(g_ent)

    def _token_weights(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self._reduced(torch.zeros(self.lead, dtype=dtype, device=device))[1]

    def _reduced(self, per_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(reduce(per_token), its gradient flattened) at these per-token losses."""
        at = per_token.view(self.lead).detach().requires_grad_()
        with torch.enable_grad():
            loss = self.reduce(at)
            _check_loss(loss)
            if not loss.requires_grad:
                raise ValueError("rl_kernel: lm_head_loss: reduce's result does not depend on the per-token losses")
            (w,) = torch.autograd.grad(loss, at, allow_unused=True)
        return loss.detach(), (torch.zeros_like(at) if w is None else w).detach().reshape(-1)

    def total(self, per_token: torch.Tensor) -> torch.Tensor:
        """reduce of the whole per-token losses, after checking reduce is linear: its gradient there is the
        token weights the blocks used, bit for bit."""
        loss, w = self._reduced(per_token)
        if not bits_equal(w, self.weights):
            raise ValueError(
                "rl_kernel: lm_head_loss: reduce is not linear in the per-token losses (its gradient depends on "
                "them), so the gradient computed in the forward would be wrong; use rl_kernel.head.loss.composed"
            )
        return loss


class _FusedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, tokens, step: _Step, *inputs):
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        loss, logp, ent, dh, dw = _blocks(step, h, weight, tokens, list(inputs), need)
        ctx.save_for_backward(*(t for t in (dh, dw) if t is not None))
        ctx.has = (dh is not None, dw is not None)
        ctx.mark_non_differentiable(logp, ent)
        return loss, logp, ent

    @staticmethod
    def backward(ctx, g_loss, _g_logp, _g_ent):
        if g_loss is not None and not bits_equal(g_loss, torch.ones_like(g_loss)):
            raise ValueError(
                f"rl_kernel: lm_head_loss computed its gradients in the forward for loss.backward() (an upstream "
                f"gradient of 1), got {g_loss.item()!r}; put a scale (1 / accumulation steps) inside reduce"
            )
        saved = iter(ctx.saved_tensors)
        dh = next(saved) if ctx.has[0] else None
        dw = next(saved) if ctx.has[1] else None
        return dh, dw, None, None, *([None] * (len(ctx.needs_input_grad) - 4))


def _blocks(step: _Step, h, weight, tokens, inputs, need: tuple[bool, bool]):
    """(loss, log-probs, entropy, dHidden or None, dWeight or None): the row blocks' forward and backward."""
    plan = step.plan
    g = plan.tier.gemms
    n = h.shape[0]
    f32 = dict(dtype=torch.float32, device=h.device)
    logp, per_token = torch.empty(n, **f32), None
    ent = torch.empty(n if plan.want_entropy else 0, **f32)
    dh = torch.empty_like(h) if need[0] else None
    dw_sum = torch.zeros(weight.shape, **f32) if need[1] else None
    dw = torch.empty_like(weight) if need[1] else None
    block = _block_rows(g, n, weight.shape[0], h.device)
    for r0 in range(0, n, block):
        rows = slice(r0, min(n, r0 + block))
        z, logp[rows], stats, e = head.whole_rows(g, plan, h[rows], weight, None, tokens[rows])
        if e is not None:
            ent[rows] = e
        loss_rows, g_lp, g_e = step.block(logp[rows], e, inputs, rows)
        per_token = torch.empty(n, dtype=loss_rows.dtype, device=h.device) if per_token is None else per_token
        per_token[rows] = loss_rows
        d = head.logits_grad(plan, plan.ranks[0], z, tokens[rows], stats, e, g_lp, g_e, h.dtype) if any(need) else None
        del z
        if dh is not None:
            dh_rows = torch.zeros((d.shape[0], h.shape[1]), **f32)
            head.add_dx(g, plan, d, weight, dh_rows)
            dh[rows] = head.round_to(dh_rows, h.dtype)
        if dw_sum is not None:  # the last block's sum rounded as the unfused dW's kernel rounds it
            g.dw_chain(d, h[rows], dw_sum, dw if rows.stop == n else None)
    loss = step.total(per_token)
    return loss, logp, ent, dh, dw


def _block_rows(g: tiers.HeadGemms, n: int, cols: int, device: torch.device) -> int:
    """Rows per block: the n rows in as few blocks as hold at most BLOCK_ELEMENTS logits each, of about equal size
    (no small last block for the GEMMs), a multiple of dW's K step (at least one step). No bit depends on it: the
    blocks chain dW's sum at its own step boundaries, and everything else is row by row."""
    step = g.dw_rows(device)
    most = max(step, BLOCK_ELEMENTS // max(1, cols) // step * step)
    blocks = -(-n // most)
    return min(most, -(-n // (blocks * step)) * step)


# ---- arguments ---------------------------------------------------------------------------------------------
def _loss_args(logp, ent, inputs) -> list[torch.Tensor]:
    return [logp, *([] if ent is None else [ent]), *inputs]


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _check_inputs(tokens, inputs, token_loss, reduce) -> list[torch.Tensor]:
    if not callable(token_loss) or not callable(reduce):
        raise TypeError("rl_kernel: lm_head_loss: token_loss and reduce must be callables (see rl_kernel.head.loss)")
    if isinstance(inputs, torch.Tensor):
        raise TypeError("rl_kernel: lm_head_loss: inputs must be a sequence of tensors, e.g. (old_logprobs, adv)")
    out = list(inputs)
    for i, t in enumerate(out):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(tokens.shape):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"rl_kernel: lm_head_loss: inputs[{i}] must be a tensor of tokens' shape "
                             f"{tuple(tokens.shape)} (one value per token), got {got}")  # fmt: skip
        if t.device != tokens.device:
            raise ValueError(f"rl_kernel: lm_head_loss: inputs[{i}] is on {t.device}, tokens on {tokens.device}")
    return out


def _check_per_token(per_token, n: int) -> None:
    if not isinstance(per_token, torch.Tensor) or per_token.shape != (n,) or not per_token.is_floating_point():
        got = tuple(per_token.shape) if isinstance(per_token, torch.Tensor) else type(per_token).__name__
        raise ValueError(f"rl_kernel: lm_head_loss: token_loss must return one floating-point loss per token of "
                         f"its 1-D block ({n},), got {got}: it must be elementwise over tokens")  # fmt: skip


def _check_loss(loss) -> None:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"rl_kernel: lm_head_loss: reduce must return a scalar tensor, got {got}")
