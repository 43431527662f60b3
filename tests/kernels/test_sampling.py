"""The sampling family (docs/numerics.md section 12): the CPU build's Gumbel-max draws equal the numpy
transcription, CPU == GPU, a sequence's draw does not depend on its batch, and the draws follow softmax."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bit_checks import assert_bits, dname

import rl_kernel
from rl_kernel import inputs
from rl_kernel.exact.sampling import reference as R

DTYPES = inputs.DTYPES
SEED, STEP = 1234, 17


def transcription(x: torch.Tensor, seed: int, step: int, keys: torch.Tensor) -> torch.Tensor:
    rows = x.float().numpy()
    return torch.tensor([R.gumbel_argmax(rows[i], seed, int(keys[i]), step) for i in range(rows.shape[0])])


def rows_of(vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Random rows and, from vocab 8, the kernels' edge rows (NaN, +-inf, all -inf, subnormals, huge, ...)."""
    x = inputs.logits(12, vocab, dtype, seed=vocab)
    return torch.cat([x, inputs.edge_rows(vocab, dtype)]) if vocab >= 8 else x


@pytest.mark.parametrize("vocab", [1, 7, 257, 32000])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_cpu_build_equals_the_transcription(vocab: int, dtype: torch.dtype) -> None:
    x = rows_of(vocab, dtype)
    keys = torch.arange(x.shape[0]) * 7919 - 5  # negative keys too: any int64
    for seed, step in ((SEED, STEP), (0, 0), (-1, 2**40)):
        got = rl_kernel.gumbel_argmax(x, seed, step, keys)
        assert torch.equal(got, transcription(x, seed, step, keys)), (seed, step)


def test_the_noise_bits_themselves() -> None:
    """Scores = -noise (the transcription's) make every score + noise exactly 0, so the draw is index 0; a
    kernel whose noise is larger anywhere by one ulp draws that index instead."""
    vocab = 4099
    base = R.row_base(SEED, 3, STEP)
    noise = R.gumbel_noise(base, np.arange(vocab))
    x = torch.from_numpy(-noise.astype(np.float32))[None]
    assert int(rl_kernel.gumbel_argmax(x, SEED, STEP, torch.tensor([3]))) == 0
    bumped = x.clone()
    bumped[0, 1234] = torch.from_numpy(np.nextafter(-noise[1234], np.float32(np.inf))[None])
    assert int(rl_kernel.gumbel_argmax(bumped, SEED, STEP, torch.tensor([3]))) == 1234


def test_a_wrong_transcription_is_caught() -> None:
    """Negative control: the comparison above sees a changed hash (another mixing constant)."""
    x = rows_of(257, torch.float32)
    keys = torch.arange(x.shape[0])
    wrong = R.MIX1
    try:
        R.MIX1 = np.uint64(0xBF58476D1CE4E5B7)
        assert not torch.equal(rl_kernel.gumbel_argmax(x, SEED, STEP, keys), transcription(x, SEED, STEP, keys))
    finally:
        R.MIX1 = wrong


def test_a_draw_depends_on_its_key_not_its_batch(device: str) -> None:
    x = inputs.logits(64, 32000, torch.bfloat16, seed=5).to(device)
    keys = (torch.arange(64) * 31 + 7).to(device)
    full = rl_kernel.gumbel_argmax(x, SEED, STEP, keys)
    assert torch.equal(rl_kernel.gumbel_argmax(x[9:10], SEED, STEP, keys[9:10]), full[9:10])
    assert torch.equal(rl_kernel.gumbel_argmax(x.flip(0), SEED, STEP, keys.flip(0)).flip(0), full)
    assert torch.equal(rl_kernel.gumbel_argmax(x.view(4, 16, -1), SEED, STEP, keys.view(4, 16)).view(-1), full)
    assert not torch.equal(rl_kernel.gumbel_argmax(x, SEED, STEP + 1, keys), full)  # the step is in the stream
    steps = torch.full((64,), STEP, device=device)
    steps[::2] += 1  # per-row steps: each row's draw is its own step's
    per_row = rl_kernel.gumbel_argmax(x, SEED, steps, keys)
    assert torch.equal(per_row[1::2], full[1::2])
    assert torch.equal(per_row[::2], rl_kernel.gumbel_argmax(x, SEED, STEP + 1, keys)[::2])


def test_draws_follow_softmax() -> None:
    """20000 draws of one row (one key each) land on each token with its softmax probability (within 5
    standard deviations: deterministic inputs, so this either always passes or never)."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -3.0, 1.5, 0.25])
    n = 20000
    got = rl_kernel.gumbel_argmax(logits.expand(n, -1).contiguous(), SEED, STEP, torch.arange(n))
    freq = torch.bincount(got, minlength=8).double() / n
    p = torch.softmax(logits.double(), 0)
    sigma = (p * (1 - p) / n).sqrt()
    assert bool(((freq - p).abs() < 5 * sigma).all()), (freq, p)


def test_bad_input_is_named() -> None:
    x = torch.zeros(2, 5)
    with pytest.raises(TypeError, match="keys must be an int64"):
        rl_kernel.gumbel_argmax(x, 0, 0, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="keys shape"):
        rl_kernel.gumbel_argmax(x, 0, 0, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="seed must be an int64"):
        rl_kernel.gumbel_argmax(x, 2**64, 0)
    with pytest.raises(TypeError, match="scores must be float32"):
        rl_kernel.gumbel_argmax(torch.zeros(2, 5, dtype=torch.float64), 0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [7, 257, 32000, 151936])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_cpu_equals_gpu(vocab: int, dtype: torch.dtype) -> None:
    x = rows_of(vocab, dtype)
    keys = torch.arange(x.shape[0]) * 7919 + 3
    cpu = rl_kernel.gumbel_argmax(x, SEED, STEP, keys)
    assert_bits(rl_kernel.gumbel_argmax(x.cuda(), SEED, STEP, keys.cuda()).cpu(), cpu, f"V={vocab}")
