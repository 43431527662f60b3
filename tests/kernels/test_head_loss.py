"""rl_kernel.lm_head_loss: an RL step's loss with its gradients computed in the forward, bit for bit the fused head
followed by the loss (head_loss.composed) in value, log-probs, entropy, dHidden and dWeight.

- The fast tier's path (row blocks, dWeight's fp32 sum chained over them by grad_w_chain) runs in the Triton
  interpreter (a subprocess): the chained dW == the uncut dW (fp32 bits, pointer and TMA kernels), a negative
  control (the blocks' partials added) that moves them; the loss's outputs and gradients == the composition at
  three row blocks and at one, with a temperature, padding rows, ignored tokens and an entropy term; a frozen
  head (dHidden only); a GPU run of the same on the H200 (-m gpu).
- Everywhere: the exact tier (no chained dW) computes the composition itself; clear errors for bad token_loss /
  reduce / inputs; a reduce that is not linear and an upstream gradient other than 1 are refused.
Every equality compares integer views of the bits.
"""

from __future__ import annotations

import re

import pytest
import torch
from triton_interpreter import failed, interpret, serve

import rl_kernel
from rl_kernel import head
from rl_kernel.bitwise import bits_equal
from rl_kernel.head import loss as head_loss

IGNORE = -100


def _case(rows: int = 150, hid: int = 32, vrows: int = 600, vocab: int = 597, dtype=torch.bfloat16, device="cpu"):
    """hidden [2, rows/2, H], weight [vrows, H] (rows past vocab: padding), tokens with ignored ones, and a GRPO
    step's per-token inputs and mask."""
    g = torch.Generator().manual_seed(5)
    h = torch.randn(2, rows // 2, hid, generator=g).to(dtype)
    w = (torch.randn(vrows, hid, generator=g) * hid**-0.5 * 3).to(dtype)
    tok = torch.randint(0, vocab, (2, rows // 2), generator=g)
    tok[:, ::7] = IGNORE
    old = torch.randn(2, rows // 2, generator=g) * 0.2 - 4
    adv = torch.randn(2, rows // 2, generator=g)
    mask = (torch.rand(2, rows // 2, generator=g) > 0.1).float()
    return [t.to(device) for t in (h, w, tok, old, adv, mask)]


def clipped(logp, ent, old, adv):
    """PPO's clipped surrogate with an entropy bonus: elementwise over tokens."""
    ratio = torch.exp(logp - old)
    return -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.28) * adv) - 0.01 * ent


def per_sequence(mask):
    """GRPO's reduction: each sequence's masked mean, then the mean over sequences (linear in the losses)."""
    return lambda x: ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def both(fn, h, w, tok, old, adv, mask, tier: str, frozen: bool = False, **kw):
    """(loss, log-probs, entropy, dHidden, dWeight or None) of fn with the clipped loss."""
    hg = h.clone().requires_grad_()
    wg = w.clone().requires_grad_(not frozen)
    out = fn(hg, wg, tok, clipped, per_sequence(mask), (old, adv), tier=tier, entropy=True, **kw)
    out.loss.backward()
    return out.loss.detach(), out.logprobs, out.entropy, hg.grad, wg.grad


def with_input_grad(fn, tier: str, h, w, tok, old, adv, mask, **kw) -> tuple:
    """(loss, dHidden, dWeight, dAdvantages) of fn when an input (the advantages: a critic's output) requires a
    gradient too; its gradient must never be silently None."""
    hg, wg, ag = (t.clone().requires_grad_() for t in (h, w, adv))
    out = fn(hg, wg, tok, clipped, per_sequence(mask), (old, ag), tier=tier, entropy=True, **kw)
    out.loss.backward()
    assert ag.grad is not None, "the input's gradient is None"
    return out.loss.detach(), hg.grad, wg.grad, ag.grad


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and bits_equal(a, b)


# ---- everywhere ------------------------------------------------------------------------------------------------
def test_the_exact_tier_computes_the_composition() -> None:
    h, w, tok, old, adv, mask = _case(rows=20, vrows=64, vocab=61)
    kw = dict(temperature=0.7, vocab_size=61)
    got = both(rl_kernel.lm_head_loss, h, w, tok, old, adv, mask, "exact", **kw)
    want = both(head_loss.composed, h, w, tok, old, adv, mask, "exact", **kw)
    assert all(same(a, b) for a, b in zip(got, want, strict=True))
    assert torch.isfinite(got[0]) and got[3].abs().sum() > 0 and got[4].abs().sum() > 0


def test_an_input_that_requires_a_gradient_gets_the_compositions() -> None:
    h, w, tok, old, adv, mask = _case(rows=20, vrows=64, vocab=61)
    got = with_input_grad(rl_kernel.lm_head_loss, "exact", h, w, tok, old, adv, mask)
    want = with_input_grad(head_loss.composed, "exact", h, w, tok, old, adv, mask)
    assert all(same(a, b) for a, b in zip(got, want, strict=True)) and got[3].abs().sum() > 0


def _bad(change: dict):
    h, w, tok, old, adv, _ = _case(rows=8, vrows=16, vocab=16)
    args = dict(token_loss=lambda lp, o, a: (lp - o) * a, reduce=lambda x: x.sum(), inputs=(old, adv))
    args.update(change)
    return lambda: rl_kernel.lm_head_loss(h.requires_grad_(), w, tok, **args)


@pytest.mark.parametrize(
    "change,words",
    [
        (dict(inputs=(torch.zeros(3),)), "inputs[0] must be a tensor of tokens' shape"),
        (dict(inputs=torch.zeros(2, 4)), "sequence of tensors"),
        (dict(token_loss=lambda lp, o, a: ((lp - o) * a).sum()), "one floating-point loss per token"),
        (dict(reduce=lambda x: x), "scalar tensor"),
        (dict(reduce="sum"), "callables"),
    ],
    ids=["input-shape", "input-not-sequence", "token-loss-not-elementwise", "reduce-not-scalar", "reduce-not-callable"],
)
def test_bad_arguments_name_the_problem(change: dict, words: str) -> None:
    with pytest.raises((ValueError, TypeError), match=re.escape(words)):
        _bad(change)()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [4096, 8192])
def test_on_the_gpu_the_fused_loss_is_the_composition_bit_for_bit(rows: int) -> None:
    """On the GPU, a 1.7B head (151936 x 2048, bf16) at 4096 and 8192 tokens (two and three row blocks): every
    output == the composition, and == itself on a second run."""
    h, w, tok, old, adv, mask = _case(rows=rows, hid=2048, vrows=151936, vocab=151936, device="cuda")
    h, w = h * 0.5, w * 0.3
    want = both(head_loss.composed, h, w, tok, old, adv, mask, "fast")
    got = both(rl_kernel.lm_head_loss, h, w, tok, old, adv, mask, "fast")
    again = both(rl_kernel.lm_head_loss, h, w, tok, old, adv, mask, "fast")
    names = ("loss", "log-probs", "entropy", "dHidden", "dWeight")
    assert [n for n, a, b in zip(names, got, want, strict=True) if not same(a, b)] == []
    assert [n for n, a, b in zip(names, got, again, strict=True) if not same(a, b)] == []
    assert torch.isfinite(got[0]) and got[4].abs().sum() > 0


# ---- the Triton interpreter (a subprocess) ---------------------------------------------------------------------
@pytest.mark.slow
def test_interpreter_chained_dweight() -> None:
    assert not failed(interpret(__file__, "chain"))


@pytest.mark.slow
def test_interpreter_fused_loss() -> None:
    assert not failed(interpret(__file__, "loss"))


def _check_chain() -> dict[str, bool]:
    """grad_w_chain over row blocks of 64 (dW's K step) == grad_w_2d over the uncut rows (fp32 and bf16 bits), for
    the pointer and the TMA kernel; the blocks' partials added instead are a different sum (the control)."""
    from rl_kernel.fast.decoder import linear as fl

    g = torch.Generator().manual_seed(2)
    m, n, k = 150, 136, 48
    dy = (torch.randn(m, n, generator=g) * 3).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    res = {}
    base = dict(block_m=64, block_n=32, block_k=64, num_warps=4, num_stages=3, group_m=2, launch={})
    for name, cfg in (("pointer", base), ("tma", dict(base, tma=True))):
        whole = fl._launch_gemm(
            fl._dw_operand(dy, x, cfg), (x.stride(0), x.stride(1)), x, k, cfg, out_dtype=torch.float32
        )
        acc, added = torch.zeros(n, k), torch.zeros(n, k)
        last, rounded = torch.zeros(n, k), torch.empty(n, k, dtype=torch.bfloat16)
        for r0 in range(0, m, 64):
            fl.grad_w_chain(dy[r0 : r0 + 64], x[r0 : r0 + 64], acc, cfg=cfg)
            if r0 + 64 >= m:
                fl.grad_w_chain(dy[r0:], x[r0:], last, rounded, cfg=cfg)
            else:
                last.copy_(acc)
            added += fl._launch_gemm(fl._dw_operand(dy[r0 : r0 + 64], x[r0 : r0 + 64], cfg), (k, 1), x[r0 : r0 + 64], k,
                                     cfg, out_dtype=torch.float32)  # fmt: skip
        res[f"{name}: chained blocks == the uncut rows (fp32 bits)"] = same(acc, whole)
        res[f"{name}: the last block rounded into out == grad_w_2d (bits)"] = same(rounded, fl.grad_w_2d(dy, x, cfg))
        res[f"{name}: control, the blocks' partials added, differ"] = not same(added, whole)
    try:
        fl.grad_w_chain(dy, x, torch.zeros(n, k, dtype=torch.bfloat16), cfg=base)
        res["a bf16 running sum is refused"] = False
    except ValueError as e:
        res["a bf16 running sum is refused"] = "fp32" in str(e)
    return res


def _check_loss() -> dict[str, bool]:
    """lm_head_loss in the fast tier == head_loss.composed in the fast tier, every output bit for bit."""
    h, w, tok, old, adv, mask = _case()
    kw = dict(temperature=0.8, vocab_size=597, vocab_chunk=128)  # dHidden: five chunks' partials
    res = {}
    want = both(head_loss.composed, h, w, tok, old, adv, mask, "fast", **kw)
    names = ("loss", "log-probs", "entropy", "dHidden", "dWeight")
    elements = head_loss.BLOCK_ELEMENTS
    for blocks, per_block in (("three row blocks", 64 * 600), ("one row block", elements)):
        head_loss.BLOCK_ELEMENTS = per_block
        try:
            got = both(rl_kernel.lm_head_loss, h, w, tok, old, adv, mask, "fast", **kw)
        finally:
            head_loss.BLOCK_ELEMENTS = elements
        for name, a, b in zip(names, got, want, strict=True):
            res[f"{blocks}: {name} == the composition (bits)"] = same(a, b)
    res["dHidden's fp32 sums before rounding == the composition's (bits)"] = _same_fp32_dhidden(
        lambda: both(head_loss.composed, h, w, tok, old, adv, mask, "fast", **kw),
        lambda: both(rl_kernel.lm_head_loss, h, w, tok, old, adv, mask, "fast", **kw),
    )
    frozen = both(rl_kernel.lm_head_loss, h, w, tok, old, adv, mask, "fast", frozen=True, **kw)
    res["a frozen head: dHidden == the composition's, no dWeight"] = same(frozen[3], want[3]) and frozen[4] is None
    res["the gradients are not zero"] = bool(want[3].abs().sum() > 0 and want[4].abs().sum() > 0)
    res["an input that requires a gradient: its gradient and every other == the composition's"] = all(
        same(a, b) for a, b in zip(with_input_grad(rl_kernel.lm_head_loss, "fast", h, w, tok, old, adv, mask, **kw),
                                   with_input_grad(head_loss.composed, "fast", h, w, tok, old, adv, mask, **kw),
                                   strict=True))  # fmt: skip
    res.update(_refusals(h, w, tok, old, adv, mask))
    return res


def _same_fp32_dhidden(composition, fused) -> bool:
    """dHidden's fp32 sums as each path hands them to head.round_to (the bf16 rounding hides most orders of the
    chunks' partials), the fused loss in three row blocks."""
    rounding, elements = head.round_to, head_loss.BLOCK_ELEMENTS
    seen: list[list[torch.Tensor]] = []

    def spy(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        seen[-1].append(x.clone())
        return rounding(x, dtype)

    head.round_to, head_loss.BLOCK_ELEMENTS = spy, 64 * 600
    try:
        for run in (composition, fused):
            seen.append([])
            run()
    finally:
        head.round_to, head_loss.BLOCK_ELEMENTS = rounding, elements
    return len(seen[1]) == 3 and same(torch.cat(seen[1]), torch.cat(seen[0]))


def _refusals(h, w, tok, old, adv, mask) -> dict[str, bool]:
    """A reduce that is not linear, and an upstream gradient other than 1: clear errors, never a wrong gradient."""
    res = {}
    hg = h.clone().requires_grad_()
    try:
        rl_kernel.lm_head_loss(hg, w, tok, lambda lp, o, a: (lp - o) * a, lambda x: (x * x).sum(), (old, adv),
                               tier="fast")  # fmt: skip
        res["a reduce that is not linear is refused"] = False
    except ValueError as e:
        res["a reduce that is not linear is refused"] = "not linear" in str(e)
    out = rl_kernel.lm_head_loss(hg, w, tok, lambda lp, o, a: (lp - o) * a, per_sequence(mask), (old, adv), tier="fast")
    try:
        (out.loss * 0.5).backward()
        res["an upstream gradient of 0.5 is refused"] = False
    except ValueError as e:
        res["an upstream gradient of 0.5 is refused"] = "inside reduce" in str(e)
    return res


if __name__ == "__main__":
    serve({"chain": _check_chain, "loss": _check_loss})


class _Steps:
    """HeadGemms' dw_rows alone: a dW K step of `step` rows."""

    def __init__(self, step: int) -> None:
        self.step = step

    def dw_rows(self, device) -> int:
        return self.step


@pytest.mark.parametrize("step", [1, 16, 64])
def test_row_blocks_cut_on_dws_k_step(step: int) -> None:
    """The fused loss's row blocks start at multiples of dW's K step (its chained dW continues the walk only there:
    a block cut elsewhere moves the fp32 dWeight sums, which the bf16 rounding mostly hides), and hold at most
    BLOCK_ELEMENTS logits unless one step is more."""
    for n in (1, step, step + 1, 1000, 8192, 12345):
        for cols in (7, 1024, 151936):
            rows = head_loss._block_rows(_Steps(step), n, cols, torch.device("cpu"))
            assert rows % step == 0 and rows >= step, (n, cols, rows)
            assert rows * cols <= max(head_loss.BLOCK_ELEMENTS, step * cols), (n, cols, rows)
