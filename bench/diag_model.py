"""Diagnosis: what makes a larger patched model's generate() differ from its forward, and ops CPU vs GPU.

    python -m bench diag_model

One line per probe: torch's elementwise operations CPU vs GPU (those ExactAdamW uses); the exact tier's attention
decoded step by step against its prefill and against the CPU; and patched Qwen3 models (rl_kernel.models'
tiny_weights, exact tier) whose greedy generate() logits are compared with three training forwards of the same
sequences (bench.rollout).
"""

from __future__ import annotations

import torch

import rl_kernel
from bench import gpu_missing, parser, rollout
from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.integrations import transformers as hf
from rl_kernel.models import sequences, tiny_weights

MAX_PROMPT = 8  # prompts of 2 .. 8 tokens


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
    ids, mask = sequences(batch, MAX_PROMPT, 0, vocab, 0)
    model = hf.patch(tiny_weights(family, vocab, 0, **shape).to(torch.bfloat16).to("cuda").eval())
    seqs, logits = rollout.generate(model, ids, mask, new)
    views = rollout.forward_views(model, rollout.unpadded(seqs, mask), new)
    bad = {k: diff(x, logits) for k, x in views.items()}
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
            q[:, :, t : t + 1].contiguous(), k[:, :, : t + 1].contiguous(), v[:, :, : t + 1].contiguous(),
            qp[:, t : t + 1].contiguous(), ks,
        )
        for t in range(T)
    ]  # fmt: skip
    dec = torch.cat(steps, 2)
    cpu = rl_kernel.attention(q.cpu(), k.cpu(), v.cpu(), qp.cpu(), ks.cpu())
    same = bits_equal(dec[:, :, 3:], full[:, :, 3:])
    print("attn", T, D, hq, hkv, "decode==prefill", same, diff(dec[:, :, 3:], full[:, :, 3:]).summary(),
          "cpu==gpu", bits_equal(full.cpu(), cpu), flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser(__name__, __doc__).parse_args(argv)
    if gpu_missing("diag_model"):
        return 2
    ops_probe()
    for T, D, hq, hkv in ((40, 16, 4, 2), (40, 128, 16, 8), (20, 128, 16, 8), (40, 64, 4, 2)):
        attention_probe(T, D, hq, hkv)
    model_probe("qwen3", 2, 64, 4, 32, vocab=512)
    model_probe("qwen3", 2, 256, 2, 6, vocab=512)
    model_probe("qwen3", 2, 256, 2, 32, vocab=512)
    model_probe("qwen3", 1, 2048, 16, 6)
    model_probe("qwen3", 1, 2048, 16, 32)
    return 0
