"""Attention sinks (GPT-OSS: a logit per query head that joins each row's softmax, with a zero value) in the exact
tier's attention, docs/numerics.md section 11: the sink joins first (m = sink, l = 1), so a row's bits still depend on
its own keys alone.

The CPU build equals the numpy transcription bit for bit (output, statistics, dq / dk / dv, and the sink's gradient:
per head the section 2 tree over its rows), with windows that cut keys and left padding; decode == prefill and alone
== batch with sinks; near float64 eager GPT-OSS math (cat the sink, softmax, drop it). Negative controls: the sink
joined after the last tile, no sink, and the sink's gradient summed in row order all differ, so each comparison can
fail. On a GPU: CPU == GPU bits for the exact tier, and the fast tier's decode == prefill, alone == batch, run to run.
The fast tier's sinks in Triton's interpreter: tests/kernels/test_fast_attention.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bit_checks import assert_bits, assert_same, cpu_bits, dname

import rl_kernel
from rl_kernel import inputs
from rl_kernel.exact.common import contract as C
from rl_kernel.exact.decoder import reference as R
from rl_kernel.exact.decoder.ops import attention_with_stats

B, HQ, HKV, T, D = 2, 4, 2, 45, 16
WINDOWS = (0, 6)  # none, and one shorter than every sequence: it cuts keys


def _case(dtype: torch.dtype, seed: int = 0):
    """q, k, v (GQA 4 over 2, 45 keys), q_pos, k_start (left padding 0 and 9), sinks (one dominating a row's keys,
    one far below them) and an upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, go = (torch.randn(B, h, T, D, generator=g).to(dtype) for h in (HQ, HKV, HKV, HQ))
    q_pos = torch.arange(T).repeat(B, 1)
    q_pos[1, :9] = 8  # padding rows: they see no key
    sinks = torch.tensor([0.5, 4.0, -1.25, -30.0])
    return q, k, v, q_pos, torch.tensor([0, 9]), sinks, go


def _widen(t: torch.Tensor) -> np.ndarray:
    return C.row_to_f32(t)


def _reference(q, k, v, q_pos, k_start, head_sinks, window, **variant):
    kw = {"sinks": head_sinks.numpy()} | variant
    return R.attention(_widen(q), _widen(k), _widen(v), q_pos.numpy(), k_start.numpy(), D**-0.5, q.dtype,
                       window=window, **kw)  # fmt: skip


@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=dname)
@pytest.mark.parametrize("window", WINDOWS)
def test_sinks_equal_reference(window: int, dtype: torch.dtype) -> None:
    q, k, v, q_pos, k_start, sinks, _ = _case(dtype, seed=window)
    out, stats = attention_with_stats(q, k, v, q_pos, k_start, window=window, sinks=sinks)
    o_ref, st_ref = _reference(q, k, v, q_pos, k_start, sinks, window)
    assert_same(cpu_bits(out), o_ref, "output")
    assert_same(cpu_bits(stats), C.bits_of(np.ascontiguousarray(st_ref)), "stats (m, l)")
    assert_same(cpu_bits(rl_kernel.attention(q, k, v, q_pos, k_start, window=window, sinks=sinks)), o_ref, "entry")
    assert (cpu_bits(out)[1, :, :9] == 0).all(), "a row that sees no key is +0 (the sink has no value)"
    # controls: the sink joined after the row's last tile, and no sink, differ from the build on these inputs
    for variant in ({"sink_last": True}, {"sinks": None}):
        o_v, st_v = _reference(q, k, v, q_pos, k_start, sinks, window, **variant)
        assert not (np.array_equal(o_v, o_ref) and np.array_equal(st_v, st_ref)), f"{variant} must show in the bits"


@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=dname)
@pytest.mark.parametrize("window", WINDOWS)
def test_sink_backward_equals_reference(window: int, dtype: torch.dtype) -> None:
    q, k, v, q_pos, k_start, sinks, go = _case(dtype, seed=10 + window)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    rl_kernel.attention(*leaves[:3], q_pos, k_start, window=window, sinks=leaves[3]).backward(go)
    o_ref, st_ref = _reference(q, k, v, q_pos, k_start, sinks, window)
    o = R.load_bits(o_ref, dtype)
    want = R.attention_backward(_widen(go), _widen(q), _widen(k), _widen(v), o, st_ref, q_pos.numpy(),
                                k_start.numpy(), D**-0.5, dtype, window=window)  # fmt: skip
    for name, leaf, w in zip(("dq", "dk", "dv"), leaves[:3], want, strict=True):
        assert_same(cpu_bits(leaf.grad), w, name)
    dsinks = R.attention_sink_grad(_widen(go), o, st_ref, sinks.numpy())
    assert_same(cpu_bits(leaves[3].grad), C.bits_of(np.ascontiguousarray(dsinks)), "dsinks")
    assert (leaves[3].grad != 0).all(), "every head's sink has a gradient"


def test_sink_gradient_is_the_tree_over_rows() -> None:
    """The sink's gradient is the tree over its head's 90 rows; summed in row order (the plain loop a kernel might
    write) it differs on these inputs, so the bit comparison above can catch an order change."""
    q, k, v, q_pos, k_start, sinks, go = _case(torch.float32, seed=3)
    out, stats = attention_with_stats(q, k, v, q_pos, k_start, sinks=sinks)
    terms = torch.ops.rl_kernel.attention_sink_terms(go, out, stats, sinks)
    tree = np.stack([C.row_sum(terms[:, h].reshape(-1).numpy()) for h in range(HQ)])
    leaf = sinks.clone().requires_grad_()
    rl_kernel.attention(q, k, v, q_pos, k_start, sinks=leaf).backward(go)
    assert_same(cpu_bits(leaf.grad), C.bits_of(np.ascontiguousarray(tree)), "dsinks == the tree")
    in_order = terms.transpose(0, 1).reshape(HQ, -1).numpy().astype(np.float32)
    seq = np.zeros(HQ, dtype=np.float32)
    for i in range(in_order.shape[1]):
        seq = seq + in_order[:, i]
    assert not np.array_equal(seq.view(np.uint32), tree.view(np.uint32)), "row order must differ from the tree"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=dname)
def test_sinks_decode_equals_prefill(dtype: torch.dtype) -> None:
    """With sinks and a window that cuts keys: each decode row over the full cache and over a cache cut to the window
    equals its prefill row; a sequence alone equals it in the batch (forward and every gradient)."""
    q, k, v, q_pos, k_start, sinks, go = _case(dtype, seed=7)
    w = 6
    pre = rl_kernel.attention(q, k, v, q_pos, k_start, window=w, sinks=sinks)
    for r in (0, 9, 20, 44):
        step = rl_kernel.attention(q[:, :, r : r + 1], k, v, q_pos[:, r : r + 1], k_start, window=w, sinks=sinks)
        assert_bits(step, pre[:, :, r : r + 1], f"decode row {r}")
    r, lo = 30, 30 - w + 1
    cut = rl_kernel.attention(q[:, :, r : r + 1], k[:, :, lo : r + 1], v[:, :, lo : r + 1], torch.full((B, 1), w - 1),
                              (k_start - lo).clamp(min=0), window=w, sinks=sinks)  # fmt: skip
    assert_bits(cut, pre[:, :, r : r + 1], "decode over a cache cut to the window")

    def grads(*xs):
        leaves = [x.clone().requires_grad_() for x in xs[:3]] + [sinks.clone().requires_grad_()]
        rl_kernel.attention(*leaves[:3], xs[3], xs[4], window=w, sinks=leaves[3]).backward(xs[5])
        return [x.grad for x in leaves]

    full = grads(q, k, v, q_pos, k_start, go)
    alone = grads(q[1:, :, 9:], k[1:, :, 9:], v[1:, :, 9:], q_pos[1:, 9:] - 9, k_start[1:] - 9, go[1:, :, 9:])
    for name, a, f in zip(("dq", "dk", "dv"), alone[:3], full[:3], strict=True):
        assert_bits(a, f[1:, :, 9:], f"{name}: alone == in the batch")
    pre_alone = rl_kernel.attention(q[1:, :, 9:], k[1:, :, 9:], v[1:, :, 9:], q_pos[1:, 9:] - 9, k_start[1:] - 9,
                                    window=w, sinks=sinks)  # fmt: skip
    assert_bits(pre_alone, pre[1:, :, 9:], "alone == in the batch")


def gpt_oss_eager(q, k, v, q_pos, k_start, sinks, window: int = 0) -> torch.Tensor:
    """transformers' GPT-OSS eager attention in float64: the sink concatenated to the masked scores, softmax, the
    sink's column dropped; a row that sees no key is 0."""
    grp = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(grp, 1), v.double().repeat_interleave(grp, 1)
    s = q.double() @ kk.transpose(-1, -2) * q.shape[-1] ** -0.5
    j = torch.arange(k.shape[2])
    first = k_start[:, None] if not window else torch.maximum(k_start[:, None], q_pos - window + 1)
    seen = (j[None, None, :] >= first[:, :, None]) & (j[None, None, :] <= q_pos[:, :, None])
    s = s.masked_fill(~seen[:, None], float("-inf"))
    logits = torch.cat([s, sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)], -1)
    probs = torch.softmax(logits, -1)[..., :-1]
    return (probs @ vv).masked_fill(~seen.any(-1)[:, None, :, None], 0.0)


@pytest.mark.parametrize("window", WINDOWS)
def test_sinks_near_float64_eager(window: int) -> None:
    """Near transformers' GPT-OSS eager attention in float64, forward and gradients (q, k, v, sinks): measured bounds,
    not an equality claim."""
    q, k, v, q_pos, k_start, sinks, go = _case(torch.float32, seed=20 + window)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out = rl_kernel.attention(*leaves[:3], q_pos, k_start, window=window, sinks=leaves[3])
    out.backward(go)
    refs = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    want = gpt_oss_eager(*refs[:3], q_pos, k_start, refs[3], window)
    want.backward(go.double())
    assert (out.double() - want).abs().max() < 1e-5
    for leaf, ref in zip(leaves, refs, strict=True):
        assert ((leaf.grad.double() - ref.grad).abs().max() / ref.grad.abs().max()) < 1e-5


def test_bad_sinks_are_refused_by_name() -> None:
    q, k, v, q_pos, k_start, sinks, _ = _case(torch.float32)
    for bad in (sinks[:3], sinks.reshape(2, 2), torch.ones(HQ, dtype=torch.int64), [0.0] * HQ):
        with pytest.raises(ValueError, match="sinks"):
            rl_kernel.attention(q, k, v, q_pos, k_start, sinks=bad)
    with pytest.raises(RuntimeError, match="sinks"):  # the operator itself, called directly
        torch.ops.rl_kernel.attention(q, k, v, q_pos, k_start, 0.25, 0, sinks.double())


def test_the_patched_attention_function_takes_a_modules_sinks() -> None:
    """The attention function patch() registers passes the sinks a module hands it (s_aux, as GPT-OSS's attention
    does) to the tier's attention; without them the bits differ."""
    from rl_kernel import tiers
    from rl_kernel.bitwise import bits_equal
    from rl_kernel.integrations import patched

    q, k, v, q_pos, k_start, sinks, _ = _case(torch.bfloat16, seed=4)
    layers, positions = tiers.get("exact").namespace(), {"rl_q_pos": q_pos, "rl_k_start": k_start}
    out, _ = patched.tier_attention(layers, None, q, k, v, None, D**-0.5, s_aux=sinks, **positions)
    assert_bits(out, rl_kernel.attention(q, k, v, q_pos, k_start, D**-0.5, sinks=sinks).transpose(1, 2), "sinks")
    plain, _ = patched.tier_attention(layers, None, q, k, v, None, D**-0.5, **positions)
    assert not bits_equal(plain, out)


# ---- on a GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("window", WINDOWS)
def test_sinks_cpu_equals_gpu(window: int) -> None:
    """The exact tier's sinks: the output, statistics and every gradient (the sinks' included) CPU == GPU."""
    q, k, v, q_pos, k_start, sinks, go = _case(torch.bfloat16, seed=30 + window)

    def run(dev: str):
        leaves = [t.to(dev).clone().requires_grad_() for t in (q, k, v, sinks)]
        pos, ks = q_pos.to(dev), k_start.to(dev)
        out = rl_kernel.attention(*leaves[:3], pos, ks, window=window, sinks=leaves[3])
        out.backward(go.to(dev))
        stats = attention_with_stats(q.to(dev), k.to(dev), v.to(dev), pos, ks, window=window, sinks=sinks.to(dev))[1]
        return [out, stats] + [x.grad for x in leaves]

    for name, c, g in zip(("out", "stats", "dq", "dk", "dv", "dsinks"), run("cpu"), run("cuda"), strict=True):
        assert_bits(g.cpu(), c, f"{name}: CPU == GPU")


@pytest.mark.gpu
def test_fast_sinks_on_gpu() -> None:
    """The fast tier's sinks on a GPU at GPT-OSS's layout (64 query heads over 8, head dim 64, a 128-key window over
    600-key rows, left padding): decode rows == prefill rows, a sequence alone == in the batch, the sinks' gradient
    run to run and near float64."""
    import rl_kernel.fast as fast

    g = torch.Generator().manual_seed(0)
    b, hq, hkv, t, d, w = 2, 64, 8, 600, 64, 128
    q, k, v, go = (torch.randn(b, h, t, d, generator=g).bfloat16().cuda() for h in (hq, hkv, hkv, hq))
    q_pos, k_start = torch.arange(t).repeat(b, 1).cuda(), torch.tensor([0, 77]).cuda()
    sinks = torch.randn(hq, generator=g).cuda()
    pre = fast.attention(q, k, v, q_pos, k_start, window=w, sinks=sinks)
    for r in (0, 77, 200, 599):
        step = fast.attention(q[:, :, r : r + 1], k, v, q_pos[:, r : r + 1], k_start, window=w, sinks=sinks)
        assert_bits(step, pre[:, :, r : r + 1], f"decode row {r}")
    alone = fast.attention(q[1:, :, 77:], k[1:, :, 77:], v[1:, :, 77:], q_pos[1:, 77:] - 77, k_start[1:] - 77,
                           window=w, sinks=sinks)  # fmt: skip
    assert_bits(alone, pre[1:, :, 77:], "alone == in the batch")

    def grads():
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
        fast.attention(*leaves[:3], q_pos, k_start, window=w, sinks=leaves[3]).backward(go)
        return [x.grad for x in leaves]

    first, again = grads(), grads()
    for name, a, b_ in zip(("dq", "dk", "dv", "dsinks"), first, again, strict=True):
        assert_bits(a, b_, f"{name} run to run")
    ref = sinks.double().requires_grad_()
    gpt_oss_eager(q.cpu(), k.cpu(), v.cpu(), q_pos.cpu(), k_start.cpu(), ref.cpu(), w).backward(go.cpu().double())
    err = (first[3].double().cpu() - ref.grad.cpu()).abs().max() / ref.grad.abs().max()
    assert err < 0.03, err
