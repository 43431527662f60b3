"""The log-prob function a cell checks: rl_kernel's, or one of the deliberately wrong negative controls.

`rlparity selftest` runs cells with RLPARITY_CONTROL set to each control (RLPARITY_VARIANT: the deprecated
name); the bitwise suite must fail every one of them. Each control is a way real kernels go wrong:

- ulp-flip:       one element's last bit differs (the smallest possible divergence).
- reversed-order: rl_kernel over the vocabulary in reverse: the same math, the reduction order reversed.
- fma-build:      rl_kernel compiled with -ffp-contract=fast (-mfma on x86), and for a GPU cell its device
                  code with --fmad=true (nvcc) or -ffp-contract=fast (hipcc): implicit FMA contraction.
                  Selected by loading that build through RL_KERNEL_LIBRARY (see build_fma_variant).
- wave-tree:      the chunk leaves dealt to the 64 lanes of a wavefront, each lane folding its chunks
                  in order, then a shuffle-down tree: an order tied to the hardware width.
- atomics:        on a GPU, a real atomics reduction: each row's sum of exp accumulated with
                  torch.index_add_ (atomicAdd, arrival order varies from call to call); on the CPU, where
                  there is no such nondeterminism to borrow, the chunk leaves joined in a random order.

Each of the following breaks exactly one property, so that each gated comparison has a control only it
catches (rlparity.selftest.EXPECTED names the comparison that must catch each control):

- batch-variant:     the reduction order depends on the batch's row count: a batch of fewer than
                     SMALL_BATCH rows reduces in reverse (as a kernel that splits rows for small batches).
- rollout-variant:   the reduction order depends on autograd: logits that do not require grad (a decode
                     step) reduce in reverse, the teacher-forced pass does not.
- profile-variant:   reads the env of the profile (OMP_NUM_THREADS, CUBLAS_WORKSPACE_CONFIG,
                     HSA_ENABLE_SDMA) and flips the last bit of every log-prob when one is set.
- placement-variant: reads the cell's placement (RLPARITY_PLACEMENT, set by cellrun) and flips the last
                     bit of every log-prob outside the split placement's ranks when it is not `single`.
- range-unchecked:   token ids outside [0, V) are clamped into it: no NaN, no error.
- rank-order:        the vocab-parallel merge done as trainers often do it: each rank's slice reduced as a
                     row of its own, the ranks' statistics merged in rank order (not the row's tree).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import rl_kernel
import rl_kernel.exact.reference as R
from rlparity.cell.episodes import IGNORE, LogprobFn
from rlparity.cells import CONTROLS

WAVE = 64
SMALL_BATCH = 16  # batch-variant: fewer rows than this take the other reduction order
PROFILE_VARS = ("OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "HSA_ENABLE_SDMA")  # set by a non-baseline profile
PLACEMENT_VAR = "RLPARITY_PLACEMENT"  # the cell's placement, exported by cellrun for placement-variant
TokenFn = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]  # (logits, tokens, validate) -> fp32


def _check(control: str) -> None:
    if control not in CONTROLS:
        raise ValueError(f"unknown RLPARITY_CONTROL {control!r} (known: {', '.join(CONTROLS)})")


def logprob_fn(control: str = "none", tier: str | rl_kernel.tiers.Tier = "exact") -> LogprobFn:
    """The token log-prob function a cell runs: the tier's (rl_kernel.tiers), or a negative control."""
    _check(control)
    # fma-build swaps the library underneath rl_kernel; rank-order breaks only the vocab-parallel merge
    if control in ("none", "fma-build", "range-unchecked", "rank-order"):
        op = rl_kernel.tiers.resolve(tier).op("token_logprobs")
        return _exact if op is rl_kernel.token_logprobs else functools.partial(_tier_logprobs, op)
    return {
        "ulp-flip": _ulp_flip,
        "reversed-order": _reversed,
        "wave-tree": _wave,
        "atomics": _atomics,
        "batch-variant": _batch_variant,
        "rollout-variant": _rollout_variant,
        "profile-variant": _profile_variant,
        "placement-variant": _placement_variant,
    }[control]


def token_fn(control: str = "none") -> TokenFn:
    """The control's token_logprobs with its validate switch (the token contract's test)."""
    _check(control)
    if control == "range-unchecked":
        return _range_unchecked
    return lambda x, tok, validate: rl_kernel.token_logprobs(x, tok, IGNORE, validate=validate)


def stats_fn(control: str = "none") -> Callable[[torch.Tensor], torch.Tensor]:
    """The control's row statistics [max, sum of exp, log of the sum] per row: the intermediates, which
    move with any change of reduction order even where the rounded log-probs do not."""
    _check(control)
    if control == "atomics":
        return lambda x: _atomic_stats(x) if x.is_cuda else _reference_stats(x, _arrival_order_tree)
    if control == "wave-tree":
        return lambda x: _reference_stats(x, _wave_tree)
    if control == "reversed-order":
        return lambda x: rl_kernel.row_stats(x.flip(-1))
    if control == "batch-variant":
        return lambda x: rl_kernel.row_stats(x.flip(-1) if x.shape[0] < SMALL_BATCH else x)
    if control == "ulp-flip":
        return lambda x: _flip_first(rl_kernel.row_stats(x))
    return rl_kernel.row_stats


def _flip_first(t: torch.Tensor) -> torch.Tensor:
    bits = t.contiguous().view(torch.int32).clone()
    if bits.numel():
        bits.view(-1)[0] ^= 1
    return bits.view(torch.float32)


def _reference_stats(x: torch.Tensor, tree) -> torch.Tensor:
    return torch.from_numpy(_rows_stats(x.detach().float().cpu().numpy(), tree)).to(x.device)


def _rows_stats(rows: np.ndarray, tree) -> np.ndarray:
    """[rows, 3]: each row's (m, s, log_s), the contract's but for `tree` over its leaves. The tree takes every row's
    leaves at once (its numpy calls once per level, not once per row: a wave's fold is ~70 joins of 7 fma_rn each)."""
    if not len(rows):
        return np.zeros((0, 3), dtype=np.float32)
    leaves = [R.leaf_stats(row) for row in rows]
    m, s = tree(np.stack([lm for lm, _ in leaves]), np.stack([ls for _, ls in leaves]))
    return np.array([R.finish(rm, rs) for rm, rs in zip(m, s, strict=True)], dtype=np.float32).reshape(len(rows), 3)


def _exact(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    return rl_kernel.token_logprobs(x, tok, IGNORE)


def _tier_logprobs(op: Callable, x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    return op(x, tok, IGNORE)


def _exact_grad(x: torch.Tensor, tok: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """rl_kernel's gradient: the controls that only change the forward reuse it."""
    with torch.enable_grad():
        leaf = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(_exact(leaf, tok), leaf, grad)
    return g


def _ulp_flip(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """Element 0 with its last bit flipped. Added as a difference of two adjacent floats, which is exact,
    so the result is the flipped value and the gradient still flows."""
    out = _exact(x, tok)
    if out.numel() == 0:
        return out
    flipped = out.detach()[:1].view(torch.int32) ^ 1
    delta = torch.zeros_like(out)
    delta[:1] = flipped.view(torch.float32) - out.detach()[:1]
    return out + delta


def _reversed(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    vocab = x.shape[-1]
    flipped = torch.where(tok == IGNORE, tok, vocab - 1 - tok)
    return rl_kernel.token_logprobs(x.flip(-1), flipped, IGNORE)


def _batch_variant(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """A reduction order chosen by the batch's row count: a small batch is reduced in reverse."""
    return _reversed(x, tok) if x.shape[0] < SMALL_BATCH else _exact(x, tok)


def _rollout_variant(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """Another order where the logits need no gradient (a decode step): only rollout vs training sees it."""
    return _exact(x, tok) if x.requires_grad else _reversed(x, tok)


def _flip_logprobs(out: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """Every non-ignored log-prob with its last bit flipped, consistently: the same rows give the same
    (wrong) bits in every call, batch and path. Exact adjacent-float deltas keep the gradient flowing."""
    flipped = (out.detach().contiguous().view(torch.int32) ^ 1).view(torch.float32)
    delta = torch.where(tok == IGNORE, torch.zeros_like(out), flipped - out.detach())
    return out + torch.nan_to_num(delta)


def _profile_variant(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    out = _exact(x, tok)
    return _flip_logprobs(out, tok) if any(os.environ.get(v) for v in PROFILE_VARS) else out


def _placement_variant(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    out = _exact(x, tok)
    moved = os.environ.get(PLACEMENT_VAR, "single") != "single" and not dist.is_initialized()
    return _flip_logprobs(out, tok) if moved else out


def _range_unchecked(x: torch.Tensor, tok: torch.Tensor, validate: bool) -> torch.Tensor:
    """Out-of-range ids clamped into [0, V): a finite, wrong log-prob and no error."""
    clamped = torch.where(tok == IGNORE, tok, tok.clamp(0, x.shape[-1] - 1))
    return rl_kernel.token_logprobs(x, clamped, IGNORE, validate=validate)


class _ReferenceWithTree(torch.autograd.Function):
    """Forward: the contract's numpy transcription with another tree over the leaves. Backward: rl_kernel's."""

    @staticmethod
    def forward(ctx, x, tok, tree_name):
        ctx.save_for_backward(x, tok)
        tree = {"wave": _wave_tree, "atomics": _arrival_order_tree}[tree_name]
        rows = x.detach().float().cpu().numpy()
        stats = _rows_stats(rows, tree)
        out = np.zeros(rows.shape[0], dtype=np.float32)
        for i, (row, t) in enumerate(zip(rows, tok.cpu().numpy(), strict=True)):
            if t != IGNORE:
                out[i] = R.token_logprob(row, int(t), IGNORE, tuple(stats[i]))
        return torch.from_numpy(out).to(x.device)

    @staticmethod
    def backward(ctx, grad):
        return _exact_grad(*ctx.saved_tensors, grad), None, None


def _wave(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    return _ReferenceWithTree.apply(x, tok, "wave")


def _atomics(x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        return _AtomicLogprobs.apply(x, tok)
    return _ReferenceWithTree.apply(x, tok, "atomics")


def _atomic_stats(x: torch.Tensor) -> torch.Tensor:
    """[max, sum of exp, log sum] per row, the sum accumulated by atomicAdd (index_add_ on the GPU)."""
    xf = x.detach().float()
    rows, vocab = xf.shape
    m = xf.max(dim=-1).values
    e = torch.exp(xf - m[:, None]).reshape(-1)
    owner = torch.arange(rows, device=x.device).repeat_interleave(vocab)
    s = torch.zeros(rows, device=x.device, dtype=torch.float32).index_add_(0, owner, e)
    return torch.stack([m, s, torch.log(s)], dim=-1)


class _AtomicLogprobs(torch.autograd.Function):
    """Forward: x[tok] - max - log(sum of exp) with an atomics sum. Backward: rl_kernel's."""

    @staticmethod
    def forward(ctx, x, tok):
        ctx.save_for_backward(x, tok)
        stats = _atomic_stats(x)
        picked = x.detach().float().gather(-1, tok.clamp_min(0)[:, None])[:, 0]
        out = (picked - stats[:, 0]) - stats[:, 2]
        return torch.where(tok == IGNORE, torch.zeros_like(out), out)

    @staticmethod
    def backward(ctx, grad):
        return _exact_grad(*ctx.saved_tensors, grad), None


def _wave_tree(m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The leaves (the last axis) dealt to the 64 lanes of one wavefront (lane l folds chunks l, l + 64, ... in
    order), then a shuffle-down tree over the lanes (offsets 32..1): an order tied to the wave width."""
    n, steps = m.shape[-1], -(-m.shape[-1] // WAVE)
    lm = np.full((*m.shape[:-1], steps * WAVE), -np.float32(np.finfo(np.float32).max), dtype=np.float32)
    ls = np.zeros_like(lm)
    lm[..., :n], ls[..., :n] = m, s
    lm, ls = lm.reshape(*m.shape[:-1], steps, WAVE), ls.reshape(*m.shape[:-1], steps, WAVE)
    am, as_ = lm[..., 0, :].copy(), ls[..., 0, :].copy()
    for k in range(1, steps):
        am, as_ = R.combine(am, as_, lm[..., k, :], ls[..., k, :])
    off = WAVE // 2
    while off:
        am[..., :off], as_[..., :off] = R.combine(am[..., :off], as_[..., :off], am[..., off : 2 * off],
                                                  as_[..., off : 2 * off])  # fmt: skip
        off //= 2
    return am[..., 0], as_[..., 0]


def _arrival_order_tree(m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The leaves (the last axis) joined in an order that differs per row and per call, as atomics would: a random
    permutation of each row's leaves, then the tree over them (vectorized; a sequential fold over every leaf would
    take minutes)."""
    rng = np.random.default_rng()  # unseeded: arrival order is not reproducible
    order = rng.permuted(np.broadcast_to(np.arange(m.shape[-1]), m.shape), axis=-1)
    return R.tree_stats(np.take_along_axis(m, order, -1), np.take_along_axis(s, order, -1))


def control_env(control: str, gpu: bool = False) -> dict[str, str]:
    """Env a cell needs for a control: the fma-build control loads its own build of rl_kernel."""
    return {"RL_KERNEL_LIBRARY": str(build_fma_variant(gpu=gpu))} if control == "fma-build" else {}


# ---- the contracted-FMA build ------------------------------------------------------------------------
FMA_FLAGS = ["-ffp-contract=fast"] + (["-mfma"] if platform.machine() in ("x86_64", "AMD64") else [])


def fma_spec(gpu: bool = False, hip: bool | None = None) -> dict:
    """The FMA-contracted build's sources and flags: the build's own sources (build_flags.sources) with implicit
    contraction on: -ffp-contract=fast (-mfma on x86) for the host, --fmad=true (nvcc) or -ffp-contract=fast
    (hipcc) for device code."""
    from rl_kernel import build_flags

    hip = bool(torch.version.hip) if hip is None else hip
    device: list[str] = []
    if gpu and hip:
        device = [f for f in build_flags.HIP_FLAGS if not f.startswith("-ffp-contract")] + ["-ffp-contract=fast"]
    elif gpu:
        device = [f.replace("--fmad=false", "--fmad=true") for f in build_flags.NVCC_FLAGS]
        device = [f for f in device if f != "-Xcompiler=-ffp-contract=off"]
    return {
        "sources": [str(build_flags.REPO / s) for s in build_flags.sources(gpu)],
        "cxx": [*build_flags.CXX_FLAGS, *FMA_FLAGS],
        "device": device,
    }


def build_fma_variant(cache: Path | None = None, gpu: bool = False) -> Path:
    """Compile rl_kernel with implicit FMA contraction (fma_spec); returns the shared library. gpu=False: the CPU
    operators only; gpu=True: also the CUDA/HIP kernels. Built and cached by
    rl_kernel.contract.mutations.build_variant."""
    from rl_kernel.contract import mutations

    root = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlparity"
    return mutations.build_variant(f"fma-{'gpu' if gpu else 'cpu'}", "rl_kernel_fma", fma_spec(gpu), root)


def main(argv: list[str] | None = None) -> int:
    """`python -m rlparity.cell.controls env NAME [--gpu]`: the control's cell env as JSON (builds the
    fma-build library here). How the host gets it without importing the cell side."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (2, 3) or argv[0] != "env" or argv[2:] not in ([], ["--gpu"]):
        print("usage: python -m rlparity.cell.controls env NAME [--gpu]", file=sys.stderr)
        return 2
    _check(argv[1])
    print(json.dumps(control_env(argv[1], gpu=argv[2:] == ["--gpu"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
