"""Golden digests of the `exact` tier: SHA-256 of output bits, committed in tests/golden/exact.json.

Each case is one output (log_softmax, token_logprobs, entropy, or a gradient) of one input set
(vocabulary x dtype); its digest is `rl_kernel.bitwise.digest(tensor)` (dtype, shape and bytes).
The CPU build is the golden reference; the GPU build must give the same digests.

Regenerate the file (only after an intended change of the numerical contract, and say so in the
commit), from the repository root, with either of

    python -m tests.test_golden --update
    RL_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py

`python -m tests.test_golden` without --update lists the cases that drifted and exits 1 if any did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest
import torch

import rl_kernel
from rl_kernel import inputs
from rl_kernel.bitwise import digest

GOLDEN = Path(__file__).parent / "golden" / "exact.json"
VOCABS = (7, 257, 32000, 151936)
IGNORE = -100


def case_inputs(vocab: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits and tokens of one case, on the CPU."""
    x = inputs.logits(2 if vocab == 151936 else 4, vocab, dtype, seed=vocab)
    if vocab >= 8:
        x = torch.cat([x, inputs.edge_rows(vocab, dtype)])
    t = inputs.tokens(x.shape[0], vocab, seed=vocab)
    t[::3] = IGNORE
    return x, t


def row_weights(n: int) -> torch.Tensor:
    """Upstream gradient per row: exact binary values, the same in every torch version."""
    return (torch.arange(n) % 7).to(torch.float32) * 0.25 - 0.75


def elem_weights(n: int, vocab: int) -> torch.Tensor:
    return ((torch.arange(n * vocab) % 13).to(torch.float32) * 0.125 - 0.75).view(n, vocab)


def outputs(vocab: int, dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    x, t = case_inputs(vocab, dtype)
    x, t = x.to(device), t.to(device)
    n = x.shape[0]
    w, ww = row_weights(n).to(device), elem_weights(n, vocab).to(device)
    out = {
        "log_softmax": rl_kernel.log_softmax(x),
        "token_logprobs": rl_kernel.token_logprobs(x, t),
        "entropy": rl_kernel.entropy(x),
    }
    losses = {
        "grad_token_logprobs": lambda a: (rl_kernel.token_logprobs(a, t) * w).sum(),
        "grad_entropy": lambda a: (rl_kernel.entropy(a) * w).sum(),
        "grad_log_softmax": lambda a: (rl_kernel.log_softmax(a) * ww).sum(),
    }
    for name, loss in losses.items():
        leaf = x.clone().requires_grad_()
        (out[name],) = torch.autograd.grad(loss(leaf), leaf)
    return out


def compute_digests(device: str = "cpu") -> dict[str, str]:
    found = {}
    for vocab in VOCABS:
        for dtype in inputs.DTYPES:
            dt = str(dtype).removeprefix("torch.")
            for name, y in outputs(vocab, dtype, device).items():
                found[f"{name}/V{vocab}/{dt}"] = digest(y)
    return found


def load_golden() -> dict[str, str]:
    if not GOLDEN.exists():
        raise FileNotFoundError(f"{GOLDEN} is missing; create it with: python -m tests.test_golden --update")
    return json.loads(GOLDEN.read_text())


def write_golden(found: dict[str, str]) -> None:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(found, indent=2, sort_keys=True) + "\n")


def drift(found: dict[str, str], golden: dict[str, str]) -> list[str]:
    """One line per case that differs from the golden file (changed, new or gone)."""
    lines = [f"changed: {k}" for k in sorted(golden.keys() & found.keys()) if golden[k] != found[k]]
    lines += [f"not in {GOLDEN.name}: {k}" for k in sorted(found.keys() - golden.keys())]
    lines += [f"no longer computed: {k}" for k in sorted(golden.keys() - found.keys())]
    return lines


def _check(device: str) -> None:
    found = compute_digests(device)
    problems = drift(found, load_golden())
    assert not problems, (
        f"{len(problems)} of {len(found)} golden digests drifted on {device}:\n  "
        + "\n  ".join(problems)
        + "\nIf the numerical contract changed on purpose, regenerate: python -m tests.test_golden --update"
    )


def test_golden_digests_cpu() -> None:
    if os.environ.get("RL_UPDATE_GOLDEN") == "1":
        write_golden(compute_digests("cpu"))
        pytest.skip(f"RL_UPDATE_GOLDEN=1: rewrote {GOLDEN}")
    _check("cpu")


@pytest.mark.gpu
def test_golden_digests_gpu() -> None:
    if os.environ.get("RL_UPDATE_GOLDEN") == "1":
        pytest.skip("RL_UPDATE_GOLDEN=1: the CPU build writes the golden file; the GPU only checks it")
    _check("cuda")


def test_golden_file_is_complete() -> None:
    golden = load_golden()
    assert len(golden) == len(VOCABS) * len(inputs.DTYPES) * 6
    assert all(len(v) == 64 and int(v, 16) >= 0 for v in golden.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", action="store_true", help=f"rewrite {GOLDEN} from the CPU build")
    parser.add_argument("--device", default="cpu", help="device to check (default cpu; --update always uses cpu)")
    args = parser.parse_args(argv)
    if args.update:
        found = compute_digests("cpu")
        write_golden(found)
        print(f"wrote {len(found)} digests to {GOLDEN}")
        return 0
    problems = drift(compute_digests(args.device), load_golden())
    print("\n".join(problems) if problems else f"all digests match {GOLDEN}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
