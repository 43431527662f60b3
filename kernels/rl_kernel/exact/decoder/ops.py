"""The decoder family: the layers of a Llama/Qwen decoder in the exact tier (docs/numerics.md section 11).

    y = rl_kernel.linear(x, weight, bias)              # F.linear; a row of y depends on that row of x only
    y = rl_kernel.rms_norm(x, weight, eps)             # Hugging Face's LlamaRMSNorm / Qwen2RMSNorm order
    cos, sin = rl_kernel.rope_table(position_ids, rl_kernel.rope_inv_freq(head_dim, base))
    q = rl_kernel.rotary(q, cos, sin)                  # q [batch, heads, seq, head_dim]
    h = rl_kernel.silu_mul(gate, up)                   # SwiGLU: silu(gate) * up
    o = rl_kernel.attention(q, k, v, q_pos, k_start)   # causal GQA, prefill and decode alike

Every operator gives the same bits on the CPU (the golden reference) and on the GPU builds, for every
batch size and batch order; every operator but rope_table is differentiable (each backward is
deterministic, without atomics, and CPU == GPU too). The kernels are in csrc/decoder/, the numpy transcription of the
contract in rl_kernel/reference/decoder.py.
"""

from __future__ import annotations

import math

import torch

from rl_kernel._library import ops, register_fake
from rl_kernel._validate import (
    DTYPES,
    check_logits,
    check_same_device,
    check_same_dtype,
    check_tensor,
    compiling,
    needs_autograd,
)
from rl_kernel.exact.common.tree import tree_adds

FAMILY = "decoder"
ATTN_TILE = 32  # keys per tile of the attention's online softmax (decoder/attention.cuh RL_ATTN_TILE)
MAX_HEAD_DIM = 256


# ---- fake implementations: output shapes and dtypes only -------------------------------------
@register_fake("rl_kernel::linear")
def _linear_fake(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@register_fake("rl_kernel::rms_norm")
def _rms_norm_fake(x, weight, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)


@register_fake("rl_kernel::rms_norm_backward")
def _rms_norm_backward_fake(grad, x, weight, rstd):
    return torch.empty_like(x), torch.empty_like(weight)


@register_fake("rl_kernel::rope_table")
def _rope_table_fake(positions, inv_freq):
    shape = (*positions.shape, inv_freq.shape[0])
    return inv_freq.new_empty(shape), inv_freq.new_empty(shape)


@register_fake("rl_kernel::rotary")
def _rotary_fake(x, cos, sin):
    return torch.empty_like(x)


@register_fake("rl_kernel::silu_mul")
def _silu_mul_fake(gate, up):
    return torch.empty_like(gate)


@register_fake("rl_kernel::silu_mul_backward")
def _silu_mul_backward_fake(grad, gate, up):
    return torch.empty_like(gate), torch.empty_like(gate)


@register_fake("rl_kernel::attention")
def _attention_fake(q, k, v, q_pos, k_start, scale, window=0, sinks=None):
    return torch.empty_like(q), q.new_empty((*q.shape[:-1], 2), dtype=torch.float32)


@register_fake("rl_kernel::attention_backward")
def _attention_backward_fake(grad, q, k, v, out, stats, q_pos, k_start, scale, window=0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@register_fake("rl_kernel::attention_sink_terms")
def _attention_sink_terms_fake(grad, out, stats, sinks):
    return out.new_empty(out.shape[:-1], dtype=torch.float32)


# ---- linear -------------------------------------------------------------------------------------
def _t(x: torch.Tensor) -> torch.Tensor:
    """[A, B] -> its transpose as a contiguous [B, A] copy (exact)."""
    return x.t().contiguous()


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return ops.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Every gradient is itself a linear (one fma_rn chain per element, section 11), so it has the
        # forward's guarantees: dx = dy . W, dW = dy^T . x (rows in order), db = dy^T . 1.
        x, weight = ctx.saved_tensors
        dy = grad.contiguous().reshape(-1, weight.shape[0])
        x2 = x.reshape(-1, weight.shape[1])
        dx = ops.linear(dy, _t(weight), None).view(x.shape) if ctx.needs_input_grad[0] else None
        dyt = _t(dy) if (ctx.needs_input_grad[1] or ctx.has_bias) else None
        dw = ops.linear(dyt, _t(x2), None) if ctx.needs_input_grad[1] else None
        db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = ops.linear(dyt, dy.new_ones((1, dy.shape[0])), None).view(-1)
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) in the exact tier: y[..., n] = sum_k x[..., k] * weight[n, k] as one
    fused multiply-add chain over k = 0 .. K-1 in fp32, + bias[n], rounded to x's dtype. A row of y depends
    on that row of x only (no split-K: the same bits at every batch size). One dtype for all three."""
    _check_like_x(x, weight=weight, bias=bias)
    if not needs_autograd(x, weight, bias):
        return ops.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)


def _check_like_x(x: torch.Tensor, **others: torch.Tensor | None) -> None:
    """x a float tensor; the others (None: absent) tensors of x's dtype on x's device."""
    check_logits(x, "x")
    for name, t in others.items():
        if t is not None:
            check_tensor(t, name)
    check_same_device({"x": x, **others})
    check_same_dtype({"x": x, **others})


# ---- RMSNorm ------------------------------------------------------------------------------------
class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y, rstd = ops.rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = ops.rms_norm_backward(grad.contiguous(), x, weight, rstd)
        return dx, dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Hugging Face's RMSNorm, weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype), in the exact tier: the
    mean of squares in fp32 by the row's tree, the contract's rsqrt, the same bits on every device."""
    _check_like_x(x, weight=weight)
    if not needs_autograd(x, weight):
        return ops.rms_norm(x, weight, float(eps))[0]
    return _RmsNorm.apply(x, weight, float(eps))


# ---- rotary embedding ---------------------------------------------------------------------------
def rope_inv_freq(head_dim: int, base: float = 10000.0, scaling: dict | None = None) -> torch.Tensor:
    """The rotary inverse frequencies base^(-2i/head_dim), i < head_dim/2, in float64 rounded once to
    float32 on the host (the same bits for every device that uses them), with Llama 3's frequency scaling
    when scaling = {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"} (Hugging Face's config.rope_scaling). "default" or None: none."""
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"rl_kernel: head_dim must be even and >= 2, got {head_dim}")
    inv = [float(base) ** (-(2 * i) / head_dim) for i in range(head_dim // 2)]
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "llama3":
        inv = _llama3(inv, scaling)
    elif kind != "default":
        raise ValueError(f"rl_kernel: rope scaling {kind!r} is not supported (supported: default, llama3)")
    return torch.tensor(inv, dtype=torch.float64).to(torch.float32)


def _llama3(inv: list[float], scaling: dict) -> list[float]:
    """Llama 3.1's smooth frequency scaling (transformers' _compute_llama3_parameters), in float64."""
    try:
        factor, lo, hi = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
    except KeyError as exc:
        raise ValueError(f"rl_kernel: llama3 rope scaling needs {exc.args[0]!r}") from None
    low_wavelen, high_wavelen = old / lo, old / hi
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def rope_table(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of positions[...] * inv_freq[i] by the contract's sin_cos: float32 [..., head_dim/2].
    |angle| must stay below 2^22 (else NaN); positions below 2^24 are exact in float32. inv_freq may be on
    the CPU (rope_inv_freq's) or on positions' device."""
    check_tensor(positions, "positions", torch.int64)
    check_tensor(inv_freq, "inv_freq", torch.float32)
    check_same_device({"positions": positions, "inv_freq": inv_freq}, host_ok=("inv_freq",))
    return ops.rope_table(positions, inv_freq.to(positions.device))


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return ops.rotary(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # The transpose of a rotation is the rotation by -angle: the same kernel with -sin (exact).
        cos, sin = ctx.saved_tensors
        return ops.rotary(grad.contiguous(), cos, -sin), None, None


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's apply_rotary_pos_emb for one tensor x [batch, heads, seq, head_dim] with cos/sin
    [batch, seq, head_dim/2] from rope_table: pairs (x_i, x_{i+D/2}) -> (x1*c - x2*s, x2*c + x1*s)."""
    check_logits(x, "x")
    check_tensor(cos, "cos", torch.float32)
    check_tensor(sin, "sin", torch.float32)
    check_same_device({"x": x, "cos": cos, "sin": sin})
    if not needs_autograd(x):
        return ops.rotary(x, cos, sin)
    return _Rotary.apply(x, cos, sin)


# ---- SwiGLU -------------------------------------------------------------------------------------
class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return ops.silu_mul(gate, up)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        return ops.silu_mul_backward(grad.contiguous(), gate, up)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's silu(gate) * up in fp32 with the contract's exp and reciprocal, rounded to the dtype."""
    check_logits(gate, "gate")
    check_tensor(up, "up")
    check_same_device({"gate": gate, "up": up})
    check_same_dtype({"gate": gate, "up": up})
    if not needs_autograd(gate, up):
        return ops.silu_mul(gate, up)
    return _SiluMul.apply(gate, up)


# ---- attention ----------------------------------------------------------------------------------
class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_pos, k_start, scale, window, sinks):
        out, stats = ops.attention(q, k, v, q_pos, k_start, scale, window, sinks)
        ctx.save_for_backward(q, k, v, out, stats, q_pos, k_start, sinks)
        ctx.scale, ctx.window = scale, window
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, stats, q_pos, k_start, sinks = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk, dv = ops.attention_backward(grad, q, k, v, out, stats, q_pos, k_start, ctx.scale, ctx.window)
        dsinks = sink_grad(ops.attention_sink_terms(grad, out, stats, sinks)) if ctx.needs_input_grad[7] else None
        return dq, dk, dv, None, None, None, None, dsinks


def sink_grad(terms: torch.Tensor) -> torch.Tensor:
    """The sinks' gradient from the rows' terms [B, Hq, Tq]: per head, section 2's tree over its rows (b, then t)."""
    return tree_adds(terms.transpose(0, 1).reshape(terms.shape[1], -1), first=False)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_start: torch.Tensor,
    scale: float | None = None,
    *,
    validate: bool = True,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention with grouped-query heads, one algorithm for prefill and decode.

    q [B, Hq, Tq, D]; k, v [B, Hkv, Tk, D] (the cache); Hq a multiple of Hkv. Query row t of sequence b sees
    the keys k_start[b] .. q_pos[b, t] (inclusive; none if q_pos < k_start: output +0.0), or with a sliding
    window of `window` keys (> 0) max(k_start[b], q_pos[b, t] - window + 1) .. q_pos[b, t]. Keys are taken in
    tiles of 32 counted from the row's first key (an online softmax with the contract's exp), so a row's bits do
    not depend on Tq, on the padding, on the other rows, on how the cache was filled or on keys the window cuts.
    scale defaults to D^-0.5 (float64, rounded to float32). validate=True checks 0 <= k_start and q_pos < Tk (a
    host sync). sinks [Hq] (GPT-OSS's attention sinks): a logit per query head that joins each row's softmax before
    its first key, with a zero value (read in fp32; its gradient per head is the tree over the head's rows).
    """
    check_logits(q, "q")
    for name, t, dtype in (
        ("k", k, None),
        ("v", v, None),
        ("q_pos", q_pos, torch.int64),
        ("k_start", k_start, torch.int64),
    ):
        check_tensor(t, name, dtype)
    check_same_device({"q": q, "k": k, "v": v, "q_pos": q_pos, "k_start": k_start})
    check_same_dtype({"q": q, "k": k, "v": v})
    if q.dim() != 4 or q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(
            f"rl_kernel: q must be [batch, heads, q_len, head_dim <= {MAX_HEAD_DIM}], got {tuple(q.shape)}"
        )
    window = check_window(window)
    sinks = check_sinks(sinks, q)
    if validate and not compiling():
        _check_key_ranges(q_pos, k_start, k.shape[2])
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if not needs_autograd(q, k, v, sinks):
        return ops.attention(q, k, v, q_pos, k_start, scale, window, sinks)[0]
    return _Attention.apply(q, k, v, q_pos, k_start, scale, window, sinks)


def check_window(window: object) -> int:
    """A sliding window's key count: an int >= 0 (0: none); a clear error otherwise."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"rl_kernel: attention's window must be an int >= 0 keys (0: none), got {window!r}")
    return window


def check_sinks(sinks: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """Attention sinks: None, or a floating tensor of one logit per query head on q's device, as fp32 (a widening
    cast, which autograd carries back to the parameter's dtype); a clear error otherwise."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point() or tuple(sinks.shape) != (q.shape[1],):
        got = f"{sinks.dtype} {tuple(sinks.shape)}" if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise ValueError(f"rl_kernel: attention's sinks must be a floating tensor [{q.shape[1]}] (a logit per query "
                         f"head), got {got}")  # fmt: skip
    if sinks.device != q.device:
        raise ValueError(f"rl_kernel: attention's sinks are on {sinks.device}, q on {q.device}")
    return sinks.float().contiguous()


def _check_key_ranges(q_pos: torch.Tensor, k_start: torch.Tensor, kv_len: int) -> None:
    if k_start.numel() and int(k_start.min()) < 0:
        raise ValueError(f"rl_kernel: k_start must be >= 0, got {int(k_start.min())}")
    if q_pos.numel() and int(q_pos.max()) >= kv_len:
        raise ValueError(f"rl_kernel: q_pos {int(q_pos.max())} is past the {kv_len} keys of the cache")


def attention_with_stats(
    q, k, v, q_pos, k_start, scale: float | None = None, window: int = 0, sinks: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """attention and each row's final (m, l): the running max and the sum of exps, for diagnostics."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return ops.attention(q, k, v, q_pos, k_start, scale, check_window(window), check_sinks(sinks, q))


# ---- embedding ----------------------------------------------------------------------------------
class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.shape, ctx.padding_idx = weight.shape, padding_idx
        return weight[ids]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        return None, _embedding_grad_op(ids, grad.contiguous(), list(ctx.shape), ctx.padding_idx), None


# An op of its own for torch.compile: its loop runs once per occurrence rank, a count only the data knows (traced,
# it would be a graph break, and an error under fullgraph=True).
@torch.library.custom_op(
    "rl_kernel_exact::embedding_grad", mutates_args=(), schema="(Tensor ids, Tensor grad, SymInt[] shape, int? "
    "padding_idx) -> Tensor"
)  # fmt: skip
def _embedding_grad_op(ids, grad, shape, padding_idx):
    return embedding_grad(ids, grad, torch.Size(shape), padding_idx)


@_embedding_grad_op.register_fake
def _(ids, grad, shape, padding_idx):
    return grad.new_empty(shape)


def embedding_grad(ids: torch.Tensor, grad: torch.Tensor, shape: torch.Size, padding_idx: int | None) -> torch.Tensor:
    """The embedding's weight gradient in a fixed order: row v = the gradients of the positions holding token
    v, added in position order from +0.0 in float32 (each add one rounding), then rounded to the weight's
    dtype; the padding row stays zero. Each pass adds one occurrence of every token at once (index_add_ onto
    distinct rows: one writer per element), so no two threads ever race for a row."""
    flat, g = ids.reshape(-1), grad.reshape(-1, shape[1]).float()
    order = torch.argsort(flat, stable=True)  # positions grouped by token, in position order
    sorted_ids = flat[order]
    n = flat.numel()
    starts = torch.ones(n, dtype=torch.bool, device=flat.device)
    starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
    group_start = torch.cummax(torch.where(starts, torch.arange(n, device=flat.device), 0), 0).values
    rank = torch.arange(n, device=flat.device) - group_start  # which occurrence of its token a position is
    out = torch.zeros(shape, dtype=torch.float32, device=grad.device)
    for r in range(int(rank.max()) + 1 if n else 0):
        sel = order[rank == r]
        out.index_add_(0, flat[sel], g[sel])
    if padding_idx is not None:
        out[padding_idx] = 0.0
    return out.to(grad.dtype)


def embedding(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """F.embedding (a gather: exact) with a weight gradient whose bits do not depend on the device: each
    token's row sums its positions' gradients in position order (embedding_grad)."""
    if check_tensor(ids, "ids").dtype != torch.int64:
        raise TypeError(f"rl_kernel: embedding ids must be int64, got {ids.dtype}")
    check_tensor(weight, "weight", DTYPES)
    check_same_device({"ids": ids, "weight": weight})
    return _Embedding.apply(ids, weight, padding_idx)


MASK_RUNS_ERROR = "rl_kernel: every attention_mask row needs one run of 1s (left or right padding only)"


def positions_from_mask(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_pos, k_start) of a prefill over a [batch, seq] mask of 1s (tokens) and 0s (padding) whose 1s are
    one run (left or right padding): k_start[b] = the first 1, q_pos[b, t] = t. Rows on padding see
    no key or only real ones; their outputs are padding too."""
    q_pos, k_start, bad = positions_and_flag(attention_mask)
    if not compiling() and bool(bad):  # a host sync: checked in eager calls only
        raise ValueError(MASK_RUNS_ERROR)
    return q_pos, k_start


def positions_and_flag(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """positions_from_mask's (q_pos, k_start) and, unread, whether a row has other than one run of 1s (a 0-d bool
    on the mask's device): a caller with other checks reads them all in one host sync (MASK_RUNS_ERROR)."""
    mask = attention_mask.to(torch.bool)
    if mask.dim() != 2:
        raise ValueError(f"rl_kernel: attention_mask must be [batch, seq], got {tuple(mask.shape)}")
    b, t = mask.shape
    idx = torch.arange(t, device=mask.device).expand(b, t)
    first = torch.where(mask, idx, t).min(dim=1).values
    runs = mask[:, :1].long().sum(dim=1) + (mask[:, 1:] & ~mask[:, :-1]).long().sum(dim=1)
    return idx.contiguous(), first.clamp(max=t - 1).contiguous(), (runs != 1).any()
