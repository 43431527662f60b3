"""Diagnosis (one device call): which piece makes a larger patched model's generate() differ from its forward,
and which ExactAdamW operation differs CPU vs GPU. Prints one line per probe."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "harness"))
import rl_kernel
from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.integrations import transformers as hf
from rlparity.cell.workloads import model as M


def ops_probe() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(1 << 20, generator=g) + 1e-3, torch.rand(1 << 20, generator=g) + 1e-3
    for name, fn in {
        "sqrt": lambda x, y: torch.sqrt(x),
        "div": lambda x, y: torch.div(x, y),
        "mul_scalar": lambda x, y: torch.mul(x, 0.1),
        "mul_scalar_b2": lambda x, y: torch.mul(x, 1.0 - 0.999),
        "add_scalar": lambda x, y: torch.add(x, 1e-8),
        "mul": lambda x, y: torch.mul(x, y),
        "add": lambda x, y: torch.add(x, y),
        "sub": lambda x, y: torch.sub(x, y),
    }.items():
        c, d = fn(a, b), fn(a.cuda(), b.cuda()).cpu()
        print("op", name, diff(d, c).summary(), flush=True)


def model_probe(family, layers, hidden, heads, new, vocab=151936, batch=8) -> None:
    shape = dict(layers=layers, hidden=hidden, heads=heads, intermediate=3 * hidden)
    p = M.prompts(batch, vocab, 0)
    model = hf.patch(M.build(family, vocab, "bf16", 0, "cuda", **shape).eval())
    r = M.generate(model, p, new, None, "cuda")
    v = M.forward_views(model, r, p, "cuda")
    bad = {k: diff(x, r.logits) for k, x in v.items()}
    first = {k: (d.count, d.first_index) for k, d in bad.items() if not d.equal}
    print("model", family, layers, hidden, heads, new, first or "equal", flush=True)


def attention_probe(T: int, D: int, hq: int, hkv: int) -> None:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, hq, T, D, generator=g).bfloat16().cuda()
    k = torch.randn(2, hkv, T, D, generator=g).bfloat16().cuda()
    v = torch.randn(2, hkv, T, D, generator=g).bfloat16().cuda()
    ks = torch.tensor([0, 3]).cuda()
    qp = torch.arange(T).expand(2, T).contiguous().cuda()
    full = rl_kernel.attention(q, k, v, qp, ks)
    steps = [
        rl_kernel.attention(
            q[:, :, t : t + 1].contiguous(),
            k[:, :, : t + 1].contiguous(),
            v[:, :, : t + 1].contiguous(),
            qp[:, t : t + 1].contiguous(),
            ks,
        )
        for t in range(T)
    ]
    dec = torch.cat(steps, 2)
    cpu = rl_kernel.attention(q.cpu(), k.cpu(), v.cpu(), qp.cpu(), ks.cpu())
    print(
        "attn",
        T,
        D,
        hq,
        hkv,
        "decode==prefill",
        bits_equal(dec[:, :, 3:], full[:, :, 3:]),
        diff(dec[:, :, 3:], full[:, :, 3:]).summary(),
        "cpu==gpu",
        bits_equal(full.cpu(), cpu),
        flush=True,
    )


if __name__ == "__main__":
    ops_probe()
    for T, D, hq, hkv in ((40, 16, 4, 2), (40, 128, 16, 8), (20, 128, 16, 8), (40, 64, 4, 2)):
        attention_probe(T, D, hq, hkv)
    model_probe("qwen3", 2, 64, 4, 32, vocab=512)
    model_probe("qwen3", 2, 256, 2, 6, vocab=512)
    model_probe("qwen3", 2, 256, 2, 32, vocab=512)
    model_probe("qwen3", 1, 2048, 16, 6)
    model_probe("qwen3", 1, 2048, 16, 32)
