"""The decoder family's checks: batch and order invariance (rl_kernel.contract.selfcheck), the golden and self-check
cases and SPECS (rl_kernel.exact.decoder.ops's operators as the tests, selfcheck and golden digests see them)."""

from __future__ import annotations

import torch

from rl_kernel.bitwise import Diff, diff
from rl_kernel.exact.decoder.ops import (
    attention,
    attention_with_stats,
    linear,
    rms_norm,
    rope_inv_freq,
    rope_table,
    rotary,
    silu_mul,
)
from rl_kernel.exact.decoder.tiny import DecoderConfig, TinyDecoder
from rl_kernel.spec import Case, OpSpec

FAMILY = "decoder"


# ---- the family's batch and order checks (rl_kernel.contract.selfcheck) --------------------------------
def invariance_checks(size: int, dtype: torch.dtype, device: torch.device) -> dict[str, Diff]:
    """On device: linear's row alone == in a batch of 1031; attention's decode rows == its prefill; the
    small decoder's rollout (prefill, then a token at a time) == its teacher-forced forward."""
    dev = device.type
    c = linear_case(size, dtype, size)
    x = torch.cat([c.logits] * 32 + [c.logits[:7]]).to(device)
    w, b = (p.to(device) for p in c.params)
    full = linear(x, w, b)
    found = {f"linear {dev} row alone == in a batch of {x.shape[0]}": diff(linear(x[5:6], w, b), full[5:6])}
    a = attention_case(size, dtype, size)
    q, (k, v, q_pos, k_start) = a.logits.to(device), (p.to(device) for p in a.params)
    pre = attention(q, k, v, q_pos, k_start)
    step = torch.cat([attention(q[:, :, t : t + 1], k, v, q_pos[:, t : t + 1], k_start) for t in (0, 35, 69)], 2)
    found[f"attention {dev} decode rows == prefill"] = diff(step, pre[:, :, [0, 35, 69]])
    pre = attention(q, k, v, q_pos, k_start, window=WINDOW)
    cut = [attention(q[:, :, t : t + 1], k[:, :, t + 1 - WINDOW :], v[:, :, t + 1 - WINDOW :],
                     torch.full_like(q_pos[:, t : t + 1], WINDOW - 1), (k_start - t - 1 + WINDOW).clamp(min=0),
                     window=WINDOW) for t in (35, 69)]  # fmt: skip
    found[f"attention {dev} windowed decode rows over a cut cache == prefill"] = diff(
        torch.cat(cut, 2), pre[:, :, [35, 69]]
    )
    model = TinyDecoder(DecoderConfig(qk_norm=size % 2 == 1), dtype, seed=size, device=device)
    ids = torch.randint(0, model.config.vocab, (3, 14), generator=torch.Generator().manual_seed(size)).to(device)
    mask = torch.ones_like(ids)
    mask[1, :3], mask[2, :6] = 0, 0
    forward, _ = model(ids, mask)
    found[f"tiny decoder {dev} rollout == forward"] = diff(model.decode_logits(ids, mask, 7), forward[:, 6:-1])
    return found


# ---- the family's cases ---------------------------------------------------------------------
SIZES = (7, 257)  # feature sizes (K, hidden, head_dim-scaled) of the golden and self-check cases


def _rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def _elem_grad(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    return _rand(shape, dtype, seed + 99)


def linear_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    """x [33, size], weight [19, size], bias [19]; the upstream gradient [33, 19]."""
    x, w, b = _rand((33, size), dtype, seed), _rand((19, size), dtype, seed + 1, 0.2), _rand((19,), dtype, seed + 2)
    return Case(x, torch.zeros(0), elem_grad=_elem_grad((33, 19), dtype, seed), params=(w, b))


def linear_weight_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    c = linear_case(size, dtype, seed)
    return Case(c.params[0], c.tokens, elem_grad=c.elem_grad, params=(c.logits, c.params[1]))


def norm_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    x = _rand((2, 9, size), dtype, seed, 3.0)
    x[0, 0] = 0.0  # a zero row: rsqrt(eps)
    w = _rand((size,), dtype, seed + 1)
    return Case(x, torch.zeros(0), elem_grad=_elem_grad(tuple(x.shape), dtype, seed), params=(w,))


def norm_weight_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    c = norm_case(size, dtype, seed)
    return Case(c.params[0], c.tokens, elem_grad=c.elem_grad, params=(c.logits,))


def _head_dim(size: int) -> int:
    return 2 * max(1, size // 8)


def rotary_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    dh = _head_dim(size)
    x = _rand((2, 3, 11, dh), dtype, seed)
    pos = torch.arange(11).repeat(2, 1) * torch.tensor([[1], [997]])  # small and large angles
    cos, sin = rope_table(pos, rope_inv_freq(dh, 10000.0))
    return Case(x, pos, elem_grad=_elem_grad(tuple(x.shape), dtype, seed), params=(cos, sin))


def rope_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    dh = _head_dim(size)
    pos = torch.cat([torch.arange(40), torch.tensor([1000, 32767, 131071, 500000])]).view(4, 11)
    return Case(pos, pos, params=(rope_inv_freq(dh, 500000.0),))


def silu_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    g = _rand((5, size), dtype, seed, 4.0)
    g[0, : min(size, 6)] = torch.tensor([0.0, -0.0, 90.0, -90.0, float("inf"), float("-inf")])[: min(size, 6)].to(dtype)
    u = _rand((5, size), dtype, seed + 1)
    return Case(g, torch.zeros(0), elem_grad=_elem_grad((5, size), dtype, seed), params=(u,))


def silu_up_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    c = silu_case(size, dtype, seed)
    return Case(c.params[0], c.tokens, elem_grad=c.elem_grad, params=(c.logits,))


def attention_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    """4 sequences, 4 query heads over 2 KV heads, 70 keys (three tiles), left padding 0, 3, 33, 69."""
    dh = _head_dim(size)
    b, hq, hkv, t = 4, 4, 2, 70
    q, k, v = (
        _rand((b, hq, t, dh), dtype, seed),
        _rand((b, hkv, t, dh), dtype, seed + 1),
        _rand((b, hkv, t, dh), dtype, seed + 2),
    )
    q_pos = torch.arange(t).repeat(b, 1)
    k_start = torch.tensor([0, 3, 33, 69])
    return Case(q, q_pos, params=(k, v, q_pos, k_start))


def attention_grad_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    c = attention_case(size, dtype, seed)
    return Case(c.logits, c.tokens, elem_grad=_elem_grad(tuple(c.logits.shape), dtype, seed), params=c.params)


def attention_kv_case(size: int, dtype: torch.dtype, seed: int = 0) -> Case:
    """k and v stacked as the differentiated input [2, B, Hkv, T, D] (both gradients in one digest)."""
    c = attention_grad_case(size, dtype, seed)
    k, v, q_pos, k_start = c.params
    return Case(torch.stack([k, v]), c.tokens, elem_grad=c.elem_grad, params=(c.logits, q_pos, k_start))


def _attention_kv_with(attend, kv: torch.Tensor, c: Case) -> torch.Tensor:
    """attend(q, k, v, ...) with k and v stacked as the differentiated input (attention_kv_case); another tier's
    checks pass their own attention."""
    q, q_pos, k_start = c.params
    return attend(q, kv[0], kv[1], q_pos, k_start)


def _attention_kv(kv: torch.Tensor, c: Case) -> torch.Tensor:
    return _attention_kv_with(attention, kv, c)


WINDOW = 20  # the windowed cases' sliding window: shorter than a tile boundary's distance, cutting most rows


def _windowed(q, k, v, q_pos, k_start):
    return attention(q, k, v, q_pos, k_start, window=WINDOW)


def _windowed_stats(q, k, v, q_pos, k_start):
    return attention_with_stats(q, k, v, q_pos, k_start, window=WINDOW)


def _fixed(case_fn):
    """A case function of (size, dtype) for the golden digests (seed 0)."""

    def golden(size: int, dtype: torch.dtype) -> Case:
        return case_fn(size, dtype, 0)

    golden.__name__ = f"golden_{case_fn.__name__}"
    return golden


def _spec(name: str, forward, upstream: str | None, case_fn) -> OpSpec:
    return OpSpec(name, FAMILY, forward, upstream, _fixed(case_fn), case_fn, SIZES, sizes=SIZES)


SPECS = (
    _spec("linear", lambda x, c: linear(x, c.params[0], c.params[1]), "elem", linear_case),
    _spec("linear.weight", lambda w, c: linear(c.params[0], w, c.params[1]), "elem", linear_weight_case),
    _spec("rms_norm", lambda x, c: rms_norm(x, c.params[0], 1e-6), "elem", norm_case),
    _spec("rms_norm.weight", lambda w, c: rms_norm(c.params[0], w, 1e-6), "elem", norm_weight_case),
    _spec("rope_table", lambda p, c: torch.stack(rope_table(p, c.params[0])), None, rope_case),
    _spec("rotary", lambda x, c: rotary(x, c.params[0], c.params[1]), "elem", rotary_case),
    _spec("silu_mul", lambda g, c: silu_mul(g, c.params[0]), "elem", silu_case),
    _spec("silu_mul.up", lambda u, c: silu_mul(c.params[0], u), "elem", silu_up_case),
    _spec("attention", lambda q, c: attention_with_stats(q, *c.params)[0], None, attention_case),
    _spec("attention.grad_q", lambda q, c: attention(q, *c.params), "elem", attention_grad_case),
    _spec("attention.grad_kv", lambda k, c: _attention_kv(k, c), "elem", attention_kv_case),
    _spec("attention.stats", lambda q, c: attention_with_stats(q, *c.params)[1], None, attention_case),
    _spec("attention.window", lambda q, c: _windowed_stats(q, *c.params)[0], None, attention_case),
    _spec("attention.window.stats", lambda q, c: _windowed_stats(q, *c.params)[1], None, attention_case),
    _spec("attention.window.grad_q", lambda q, c: _windowed(q, *c.params), "elem", attention_grad_case),
    _spec("attention.window.grad_kv", lambda k, c: _attention_kv_with(_windowed, k, c), "elem", attention_kv_case),
)
