"""The decoder family (docs/numerics.md section 11): batch invariance, decode == prefill, CPU == GPU.

Every equality claim is bitwise (integer views); accuracy against float64 is checked with explicit
bounds, which are not equality claims. Tests that take `device` run on the CPU and, where there is one,
on the GPU (conftest.py); the `cpu == gpu` tests need a GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bit_checks import assert_bits, dname

import rl_kernel
from rl_kernel import inputs
from rl_kernel.bitwise import bits_equal
from rl_kernel.exact.decoder import checks as decoder_checks
from rl_kernel.exact.decoder.tiny import DecoderConfig, TinyDecoder, split_k_linear, split_kv_attention

DTYPES = inputs.DTYPES
SPECS = {s.name: s for s in decoder_checks.SPECS}


def rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


# ---------------------------------------------------------------- rms_norm, wide rows
@pytest.mark.parametrize("hidden", [2048, 8192])
def test_rms_norm_wide_rows_do_not_depend_on_the_batch(hidden: int, device: str) -> None:
    """Rows of more than 64 chunks (a real model's hidden size): the GPU's tree joins them across warps, where
    a compacting in-place tree raced (found on the H200 by a 2048-wide Qwen3's batch forward)."""
    x = rand((320, hidden), torch.bfloat16, 5).to(device)
    w = rand((hidden,), torch.bfloat16, 6).to(device)
    full = rl_kernel.rms_norm(x, w)
    for rows in (1, 7, 129):
        assert_bits(rl_kernel.rms_norm(x[:rows], w), full[:rows], f"rows={rows}")
    assert_bits(full.cpu(), rl_kernel.rms_norm(x.cpu(), w.cpu()), "cpu == this device")


# ---------------------------------------------------------------- no-grad calls
def _decoder_calls(dtype: torch.dtype, device: str, grad: bool) -> dict[str, torch.Tensor]:
    """Each decoder operator once, its float inputs requiring grad or not."""

    def t(shape, seed, scale=1.0):
        return rand(shape, dtype, seed, scale).to(device).requires_grad_(grad)

    q, k, v = (t((2, 4, 9, 16), s) for s in (11, 12, 13))
    q_pos = torch.arange(9, device=device).expand(2, 9).contiguous()
    cos, sin = rl_kernel.rope_table(q_pos, rl_kernel.rope_inv_freq(16))
    return {
        "linear": rl_kernel.linear(t((9, 24), 1), t((8, 24), 2, 0.2), t((8,), 3)),
        "rms_norm": rl_kernel.rms_norm(t((9, 24), 4), t((24,), 5)),
        "rotary": rl_kernel.rotary(q, cos, sin),
        "silu_mul": rl_kernel.silu_mul(t((9, 24), 6), t((9, 24), 7)),
        "attention": rl_kernel.attention(q, k, v, q_pos, torch.tensor([0, 3], device=device)),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_no_grad_calls_give_the_autograd_paths_bits(dtype: torch.dtype, device: str) -> None:
    """Where no gradient can flow the operators call their kernels directly (a decode step's host time); the
    output is the autograd path's, bit for bit, and carries no graph."""
    with_grad = _decoder_calls(dtype, device, grad=True)
    direct = _decoder_calls(dtype, device, grad=False)
    with torch.no_grad():
        no_grad = _decoder_calls(dtype, device, grad=True)
    for name, out in with_grad.items():
        assert out.grad_fn is not None, name
        for path, other in (("inputs without grad", direct[name]), ("torch.no_grad", no_grad[name])):
            assert other.grad_fn is None, (name, path)
            assert_bits(other, out.detach(), f"{name}, {path}")


# ---------------------------------------------------------------- linear
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_linear_rows_do_not_depend_on_the_batch(dtype: torch.dtype, device: str) -> None:
    """Row r of linear(x[:m]) == row r of linear(x) for M in {1, 7, 64, 1024, 4097}."""
    x = rand((4097, 72), dtype, 1).to(device)
    w, b = rand((40, 72), dtype, 2, 0.2).to(device), rand((40,), dtype, 3).to(device)
    full = rl_kernel.linear(x, w, b)
    for m in (1, 7, 64, 1024, 4097):
        assert_bits(rl_kernel.linear(x[:m], w, b), full[:m], f"M={m}")
    assert_bits(rl_kernel.linear(x.flip(0), w, b).flip(0), full, "reversed batch")
    assert_bits(rl_kernel.linear(x.view(17, 241, 72), w, b).view(4097, 40), full, "[B, T, K] input")


def test_linear_split_k_control_is_caught() -> None:
    """The same row check catches a linear whose K split depends on M (the negative control)."""
    x, w = rand((64, 72), torch.float32, 1), rand((40, 72), torch.float32, 2, 0.2)
    assert not bits_equal(split_k_linear(x[:1], w), split_k_linear(x, w)[:1])


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_linear_matches_float64(dtype: torch.dtype, device: str) -> None:
    x, w, b = rand((33, 300), dtype, 4), rand((50, 300), dtype, 5, 0.1), rand((50,), dtype, 6)
    got = rl_kernel.linear(x.to(device), w.to(device), b.to(device)).cpu().double()
    want = F.linear(x.double(), w.double(), b.double())
    tol = {torch.float32: 2e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    assert (got - want).abs().max() <= tol * want.abs().max()


def test_linear_gradients_match_float64(device: str) -> None:
    x = rand((9, 48), torch.float32, 7).to(device).requires_grad_()
    w = rand((20, 48), torch.float32, 8, 0.2).to(device).requires_grad_()
    b = rand((20,), torch.float32, 9).to(device).requires_grad_()
    dy = rand((9, 20), torch.float32, 10).to(device)
    got = torch.autograd.grad(rl_kernel.linear(x, w, b), (x, w, b), dy)
    want = torch.autograd.grad(F.linear(x.double(), w.double(), b.double()), (x, w, b), dy.double())
    for g, r in zip(got, want, strict=True):
        assert (g.double() - r).abs().max() <= 1e-5 * (1 + r.abs().max())


def test_linear_rejects_bad_input() -> None:
    x, w = torch.randn(3, 8), torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="weight is"):
        rl_kernel.linear(x, torch.randn(4, 9))
    with pytest.raises(TypeError, match="one dtype"):  # checked in Python (_validate) before the dispatch
        rl_kernel.linear(x, w.to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="bias must be"):
        rl_kernel.linear(x, w, torch.randn(5))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        rl_kernel.linear(x.long(), w)


# ---------------------------------------------------------------- rms_norm, rotary, silu_mul
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_rms_norm_matches_hugging_face_and_is_row_invariant(dtype: torch.dtype, device: str) -> None:
    x, w = rand((65, 100), dtype, 11, 3.0), rand((100,), dtype, 12)
    y = rl_kernel.rms_norm(x.to(device), w.to(device), 1e-6)
    assert_bits(rl_kernel.rms_norm(x[5:6].to(device), w.to(device), 1e-6), y[5:6], "a row alone")
    xf = x.double()
    want = w.double() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6))
    tol = {torch.float32: 1e-6, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    assert (y.cpu().double() - want).abs().max() <= tol * want.abs().max()


def test_rms_norm_gradients_match_float64(device: str) -> None:
    x = rand((5, 96), torch.float32, 13).to(device).requires_grad_()
    w = rand((96,), torch.float32, 14).to(device).requires_grad_()
    dy = rand((5, 96), torch.float32, 15).to(device)

    def hf(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    got = torch.autograd.grad(rl_kernel.rms_norm(x, w, 1e-6), (x, w), dy)
    want = torch.autograd.grad(hf(x.double(), w.double()), (x, w), dy.double())
    for g, r in zip(got, want, strict=True):
        assert (g.double() - r).abs().max() <= 2e-6 * (1 + r.abs().max())


def test_rope_table_matches_float64_and_inv_freq_scaling() -> None:
    inv = rl_kernel.rope_inv_freq(64, 10000.0)
    pos = torch.arange(4096).view(1, -1)
    cos, sin = rl_kernel.rope_table(pos, inv)
    angle = pos[..., None].double() * inv.double()
    # The angle itself is rounded to float32 (as Hugging Face's is); compare against its exact cos/sin.
    exact = (pos[..., None].float() * inv).double()
    assert (cos.double() - exact.cos()).abs().max() < 2e-6
    assert (sin.double() - exact.sin()).abs().max() < 2e-6
    assert (cos.double() - angle.cos()).abs().max() < 4e-4  # float32 angles near 4096 rad: ulp 2.4e-4
    scaled = rl_kernel.rope_inv_freq(
        64,
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    base = rl_kernel.rope_inv_freq(64, 500000.0)
    assert torch.equal(scaled[:8], base[:8]) and bits_equal(scaled[-1], base[-1] / 8)
    with pytest.raises(ValueError, match="not supported"):
        rl_kernel.rope_inv_freq(64, 1e4, {"rope_type": "yarn"})
    big = rl_kernel.rope_table(torch.tensor([[5_000_000]]), torch.ones(1))[0]
    assert torch.isnan(big).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_rotary_matches_hugging_face(dtype: torch.dtype, device: str) -> None:
    x = rand((2, 3, 50, 32), dtype, 16)
    pos = torch.arange(50).repeat(2, 1)
    cos, sin = rl_kernel.rope_table(pos, rl_kernel.rope_inv_freq(32))
    got = rl_kernel.rotary(x.to(device), cos.to(device), sin.to(device)).cpu().double()
    c, s = torch.cat([cos, cos], -1)[:, None].double(), torch.cat([sin, sin], -1)[:, None].double()
    xd = x.double()
    want = xd * c + torch.cat([-xd[..., 16:], xd[..., :16]], -1) * s
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
    assert (got - want).abs().max() <= tol * want.abs().max()


def test_silu_mul_matches_float64(device: str) -> None:
    g = (torch.linspace(-30, 30, 4001)).to(device).requires_grad_()
    u = rand((4001,), torch.float32, 17).to(device).requires_grad_()
    y = rl_kernel.silu_mul(g, u)
    want = F.silu(g.double()) * u.double()
    assert (y.double() - want).abs().max() <= 1e-6 * (1 + want.abs().max())
    dy = rand((4001,), torch.float32, 18).to(device)
    got = torch.autograd.grad(y, (g, u), dy)
    ref = torch.autograd.grad(want, (g, u), dy.double())
    for a, r in zip(got, ref, strict=True):
        assert (a.double() - r).abs().max() <= 1e-5 * (1 + r.abs().max())


# ---------------------------------------------------------------- attention
def _qkv(dtype, b=3, hq=4, hkv=2, t=75, dh=32, seed=20):
    return (
        rand((b, hq, t, dh), dtype, seed),
        rand((b, hkv, t, dh), dtype, seed + 1),
        rand((b, hkv, t, dh), dtype, seed + 2),
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_attention_decode_equals_prefill(dtype: torch.dtype, device: str) -> None:
    """Each query row decoded alone over the cache (q_len 1, the cache as long as needed) gives the
    prefill's bits, also with a cache longer than the row's keys."""
    q, k, v = (a.to(device) for a in _qkv(dtype))
    b, _, t, _ = q.shape
    k_start = torch.tensor([0, 4, 40], device=device)
    q_pos = torch.arange(t, device=device).expand(b, t).contiguous()
    full = rl_kernel.attention(q, k, v, q_pos, k_start)
    for i in (0, 3, 4, 31, 36, 40, 71, 74):
        cache = i + 1
        step = rl_kernel.attention(q[:, :, i : i + 1], k[:, :, :cache], v[:, :, :cache], q_pos[:, i : i + 1], k_start)
        assert_bits(step, full[:, :, i : i + 1], f"decode of row {i}")
        longer = rl_kernel.attention(q[:, :, i : i + 1], k, v, q_pos[:, i : i + 1], k_start)
        assert_bits(longer, full[:, :, i : i + 1], f"decode of row {i} over the whole cache")
    assert torch.equal(full[2, :, :40].float(), torch.zeros_like(full[2, :, :40].float()))  # rows before any key


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=dname)
def test_attention_padding_and_batch_do_not_change_bits(dtype: torch.dtype, device: str) -> None:
    """One sequence, left padded by 0..7 in batches of 1..8 (the others random): its rows keep their bits."""
    q0, k0, v0 = _qkv(dtype, b=1, t=40, seed=30)
    alone = rl_kernel.attention(
        q0.to(device),
        k0.to(device),
        v0.to(device),
        torch.arange(40).view(1, 40).to(device),
        torch.zeros(1, dtype=torch.long, device=device),
    )
    for batch in range(1, 9):
        pad = batch - 1
        q, k, v = _qkv(dtype, b=batch, t=40 + pad, seed=31 + batch)
        q[-1, :, pad:], k[-1, :, pad:], v[-1, :, pad:] = q0[0], k0[0], v0[0]
        k_start = torch.tensor([batch % 3] * (batch - 1) + [pad])
        q_pos = torch.arange(40 + pad).expand(batch, -1).contiguous()
        out = rl_kernel.attention(q.to(device), k.to(device), v.to(device), q_pos.to(device), k_start.to(device))
        assert_bits(out[-1:, :, pad:], alone, f"left pad {pad}, batch {batch}")


def test_attention_matches_sdpa(device: str) -> None:
    q, k, v = _qkv(torch.float32)
    k_start = torch.tensor([0, 4, 40])
    t = q.shape[2]
    q_pos = torch.arange(t).expand(3, t).contiguous()
    got = rl_kernel.attention(q.to(device), k.to(device), v.to(device), q_pos.to(device), k_start.to(device)).cpu()
    mask = torch.ones(3, 1, t, t, dtype=torch.bool).tril()
    for i, s in enumerate(k_start.tolist()):
        mask[i, :, :, :s] = False
    want = F.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1), attn_mask=mask
    )
    for i, s in enumerate(k_start.tolist()):
        assert (got[i, :, s:].double() - want[i, :, s:]).abs().max() < 2e-6


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=dname)
def test_attention_gradients_match_float64(dtype: torch.dtype, device: str) -> None:
    """dq, dk, dv (GQA, left padding, rows that see no key) against float64 autograd through SDPA."""
    q, k, v = (a.to(device).requires_grad_() for a in _qkv(dtype, t=45))
    k_start = torch.tensor([0, 4, 40], device=device)
    q_pos = torch.arange(45, device=device).expand(3, 45).contiguous()
    dy = rand(tuple(q.shape), dtype, 60).to(device)
    got = torch.autograd.grad(rl_kernel.attention(q, k, v, q_pos, k_start), (q, k, v), dy)
    mask = torch.ones(3, 1, 45, 45, dtype=torch.bool, device=device).tril()
    for i, s in enumerate(k_start.tolist()):
        mask[i, :, :, :s] = False
        mask[i, :, :s, :] = False  # rows that see no key: no output, no gradient
    qd, kd, vd = (a.detach().double().requires_grad_() for a in (q, k, v))
    want = F.scaled_dot_product_attention(qd, kd.repeat_interleave(2, 1), vd.repeat_interleave(2, 1), attn_mask=mask)
    want = torch.nan_to_num(want)
    ref = torch.autograd.grad(want, (qd, kd, vd), dy.double())
    tol = {torch.float32: 2e-5, torch.bfloat16: 3e-2}[dtype]
    for g, r in zip(got, ref, strict=True):
        assert (g.double() - r).abs().max() <= tol * (1 + r.abs().max())


def test_attention_split_kv_control_is_caught() -> None:
    q, k, v = _qkv(torch.float32, t=70)
    q_pos = torch.arange(70).expand(3, 70).contiguous()
    k_start = torch.tensor([0, 4, 40])
    full = rl_kernel.attention(q, k, v, q_pos, k_start)
    step = split_kv_attention(q[:, :, 69:70], k, v, q_pos[:, 69:70], k_start)
    assert not bits_equal(step, full[:, :, 69:70])


def test_attention_rejects_bad_input() -> None:
    q, k, v = _qkv(torch.float32, t=8)
    q_pos, k_start = torch.arange(8).expand(3, 8).contiguous(), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="past the 8 keys"):
        rl_kernel.attention(q, k, v, q_pos + 1, k_start)
    with pytest.raises(ValueError, match="k_start must be >= 0"):
        rl_kernel.attention(q, k, v, q_pos, k_start - 1)
    with pytest.raises(RuntimeError, match="not a multiple"):
        rl_kernel.attention(q[:, :3], k, v, q_pos, k_start)
    with pytest.raises(ValueError, match="one run of 1s"):
        rl_kernel.positions_from_mask(torch.tensor([[1, 0, 1]]))


# ---------------------------------------------------------------- the small decoder
CONFIGS = {
    "llama": DecoderConfig(),
    "qwen2": DecoderConfig(attention_bias=True),
    "qwen3": DecoderConfig(qk_norm=True),
}


def _batch(cfg: DecoderConfig, pads: list[int], length: int = 18, seed: int = 3):
    ids = torch.randint(0, cfg.vocab, (len(pads), length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(len(pads), length, dtype=torch.long)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
    return ids, mask


@pytest.mark.parametrize("family", tuple(CONFIGS))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=dname)
def test_decoder_decode_equals_forward(family: str, dtype: torch.dtype, device: str) -> None:
    """A rollout's logits (prefill, then a token at a time over the cache) == one teacher-forced forward."""
    model = TinyDecoder(CONFIGS[family], dtype, seed=1, device=device)
    ids, mask = _batch(model.config, [0, 1, 3, 7])
    ids, mask = ids.to(device), mask.to(device)
    full, _ = model(ids, mask)
    prompt = 8
    assert_bits(model.decode_logits(ids, mask, prompt), full[:, prompt - 1 : -1], f"{family} decode vs forward")


@pytest.mark.parametrize("control", ("split_k_linear", "split_kv_attention"))
def test_decoder_controls_are_caught(control: str) -> None:
    """The same decode == forward check fails for a wrong layer: it can fail."""
    model = TinyDecoder(CONFIGS["llama"], torch.float32, seed=1)
    ids, mask = _batch(model.config, [0, 2])
    full, _ = model(ids, mask)
    if control == "split_k_linear":
        model.linear = split_k_linear
    else:
        model.attention = split_kv_attention
    assert not bits_equal(model.decode_logits(ids, mask, 8), full[:, 7:-1])


def test_decoder_rows_do_not_depend_on_the_batch() -> None:
    """A sequence's logits alone == in a batch with others and other padding."""
    model = TinyDecoder(CONFIGS["qwen3"], torch.bfloat16, seed=2)
    ids, mask = _batch(model.config, [0, 4, 2])
    full, _ = model(ids, mask)
    alone, _ = model(ids[1:2, 4:], mask[1:2, 4:])
    assert_bits(alone, full[1:2, 4:], "sequence 1 alone")


# ---------------------------------------------------------------- CPU == GPU
@pytest.mark.gpu
@pytest.mark.parametrize("name", tuple(SPECS))
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_cpu_equals_gpu(name: str, dtype: torch.dtype) -> None:
    spec = SPECS[name]
    for size in spec.sizes:
        case = spec.check_case(size, dtype, size)
        if spec.differentiable:
            cpu, gpu = spec.output_and_grad(case), spec.output_and_grad(case.to("cuda"))
            assert_bits(gpu[1].cpu(), cpu[1], f"{name} gradient, size {size}")
        else:
            cpu, gpu = (spec.output(case),), (spec.output(case.to("cuda")),)
        assert_bits(gpu[0].cpu(), cpu[0], f"{name}, size {size}")


@pytest.mark.gpu
@pytest.mark.parametrize("family", tuple(CONFIGS))
def test_decoder_cpu_equals_gpu(family: str) -> None:
    ids, mask = _batch(CONFIGS[family], [0, 3, 5])
    cpu = TinyDecoder(CONFIGS[family], torch.bfloat16, seed=4)
    gpu = TinyDecoder(CONFIGS[family], torch.bfloat16, seed=4, device="cuda")
    assert_bits(gpu(ids.cuda(), mask.cuda())[0].cpu(), cpu(ids, mask)[0], f"{family} forward")
    assert_bits(gpu.decode_logits(ids.cuda(), mask.cuda(), 6).cpu(), cpu.decode_logits(ids, mask, 6), "decode")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_linear_large_cpu_equals_gpu(dtype: torch.dtype) -> None:
    """Shapes that exercise the GPU tiles' edges: K not a multiple of 8, M and N not of 128."""
    x, w, b = rand((1030, 1001), dtype, 40), rand((260, 1001), dtype, 41, 0.05), rand((260,), dtype, 42)
    assert_bits(rl_kernel.linear(x.cuda(), w.cuda(), b.cuda()).cpu(), rl_kernel.linear(x, w, b), "linear")


# ---------------------------------------------------------------- run to run, torch.compile
@pytest.mark.parametrize("name", tuple(SPECS))
def test_run_to_run(name: str, device: str) -> None:
    spec = SPECS[name]
    case = spec.check_case(spec.sizes[-1], torch.bfloat16, 5).to(device)
    first = spec.output_and_grad(case) if spec.differentiable else (spec.output(case),)
    again = spec.output_and_grad(case) if spec.differentiable else (spec.output(case),)
    for a, b in zip(first, again, strict=True):
        assert_bits(a, b, f"{name} repeated")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_torch_compile_matches_eager(device: str) -> None:
    """fullgraph: every decoder operator traces through its fake implementation. The stock op beside them is exact
    (x2): a stock reduction here would be re-generated by inductor, whose CPU vector width (AVX2 or AVX-512) sets
    its order, and compiled != eager would then be torch's, not the tier's."""

    def block(x, w, wn, g, cos, sin, q_pos, k_start):
        h = rl_kernel.rms_norm(x, wn, 1e-6)
        h = rl_kernel.silu_mul(rl_kernel.linear(h, w), rl_kernel.linear(h, w))
        q = rl_kernel.rotary(h.view(1, 1, *h.shape), cos, sin)
        return rl_kernel.attention(q, q, q, q_pos, k_start, validate=False), g * 2

    torch._dynamo.reset()
    x, w, wn = rand((6, 16), torch.float32, 50), rand((16, 16), torch.float32, 51), rand((16,), torch.float32, 52)
    cos, sin = rl_kernel.rope_table(torch.arange(6).view(1, 6), rl_kernel.rope_inv_freq(16))
    args = [a.to(device) for a in (x, w, wn, x, cos, sin, torch.arange(6).view(1, 6), torch.zeros(1, dtype=torch.long))]
    eager = block(*args)
    compiled = torch.compile(block, fullgraph=True)(*args)
    for what, got, want in zip(("attention", "stock x2"), compiled, eager, strict=True):
        assert_bits(got, want, f"compiled block's {what}")
