"""`make selfcheck` (rl_kernel.selfcheck): passes on this build, and a planted mismatch fails it."""

from __future__ import annotations

import torch

from rl_kernel import selfcheck
from rl_kernel.ops import softmax


def test_selfcheck_passes_and_prints_a_table(capsys) -> None:
    assert selfcheck.main(["--vocabs", "7,257"]) == 0
    out = capsys.readouterr().out
    assert "bitwise self-check" in out and "comparisons bitwise equal" in out


def test_selfcheck_catches_a_one_ulp_flip(monkeypatch, capsys) -> None:
    real = softmax.token_logprobs
    calls = {"n": 0}

    def flipped(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:  # the second full pass (run-to-run) differs in one element by one ulp
            bits = out.detach().view(torch.int32).clone()
            bits[1] ^= 1
            return out + (bits.view(torch.float32) - out.detach())  # exact: keeps autograd
        return out

    monkeypatch.setattr(softmax, "token_logprobs", flipped)  # the spec's forward looks it up here
    assert selfcheck.main(["--vocabs", "257"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_require_gpu_without_gpu_is_an_error() -> None:
    if torch.cuda.is_available():
        return
    assert selfcheck.main(["--vocabs", "7", "--require-gpu"]) == 2
