"""The fast tier's grouped linears: two or three linears of one input in one launch (a decode step's q/k/v, an MLP's
gate and up), each output tile with rl_kernel.fast.decoder.linear's arithmetic, so the bits of separate launches.

Why: an eager decode step is bound by the host, and each launch of the fast linear costs it more than a torch op
(bench launch_cost); a group is one launch where there were two or three. Whether a target groups is pinned in
configs.toml (linear.group), a speed knob: the bits are the same either way.
"""

from __future__ import annotations

import torch

from rl_kernel._validate import needs_autograd
from rl_kernel.fast.configs import config_for, grouped_launches
from rl_kernel.fast.decoder import plan as plans
from rl_kernel.fast.decoder.linear import (  # Triton, or linear's stand-ins where it is missing
    _check_shapes,
    _jit,
    _pointer_tile,
    _store_tile,
    _tile_of,
    forward_2d,
    linear,
    tl,
    triton,
)
from rl_kernel.triton_tier import interpreting, launch, launch_replay, target_of


@_jit(do_not_specialize=["M"])
def _gemm_group_kernel(
    a_ptr,
    b1_ptr,
    b2_ptr,
    b3_ptr,
    c1_ptr,
    c2_ptr,
    c3_ptr,
    bias1_ptr,
    bias2_ptr,
    bias3_ptr,
    M,
    N1,
    N2,
    N3,
    K,
    stride_am,
    stride_b1n,
    stride_b2n,
    stride_b3n,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """Two or three linears of one input in one launch (N3 = 0 for two): C_i = A @ B_i^T (+ bias_i), B_i [N_i, K],
    row-major operands. The first tiles are C1's, then C2's, then C3's, each _gemm_kernel's arithmetic: the bits
    of separate launches (a decode step's q/k/v or gate/up projections, fewer launches on the host). A program picks
    its linear's operands first and runs one K loop: one pipeline's shared memory, as a single linear's."""
    t1 = tl.cdiv(M, BLOCK_M) * tl.cdiv(N1, BLOCK_N)
    t2 = tl.cdiv(M, BLOCK_M) * tl.cdiv(N2, BLOCK_N)
    pid = tl.program_id(0)
    first = pid < t1
    second = (pid >= t1) & (pid < t1 + t2)
    b_ptr = tl.where(first, b1_ptr, tl.where(second, b2_ptr, b3_ptr))
    c_ptr = tl.where(first, c1_ptr, tl.where(second, c2_ptr, c3_ptr))
    bias_ptr = tl.where(first, bias1_ptr, tl.where(second, bias2_ptr, bias3_ptr))
    N = tl.where(first, N1, tl.where(second, N2, N3))
    stride_bn = tl.where(first, stride_b1n, tl.where(second, stride_b2n, stride_b3n))
    tile = tl.where(first, pid, tl.where(second, pid - t1, pid - t1 - t2))
    pid_m, pid_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _pointer_tile(a_ptr, b_ptr, acc, offs_m, offs_n, M, N, K, stride_am, 1, 1, stride_bn, EVEN_K, BLOCK_K)
    _store_tile(acc, c_ptr, bias_ptr, offs_m, offs_n, M, N, N, 1, HAS_BIAS, False)


def launches_once(x: torch.Tensor) -> bool:
    """Whether linear_group can launch a group once for x: a GPU (or the interpreter) whose target groups its
    launches (configs.toml's linear.group). Where it cannot, a patched model's modules make their own calls."""
    if x.device.type != "cuda" and not interpreting():
        return False
    return grouped_launches(target_of(x.device))


def _group_config(x: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> dict | None:
    """The one config every linear of a group takes (the pointer kernel's, equal for all), else None; None where the
    target does not group its launches (configs.toml's linear.group)."""
    m, k = x.shape
    if not launches_once(x):
        return None
    target = target_of(x.device)
    cfgs = [config_for("linear", target, m=m, n=w.shape[0], k=k) for w in weights]
    same = all(c == cfgs[0] for c in cfgs)
    return cfgs[0] if same and not cfgs[0].get("tma") else None


def group_operands(x: torch.Tensor, ws: tuple, bs: tuple, outs: tuple) -> tuple[torch.Tensor, ...]:
    """_gemm_group_kernel's tensor arguments: x, the three slots' weights, outputs and biases (a group of two fills
    its third slot with the first's, which no program reads; an output stands in for an absent bias)."""
    w3, y3, b3 = (ws[2], outs[2], bs[2]) if len(ws) == 3 else (ws[0], outs[0], None)
    b1, b2 = (bs[0], bs[1]) if bs[0] is not None else (outs[0], outs[1])
    return x, ws[0], ws[1], w3, outs[0], outs[1], y3, b1, b2, y3 if b3 is None else b3


def forward_group_2d(
    x: torch.Tensor, weights: tuple, biases: tuple, cfg: dict | None = None, plan: tuple | None = None
) -> tuple[torch.Tensor, ...]:
    """(forward_2d(x, w, b) for each weight and bias), their bits: for two or three weights, one launch of
    _gemm_group_kernel where all take one pointer-kernel config (decode rows) and the target groups its launches,
    row-major operands and all or no biases; else a launch each. cfg (a pointer-kernel config) groups them
    whatever the target's knob (tests, bench/launch_cost.py); plan: the call's plan key (fast.decoder.plan), under
    which the grouped launch is kept (the pinned configs' calls only)."""
    m, k = x.shape
    has_bias = biases[0] is not None
    groupable = 2 <= len(weights) <= 3 and all((b is not None) == has_bias for b in biases)
    row_major = x.stride(1) == 1 and all(w.stride(1) == 1 for w in weights)
    if not (groupable and row_major and m and k) or (cfg is not None and cfg.get("tma")):
        cfg = None
    elif cfg is None:
        cfg = _group_config(x, weights)
    else:
        plan = None  # a config given is no plan of the pinned one's
    if cfg is None:
        return tuple(forward_2d(x, w, b) for w, b in zip(weights, biases, strict=True))
    outs = tuple(torch.empty((m, w.shape[0]), dtype=x.dtype, device=x.device) for w in weights)
    bm, bn = cfg["block_m"], cfg["block_n"]
    tiles = triton.cdiv(m, bm) * sum(triton.cdiv(w.shape[0], bn) for w in weights)
    n3 = weights[2].shape[0] if len(weights) == 3 else 0
    replay = (launch if plan is None else launch_replay)(
        _gemm_group_kernel, (tiles,), *group_operands(x, weights, biases, outs), m, weights[0].shape[0],
        weights[1].shape[0], n3, k, x.stride(0), weights[0].stride(0), weights[1].stride(0),
        weights[2 if n3 else 0].stride(0), HAS_BIAS=has_bias, EVEN_K=k % cfg["block_k"] == 0, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=cfg["block_k"], GROUP_M=cfg["group_m"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **cfg["launch"],
    )  # fmt: skip
    if plan is not None:
        plans.keep(plan, replay, tuple(w.shape[0] for w in weights), group_operands)
    return outs


def linear_group(x: torch.Tensor, weights: tuple, biases: tuple) -> tuple[torch.Tensor, ...]:
    """(linear(x, w, b) for each weight and bias), the same bits: where no gradient can flow, one launch for two or
    three (forward_group_2d); else the linears, each with its autograd."""
    if len(weights) != len(biases):
        raise ValueError(f"rl_kernel.fast.linear_group: {len(weights)} weights but {len(biases)} biases")
    for w, b in zip(weights, biases, strict=True):
        _check_shapes(x, w, b)
    if needs_autograd(x, *weights, *biases):
        return tuple(linear(x, w, b) for w, b in zip(weights, biases, strict=True))
    plan = plans.key(x, weights, biases)  # kept for the next call of these layouts (a decode step's)
    x2 = x.contiguous().reshape(-1, x.shape[-1])
    ws = tuple(w.contiguous() for w in weights)
    bs = tuple(None if b is None else b.contiguous() for b in biases)
    outs = forward_group_2d(x2, ws, bs, plan=plan)
    return tuple(y.view(*x.shape[:-1], w.shape[0]) for y, w in zip(outs, ws, strict=True))
