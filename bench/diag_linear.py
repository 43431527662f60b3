"""Diagnosis: a larger patched model's batch forward vs the same rows alone, layer by layer (one device call)."""

from __future__ import annotations

import torch

import rl_kernel
from rl_kernel.bitwise import diff

g = torch.Generator(device="cuda").manual_seed(0)
for m, n, k in ((320, 151936, 2048), (320, 6144, 2048), (320, 2048, 6144), (320, 2048, 2048), (320, 512, 256)):
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    full = rl_kernel.linear(x, w)
    for rows in (40, 129, 200):
        print(
            "linear", m, n, k, rows, diff(rl_kernel.linear(x[:rows].contiguous(), w), full[:rows]).summary(), flush=True
        )
for b, t in ((8, 40), (8, 14), (2, 40), (4, 40)):
    q = torch.randn(b, 16, t, 128, device="cuda", generator=g).bfloat16()
    kk = torch.randn(b, 8, t, 128, device="cuda", generator=g).bfloat16()
    v = torch.randn(b, 8, t, 128, device="cuda", generator=g).bfloat16()
    qp = torch.arange(t, device="cuda").expand(b, t).contiguous()
    ks = torch.zeros(b, dtype=torch.long, device="cuda")
    full = rl_kernel.attention(q, kk, v, qp, ks)
    one = rl_kernel.attention(q[:1].contiguous(), kk[:1].contiguous(), v[:1].contiguous(), qp[:1], ks[:1])
    print("attention", b, t, diff(one, full[:1]).summary(), flush=True)
for rows in (320, 40):
    x = torch.randn(rows, 2048, device="cuda", generator=g).bfloat16()
    w = torch.randn(2048, device="cuda", generator=g).bfloat16()
    print("rms_norm", rows, diff(rl_kernel.rms_norm(x[:7], w), rl_kernel.rms_norm(x, w)[:7]).summary(), flush=True)
