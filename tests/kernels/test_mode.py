"""rl_kernel.mode(tier) (rl_kernel.aten.mode): the tier's kernels for aten's matrix products and
log_softmax in code that knows nothing of rl_kernel; nothing left registered after it; its audit names what a model
still leaves to stock."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import rl_kernel
from rl_kernel.aten import mode as M
from rl_kernel.bitwise import bits_equal, diff

DTYPES = [torch.float32, torch.bfloat16]


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and bits_equal(a, b), f"{what}: {diff(a, b).summary()}"


def operands(dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 9, 300, generator=g).to(dtype)  # K = 300: a BLAS sums it in another order than one chain
    w = (torch.randn(70, 300, generator=g) * 0.1).to(dtype)
    return x, w, torch.randn(2, 9, 70, generator=g).to(dtype)


def linear_grads(fn, x, w, dy):
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(xg, wg)
    y.backward(dy)
    return y, xg.grad, wg.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_under_the_mode_is_the_tiers_linear_forward_and_backward(dtype) -> None:
    x, w, dy = operands(dtype)
    want = linear_grads(rl_kernel.linear, x, w, dy)
    with rl_kernel.mode("exact"):  # the public name
        got = linear_grads(F.linear, x, w, dy)
    for name, a, b in zip(("y", "dx", "dW"), got, want, strict=True):
        same(a, b, f"{dtype} {name}")


def test_nothing_stays_after_the_mode_even_when_the_block_raises() -> None:
    x, w, _ = operands(torch.float32)
    stock = torch.mm(x[0], w.t())
    with M.mode("exact"):
        served = torch.mm(x[0], w.t())
    assert not bits_equal(served, stock), "the case must tell the tier's mm from stock's"
    with pytest.raises(KeyError), M.mode("exact"):
        raise KeyError("inside")
    same(torch.mm(x[0], w.t()), stock, "mm after the mode")
    assert M.active() is None


def test_an_inner_mode_hands_back_to_the_outer_one() -> None:
    x, w, _ = operands(torch.float32)
    exact = rl_kernel.linear(x[0], w)
    with M.mode("exact"):
        with M.mode("exact"):
            assert M.active() == "exact"
        same(torch.mm(x[0], w.t()), exact, "mm after the inner mode, inside the outer")
    assert M.active() is None
    M.enable("exact")
    try:
        same(torch.mm(x[0], w.t()), exact, "mm between enable() and disable()")
    finally:
        M.disable()
    with pytest.raises(M.ModeError, match="without an enabled mode"):
        M.disable()


def test_the_mode_is_the_whole_process() -> None:
    """torch's dispatcher is process-wide: a thread started inside the block computes with the tier."""
    x, w, _ = operands(torch.float32)
    found = {}
    with M.mode("exact"):
        worker = threading.Thread(target=lambda: found.setdefault("y", torch.mm(x[0], w.t())))
        worker.start()
        worker.join()
    same(found["y"], rl_kernel.linear(x[0], w), "mm in another thread")


def test_addmm_and_bmm_are_linears() -> None:
    x, w, _ = operands(torch.float32)
    b = torch.randn(70, generator=torch.Generator().manual_seed(5))
    with M.mode("exact"):
        biased = F.linear(x[0], w, b)  # 2-D with a bias: aten::addmm
        row_bias = torch.addmm(b[None], x[0], w.t())  # a bias of shape (1, N) broadcast over the rows
        batched = torch.bmm(x, w.t().expand(2, 300, 70))
        alone = torch.bmm(x[1:], w.t().expand(1, 300, 70))
    same(biased, rl_kernel.linear(x[0], w, b), "addmm")
    same(row_bias, biased, "addmm with a (1, N) bias")
    same(batched, rl_kernel.linear(x, w), "bmm")
    same(alone[0], batched[1], "bmm: a batch of one == that item in a batch of two")


def test_log_softmax_and_its_backward_are_the_tiers() -> None:
    g = torch.Generator().manual_seed(2)
    z, gz = torch.randn(4, 1000, generator=g) * 5, torch.randn(4, 1000, generator=g)
    zg, ref = z.clone().requires_grad_(), z.clone().requires_grad_()
    with M.mode("exact"):
        out = F.log_softmax(zg, dim=-1)
        out.backward(gz)
    want = rl_kernel.log_softmax(ref)
    want.backward(gz)
    same(out, want, "log_softmax")
    same(zg.grad, ref.grad, "log_softmax backward")


def test_what_the_tier_cannot_serve_is_refused_by_name() -> None:
    x, w, _ = operands(torch.float32)
    with M.mode("exact"):
        with pytest.raises(M.ModeError, match="beta=2, alpha=1"):
            torch.addmm(torch.zeros(70), x[0], w.t(), beta=2)
        with pytest.raises(M.ModeError, match="beta=1, alpha=2"):
            torch.addmm(torch.zeros(70), x[0], w.t(), alpha=2)
        with pytest.raises(M.ModeError, match=r"aten::mm in torch.float64: the exact tier has fp32, bf16, fp16"):
            torch.mm(x[0].double(), w.t().double())
        with pytest.raises(M.ModeError, match=r"bias of shape \(9, 70\)"):
            torch.addmm(torch.zeros(9, 70), x[0], w.t())
    assert M.active() is None
    with pytest.raises(Exception, match="tier 'no-such-tier' is not available"):
        M.enable("no-such-tier")
    assert M.active() is None


def test_a_device_the_tier_has_no_kernels_for_is_refused() -> None:
    """The fast tier (GPU only) under the mode: a CPU matrix product is an error naming the tier's platforms."""
    x, w, _ = operands(torch.bfloat16)
    with M.mode("fast"):
        with pytest.raises(M.ModeError, match=r"aten::mm on cpu: the fast tier runs on cuda, rocm"):
            torch.mm(x[0], w.t())
        same(x.float().sum(-1), M.tree_sum(x.float()), "a sum: the contract's tree on any device")
        same(torch.logsumexp(x.float(), -1), M.logsumexp(x.float(), [-1]), "a logsumexp: the tree on any device")
    assert M.active() is None


def test_a_dtype_the_tier_lacks_goes_to_its_fallback() -> None:
    """by_dtype: the tier's server when every floating-point argument is one of its dtypes (integer ones do not
    choose), its fallback's otherwise (the fast tier: bf16 / fp16, a bf16 model's fp32 rotary products exact)."""
    serve = M.by_dtype({torch.bfloat16}, lambda *a, **k: "own", lambda *a, **k: "below")
    bf16, fp32 = torch.ones(2, dtype=torch.bfloat16), torch.ones(2)
    assert serve(bf16, bf16) == "own" and serve(bf16, torch.arange(2)) == "own"
    assert serve(bf16, fp32) == "below" and serve(bf16, bias=fp32) == "below"


@pytest.mark.gpu
def test_the_fast_mode_serves_fp32_by_the_exact_tier() -> None:
    x, w, _ = (t.cuda() for t in operands(torch.float32))
    with M.mode("fast"):
        got = torch.mm(x[0], w.t())
        with pytest.raises(M.ModeError, match=r"aten::mm in torch.float64: the exact tier has"):
            torch.mm(x[0].double(), w.t().double())
    with M.mode("exact"):
        same(got, torch.mm(x[0], w.t()), "fp32 under the fast mode: the exact tier's product")


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("shape", [(2, 9, 300), (5, 300)], ids=["3-d", "2-d"])
def test_autograds_products_of_a_linear_have_the_forward_dx_and_dw_layouts(shape, bias: bool) -> None:
    """fast.mm picks the linear's kernel by its operands' layouts (mm_form): F.linear's forward and the two products
    its backward makes (aten's mm backward keeps W.t()'s layout) are one of each form, so under the mode they are
    fast.linear's forward, dX and dW kernels (the GPU test below checks the bits)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from rl_kernel.fast.decoder.linear import mm_form

    forms = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__ in ("mm.default", "addmm.default"):
                forms.append(mm_form(*args[-2:]))
            return func(*args, **(kwargs or {}))

    x = torch.randn(*shape, requires_grad=True)
    w, b = torch.randn(70, 300, requires_grad=True), torch.randn(70, requires_grad=True) if bias else None
    with Record():
        y = F.linear(x, w, b)
        y.backward(torch.randn_like(y))
    assert forms[0] == "forward" and sorted(forms[1:]) == ["dw", "dx"], forms
    assert mm_form(torch.ones(4, 3), torch.ones(3, 5)) == "dx", "two row-major operands: dY @ W"


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
def test_linear_under_the_fast_mode_is_the_fast_linear_forward_and_backward(bias: bool) -> None:
    """The fast tier's mode: F.linear's forward, dX and dW have rl_kernel.fast.linear's bits (patch's), at an M on
    each side of the sm_90 buckets."""
    for m in (9, 300):
        g = torch.Generator().manual_seed(m)
        x = torch.randn(m, 256, generator=g).bfloat16().cuda()
        w = (torch.randn(192, 256, generator=g) * 0.1).bfloat16().cuda()
        b = torch.randn(192, generator=g).bfloat16().cuda() if bias else None
        dy = torch.randn(m, 192, generator=g).bfloat16().cuda()
        want = linear_grads(lambda a, c, b=b: rl_kernel.fast.linear(a, c, b), x, w, dy)
        with rl_kernel.mode("fast"):
            got = linear_grads(lambda a, c, b=b: F.linear(a, c, b), x, w, dy)
        for name, a, c in zip(("y", "dx", "dW"), got, want, strict=True):
            same(a, c, f"M={m} {name}")


def norm_grads(fn, x, w, dy):
    leaves = [x.clone().requires_grad_()] + ([w.clone().requires_grad_()] if w is not None else [])
    y = fn(*leaves)
    y.backward(dy)
    return y, *(t.grad for t in leaves)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_is_the_tiers_fused_rms_norm_forward_and_backward(dtype) -> None:
    """F.rms_norm and nn.RMSNorm (eps None: the dtype's epsilon; no weight: times 1) under the mode are the tier's
    rms_norm, forward, dX and dW; stock's differs on the same case (the check can fail)."""
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(6, 7, 1000, generator=g).to(dtype) * 3, (1 + torch.randn(1000, generator=g) * 0.1).to(dtype)
    dy = torch.randn(6, 7, 1000, generator=g).to(dtype)
    want = norm_grads(lambda a, b: rl_kernel.rms_norm(a, b, 1e-5), x, w, dy)
    stock = norm_grads(lambda a, b: F.rms_norm(a, (1000,), b, 1e-5), x, w, dy)
    assert any(not bits_equal(a, b) for a, b in zip(stock, want, strict=True)), "stock must differ somewhere"
    with rl_kernel.mode("exact"), warnings.catch_warnings():
        warnings.simplefilter("error")  # served above autograd: no "autograd kernel was not registered" warning
        got = norm_grads(lambda a, b: F.rms_norm(a, (1000,), b, 1e-5), x, w, dy)
        module = torch.nn.RMSNorm(1000, dtype=dtype)
        by_module = module(x)
        unweighted = F.rms_norm(x, (1000,))
    for name, a, b in zip(("y", "dx", "dW"), got, want, strict=True):
        same(a, b, f"{dtype} {name}")
    eps = torch.finfo(dtype).eps
    same(by_module, rl_kernel.rms_norm(x, module.weight.detach(), eps), "nn.RMSNorm")
    same(unweighted, rl_kernel.rms_norm(x, torch.ones(1000, dtype=dtype), eps), "no weight")


@pytest.mark.gpu
def test_rms_norm_under_the_fast_mode_is_the_fast_rms_norm() -> None:
    g = torch.Generator().manual_seed(6)
    x, dy = (torch.randn(300, 2048, generator=g).bfloat16().cuda() for _ in range(2))
    w = (1 + torch.randn(2048, generator=g) * 0.1).bfloat16().cuda()
    want = norm_grads(lambda a, b: rl_kernel.fast.rms_norm(a, b, 1e-6), x, w, dy)
    with rl_kernel.mode("fast"):
        got = norm_grads(lambda a, b: F.rms_norm(a, (2048,), b, 1e-6), x, w, dy)
    for name, a, b in zip(("y", "dx", "dW"), got, want, strict=True):
        same(a, b, f"fast {name}")


def test_an_rms_norm_the_tier_cannot_state_is_refused_by_name() -> None:
    x = torch.randn(3, 4, 8)
    with M.mode("exact"):
        with pytest.raises(M.ModeError, match=r"rms_norm over \[4, 8\] of a \(3, 4, 8\) input"):
            F.rms_norm(x, (4, 8))
        with pytest.raises(M.ModeError, match=r"rms_norm of torch.bfloat16 with a torch.float32 weight"):
            F.rms_norm(x.bfloat16(), (8,), torch.ones(8))


def qkv(dtype: torch.dtype = torch.float32, b: int = 3, t: int = 11):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(b, 4, t, 16, generator=g).to(dtype)
    k, v = (torch.randn(b, 2, t, 16, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def attention_grads(fn, q, k, v, grad):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(grad)
    return out, *(x.grad for x in leaves)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_causal_sdpa_is_the_tiers_attention_forward_and_backward(dtype) -> None:
    q, k, v = qkv(dtype)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).to(dtype)
    b, t = q.shape[0], q.shape[2]
    rows, starts = torch.arange(t).expand(b, t).contiguous(), torch.zeros(b, dtype=torch.int64)
    want = attention_grads(lambda *x: rl_kernel.attention(*x, rows, starts), q, k, v, grad)
    with rl_kernel.mode("exact"):
        got = attention_grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=True, enable_gqa=True),
                              q, k, v, grad)  # fmt: skip
        with torch.inference_mode():  # below autograd: the backend keys serve it too
            inferred = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    for name, a, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        same(a, w, f"{dtype} causal {name}")
    same(inferred, want[0], f"{dtype} causal, inference mode")


def test_a_left_padded_causal_mask_is_the_tiers_key_ranges() -> None:
    """HF's padded batch: row t of sequence b sees keys pad[b] .. t; a sequence alone == in the padded batch."""
    q, k, v = qkv()
    t = q.shape[2]
    pad = torch.tensor([0, 3, 7])
    cols = torch.arange(t)
    mask = (cols[None, None, :] <= cols[None, :, None]) & (cols[None, None, :] >= pad[:, None, None])
    for form in (mask[:, None], torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))[:, None]):
        with rl_kernel.mode("exact"):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=form, enable_gqa=True)
        rows = torch.where(cols >= pad[:, None], cols, pad[:, None] - 1)
        same(out, rl_kernel.attention(q, k, v, rows, pad), f"padded {form.dtype} mask")
    with rl_kernel.mode("exact"):
        alone = F.scaled_dot_product_attention(q[2:, :, 7:], k[2:, :, 7:], v[2:, :, 7:], is_causal=True,
                                               enable_gqa=True)  # fmt: skip
    same(alone, out[2:, :, 7:], "the third sequence alone (unpadded) == in the padded batch")


@pytest.mark.parametrize("window", [1, 3, 6])
def test_a_sliding_window_mask_is_the_tiers_windowed_attention(window: int) -> None:
    """A left-padded causal mask cut to the last `window` keys of each row (HF's sliding window): the tier's
    attention with that window; a sequence alone == in the padded batch; a window wider than every row is none."""
    q, k, v = qkv()
    t = q.shape[2]
    pad = torch.tensor([0, 3, 7])
    cols = torch.arange(t)
    causal = (cols[None, None, :] <= cols[None, :, None]) & (cols[None, None, :] >= pad[:, None, None])
    mask = causal & (cols[None, None, :] > cols[None, :, None] - window)
    with rl_kernel.mode("exact"):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
        alone = F.scaled_dot_product_attention(q[2:, :, 7:], k[2:, :, 7:], v[2:, :, 7:], enable_gqa=True,
                                               attn_mask=mask[2:, None, 7:, 7:])  # fmt: skip
    rows = torch.where(cols >= pad[:, None], cols, pad[:, None] - 1)
    same(out, rl_kernel.attention(q, k, v, rows, pad, window=window), f"window {window}")
    same(alone, out[2:, :, 7:], "the third sequence alone (unpadded) == in the padded batch")
    assert not bits_equal(out, rl_kernel.attention(q, k, v, rows, pad)), "the window must cut keys here"
    assert M.key_ranges(q, k, causal[:, None], False)[2] == 0


@pytest.mark.parametrize("window", [2, 4])
def test_right_pads_under_a_window_are_served_and_a_stray_key_is_refused(window: int) -> None:
    """A right-padded batch under a sliding window (a trainer's forward): the pads past each sequence see the tail of
    its last row's window, or nothing; served, the real rows' bits those of the tier's windowed attention. Control:
    a pad row that sees a key outside that range is no key range, refused by name."""
    q, k, v = qkv()
    t = q.shape[2]
    length = torch.tensor([t, t - 3, t - 7])
    cols = torch.arange(t)
    real = cols[None, :] < length[:, None]
    mask = (cols[None, None, :] <= cols[None, :, None]) & (cols[None, None, :] > cols[None, :, None] - window)
    mask = mask & real[:, None, :]
    with rl_kernel.mode("exact"):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
    rows = torch.minimum(cols[None, :], length[:, None] - 1)
    want = rl_kernel.attention(q, k, v, rows, torch.zeros(3, dtype=torch.int64), window=window)
    same(out[real[:, None, :, None].expand_as(out)], want[real[:, None, :, None].expand_as(want)], "the real rows")
    stray = mask.clone()
    stray[1, t - 3, 0] = True  # the second sequence's first pad row also sees its first key
    with rl_kernel.mode("exact"), pytest.raises(M.ModeError, match="not a key range"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=stray[:, None], enable_gqa=True)


def test_a_sequence_that_sees_no_key_gets_the_tiers_empty_rows() -> None:
    """A mask row of no key at all (a whole sequence masked): the tier's attention over no key (zeros); the other
    sequences as under a causal mask alone."""
    q, k, v = qkv()
    cols = torch.arange(q.shape[2])
    mask = (cols[None, :] <= cols[:, None]).expand(3, -1, -1).clone()
    mask[1] = False
    with rl_kernel.mode("exact"):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert bits_equal(out[1], torch.zeros_like(out[1])), "the masked sequence"
    same(out[0::2], causal[0::2], "the other sequences")


def test_an_attention_the_tier_cannot_state_is_refused_by_name() -> None:
    q, k, v = qkv()
    packed = torch.block_diag(torch.ones(5, 5, dtype=torch.bool), torch.ones(6, 6, dtype=torch.bool)).tril()
    biased = torch.randn(11, 11)
    causal = torch.ones(11, 11, dtype=torch.bool).tril()
    by_head = torch.stack([causal, causal, torch.ones_like(causal), causal])  # head 2 sees every key
    cases = [
        (dict(attn_mask=packed), "not a key range"),  # two packed sequences: a row's first key jumps
        (dict(attn_mask=biased), "values other than 0 and -inf"),
        (dict(attn_mask=by_head), "differs by head"),
        (dict(is_causal=True, dropout_p=0.1), "dropout_p=0.1"),
    ]
    with rl_kernel.mode("exact"):
        for kwargs, words in cases:
            with pytest.raises(M.ModeError, match=words):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    stock = F.scaled_dot_product_attention(q, k, v, attn_mask=packed, enable_gqa=True)  # after the mode: stock
    assert stock.shape == q.shape


def test_the_embeddings_weight_gradient_is_the_tiers() -> None:
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(0, 20, (4, 30), generator=g)  # every token many times
    # bf16: stock adds in bf16 (each add rounded), the tier in fp32 rounded once, so the two differ here
    weight, grad = torch.randn(20, 16, generator=g).bfloat16(), (torch.randn(4, 30, 16, generator=g) * 100).bfloat16()
    stock = weight.clone().requires_grad_()
    F.embedding(ids, stock, padding_idx=3).backward(grad)
    wg, ref = weight.clone().requires_grad_(), weight.clone().requires_grad_()
    with rl_kernel.mode("exact"):
        F.embedding(ids, wg, padding_idx=3).backward(grad)
        with pytest.raises(M.ModeError, match="scale_grad_by_freq"):
            F.embedding(ids, weight.clone().requires_grad_(), scale_grad_by_freq=True).backward(grad)
    rl_kernel.embedding(ids, ref, padding_idx=3).backward(grad)
    same(wg.grad, ref.grad, "embedding weight gradient")
    assert not bits_equal(stock.grad, ref.grad), "the case must tell the tier's gradient from stock's"


class PlainModel(torch.nn.Module):
    """An engine's own model class, in plain PyTorch (no transformers, no rl_kernel): two linears and a group norm."""

    def __init__(self, norm: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(9)
        self.up = torch.nn.Parameter(torch.randn(64, 32, generator=g) * 0.2)
        self.down = torch.nn.Parameter(torch.randn(50, 64, generator=g) * 0.2)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(F.linear(x, self.up))
        if self.norm:  # a GroupNorm: aten::native_group_norm, which the mode leaves to stock
            h = F.group_norm(h, 8)
        return F.log_softmax(F.linear(h, self.down), dim=-1)


def step(model: torch.nn.Module, loss_over_the_batch: bool = False):
    """A forward and backward: from a fixed gradient of the log-probs (no reduction outside the model), or from a
    loss that reduces over the batch (left to stock)."""
    g = torch.Generator().manual_seed(1)
    x, grad = torch.randn(6, 32, generator=g), torch.randn(6, 50, generator=g)

    def run() -> None:
        model.zero_grad()
        lp = model(x)
        if loss_over_the_batch:
            lp.cumsum(0).max().backward()  # a floating cumsum over the batch: left to stock
        else:
            lp.backward(grad)

    return run


def test_the_audit_covers_a_model_of_served_operators_only() -> None:
    found = M.audit(step(PlainModel(norm=False)))
    assert found.covered, found.summary()
    assert {"mm", "_log_softmax", "_log_softmax_backward_data"} <= set(found.served)


def test_the_audit_names_each_operator_left_to_stock() -> None:
    """Negative controls: a GroupNorm and a loss through a cumsum over the batch are named."""
    norm = M.audit(step(PlainModel(norm=True)))
    assert not norm.covered and "native_group_norm" in norm.unserved, norm.summary()
    assert "aten::native_group_norm" in norm.summary()
    loss = M.audit(step(PlainModel(norm=False), loss_over_the_batch=True))
    assert not loss.covered and "cumsum" in loss.unserved, loss.summary()
    assert M.active() is None
