"""Static proof, without a GPU, that every fast kernel uses exactly the pinned arithmetic on every target.

    python -m rl_kernel.fast.compile_check [--json OUT] [--targets sm_90,gfx942]

Each fast kernel (linear forward per M bucket, dX, dW, db; attention forward, delta, dK/dV, dQ) is compiled
with triton.compile(ASTSource(...), target=GPUTarget(...), options=<the target's pinned launch options>)
for every target in configs.toml, and its assembly read back:
- the matrix instruction(s) (wgmma.mma_async m64nNk16 / mma.sync in PTX and HGMMA/HMMA in SASS on sm_90,
  v_mfma_* / v_wmma_* in amdgcn) must all match the target's pinned family (configs.toml `instr`);
- the K step of every dot (from the TTGIR: the K extent of each tt.dot / warp_group_dot) must be the pinned
  one (BLOCK_K for the linear, head dim / key tile / query tile for attention): K order fixed by data;
- no atomics anywhere (no tt.atomic_* in TTIR, no atom./red. in PTX, no *_atomic in amdgcn): every output
  element has one writer, so there is no split-K or stream-K reduction.
negative_controls() compiles variants that break each rule (another BLOCK_K, another instruction shape,
an atomic split-K) and shows that the scan flags every one.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from rl_kernel.fast import attention_kernels, group_kernels, grouped_kernels, linear_kernels
from rl_kernel.fast.configs import configs, target_config
from rl_kernel.fast.decoder import attention_backward
from rl_kernel.fast.sass import sass_instructions

try:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # the functions below raise a clear error
    triton = tl = None

ARCH = {"sm_90": ("cuda", 90, 32)}
INSTR_RE = re.compile(r"(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*|v_mfma_\w+|v_wmma_\w+|\bHGMMA[\w.]*|\bHMMA[\w.]*)")
ATOMIC_RE = {
    "ptx": re.compile(r"^\s*(@!?%p\d+\s+)?(atom|red)\.", re.M),
    "amdgcn": re.compile(r"\b(global|buffer|flat)_atomic\w*"),
}
TTIR_ATOMIC_RE = re.compile(r"tt\.atomic_(rmw|cas)")
DOT_RE = re.compile(r"=\s*(?:tt\.dot|ttng\.warp_group_dot)\s.*?:\s*(?:tensor|!ttg\.memdesc)<(\d+)x(\d+)x")


@dataclass
class Report:
    kernel: str
    target: str
    dtype: str
    tile: dict[str, int]
    instructions: list[str]
    sass_instructions: list[str]
    k_steps: list[int]
    expected_k_steps: list[int]
    atomics: list[str]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _require_triton() -> None:
    if triton is None:
        raise RuntimeError("rl_kernel.fast.compile_check needs Triton (pip install triton==3.6.0)")


def gpu_target(name: str):
    """GPUTarget of a config key: sm_90 -> cuda 90 (warp 32); gfx* -> hip with the table's warp size."""
    t = target_config(name)
    if t["backend"] == "cuda":
        return GPUTarget("cuda", int(name.removeprefix("sm_")), t["warp_size"])
    return GPUTarget("hip", name, t["warp_size"])


def _signature(fn, types: dict[str, str], constexprs: dict[str, Any]) -> tuple[dict, dict, dict]:
    """Full ASTSource signature: given types, 'constexpr' for the constexprs, pointers 16-byte aligned and
    every other int divisible by 16 (as the launcher specializes real, aligned tensors)."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = types[name]
            if types[name].startswith("*") or name.startswith("stride") or name in ("N", "K", "sq_b", "sk_b"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def _compile(fn, types, constexprs, target: str, options: dict):
    sig, const, attrs = _signature(fn, types, constexprs)
    return triton.compile(ASTSource(fn, sig, const, attrs), target=gpu_target(target), options=options)


def scan(kernel, name: str, target: str, dtype: str, tile: dict, expected_k: set[int], needs_mma: bool) -> Report:
    """Read the compiled kernel's assembly and check it against the target's pinned rules."""
    t = target_config(target)
    key = "ptx" if t["backend"] == "cuda" else "amdgcn"
    asm = kernel.asm[key]
    instrs = sorted(set(INSTR_RE.findall(asm)))
    k_steps = sorted({int(m.group(2)) for m in DOT_RE.finditer(kernel.asm["ttgir"])})
    atomics = sorted(set(m.group(0).strip() for m in ATOMIC_RE[key].finditer(asm)))
    atomics += sorted(set(TTIR_ATOMIC_RE.findall(kernel.asm["ttir"])) and {"tt.atomic (TTIR)"})
    sass = sass_instructions(kernel, INSTR_RE) if key == "ptx" else []
    rep = Report(name, target, dtype, tile, instrs, sass, k_steps, sorted(expected_k), atomics)
    family = re.compile(t["instr"])
    if needs_mma and not instrs:
        rep.problems.append("no matrix instruction")
    bad = [i for i in instrs if not family.fullmatch(i)]
    if bad:
        rep.problems.append(f"instruction outside the pinned family {t['instr']!r}: {bad}")
    if key == "ptx" and sass and any(s.startswith("HMMA") for s in sass):
        rep.problems.append(f"SASS has HMMA (mma.sync) next to/instead of HGMMA: {sass}")
    if set(k_steps) != set(expected_k):
        rep.problems.append(f"K steps {k_steps} != pinned {sorted(expected_k)}")
    if atomics:
        rep.problems.append(f"atomics on outputs (split-K/stream-K style reduction): {atomics}")
    return rep


# ---- the fast kernels' compile cases -----------------------------------------------------------------
def _ptr(dtype: str) -> str:
    return "*" + dtype


def _gemm_types(dtype: str) -> dict[str, str]:
    t = {n: "i32" for n in linear_kernels._gemm_kernel.arg_names}
    t.update(a_ptr=_ptr(dtype), b_ptr=_ptr(dtype), c_ptr=_ptr(dtype), bias_ptr=_ptr(dtype))
    return t


# Stride arguments equal to 1 are specialized as constants by the launcher: the layout of each GEMM.
_GEMM_UNIT_STRIDES = {
    "fwd": ("stride_ak", "stride_bk", "stride_cn"),  # x [M, K] row-major, B = W^T (W [N, K] row-major)
    "dx": ("stride_ak", "stride_bn", "stride_cn"),  # dY [M, N] row-major, B = W [N, K]
    "dw": ("stride_am", "stride_bn", "stride_cn"),  # A = dY^T (dY row-major), B = X [M, K]
}


# The TMA kernel's operands per GEMM: (A read as A^T [K, M], B read as the [N, K] tensor it is).
_TMA_LAYOUT = {"fwd": (False, True), "dx": (False, False), "dw": (True, False)}


def compile_gemm_tma(target: str, dtype: str, kind: str, tile: dict, options: dict, has_bias: bool = False,
                     chain: bool = False):  # fmt: skip
    """The persistent TMA kernel (a config's tma = true), with the descriptors its launch builds for `kind`."""
    a_t, b_t = _TMA_LAYOUT[kind]
    bm, bn, bk = tile["block_m"], tile["block_n"], tile["block_k"]
    fn = linear_kernels._gemm_tma_kernel
    types = {n: "i32" for n in fn.arg_names} | {"c_ptr": _ptr(dtype), "bias_ptr": _ptr(dtype)}
    types["acc_ptr"] = _ptr("fp32" if chain else dtype)
    types["a_desc"] = f"tensordesc<{dtype}{[bk, bm] if a_t else [bm, bk]}>"
    types["b_desc"] = f"tensordesc<{dtype}{[bn, bk] if b_t else [bk, bn]}>"
    const = {"stride_cn": 1, "A_T": a_t, "B_T": b_t, "HAS_BIAS": has_bias, "ACCUMULATE": False, "CHAIN": chain,
             "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": tile["group_m"]}  # fmt: skip
    return _compile(fn, types, const, target, options)


def compile_gemm(target: str, dtype: str, kind: str, tile: dict, options: dict, has_bias: bool = False,
                 chain: bool = False):  # fmt: skip
    """A linear GEMM of `kind` (fwd, dx, dw) as its launch compiles it; chain: dW continuing an fp32 running sum
    (grad_w_chain: the fused policy loss's row blocks), its sum rounded to dtype as the last block stores it."""
    if tile.get("tma"):
        return compile_gemm_tma(target, dtype, kind, tile, options, has_bias, chain)
    const = {s: 1 for s in _GEMM_UNIT_STRIDES[kind]}
    const.update(
        ACCUMULATE=False,
        CHAIN=chain,
        HAS_BIAS=has_bias,
        EVEN_K=kind != "dw",
        BLOCK_M=tile["block_m"],
        BLOCK_N=tile["block_n"],
        BLOCK_K=tile["block_k"],
        GROUP_M=tile["group_m"],
    )
    types = _gemm_types(dtype) | {"acc_ptr": _ptr("fp32" if chain else dtype)}
    return _compile(linear_kernels._gemm_kernel, types, const, target, options)


def compile_gemm_group(target: str, dtype: str, tile: dict, options: dict):
    """The group kernel (two or three linears of one input in one launch: a decode step's q/k/v, gate/up),
    row-major operands."""
    fn = group_kernels._gemm_group_kernel
    types = {n: "i32" for n in fn.arg_names} | {n: _ptr(dtype) for n in fn.arg_names if n.endswith("_ptr")}
    const = {"HAS_BIAS": False, "EVEN_K": True, "BLOCK_M": tile["block_m"], "BLOCK_N": tile["block_n"],
             "BLOCK_K": tile["block_k"], "GROUP_M": tile["group_m"]}  # fmt: skip
    return _compile(fn, types, const, target, options)


def _grouped_types(fn, dtype: str) -> dict[str, str]:
    types = {n: "i32" for n in fn.arg_names} | {n: _ptr(dtype) for n in fn.arg_names if n.endswith("_ptr")}
    return types | ({"offs_ptr": "*i32", "flag_ptr": "*i32"} if "offs_ptr" in types else {})


def compile_grouped_gemm(target: str, dtype: str, tile: dict, options: dict, kind: str = "fwd"):
    """The grouped GEMM (a mixture of experts' products, every expert in one launch, its tiles found from offs on
    the device, checking them), the forward's strides (a weight's transpose: unit stride over k) or dX's (b[g]
    row-major: unit stride over n), 64 experts."""
    fn = grouped_kernels._grouped_gemm_kernel
    unit = {"stride_ak": 1, "stride_bk": 1} if kind == "fwd" else {"stride_ak": 1, "stride_bn": 1}
    const = unit | {"CHECK": True, "EVEN_K": True, "GROUPS": 128, "BLOCK_M": tile["block_m"],
                    "BLOCK_N": tile["block_n"], "BLOCK_K": tile["block_k"]}  # fmt: skip
    return _compile(fn, _grouped_types(fn, dtype), const, target, options)


def compile_grouped_dw(target: str, dtype: str, tile: dict, options: dict):
    """The experts' dW in one launch (each expert's sum over its tokens), A K-contiguous as grouped_dw copies it."""
    fn = grouped_kernels._grouped_dw_kernel
    const = {"stride_ak": 1, "CHECK": True, "GROUPS": 64, "BLOCK_M": tile["block_m"], "BLOCK_N": tile["block_n"],
             "BLOCK_K": tile["block_k"]}  # fmt: skip
    return _compile(fn, _grouped_types(fn, dtype), const, target, options)


def compile_grouped_tma(target: str, dtype: str, tile: dict, options: dict, kind: str):
    """The grouped GEMM's TMA kernels (a target whose dW reads by TMA), with the descriptors their launches build:
    fwd (A [S, K], the weights' [N, K] rows stacked), dx (their [K, N] rows stacked), dw (A^T [S, M] read in
    place, B [S, N])."""
    bm, bn, bk = tile["block_m"], tile["block_n"], tile["block_k"]
    dw = kind == "dw"
    fn = grouped_kernels._grouped_dw_tma_kernel if dw else grouped_kernels._grouped_gemm_tma_kernel
    types = _grouped_types(fn, dtype)
    types["a_desc"] = f"tensordesc<{dtype}{[bk, bm] if dw else [bm, bk]}>"
    types["b_desc"] = f"tensordesc<{dtype}{[bn, bk] if kind == 'fwd' else [bk, bn]}>"
    const = {"CHECK": True, "GROUPS": 64 if dw else 128, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    return _compile(fn, types, const | ({} if dw else {"B_T": kind == "fwd"}), target, options)


def compile_batched_gemm(target: str, dtype: str, kind: str, tile: dict, options: dict):
    """aten::bmm in one launch (B elements, each fast.mm's form and tile), with `kind`'s unit strides (the linear's
    layouts of _GEMM_UNIT_STRIDES but C's, which is row-major)."""
    fn = grouped_kernels._batched_gemm_kernel
    const = {s: 1 for s in _GEMM_UNIT_STRIDES[kind] if s != "stride_cn"} | {
        "EVEN_K": kind != "dw",
        "BLOCK_M": tile["block_m"],
        "BLOCK_N": tile["block_n"],
        "BLOCK_K": tile["block_k"],
    }
    return _compile(fn, _grouped_types(fn, dtype), const, target, options)


def _options(t: dict, tile: dict, prefix: str = "") -> dict:
    return {"num_warps": tile[prefix + "num_warps"], "num_stages": tile[prefix + "num_stages"], **t["launch"]}


def _linear_reports(target: str, dtypes: tuple[str, ...]) -> list[Report]:
    t = target_config(target)
    out = []
    buckets = {"fwd": t["linear"]["buckets"], "dx": t["linear"].get("dx_buckets", t["linear"]["buckets"])}
    for dtype in dtypes:
        for kind, table in buckets.items():
            for i, b in enumerate(table):
                tile = {k: v for k, v in b.items() if k != "max_m"} | {"block_k": t["linear"]["block_k"]}
                k = compile_gemm(target, dtype, kind, tile, _options(t, tile), has_bias=kind == "fwd")
                name = f"linear.{kind}[bucket {i}]{' (tma)' if tile.get('tma') else ''}"
                out.append(scan(k, name, target, dtype, tile, {tile["block_k"]}, True))
                if kind == "fwd" and not tile.get("tma"):  # forward_group_2d's launches (pointer buckets)
                    k = compile_gemm_group(target, dtype, tile, _options(t, tile))
                    out.append(scan(k, f"linear.group[bucket {i}]", target, dtype, tile, {tile["block_k"]}, True))
                # grouped_mm's and bmm's launches take their form's bucket tiles (the pointer kernel's K loop)
                k = compile_grouped_gemm(target, dtype, tile, _options(t, tile), kind)
                out.append(scan(k, f"linear.grouped {kind}[bucket {i}]", target, dtype, tile, {tile["block_k"]}, True))
                if t["linear_dw"].get("tma"):  # grouped_mm's TMA kernel on such a target
                    k = compile_grouped_tma(target, dtype, tile, _options(t, tile), kind)
                    name = f"linear.grouped {kind}[bucket {i}] (tma)"
                    out.append(scan(k, name, target, dtype, tile, {tile["block_k"]}, True))
                k = compile_batched_gemm(target, dtype, kind, tile, _options(t, tile))
                out.append(scan(k, f"linear.bmm {kind}[bucket {i}]", target, dtype, tile, {tile["block_k"]}, True))
        dw = dict(t["linear_dw"])
        for chain in (False, True):
            k = compile_gemm(target, dtype, "dw", dw, _options(t, dw), chain=chain)
            name = f"linear.dw{' chain' if chain else ''}{' (tma)' if dw.get('tma') else ''}"
            out.append(scan(k, name, target, dtype, dw, {dw["block_k"]}, True))
        k = compile_grouped_dw(target, dtype, dw, _options(t, dw))  # the pointer kernel with dW's pinned tile
        out.append(scan(k, "linear.grouped dw", target, dtype, dw, {dw["block_k"]}, True))
        if dw.get("tma"):
            k = compile_grouped_tma(target, dtype, dw, _options(t, dw), "dw")
            out.append(scan(k, "linear.grouped dw (tma)", target, dtype, dw, {dw["block_k"]}, True))
        k = compile_batched_gemm(target, dtype, "dw", dw, _options(t, dw))
        out.append(scan(k, "linear.bmm dw", target, dtype, dw, {dw["block_k"]}, True))
        types = {"x_ptr": _ptr(dtype), "out_ptr": _ptr(dtype), "M": "i32", "N": "i32"}
        k = _compile(
            linear_kernels._colsum_kernel,
            types,
            {"BLOCK_R": 32, "BLOCK_N": 64},
            target,
            {"num_warps": 4, **t["launch"]},
        )
        out.append(scan(k, "linear.db", target, dtype, {"block_r": 32, "block_n": 64}, set(), False))
    return out


def _attn_types(fn, dtype: str) -> dict[str, str]:
    types = {n: "i32" for n in fn.arg_names}
    for n in fn.arg_names:
        if n.endswith("_ptr"):
            types[n] = _ptr(dtype)
    for n in ("lse_ptr", "delta_ptr", "sinks_ptr"):
        types[n] = "*fp32"
    for n in ("qpos_ptr", "kstart_ptr"):
        types[n] = "*i64"
    for n in ("qk_scale", "scale"):
        types[n] = "fp32"
    return types


def _attention_reports(target: str, dtypes: tuple[str, ...], head_dims: tuple[int, ...] = (64, 128)) -> list[Report]:
    t = target_config(target)
    out = []
    for dtype in dtypes:
        for d, windowed in ((d, w) for d in head_dims for w in (False, True)):  # a sliding window: other code
            a, name = t["attention"][f"d{d}"], "attention.window" if windowed else "attention"
            fwd_tile = {"block_m": a["block_m"], "block_n": a["block_n"], "block_d": d}
            fn = attention_kernels._attn_fwd_kernel
            for sinks in (False, True):  # attention sinks (GPT-OSS): the rows' starting state, other code
                const = {"G": 2, "HEAD_D": d, "BLOCK_D": d, "BLOCK_M": a["block_m"], "BLOCK_N": a["block_n"],
                         "ROWS_T": a["block_m"] // 2, "WINDOWED": windowed, "HAS_SINK": sinks}  # fmt: skip
                k = _compile(fn, _attn_types(fn, dtype), const, target, _options(t, a))
                kernel = f"{name}{'.sinks' if sinks else ''}.fwd[d{d}]"
                out.append(scan(k, kernel, target, dtype, fwd_tile, {d, a["block_n"]}, True))
            bm, bn = a["bwd_block_m"], a["bwd_block_n"]
            const = {"G": 2, "HEAD_D": d, "BLOCK_D": d, "BLOCK_M": bm, "BLOCK_N": bn, "WINDOWED": windowed}
            tile = {"block_m": bm, "block_n": bn, "block_d": d}
            fn = attention_backward._attn_bwd_dkdv_kernel
            k = _compile(fn, _attn_types(fn, dtype), const, target, _options(t, a, "bwd_"))
            out.append(scan(k, f"{name}.bwd_dkdv[d{d}]", target, dtype, tile, {d, bm}, True))
            fn = attention_backward._attn_bwd_dq_kernel
            rows = {"ROWS_T": bm // 2}
            k = _compile(fn, _attn_types(fn, dtype), const | rows, target, _options(t, a, "bwd_"))
            out.append(scan(k, f"{name}.bwd_dq[d{d}]", target, dtype, tile, {d, bn}, True))
        for d in head_dims:
            fn = attention_backward._bwd_delta_kernel
            types = {"o_ptr": _ptr(dtype), "do_ptr": _ptr(dtype), "delta_ptr": "*fp32", "R": "i32"}
            const = {"HEAD_D": d, "BLOCK_D": d, "BLOCK_R": 32}
            k = _compile(fn, types, const, target, {"num_warps": 4, **t["launch"]})
            out.append(scan(k, f"attention.bwd_delta[d{d}]", target, dtype, {"block_r": 32}, set(), False))
    return out


def check_target(target: str, dtypes: tuple[str, ...] = ("bf16", "fp16")) -> list[Report]:
    """Every fast kernel compiled and scanned for one target (bf16 and fp16 linears; bf16 attention)."""
    _require_triton()
    return _linear_reports(target, dtypes) + _attention_reports(target, dtypes[:1])


def all_targets() -> list[str]:
    return sorted(configs()["targets"])


# ---- negative controls: variants that break a rule, which the scan must flag --------------------------
@triton.jit if triton is not None else (lambda f: f)
def _splitk_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """A split-K GEMM (the kind the fast tier forbids): K slices summed into C by atomics in arrival order."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K * SPLIT_K):
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak)
        b = tl.load(b_ptr + (k0 + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn)
        acc = tl.dot(a, b, acc)
    tl.atomic_add(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc)


def negative_controls() -> list[dict[str, Any]]:
    """Each rule broken once; every entry must come back flagged (problems non-empty)."""
    _require_triton()
    out = []

    def add(name: str, rep: Report) -> None:
        out.append({"control": name, "flagged": not rep.ok, "problems": rep.problems, "instructions": rep.instructions})

    t90 = target_config("sm_90")
    tile = {k: v for k, v in t90["linear"]["buckets"][0].items() if k != "max_m"} | {"block_k": 32}
    k = compile_gemm("sm_90", "bf16", "fwd", tile, _options(t90, tile))
    add("sm_90 linear with BLOCK_K=32 instead of the pinned 64", scan(k, "ctl", "sm_90", "bf16", tile, {64}, True))
    tile = {"block_m": 16, "block_n": 64, "block_k": 64, "group_m": 8, "num_warps": 4, "num_stages": 3}
    k = compile_gemm("sm_90", "bf16", "fwd", tile, _options(t90, tile))
    add("sm_90 linear with BLOCK_M=16 (mma.sync instead of wgmma)", scan(k, "ctl", "sm_90", "bf16", tile, {64}, True))
    t942 = target_config("gfx942")
    tile = {k: v for k, v in t942["linear"]["buckets"][-1].items() if k != "max_m"} | {"block_k": 64}
    opts = _options(t942, tile) | {"matrix_instr_nonkdim": 32}
    k = compile_gemm("gfx942", "bf16", "fwd", tile, opts)
    add("gfx942 linear with matrix_instr_nonkdim=32 (32x32x8 MFMA)", scan(k, "ctl", "gfx942", "bf16", tile, {64}, True))
    for target in ("sm_90", "gfx942"):
        tc = target_config(target)
        types = {n: "i32" for n in _splitk_gemm_kernel.arg_names} | {
            "a_ptr": "*bf16",
            "b_ptr": "*bf16",
            "c_ptr": "*fp32",
        }
        tile = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 4}
        const = tile | {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1}
        k = _compile(_splitk_gemm_kernel, types, const, target, {"num_warps": 4, "num_stages": 2, **tc["launch"]})
        add(f"{target} atomic split-K GEMM", scan(k, "ctl", target, "bf16", tile, {64}, True))
    return out


# ---- command line -----------------------------------------------------------------------------------
def run(targets: list[str] | None = None) -> dict[str, Any]:
    reports = [r for t in (targets or all_targets()) for r in check_target(t)]
    controls = negative_controls()
    ok = all(r.ok for r in reports) and all(c["flagged"] for c in controls)
    return {
        "triton": triton.__version__,
        "ok": ok,
        "reports": [asdict(r) | {"ok": r.ok} for r in reports],
        "negative_controls": controls,
    }


def _table(result: dict[str, Any]) -> str:
    lines = [f"{'target':8} {'kernel':28} {'dtype':5} {'instructions':58} {'K steps':10} atomics  ok"]
    for r in result["reports"]:
        ins = ",".join(r["instructions"]) or "-"
        lines.append(
            f"{r['target']:8} {r['kernel']:28} {r['dtype']:5} {ins[:58]:58} {r['k_steps']!s:10} "
            f"{'yes' if r['atomics'] else 'no':8} {'ok' if r['ok'] else 'FAIL: ' + '; '.join(r['problems'])}"
        )
    for c in result["negative_controls"]:
        lines.append(f"control: {c['control']}: {'flagged' if c['flagged'] else 'NOT FLAGGED'} {c['problems']}")
    lines.append(f"overall: {'ok' if result['ok'] else 'FAIL'} (triton {result['triton']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rl_kernel.fast.compile_check", description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the full result as JSON to this path")
    p.add_argument("--targets", help="comma-separated config keys (default: every target in configs.toml)")
    args = p.parse_args(argv)
    result = run(args.targets.split(",") if args.targets else None)
    print(_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())


def tier_scan(only: str | None = None) -> list[dict[str, Any]]:
    """kernels_check's view of this scan (the fast tier's descriptor names it): per target, every fast kernel
    compiled and scanned (its violations), and a last row for the negative controls, each of which must be
    flagged. only: "cuda" or "hip" keeps that backend's targets; any other value keeps none but the controls."""
    _require_triton()
    backends = {None: ("cuda", "hip"), "cuda": ("cuda",), "hip": ("hip",)}.get(only, ())
    rows = []
    for target in (t for t in all_targets() if target_config(t)["backend"] in backends):
        reports = check_target(target)
        rows.append(
            {
                "target": target,
                "toolchain": f"triton {triton.__version__}",
                "kernels": len(reports),
                "violations": [f"{r.kernel} {r.dtype}: {p}" for r in reports for p in r.problems],
            }
        )
    controls = negative_controls()
    missed = [f"negative control not flagged: {c['control']}" for c in controls if not c["flagged"]]
    rows.append({"target": "controls", "toolchain": f"triton {triton.__version__}", "kernels": len(controls),
                 "violations": missed})  # fmt: skip
    return rows
