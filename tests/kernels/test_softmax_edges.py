"""Behaviour of rl_kernel's public API (the `exact` tier) at the edges: edge rows, denormal modes, bad input and empty
batches, torch.compile, run to run and thread counts, GPU == CPU bits.

Every equality claim here is bitwise (integer views, `rl_kernel.bitwise.bits_equal`); accuracy
against float64 is checked with explicit numeric bounds, which are not equality claims.
Tests that take `device` run on the CPU and, where there is one, on the GPU (conftest.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from bit_checks import assert_bits, dname
from softmax_cases import (
    BAD_ROWS,
    CANONICAL_NAN,
    CONSTANT,
    EDGE_VOCABS,
    ENT_ATOL,
    ENT_RTOL,
    HUGE,
    IGNORE,
    LSM_MAX_ABS,
    MIN_NORMAL,
    NEG_ZERO,
    OPS,
    SIGNED_ZEROS,
    SINGLE,
    SOME_NEG_INF,
    SUBNORMALS,
    case,
    grads,
    run,
    vd_params,
    views,
)

import rl_kernel
from rl_kernel import inputs
from rl_kernel.bitwise import int_view

# ---------------------------------------------------------------- edge cases


def _edge_tokens(vocab: int, device: str, some_neg_inf_tok: int) -> torch.Tensor:
    t = torch.tensor([1, 1, 1, some_neg_inf_tok, 1, 1, 1, vocab - 1, vocab - 1, IGNORE], device=device)
    return t


def _check_clean_bits(y: torch.Tensor, what: str) -> None:
    """No -0.0, no subnormal, every NaN canonical (fp32 outputs)."""
    bits = int_view(y).cpu()
    assert not bool((bits == NEG_ZERO[y.dtype]).any()), f"{what}: contains -0.0"
    nan = torch.isnan(y).cpu()
    assert bool((bits[nan] == CANONICAL_NAN[y.dtype]).all()), f"{what}: non-canonical NaN bits"
    small = (y.float().abs() < MIN_NORMAL).cpu()
    assert bool((bits[small] == 0).all()), f"{what}: subnormal (or -0.0) values"


@pytest.mark.parametrize(("vocab", "dtype"), vd_params(EDGE_VOCABS))
def test_edge_rows(vocab: int, dtype: torch.dtype, device: str) -> None:
    x = inputs.edge_rows(vocab, dtype).to(device)
    xf = x.float().cpu()
    t_inf = _edge_tokens(vocab, device, 0)  # token 0 of the masked row is -inf
    t_fin = _edge_tokens(vocab, device, 1)  # token 1 of the masked row is finite
    lsm = rl_kernel.log_softmax(x)
    ent = rl_kernel.entropy(x)
    tok_inf = rl_kernel.token_logprobs(x, t_inf)
    tok_fin = rl_kernel.token_logprobs(x, t_fin)
    for name, y in (("log_softmax", lsm), ("entropy", ent), ("token_logprobs", tok_inf), ("tokens", tok_fin)):
        assert y.dtype == torch.float32
        _check_clean_bits(y, name)
    lsm, ent, tok_inf, tok_fin = lsm.cpu(), ent.cpu(), tok_inf.cpu(), tok_fin.cpu()
    nan_bits = CANONICAL_NAN[torch.float32]

    # NaN, all -inf and +inf rows: every output of the row is the canonical NaN.
    for r in BAD_ROWS:
        assert bool((int_view(lsm[r]) == nan_bits).all()), f"row {r}: log_softmax not all NaN"
        assert int(int_view(ent[r])) == nan_bits, f"row {r}: entropy not NaN"
        assert int(int_view(tok_inf[r])) == nan_bits, f"row {r}: token log-prob not NaN"
    good = [r for r in range(10) if r not in BAD_ROWS]
    assert not bool(lsm[good].isnan().any()) and not bool(ent[good].isnan().any())
    assert not bool(tok_inf[good].isnan().any())
    assert bool((lsm[good] <= 0).all()) and bool((ent[good] >= 0).all())

    # A bad row does not touch the others: they have the same bits when computed without it.
    for r in BAD_ROWS:
        rest = [i for i in range(10) if i != r]
        xr, tr = x[rest], t_inf[rest]
        assert_bits(rl_kernel.log_softmax(xr).cpu(), lsm[rest], f"log_softmax without row {r}")
        assert_bits(rl_kernel.entropy(xr).cpu(), ent[rest], f"entropy without row {r}")
        assert_bits(rl_kernel.token_logprobs(xr, tr).cpu(), tok_inf[rest], f"token_logprobs without row {r}")

    # Masked row: -inf exactly where the input is -inf, finite elsewhere.
    masked = torch.isneginf(xf[SOME_NEG_INF])
    assert bool(torch.isneginf(lsm[SOME_NEG_INF][masked]).all())
    assert bool(torch.isfinite(lsm[SOME_NEG_INF][~masked]).all())
    assert math.isfinite(ent[SOME_NEG_INF].item())
    assert tok_inf[SOME_NEG_INF].item() == -math.inf
    assert math.isfinite(tok_fin[SOME_NEG_INF].item())

    # One finite value among -inf: log p = +0.0 there, -inf elsewhere; entropy +0.0.
    assert int(int_view(lsm[SINGLE, vocab - 1])) == 0
    assert bool(torch.isneginf(lsm[SINGLE, :-1]).all())
    assert int(int_view(ent[SINGLE])) == 0
    assert int(int_view(tok_inf[SINGLE])) == 0

    # Uniform rows (signed zeros, subnormals flushed or not, constant): every element log(1/V).
    for r in (SIGNED_ZEROS, CONSTANT) + ((SUBNORMALS,) if dtype != torch.float16 else ()):
        row = lsm[r]
        assert bool((int_view(row) == int_view(row[:1])).all()), f"row {r} not uniform"
        assert abs(row[0].item() + math.log(vocab)) <= LSM_MAX_ABS, f"row {r}: {row[0].item()} vs -log V"
        assert abs(ent[r].item() - math.log(vocab)) <= ENT_RTOL * math.log(vocab) + ENT_ATOL
    # fp16 subnormals are exact binary16 values, so that row is merely near-uniform.
    assert (lsm[SUBNORMALS] + math.log(vocab)).abs().max().item() <= 1e-4

    # Huge magnitudes: no NaN. For fp32/bf16 every other value is ~1e34 below the maximum, so the
    # c elements equal to the maximum (c = 1 in fp32; bf16 rounding merges the top of the row) have
    # log p = -log c, +0.0 when c = 1.
    assert not bool(lsm[HUGE].isnan().any())
    if dtype != torch.float16:
        top = xf[HUGE] == xf[HUGE].max()
        count = int(top.sum())
        assert (lsm[HUGE][top] + math.log(count)).abs().max().item() <= LSM_MAX_ABS
        if dtype == torch.float32:
            assert count == 1 and int(int_view(lsm[HUGE, vocab - 1])) == 0
    # Ignored token: +0.0.
    assert int(int_view(tok_inf[CONSTANT])) == 0


@pytest.mark.parametrize(("vocab", "dtype"), vd_params((8, 257, 32000)))
def test_edge_rows_gradients(vocab: int, dtype: torch.dtype, device: str) -> None:
    x = inputs.edge_rows(vocab, dtype).to(device)
    t = _edge_tokens(vocab, device, 1)
    g = grads(x, t)
    good = [r for r in range(10) if r not in BAD_ROWS]
    for op, gi in g.items():
        assert gi.dtype == dtype
        bits = int_view(gi).cpu()
        for r in BAD_ROWS:
            assert bool((bits[r] == CANONICAL_NAN[dtype]).all()), f"{op}: row {r} gradient not canonical NaN"
        assert bool(torch.isfinite(gi[good]).all()), f"{op}: non-finite gradient in a good row"
        # A gradient that rounds to zero in the output dtype is +0.0, never -0.0.
        assert not bool((bits == NEG_ZERO[dtype]).any()), f"{op}: gradient contains -0.0"
    assert bool((int_view(g["token_logprobs"][CONSTANT]) == 0).all()), "ignored row: gradient not +0.0"


# ---------------------------------------------------------------- denormal mode


def _all_outputs(x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {op: run(op, x, t) for op in OPS}
    out.update({f"grad {op}": g for op, g in grads(x, t).items()})
    return out


@pytest.mark.parametrize(("vocab", "dtype"), vd_params((8, 257, 32000)))
def test_denormal_mode_does_not_matter(vocab: int, dtype: torch.dtype) -> None:
    x, t = case(vocab, dtype, rows=4)
    x = torch.cat([x, inputs.edge_rows(vocab, dtype)])
    t = torch.cat([t, _edge_tokens(vocab, "cpu", 1)])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the mode is per thread: run the rows on this one
        if not torch.set_flush_denormal(True):
            pytest.skip("torch.set_flush_denormal is not supported on this CPU")
        assert (torch.tensor([2.0**-130]) * 1.0).item() == 0.0, "flush-denormal mode is not in effect"
        flushed = _all_outputs(x, t)
        torch.set_flush_denormal(False)
        assert (torch.tensor([2.0**-130]) * 1.0).item() != 0.0
        ieee = _all_outputs(x, t)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    for name, y in ieee.items():
        assert_bits(flushed[name], y, f"{name}: flush-denormal vs IEEE")


# ---------------------------------------------------------------- errors and empty inputs


_X = torch.randn(3, 5)
_T = torch.tensor([0, 1, 2])
BAD_CALLS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("int logits", lambda: rl_kernel.log_softmax(_X.int()), TypeError, "float32, bfloat16 or float16"),
    ("int logits tok", lambda: rl_kernel.token_logprobs(_X.long(), _T), TypeError, "float32, bfloat16 or float16"),
    ("int logits ent", lambda: rl_kernel.entropy(_X.short()), TypeError, "float32, bfloat16 or float16"),
    ("float64 logits", lambda: rl_kernel.entropy(_X.double()), TypeError, "float64"),
    (
        "token too large",
        lambda: rl_kernel.token_logprobs(_X, torch.tensor([0, 5, 1])),
        ValueError,
        "outside the vocabulary",
    ),
    (
        "negative token",
        lambda: rl_kernel.token_logprobs(_X, torch.tensor([0, -1, 1])),
        ValueError,
        "outside the vocabulary",
    ),
    ("float tokens", lambda: rl_kernel.token_logprobs(_X, _T.float()), TypeError, "integer"),
    ("bool tokens", lambda: rl_kernel.token_logprobs(_X, _T > 0), TypeError, "integer"),
    ("tokens shape", lambda: rl_kernel.token_logprobs(_X, _T[:2]), ValueError, "shape"),
    ("tokens 2-D", lambda: rl_kernel.token_logprobs(_X, _T[:, None]), ValueError, "shape"),
    ("non-tensor tokens", lambda: rl_kernel.token_logprobs(_X, [0, 1, 2]), TypeError, "torch.Tensor"),
    ("0-d logits", lambda: rl_kernel.log_softmax(torch.tensor(1.0)), ValueError, "at least one dimension"),
    ("0-d logits ent", lambda: rl_kernel.entropy(torch.tensor(1.0)), ValueError, "at least one dimension"),
    ("empty vocab", lambda: rl_kernel.log_softmax(torch.zeros(3, 0)), ValueError, "empty vocabulary"),
    ("empty vocab tok", lambda: rl_kernel.token_logprobs(torch.zeros(3, 0), _T), ValueError, "empty vocabulary"),
    ("empty vocab ent", lambda: rl_kernel.entropy(torch.zeros(3, 0)), ValueError, "empty vocabulary"),
    ("non-tensor logits", lambda: rl_kernel.log_softmax([[1.0, 2.0]]), TypeError, "torch.Tensor"),
    ("numpy logits", lambda: rl_kernel.entropy(_X.numpy()), TypeError, "torch.Tensor"),
]


@pytest.mark.parametrize(("call", "exc", "match"), [pytest.param(c, e, m, id=i) for i, c, e, m in BAD_CALLS])
def test_bad_input_raises(call: Callable[[], object], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        call()


def test_error_messages_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"token id 7 at index \(1, 0\).*\[0, 5\).*ignore_index=-100"):
        rl_kernel.token_logprobs(torch.randn(2, 1, 5), torch.tensor([[0], [7]]))
    with pytest.raises(TypeError, match=r"torch\.float64"):
        rl_kernel.log_softmax(torch.randn(2, 5, dtype=torch.float64))


def test_ignore_index_is_not_range_checked() -> None:
    y = rl_kernel.token_logprobs(_X, torch.tensor([-100, 1, -100]))
    assert int(int_view(y)[0]) == 0 and int(int_view(y)[2]) == 0


def test_validate_false_gives_nan_for_bad_ids(device: str) -> None:
    x, _ = case(257, torch.float32, device, rows=4)
    t = torch.tensor([3, 257, -7, IGNORE], device=device)
    y = rl_kernel.token_logprobs(x, t, validate=False).cpu()
    bits = int_view(y)
    assert int(bits[1]) == CANONICAL_NAN[torch.float32] and int(bits[2]) == CANONICAL_NAN[torch.float32]
    assert int(bits[3]) == 0
    assert_bits(y[:1], rl_kernel.token_logprobs(x[:1], t[:1]).cpu(), "valid id next to bad ones")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        rl_kernel.token_logprobs(x, t)


_OPS = torch.ops.rl_kernel
RAW_CALLS: list[tuple[str, Callable[[], object], str]] = [
    ("log_softmax f64", lambda: _OPS.log_softmax(_X.double()), "float32, bfloat16 or float16"),
    ("entropy int", lambda: _OPS.entropy(_X.int()), "float32, bfloat16 or float16"),
    ("row_stats f64", lambda: _OPS.row_stats(_X.double()), "float32, bfloat16 or float16"),
    ("token_logprobs f64", lambda: _OPS.token_logprobs(_X.double(), _T, IGNORE), "float32, bfloat16 or float16"),
    ("token_logprobs int32 tokens", lambda: _OPS.token_logprobs(_X, _T.int(), IGNORE), "int64"),
    ("token_logprobs shape", lambda: _OPS.token_logprobs(_X, _T[:2], IGNORE), "shape"),
    ("empty vocab", lambda: _OPS.log_softmax(torch.zeros(3, 0)), "empty vocabulary"),
    ("0-d", lambda: _OPS.entropy(torch.tensor(1.0)), "at least one dimension"),
    (
        "backward shape",
        lambda: _OPS.log_softmax_backward(torch.zeros(3, 5), torch.zeros(3, 4), torch.float32),
        "shape",
    ),
]


@pytest.mark.parametrize(("call", "match"), [pytest.param(c, m, id=i) for i, c, m in RAW_CALLS])
def test_raw_ops_raise(call: Callable[[], object], match: str) -> None:
    with pytest.raises(RuntimeError, match=match):
        call()


@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=dname)
@pytest.mark.parametrize("op", OPS)
def test_empty_batch(op: str, dtype: torch.dtype, device: str) -> None:
    for lead in ((0,), (2, 0), (0, 3)):
        x = torch.zeros((*lead, 50), dtype=dtype, device=device, requires_grad=True)
        t = torch.zeros(lead, dtype=torch.long, device=device)
        y = run(op, x, t)
        want = (*lead, 50) if op == "log_softmax" else lead
        assert y.shape == want and y.dtype == torch.float32
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape and x.grad.dtype == dtype


# ---------------------------------------------------------------- torch.compile


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch-internal
def test_torch_compile_matches_eager(device: str) -> None:
    """fullgraph: no graph break on either device (on CUDA the GPU-kernel check once broke the graph). Each
    loss sums at most two gradients, whose one bf16 addition inductor and eager autograd round alike."""

    def logprob_entropy(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return rl_kernel.token_logprobs(x, t).sum() + rl_kernel.entropy(x).sum()

    def log_softmax(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return rl_kernel.log_softmax(x)[..., :5].sum()

    torch._dynamo.reset()
    for loss in (logprob_entropy, log_softmax):
        compiled = torch.compile(loss, fullgraph=True)
        for dtype in (torch.float32, torch.bfloat16):
            x, t = case(37, dtype, device, rows=4, seed=3)
            xe = x.clone().requires_grad_()
            xc = x.clone().requires_grad_()
            ye = loss(xe, t)
            yc = compiled(xc, t)
            (ge,) = torch.autograd.grad(ye, xe)
            (gc,) = torch.autograd.grad(yc, xc)
            assert_bits(yc.detach(), ye.detach(), f"compiled {loss.__name__} forward ({dtype})")
            assert_bits(gc, ge, f"compiled {loss.__name__} gradient ({dtype})")


# ---------------------------------------------------------------- run to run, dtypes, threads


@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=dname)
def test_run_to_run(dtype: torch.dtype, device: str) -> None:
    x, t = case(32000, dtype, device, rows=8)
    first = _all_outputs(x, t)
    for _ in range(2):
        again = _all_outputs(x, t)
        for name, y in first.items():
            assert_bits(again[name], y, f"{name}, repeated")


@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=dname)
def test_cpu_thread_count_does_not_matter(dtype: torch.dtype) -> None:
    x, t = case(50257, dtype, rows=6)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _all_outputs(x, t)
        torch.set_num_threads(max(2, threads))
        many = _all_outputs(x, t)
    finally:
        torch.set_num_threads(threads)
    for name, y in one.items():
        assert_bits(many[name], y, f"{name}: 1 thread vs {max(2, threads)}")


@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=dname)
def test_output_dtypes_and_shapes(dtype: torch.dtype, device: str) -> None:
    x = inputs.logits(6, 300, dtype, seed=4).view(2, 3, 300).to(device)
    t = inputs.tokens(6, 300, seed=4).view(2, 3).to(device)
    assert rl_kernel.log_softmax(x).dtype == torch.float32
    assert rl_kernel.log_softmax(x).shape == x.shape
    for y in (rl_kernel.token_logprobs(x, t), rl_kernel.entropy(x)):
        assert y.dtype == torch.float32 and y.shape == (2, 3)
    stats = rl_kernel.row_stats(x)
    assert stats.dtype == torch.float32 and stats.shape == (2, 3, 3)
    assert_bits(stats[..., 0], x.float().amax(-1), "row_stats max")
    # int32 tokens are accepted and give the int64 result.
    assert_bits(rl_kernel.token_logprobs(x, t.int()), rl_kernel.token_logprobs(x, t), "int32 tokens")
    assert "exact" in rl_kernel.tiers.tiers()


# ---------------------------------------------------------------- GPU against the CPU reference


@pytest.mark.gpu
@pytest.mark.parametrize(("vocab", "dtype"), vd_params((7, 255, 256, 257, 32000, 151936)))
def test_gpu_bits_equal_cpu(vocab: int, dtype: torch.dtype) -> None:
    x, t = case(vocab, dtype, rows=8)
    if vocab >= 8:
        x = torch.cat([x, inputs.edge_rows(vocab, dtype)])
        t = torch.cat([t, _edge_tokens(vocab, "cpu", 0)])
    cpu = _all_outputs(x, t)
    gpu = _all_outputs(x.cuda(), t.cuda())
    for name, y in cpu.items():
        assert gpu[name].device.type == "cuda"
        assert_bits(gpu[name].cpu(), y, f"{name}: GPU vs CPU")
    # Rows that do not start on a 16-byte boundary take the GPU's scalar load path.
    for layout, (xv, tv) in views(x, t).items():
        for op in OPS:
            assert_bits(run(op, xv.cuda(), tv.cuda()).cpu(), run(op, xv, tv), f"{op}, {layout}: GPU vs CPU")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=dname)
def test_gpu_run_to_run(dtype: torch.dtype) -> None:
    x, t = case(151936, dtype, "cuda", rows=64)
    first = _all_outputs(x, t)
    for _ in range(3):
        again = _all_outputs(x, t)
        torch.cuda.synchronize()
        for name, y in first.items():
            assert_bits(again[name], y, f"{name}: GPU repeat")


def test_out_of_range_token_unvalidated_gives_nan_forward_and_gradient() -> None:
    x = rl_kernel.inputs.logits(3, 50, torch.float32, seed=3).requires_grad_(True)
    t = torch.tensor([1, 77, -100])
    out = rl_kernel.token_logprobs(x, t, validate=False)
    out.sum().backward()
    assert int(out[1:2].view(torch.int32)) == 0x7FC00000
    assert bool((x.grad[1].view(torch.int32) == 0x7FC00000).all())
    assert bool((x.grad[2].view(torch.int32) == 0).all())
    assert bool(torch.isfinite(x.grad[0]).all())
