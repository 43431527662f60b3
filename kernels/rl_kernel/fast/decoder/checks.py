"""The fast tier's decoder family as selfcheck and the golden digests see it: linear (forward, dX, dW) and
attention (forward, dQ, dK/dV) on the exact tier's cases, each with its float64 reference and a bound on the
relative error (bf16 operands: ~1e-2), and the invariance checks that define the tier: a row alone == in a
batch across M buckets, decode rows == prefill rows, a sequence alone == in a batch."""

from __future__ import annotations

import torch

from rl_kernel.bitwise import Diff, diff
from rl_kernel.exact.decoder import checks as exact
from rl_kernel.fast import attention, linear
from rl_kernel.spec import Case, OpSpec

FAMILY = "decoder"
SIZES = (64, 256)  # K of the linear cases; head dim 2 * size // 8 of the attention cases (16, 64)
TOLERANCE = 2e-2  # ||out - ref|| / ||ref|| for bf16/fp16 operands with fp32 accumulation


def _linear_ref(c: Case) -> torch.Tensor:
    w, b = c.params
    return torch.nn.functional.linear(c.logits.double(), w.double(), b.double())


def _attention_ref(c: Case) -> torch.Tensor:
    """Causal GQA in float64 with the tier's semantics: row t of sequence b sees keys k_start[b] .. q_pos[b, t]."""
    q, (k, v, q_pos, k_start) = c.logits.double(), c.params
    k, v = k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    keys = torch.arange(k.shape[2])
    allowed = (keys[None, None, :] <= q_pos[:, :, None]) & (keys[None, None, :] >= k_start[:, None, None])
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v


def _spec(name: str, forward, upstream: str | None, case_fn, reference=None) -> OpSpec:
    golden = exact._fixed(case_fn)
    return OpSpec(name, FAMILY, forward, upstream, golden, case_fn, SIZES, sizes=SIZES, reference=reference,
                  tolerance=TOLERANCE)  # fmt: skip


SPECS = (
    _spec("linear", lambda x, c: linear(x, c.params[0], c.params[1]), "elem", exact.linear_case, _linear_ref),
    _spec("linear.weight", lambda w, c: linear(c.params[0], w, c.params[1]), "elem", exact.linear_weight_case),
    _spec("attention", lambda q, c: attention(q, *c.params), None, exact.attention_case, _attention_ref),
    _spec("attention.grad_q", lambda q, c: attention(q, *c.params), "elem", exact.attention_grad_case),
    _spec(
        "attention.grad_kv", lambda kv, c: exact._attention_kv_with(attention, kv, c), "elem", exact.attention_kv_case
    ),
)


def invariance_checks(size: int, dtype: torch.dtype, device: torch.device) -> dict[str, Diff]:
    """On device: a linear row alone == in batches of 17, 300 and 4099 rows (other M buckets) and its dX the
    same way; attention's decode rows == its prefill rows, and a sequence alone == in the batch."""
    dev = device.type
    c = exact.linear_case(size, dtype, size)
    x = torch.cat([c.logits] * 125 + [c.logits[:4]]).to(device)  # 4129 rows
    w, b = (p.to(device) for p in c.params)
    found = {}
    alone = linear(x[5:6], w, b)
    for rows in (17, 300, x.shape[0]):
        found[f"fast linear {dev} row alone == in a batch of {rows}"] = diff(alone, linear(x[:rows], w, b)[5:6])
    a = exact.attention_case(size, dtype, size)
    q, (k, v, q_pos, k_start) = a.logits.to(device), (p.to(device) for p in a.params)
    pre = attention(q, k, v, q_pos, k_start)
    step = torch.cat([attention(q[:, :, t : t + 1], k, v, q_pos[:, t : t + 1], k_start) for t in (0, 35, 69)], 2)
    found[f"fast attention {dev} decode rows == prefill"] = diff(step, pre[:, :, [0, 35, 69]])
    one = attention(q[2:3], k[2:3], v[2:3], q_pos[2:3], k_start[2:3])
    found[f"fast attention {dev} sequence alone == in the batch"] = diff(one, pre[2:3])
    return found
