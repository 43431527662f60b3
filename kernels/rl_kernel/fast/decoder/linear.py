"""The fast tier's linear: Triton matrix-core GEMMs whose reduction order depends on K only.

    y  = x @ W^T (+ b)     forward, one tile per M bucket, BLOCK_K fixed per (N, K) and target
    dX = dY @ W            the forward's kernel with W read untransposed: batch invariant like the forward
    dW = dY^T @ X          one tile for every M: the same bits on every run
    db = sum of dY's rows  a fixed-order column sum (no atomics)

Why the bits of a row of y do not depend on M: a program owns a BLOCK_M x BLOCK_N tile of y, walks K from 0
in steps of BLOCK_K (a K tail is zero-padded the same way for every M) and issues one fixed matrix
instruction family per target (wgmma on sm_90, the 16x16 MFMA on CDNA): every output element is the
same chain of instruction-sized K steps whatever BLOCK_M/BLOCK_N the M bucket picks. The bias is added
after the K loop in fp32 and the sum rounded once. No split-K, stream-K or atomics.
"""

from __future__ import annotations

import functools

import torch

from rl_kernel._triton import jit as _jit  # Triton where installed: rl_kernel.fast reports it missing on a call
from rl_kernel._triton import tl, triton
from rl_kernel._validate import needs_autograd
from rl_kernel.fast.configs import config_for
from rl_kernel.fast.decoder import plan as plans
from rl_kernel.triton_tier import launch, launch_replay, target_of

if triton is not None:
    from triton.tools.tensor_descriptor import TensorDescriptor
else:
    TensorDescriptor = None


# ---- kernels --------------------------------------------------------------------------------------
@_jit
def _tile_of(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """The (pid_m, pid_n) of a tile in grouped order, for L2 reuse: which program owns a tile changes nothing in
    its arithmetic."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (tile // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    return first_m + ((tile % group) % size_m), (tile % group) // size_m


@_jit
def _store_tile(acc, c_ptr, bias_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS: tl.constexpr,
                ACCUMULATE: tl.constexpr):  # fmt: skip
    """The K loop's fp32 sum: + bias in fp32, or added to an fp32 C, then rounded once to C's dtype."""
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + (offs_n % N)).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if ACCUMULATE:
        acc = tl.load(c_ptrs, mask=c_mask, other=0.0) + acc
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


@_jit
def _start_tile(acc_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, CHAIN: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):  # fmt: skip
    """The fp32 sum a tile's K loop starts from: +0, or (CHAIN) the tile of acc (fp32, C's strides), a running sum
    over earlier K steps that this launch continues (a K walk cut between launches at multiples of BLOCK_K: the
    uncut walk's bits)."""
    if CHAIN:
        c_ptrs = acc_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
        return tl.load(c_ptrs, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), other=0.0)
    return tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@_jit(do_not_specialize=["M"])
def _gemm_tma_kernel(
    a_desc,
    b_desc,
    c_ptr,
    bias_ptr,
    acc_ptr,
    M,
    N,
    K,
    stride_cm,
    stride_cn,
    programs,
    A_T: tl.constexpr,
    B_T: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    CHAIN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """_gemm_kernel's arithmetic, persistent and TMA-fed (sm_90): `programs` programs walk the tiles in grouped order,
    operands reach shared memory by tensor descriptors (A_T: a_desc holds A^T [K, M]; B_T: b_desc holds B^T [N, K])
    and the hardware zero-fills past an edge, as the masked loads do. Each tile: fp32 from +0, K ascending in
    steps of BLOCK_K, the same dot per step: the pointer kernel's bits."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, programs):
        pid_m, pid_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        acc = _start_tile(acc_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, CHAIN, BLOCK_M, BLOCK_N)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([k0, off_m]).T if A_T else a_desc.load([off_m, k0])
            b = b_desc.load([off_n, k0]).T if B_T else b_desc.load([k0, off_n])
            acc = tl.dot(a, b, acc, input_precision="ieee")
        _store_tile(acc, c_ptr, bias_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS, ACCUMULATE)


@_jit
def _pointer_tile(a_ptr, b_ptr, acc, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """acc (fp32, the tile at rows offs_m, columns offs_n) + that tile of A[M, K] @ B[K, N]: K ascending in steps of
    BLOCK_K, one dot per step."""
    # Rows/columns past the edge re-read valid ones (modulo): those results are never stored.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k0
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@_jit(do_not_specialize=["M"])
def _gemm_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, acc_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
    stride_cn, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr, CHAIN: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr
):  # fmt: skip
    """C[M, N] = A[M, K] @ B[K, N] (+ bias[N]) with any strides; fp32 accumulation from +0, K ascending.
    ACCUMULATE (an fp32 C): C = C + that result, one fp32 add per element as it is stored. CHAIN: the accumulation
    starts from acc's tile instead of +0 (_start_tile); C may be acc itself. acc_ptr is C where there is no CHAIN."""
    pid_m, pid_n = _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _start_tile(acc_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, CHAIN, BLOCK_M, BLOCK_N)
    acc = _pointer_tile(a_ptr, b_ptr, acc, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, EVEN_K,
                        BLOCK_K)  # fmt: skip
    _store_tile(acc, c_ptr, bias_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS, ACCUMULATE)


@_jit(do_not_specialize=["M"])
def _colsum_kernel(x_ptr, out_ptr, M, N, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n] = sum over rows of x[:, n]: BLOCK_R running fp32 partial sums (row r into slot r % BLOCK_R,
    rows ascending), then one fixed tree over the slots. Depends on M, never on the run."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, M, BLOCK_R):
        rows = r0 + offs_r
        mask = (rows[:, None] < M) & (offs_n[None, :] < N)
        acc += tl.load(x_ptr + rows.to(tl.int64)[:, None] * N + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=offs_n < N)


# ---- launches -------------------------------------------------------------------------------------
def _launch_gemm(
    a: torch.Tensor, b_strides: tuple[int, int], b: torch.Tensor, n: int, cfg: dict, bias=None, out_dtype=None,
    into: torch.Tensor | None = None, plan: tuple | None = None, out: torch.Tensor | None = None,
    chain: torch.Tensor | None = None,
):  # fmt: skip
    """a [M, K] (any strides), B given as (tensor, stride over k, stride over n) -> C [M, n] in out_dtype (default
    a's dtype; fp32 stores the accumulator unrounded). into (fp32 [M, n]): C is added to it in place instead;
    out ([M, n], any strides): C is stored there; chain (fp32 [M, n], C's strides): the K walk starts from chain's
    values (a K walk continued), its sum stored in out, else in chain. plan: the plan key of a linear's call
    (fast.decoder.plan), under which a replayable launch is kept."""
    m, k = a.shape
    c = into if into is not None else out if out is not None else chain
    if c is None:
        c = torch.empty((m, n), dtype=out_dtype or a.dtype, device=a.device)
    if m == 0 or n == 0 or (k == 0 and (into is not None or chain is not None)):
        return c
    if k == 0:
        return c.copy_(bias.expand(m, n)) if bias is not None else c.zero_()
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    tensors = (*linear_operands(a, (b,), (bias,), (c,))[:4], c if chain is None else chain)
    tma = _tma_operands(a, b, b_strides, cfg) if cfg.get("tma") else None
    if tma is not None:
        programs = min(tiles, _programs(a.device))
        _gemm_tma_kernel[(programs,)](
            tma[0], tma[2], *tensors[2:], m, n, k, c.stride(0), c.stride(1), programs,
            A_T=tma[1], B_T=tma[3], HAS_BIAS=bias is not None, ACCUMULATE=into is not None, CHAIN=chain is not None,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg["group_m"], num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"], **cfg["launch"],
        )  # fmt: skip
        return c
    replay = (launch if plan is None else launch_replay)(
        _gemm_kernel, (tiles,), *tensors, m, n, k, a.stride(0), a.stride(1),
        b_strides[0], b_strides[1], c.stride(0), c.stride(1), HAS_BIAS=bias is not None, ACCUMULATE=into is not None,
        CHAIN=chain is not None, EVEN_K=k % bk == 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg["group_m"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **cfg["launch"],
    )  # fmt: skip
    if plan is not None:
        plans.keep(plan, replay, (n,), linear_operands)
    return c


def linear_operands(x: torch.Tensor, ws: tuple, bs: tuple, outs: tuple) -> tuple[torch.Tensor, ...]:
    """A linear's tensor arguments of _gemm_kernel (a, b, c, bias, acc; c where there is no bias and as acc), for
    its plan."""
    return x, ws[0], outs[0], outs[0] if bs[0] is None else bs[0], outs[0]


def _tma_readable(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can describe the 2D tensor: its last dimension contiguous, its base and row stride
    16-byte aligned."""
    return t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def _described(t: torch.Tensor, block: list[int]):
    """A TMA descriptor of the 2D tensor, or None where TMA cannot read it."""
    return TensorDescriptor.from_tensor(t, block) if _tma_readable(t) else None


def _tma_operands(a: torch.Tensor, b: torch.Tensor, b_strides: tuple[int, int], cfg: dict):
    """(a_desc, A_T, b_desc, B_T) for _gemm_tma_kernel, or None (the pointer kernel then runs: the same bits).
    A [M, K] is read as itself or, column-major, as A^T [K, M]; B is `b` as [K, N] or, when its k stride is 1, as
    the [N, K] tensor it is (a linear's weight)."""
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    if a.stride(1) == 1:
        a_desc, a_t = _described(a, [bm, bk]), False
    elif a.stride(0) == 1:
        a_desc, a_t = _described(a.t(), [bk, bm]), True
    else:
        return None
    if b_strides[1] == 1:
        b_desc, b_t = _described(b, [bk, bn]), False
    elif b_strides[0] == 1:
        b_desc, b_t = _described(b, [bn, bk]), True
    else:
        return None
    return None if a_desc is None or b_desc is None else (a_desc, a_t, b_desc, b_t)


def _programs(device: torch.device) -> int:
    """The persistent kernel's programs: one per multiprocessor (3 in Triton's interpreter, so programs loop)."""
    if device.type != "cuda":
        return 3
    return _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def forward_2d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: dict | None = None, plan: tuple | None = None
) -> torch.Tensor:
    """y [M, N] = x [M, K] @ weight[N, K]^T (+ bias): the M bucket's tile, (N, K)'s BLOCK_K.
    cfg overrides the pinned config (the tuning sweep of bench/fast_tier.py (python -m bench fast_tier) only);
    plan: the call's plan key (fast.decoder.plan; the pinned config's calls only)."""
    m, k = x.shape
    n = weight.shape[0]
    if cfg is not None:
        plan = None
    cfg = cfg or config_for("linear", target_of(x.device), m=m, n=n, k=k)
    return _launch_gemm(x, (weight.stride(1), weight.stride(0)), weight, n, cfg, bias, plan=plan)


def grad_x_2d(
    dy: torch.Tensor, weight: torch.Tensor, cfg: dict | None = None, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """dX [M, K] = dY [M, N] @ weight [N, K]: a linear with N and K swapped (reduction over N). out_dtype fp32:
    the unrounded accumulator (the fused head sums its vocabulary chunks' partials)."""
    m, n = dy.shape
    k = weight.shape[1]
    cfg = cfg or config_for("linear_dx", target_of(dy.device), m=m, n=k, k=n)
    return _launch_gemm(dy, (weight.stride(0), weight.stride(1)), weight, k, cfg, out_dtype=out_dtype)


def add_grad_x_2d(dy: torch.Tensor, weight: torch.Tensor, into: torch.Tensor, cfg: dict | None = None) -> None:
    """into [M, K] (fp32) += dY [M, N] @ weight [N, K]: grad_x_2d's fp32 result added as it is stored, the bits of
    `into + grad_x_2d(dy, weight, out_dtype=torch.float32)` without the partial's round trip through memory."""
    m, n = dy.shape
    k = weight.shape[1]
    if into.dtype != torch.float32 or tuple(into.shape) != (m, k) or into.stride(1) != 1:
        raise ValueError(f"add_grad_x_2d: into must be a row-major fp32 [{m}, {k}], got {into.dtype} "
                         f"{tuple(into.shape)} strides {into.stride()}")  # fmt: skip
    cfg = cfg or config_for("linear_dx", target_of(dy.device), m=m, n=k, k=n)
    _launch_gemm(dy, (weight.stride(0), weight.stride(1)), weight, k, cfg, into=into)


def grad_w_2d(
    dy: torch.Tensor, x: torch.Tensor, cfg: dict | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """dW [N, K] = dY^T [N, M] @ X [M, K]: one tile for every M, reduction over the rows ascending.
    dY^T is copied K-contiguous first (the pointer kernel's matrix cores read an M-major A operand 3-4x slower on
    the H200), except where the TMA kernel reads dY itself as A^T. out: dW stored there (dY's dtype, [N, K])."""
    n, k = dy.shape[1], x.shape[1]
    if out is not None and (out.dtype != dy.dtype or tuple(out.shape) != (n, k) or out.device != dy.device):
        raise ValueError(f"grad_w_2d: out must be {dy.dtype} [{n}, {k}] on {dy.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")  # fmt: skip
    cfg = cfg or config_for("linear_dw", target_of(dy.device))
    return _launch_gemm(_dw_operand(dy, x, cfg), (x.stride(0), x.stride(1)), x, k, cfg, out=out)


def _dw_operand(dy: torch.Tensor, x: torch.Tensor, cfg: dict) -> torch.Tensor:
    """dW's A operand, dY^T: a view where the TMA kernel reads dY itself, else a K-contiguous copy."""
    return dy.t() if cfg.get("tma") and _tma_readable(dy) and _tma_readable(x) else dy.t().contiguous()


def grad_w_chain(
    dy: torch.Tensor, x: torch.Tensor, acc: torch.Tensor, out: torch.Tensor | None = None, cfg: dict | None = None
) -> None:
    """acc [N, K] (fp32, row-major): grad_w_2d's walk over the rows continued by these rows, the sum stored back in
    acc, or (the last block) rounded into out (dY's dtype, [N, K] row-major) as grad_w_2d stores it. grad_w_2d
    over rows cut into blocks, each a multiple of dw_rows() rows but the last, chained block after block from an
    acc of +0, is grad_w_2d of the uncut rows, bit for bit: the same K steps (BLOCK_K rows each) in the same
    order, the running sum held in fp32 memory between launches instead of in registers."""
    n, k = dy.shape[1], x.shape[1]
    if acc.dtype != torch.float32 or tuple(acc.shape) != (n, k) or acc.device != dy.device or acc.stride(1) != 1:
        raise ValueError(f"grad_w_chain: acc must be a row-major fp32 [{n}, {k}] on {dy.device}, got {acc.dtype} "
                         f"{tuple(acc.shape)} strides {acc.stride()} on {acc.device}")  # fmt: skip
    if out is not None and (out.dtype != dy.dtype or tuple(out.shape) != (n, k) or out.stride() != acc.stride()):
        raise ValueError(f"grad_w_chain: out must be a row-major {dy.dtype} [{n}, {k}], got {out.dtype} "
                         f"{tuple(out.shape)} strides {out.stride()}")  # fmt: skip
    cfg = cfg or config_for("linear_dw", target_of(dy.device))
    _launch_gemm(_dw_operand(dy, x, cfg), (x.stride(0), x.stride(1)), x, k, cfg, out=out, chain=acc)


def dw_rows(device: torch.device) -> int:
    """The rows of one K step of dW (its BLOCK_K): grad_w_chain's blocks are multiples of it."""
    return config_for("linear_dw", target_of(device))["block_k"]


def _transposed(t: torch.Tensor) -> bool:
    """A column-major 2-D view: the transpose of a row-major tensor (as W.t() and dY.t() reach aten::mm)."""
    return not t.is_contiguous() and t.t().is_contiguous()


def mm_form(a: torch.Tensor, b: torch.Tensor) -> str:
    """Which of a linear's three products a @ b is, by the layouts autograd gives them (aten's mm backward keeps a
    transposed operand's layout): "forward" y = x W^T (b = W.t()), "dw" dW = dY^T X (a = dY.t()), else "dx"
    dX = dY W (b row-major)."""
    if _transposed(b):
        return "forward"
    return "dw" if _transposed(a) else "dx"


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] (+ bias [N]) by the kernel of its form (mm_form): the linear's forward, dX or dW kernel
    with its own configs, so that a product autograd makes of F.linear has rl_kernel.fast.linear's bits, and no
    operand is copied to another layout. A bias goes with the forward (a's rows, b transposed if it is not)."""
    form = "forward" if bias is not None else mm_form(a, b)
    if form == "forward":
        return forward_2d(a.contiguous(), b.t().contiguous(), bias)
    if form == "dw":
        return grad_w_2d(a.t(), b.contiguous())
    return grad_x_2d(a.contiguous(), b.contiguous())


def grad_b_2d(dy: torch.Tensor) -> torch.Tensor:
    return colsum(dy, dy.dtype)


def launch_options(device: torch.device) -> dict:
    """The target's pinned compiler options (enable_fp_fusion, and HIP's), for a kernel with no tile of its own."""
    return config_for("linear_dw", target_of(device))["launch"]


def colsum(x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """out [N] = the sum over the rows of x [M, N] in fp32 (_colsum_kernel's fixed order), rounded to out_dtype."""
    m, n = x.shape
    out = torch.empty(n, dtype=out_dtype, device=x.device)
    if n == 0:
        return out
    if m == 0:
        return out.zero_()
    block_n = 64
    launch(
        _colsum_kernel,
        (triton.cdiv(n, block_n),),
        x.contiguous(),
        out,
        m,
        n,
        BLOCK_R=32,
        BLOCK_N=block_n,
        num_warps=4,
        **launch_options(x.device),
    )
    return out


# ---- torch.library ops: the config is chosen inside, at run time (also under torch.compile) ------------
@torch.library.custom_op(
    "rl_kernel_fast::linear", mutates_args=(), schema="(Tensor x, Tensor weight, Tensor? bias) -> Tensor"
)
def _linear_op(x, weight, bias):
    k = x.shape[-1]
    y = forward_2d(x.reshape(-1, k), weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


@_linear_op.register_fake
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op(
    "rl_kernel_fast::linear_backward",
    mutates_args=(),
    schema="(Tensor grad, Tensor x, Tensor weight, bool need_dx, bool need_dw, bool need_db) "
    "-> (Tensor, Tensor, Tensor)",
)
def _linear_backward_op(grad, x, weight, need_dx, need_dw, need_db):
    n, k = weight.shape
    dy = grad.reshape(-1, n).contiguous()
    x2 = x.reshape(-1, k)
    # An output not asked for is its own empty tensor: outputs of a custom op may not alias each other.
    dx = grad_x_2d(dy, weight).view(x.shape) if need_dx else grad.new_empty(0)
    dw = grad_w_2d(dy, x2) if need_dw else grad.new_empty(0)
    db = grad_b_2d(dy) if need_db else grad.new_empty(0)
    return dx, dw, db


@_linear_backward_op.register_fake
def _(grad, x, weight, need_dx, need_dw, need_db):
    return (
        torch.empty_like(x) if need_dx else grad.new_empty(0),
        torch.empty_like(weight) if need_dw else grad.new_empty(0),
        weight.new_empty(weight.shape[0]) if need_db else grad.new_empty(0),
    )


def _setup_context(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_db = ctx.has_bias and ctx.needs_input_grad[2]
    dx, dw, db = _linear_backward_op(grad.contiguous(), x, weight, need_dx, need_dw, need_db)
    return dx if need_dx else None, dw if need_dw else None, db if need_db else None


_linear_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the public entry (rl_kernel.fast.linear checks devices and dtypes first) ---------------------------
def _check_shapes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2:
        raise ValueError(f"rl_kernel.fast.linear: weight must be [N, K], got {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"rl_kernel.fast.linear: x's last dimension must be K = {weight.shape[1]}, got {tuple(x.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"rl_kernel.fast.linear: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """rl_kernel.fast.linear after its device/dtype checks: shapes, then the kernels (or the op)."""
    _check_shapes(x, weight, bias)
    grad = needs_autograd(x, weight, bias)
    plan = None if grad else plans.key(x, (weight,), (bias,))  # kept for the next call of these layouts
    # Contiguous operands: the kernel's loads (and so its speed, never its sums) assume row-major inputs.
    x, weight = x.contiguous(), weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    if grad:
        return _linear_op(x, weight, bias)
    return forward_2d(x.reshape(-1, x.shape[-1]), weight, bias, plan=plan).view(*x.shape[:-1], weight.shape[0])
