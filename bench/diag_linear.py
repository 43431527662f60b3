"""Diagnosis: the exact tier's linear, attention and RMSNorm, rows of a batch against the same rows alone.

    python -m bench diag_linear

Which layer made a larger patched model's batch forward differ from the same rows alone (docs/benchmarks.md,
2026-12-01 fifth session): one line per probe, rl_kernel.bitwise's summary of the difference.
"""

from __future__ import annotations

import torch

import rl_kernel
from bench import gpu_missing, parser
from rl_kernel.bitwise import diff


def linear_probes(g: torch.Generator) -> None:
    for m, n, k in ((320, 151936, 2048), (320, 6144, 2048), (320, 2048, 6144), (320, 2048, 2048), (320, 512, 256)):
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
        full = rl_kernel.linear(x, w)
        for rows in (40, 129, 200):
            d = diff(rl_kernel.linear(x[:rows].contiguous(), w), full[:rows])
            print("linear", m, n, k, rows, d.summary(), flush=True)


def attention_probes(g: torch.Generator) -> None:
    for b, t in ((8, 40), (8, 14), (2, 40), (4, 40)):
        q = torch.randn(b, 16, t, 128, device="cuda", generator=g).bfloat16()
        kk = torch.randn(b, 8, t, 128, device="cuda", generator=g).bfloat16()
        v = torch.randn(b, 8, t, 128, device="cuda", generator=g).bfloat16()
        qp = torch.arange(t, device="cuda").expand(b, t).contiguous()
        ks = torch.zeros(b, dtype=torch.long, device="cuda")
        full = rl_kernel.attention(q, kk, v, qp, ks)
        one = rl_kernel.attention(q[:1].contiguous(), kk[:1].contiguous(), v[:1].contiguous(), qp[:1], ks[:1])
        print("attention", b, t, diff(one, full[:1]).summary(), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser(__name__, __doc__).parse_args(argv)
    if gpu_missing("diag_linear"):
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    linear_probes(g)
    attention_probes(g)
    for rows in (320, 40):
        x = torch.randn(rows, 2048, device="cuda", generator=g).bfloat16()
        w = torch.randn(2048, device="cuda", generator=g).bfloat16()
        print("rms_norm", rows, diff(rl_kernel.rms_norm(x[:7], w), rl_kernel.rms_norm(x, w)[:7]).summary(), flush=True)
    return 0
