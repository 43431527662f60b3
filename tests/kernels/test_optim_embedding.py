"""The exact tier's training pieces outside the kernels: rl_kernel.embedding's fixed-order weight gradient and
rl_kernel.optim.ExactAdamW, each one IEEE operation per torch call, so CPU == GPU bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from bit_checks import assert_bits, dname

import rl_kernel
from rl_kernel.integrations import divide_by_temperature
from rl_kernel.optim import ExactAdamW

DTYPES = (torch.float32, torch.bfloat16)


def _ids(n: int, vocab: int, seed: int) -> torch.Tensor:
    ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))
    ids[::7] = 3  # one token many times: its row sums many gradients
    return ids


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_embedding_gradient_is_the_position_order_sum(dtype: torch.dtype) -> None:
    vocab, hidden = 50, 16
    ids = _ids(300, vocab, 0).view(3, 100)
    w = torch.randn(vocab, hidden, dtype=torch.float32).to(dtype).requires_grad_()
    g = torch.randn(3, 100, hidden).to(dtype)
    out = rl_kernel.embedding(ids, w, padding_idx=0)
    assert_bits(out, w.detach()[ids], "forward: a gather")
    out.backward(g)
    want = torch.zeros(vocab, hidden)
    for pos, tok in enumerate(ids.reshape(-1).tolist()):  # the contract, one add at a time
        want[tok] = want[tok] + g.reshape(-1, hidden)[pos].float()
    want[0] = 0.0
    assert_bits(w.grad, want.to(dtype), "gradient")


def test_adamw_follows_torch_adamw() -> None:
    """The same algorithm as torch.optim.AdamW (an accuracy check: a different rounding, not equality)."""
    torch.manual_seed(0)
    a = torch.randn(64, 32, requires_grad=True)
    b, start = a.detach().clone().requires_grad_(), a.detach().clone()
    ours, ref = ExactAdamW([a], lr=1e-2, weight_decay=0.1), torch.optim.AdamW([b], lr=1e-2, weight_decay=0.1)
    for i in range(5):
        g = torch.randn(64, 32, generator=torch.Generator().manual_seed(i))
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert (a - b).abs().max() < 1e-6 and (a - start).abs().min() > 0  # close to torch's, and it moved


def _adamw_transcribed(p: np.ndarray, grads: list[np.ndarray], lr: float, wd: float, dtype: torch.dtype):
    """The module docstring's update in numpy: float32 element ops (each correctly rounded), the scalars computed
    in float64 and rounded to float32, the square root through float64, the parameter rounded to dtype once."""
    b1, b2, eps, f32 = 0.9, 0.999, 1e-8, np.float32
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        m = m * f32(b1) + g * f32(1.0 - b1)
        v = v * f32(b2) + (g * g) * f32(1.0 - b2)
        denom = np.sqrt(v.astype(np.float64)).astype(f32) * f32(1.0 / math.sqrt(1.0 - b2**t)) + f32(eps)
        new = p * f32(1.0 - lr * wd) - (m / denom) * f32(lr / (1.0 - b1**t))
        p = torch.from_numpy(new).to(dtype).float().numpy()
    return p


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_adamw_is_its_written_update(dtype: torch.dtype) -> None:
    """Bit for bit the docstring's formula on the CPU (a division by a host number where the formula multiplies by
    its reciprocal rounds differently, and shows here)."""
    gen = torch.Generator().manual_seed(4)
    p = torch.randn(4096, generator=gen).to(dtype).requires_grad_()
    grads = [torch.randn(4096, generator=gen).to(dtype) for _ in range(3)]
    want = _adamw_transcribed(p.detach().float().numpy(), [g.float().numpy() for g in grads], 1e-3, 0.01, dtype)
    opt = ExactAdamW([p], lr=1e-3, weight_decay=0.01)
    for g in grads:
        p.grad = g
        opt.step()
    assert_bits(p.detach(), torch.from_numpy(want).to(dtype), "ExactAdamW against its transcription")


def test_adamw_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="betas"):
        ExactAdamW([torch.zeros(1, requires_grad=True)], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr, eps and weight_decay"):
        ExactAdamW([torch.zeros(1, requires_grad=True)], lr=-1.0)


def _adam_run(opt_cls, device: str, dtype: torch.dtype) -> torch.Tensor:
    p = torch.randn(4096, generator=torch.Generator().manual_seed(1)).to(dtype).to(device).requires_grad_()
    opt = opt_cls([p], lr=1e-3, weight_decay=0.01)
    for i in range(3):
        p.grad = torch.randn(4096, generator=torch.Generator().manual_seed(10 + i)).to(dtype).to(device)
        opt.step()
    return p.detach().cpu()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_cpu_equals_gpu(dtype: torch.dtype) -> None:
    """ExactAdamW, embedding's gradient and the temperature division: CPU == GPU. The controls: torch's AdamW
    and torch's divide by a Python number do differ between the two (else these checks would show nothing)."""
    assert_bits(_adam_run(ExactAdamW, "cuda", dtype), _adam_run(ExactAdamW, "cpu", dtype), "ExactAdamW")
    if dtype == torch.float32:
        assert not torch.equal(_adam_run(torch.optim.AdamW, "cuda", dtype), _adam_run(torch.optim.AdamW, "cpu", dtype))
    ids, g = _ids(4000, 300, 2), torch.randn(4000, 64).to(dtype)
    grads = []
    for dev in ("cpu", "cuda"):
        w = torch.zeros(300, 64, dtype=dtype, device=dev, requires_grad=True)
        rl_kernel.embedding(ids.to(dev), w).backward(g.to(dev))
        grads.append(w.grad.cpu())
    assert_bits(grads[1], grads[0], "embedding gradient")
    x = torch.randn(256, 4096, generator=torch.Generator().manual_seed(3)).to(dtype)
    assert_bits(divide_by_temperature(x.cuda(), 0.7).cpu(), divide_by_temperature(x, 0.7), "x / T")
    assert not torch.equal((x.float().cuda() / 0.7).cpu(), x.float() / 0.7)
