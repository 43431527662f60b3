"""rl_kernel.fast: the fast tier. Triton matrix-core kernels with the exact tier's Python signatures.

    y = rl_kernel.fast.linear(x, weight, bias)                # F.linear, bf16/fp16 on a GPU
    o = rl_kernel.fast.attention(q, k, v, q_pos, k_start)     # causal GQA, prefill and decode alike

The fast tier is bitwise reproducible within one GPU target (sm_90, gfx942, ...), not across targets or
against the CPU: a row's bits do not depend on the batch size, on the other rows, on Tq or on how the KV
cache was filled, and every backward is deterministic run to run (no atomics, no split-K). Every knob that
changes the arithmetic is pinned per target in configs.toml (configs(), config_for()).

Importing this module needs neither a GPU nor Triton: a missing Triton is reported when a kernel is called.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

import torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIG_PATH = Path(__file__).with_name("configs.toml")
HEAD_DIM_BUCKETS = (64, 128, 256)
_LINEAR_BUCKET_KEYS = {"max_m", "block_m", "block_n", "num_warps", "num_stages", "group_m"}
_DW_KEYS = {"block_m", "block_n", "block_k", "num_warps", "num_stages", "group_m"}
_ATTN_KEYS = {
    "block_m",
    "block_n",
    "num_warps",
    "num_stages",
    "bwd_block_m",
    "bwd_block_n",
    "bwd_num_warps",
    "bwd_num_stages",
}
_TARGET_KEYS = {"backend", "warp_size", "instr", "launch", "linear", "linear_dw", "attention"}
_LAUNCH_KEYS = {
    "cuda": {"enable_fp_fusion"},
    "hip": {"enable_fp_fusion", "matrix_instr_nonkdim", "kpack", "waves_per_eu"},
}


class ConfigError(ValueError):
    """configs.toml is malformed (a missing, unknown or ill-typed key)."""


# ---- the pinned configuration -----------------------------------------------------------------
def _require(table: dict, keys: set[str], where: str, ints: bool = True, optional: frozenset = frozenset()) -> None:
    """Exactly `keys` (plus any of `optional`); with ints, every value a non-negative int."""
    if not isinstance(table, dict):
        raise ConfigError(f"rl_kernel.fast configs.toml: {where} must be a table")
    missing = keys - set(table)
    unknown = set(table) - keys - optional
    if missing:
        raise ConfigError(f"rl_kernel.fast configs.toml: {where} lacks {sorted(missing)}")
    if unknown:
        raise ConfigError(f"rl_kernel.fast configs.toml: {where} has unknown keys {sorted(unknown)}")
    for k, v in table.items():
        if not ints or k in ("block_k_by_nk", "buckets", "dx_buckets"):
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"rl_kernel.fast configs.toml: {where}.{k} must be a non-negative int, got {v!r}")


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _check_buckets(name: str, buckets: list, where: str) -> None:
    """M buckets: increasing max_m, the last unbounded (max_m = 0); wgmma-only tiles on sm_90."""
    if not isinstance(buckets, list) or not buckets or buckets[-1].get("max_m") != 0:
        raise ConfigError(f"rl_kernel.fast configs.toml: {where} must be a list ending with max_m = 0 (no bound)")
    for i, b in enumerate(buckets):
        _require(b, _LINEAR_BUCKET_KEYS, f"{where}[{i}]")
        if name == "sm_90" and (b["block_m"] < 64 or b["num_warps"] % 4):
            raise ConfigError(
                f"rl_kernel.fast configs.toml: {where}[{i}] needs block_m >= 64 and num_warps % 4 == 0 "
                "(else Triton picks mma.sync instead of wgmma, another summation)"
            )
    bounds = [b["max_m"] for b in buckets[:-1]]
    if bounds != sorted(bounds) or len(set(bounds)) != len(bounds) or 0 in bounds:
        raise ConfigError(f"rl_kernel.fast configs.toml: {where} max_m must increase, got {bounds}")


def _check_target(name: str, t: dict) -> None:
    where = f"targets.{name}"
    _require(t, _TARGET_KEYS, where, ints=False)
    if not isinstance(t["warp_size"], int) or not isinstance(t["instr"], str):
        raise ConfigError(f"rl_kernel.fast configs.toml: {where}: warp_size must be an int and instr a regex string")
    backend = t["backend"]
    if backend not in _LAUNCH_KEYS:
        raise ConfigError(f"rl_kernel.fast configs.toml: {where}.backend must be cuda or hip, got {backend!r}")
    launch = t["launch"]
    if not isinstance(launch, dict) or set(launch) != _LAUNCH_KEYS[backend]:
        raise ConfigError(
            f"rl_kernel.fast configs.toml: {where}.launch must pin exactly {sorted(_LAUNCH_KEYS[backend])} "
            f"(enable_fp_fusion explicit: its default flips in Triton 3.10), got {sorted(launch)}"
        )
    if not isinstance(launch["enable_fp_fusion"], bool):
        raise ConfigError(f"rl_kernel.fast configs.toml: {where}.launch.enable_fp_fusion must be true or false")
    lin = t["linear"]
    _require(lin, {"block_k", "buckets", "block_k_by_nk"}, f"{where}.linear", optional=frozenset({"dx_buckets"}))
    for key in ("buckets", "dx_buckets"):
        if key in lin:
            _check_buckets(name, lin[key], f"{where}.linear.{key}")
    for nk, bk in lin["block_k_by_nk"].items():
        parts = nk.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) or not _pow2(bk):
            raise ConfigError(f"rl_kernel.fast configs.toml: {where}.linear.block_k_by_nk: bad entry {nk!r} = {bk!r}")
    _require(t["linear_dw"], _DW_KEYS, f"{where}.linear_dw")
    att = t["attention"]
    want = {f"d{d}" for d in HEAD_DIM_BUCKETS}
    if set(att) != want:
        raise ConfigError(f"rl_kernel.fast configs.toml: {where}.attention needs exactly {sorted(want)}")
    for d, a in att.items():
        _require(a, _ATTN_KEYS, f"{where}.attention.{d}")


@functools.cache
def _load(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    if data.get("schema") != 1 or not isinstance(data.get("targets"), dict):
        raise ConfigError(f"rl_kernel.fast configs.toml ({path}): needs schema = 1 and a [targets] table")
    for name, t in data["targets"].items():
        _check_target(name, t)
    return data


CONFIG_VAR = "RL_KERNEL_FAST_CONFIGS"  # another pinned file (a negative control: another BLOCK_K), recorded by
# the fingerprint with every RL_KERNEL_ variable


def configs(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The parsed, validated configs.toml (or $RL_KERNEL_FAST_CONFIGS): {"schema": 1, "targets": {target: {...}}}."""
    return _load(str(path or os.environ.get(CONFIG_VAR) or CONFIG_PATH))


def target_of(device: torch.device | None = None) -> str:
    """The config key of a device: sm_{major}{minor} on CUDA, gcnArchName's first part on ROCm.
    RL_KERNEL_FAST_TARGET overrides it (the Triton interpreter has no device; it defaults to sm_90)."""
    forced = os.environ.get("RL_KERNEL_FAST_TARGET")
    if forced:
        return forced
    if _interpreting():
        return "sm_90"
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    return _device_target(index)


@functools.lru_cache(maxsize=64)
def _device_target(index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def target_config(target: str) -> dict[str, Any]:
    t = configs()["targets"].get(target)
    if t is None:
        known = ", ".join(sorted(configs()["targets"]))
        raise ValueError(f"rl_kernel.fast: no pinned config for target {target!r} in configs.toml (pinned: {known})")
    return t


def linear_block_k(target: str, n: int, k: int) -> int:
    lin = target_config(target)["linear"]
    return int(lin["block_k_by_nk"].get(f"{n},{k}", lin["block_k"]))


@functools.lru_cache(maxsize=4096)
def config_for(op: str, target: str, *, m: int = 0, n: int = 0, k: int = 0, head_dim: int = 0) -> dict[str, Any]:
    """The launch config of one call: op "linear" (y[m, n] = x[m, k] W^T: the M bucket's tile + the (n, k)
    BLOCK_K), "linear_dx" (dX [m, n] = dY [m, k] W: its own M buckets, the same BLOCK_K rule), "linear_dw" (one
    tile for every m), or "attention" (the head-dim bucket's one tile).
    The result holds the tile constexprs and "launch" (the target's pinned compiler options). It is cached:
    treat it as read-only."""
    t = target_config(target)
    if op in ("linear", "linear_dx"):
        buckets = t["linear"].get("dx_buckets", t["linear"]["buckets"]) if op == "linear_dx" else t["linear"]["buckets"]
        bucket = next(b for b in buckets if b["max_m"] == 0 or m <= b["max_m"])
        cfg = {k_: v for k_, v in bucket.items() if k_ != "max_m"}
        cfg["block_k"] = linear_block_k(target, n, k)
    elif op == "linear_dw":
        cfg = dict(t["linear_dw"])
    elif op == "attention":
        bucket = next((d for d in HEAD_DIM_BUCKETS if head_dim <= d), None)
        if bucket is None:
            raise ValueError(f"rl_kernel.fast: head_dim {head_dim} > {HEAD_DIM_BUCKETS[-1]} is not supported")
        cfg = dict(t["attention"][f"d{bucket}"])
        cfg["block_d"] = bucket
    else:
        raise ValueError(f"rl_kernel.fast: unknown op {op!r} (linear, linear_dx, linear_dw, attention)")
    cfg["launch"] = dict(t["launch"])
    return cfg


def fingerprint() -> dict[str, Any]:
    """What a cell's fingerprint records of this tier: Triton's version and, per target this machine has (every
    target of configs.toml without a GPU), the pinned configuration with its matrix instruction."""
    try:
        import triton

        version = triton.__version__
    except ImportError:
        version = None
    known = configs()["targets"]
    here = [target_of(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
    names = [t for t in dict.fromkeys(here) if t in known] or sorted(known)
    return {"triton": version, "targets": {t: target_config(t) for t in names}}


# ---- argument checks shared by the ops ----------------------------------------------------------
def compiling() -> bool:
    """True while torch.compile traces (no host syncs or eager shortcuts then)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(is_compiling and is_compiling())


def needs_autograd(*tensors: torch.Tensor | None) -> bool:
    """The custom op (with its autograd) is needed: tracing, or a gradient may flow. Else the kernels are
    called directly (the same kernels, the same bits, without the dispatcher's overhead)."""
    if compiling():
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


FAST_DTYPES = (torch.bfloat16, torch.float16)


def check_tensors(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """One device (a GPU, or the CPU under the Triton interpreter) and one bf16/fp16 dtype for the float
    tensors; clear errors otherwise. Returns the device. Lean: it runs on every call."""
    device = dtype = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rl_kernel.fast.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if device is None:
            device = t.device
        elif t.device != device:
            where = ", ".join(f"{n} on {u.device}" for n, u in tensors.items() if u is not None)
            raise ValueError(f"rl_kernel.fast.{op}: all tensors must be on one device, got {where}")
        if t.is_floating_point():
            if t.dtype not in FAST_DTYPES:
                raise TypeError(
                    f"rl_kernel.fast.{op}: {name} is {t.dtype}; the fast tier is bfloat16/float16 only (fp32 would "
                    "silently run as TF32): keep fp32 layers on tier='exact'"
                )
            if dtype is None:
                dtype = t.dtype
            elif t.dtype != dtype:
                where = ", ".join(
                    f"{n} {u.dtype}" for n, u in tensors.items() if u is not None and u.is_floating_point()
                )
                raise TypeError(f"rl_kernel.fast.{op}: one dtype for all inputs, got {where}")
    if device is not None and device.type != "cuda":
        if device.type == "cpu" and not _interpreting():
            raise ValueError(
                f"rl_kernel: the fast tier has no CPU kernels ({op} got CPU tensors); use tier='exact' "
                "(rl_kernel.ops.decoder) on the CPU"
            )
        if device.type not in ("cpu", "meta"):
            raise ValueError(f"rl_kernel.fast.{op}: tensors are on {device}; the fast tier runs on CUDA/ROCm GPUs")
    return device


def require_triton() -> None:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "rl_kernel.fast needs Triton (pip install triton==3.6.0 on CUDA; ROCm torch ships its own); "
            "or use tier='exact'"
        ) from exc


# ---- the public operators ------------------------------------------------------------------
# The kernel modules import without Triton (their kernels are defined only when it is there). They are
# imported before the public functions below are defined: importing a submodule binds its name on the
# package, and the functions of the same names must win. Use linear_kernels / attention_kernels (or
# sys.modules) to reach the modules.
from rl_kernel.fast import attention as attention_kernels  # noqa: E402
from rl_kernel.fast import linear as linear_kernels  # noqa: E402

CONTROL_VAR = "RL_KERNEL_FAST_CONTROL"  # a negative control for the gate: "split-k" (below); unset: the tier
CONTROLS = ("split-k",)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) in the fast tier: y = x W^T (+ bias after the K loop, in fp32), fp32
    accumulation on the matrix cores, rounded once to x's dtype. x [..., K], weight [N, K], bias [N].
    A row of y has the same bits at every batch size; the backward (dX, dW, db) is deterministic."""
    check_tensors("linear", x=x, weight=weight, bias=bias)
    require_triton()
    control = os.environ.get(CONTROL_VAR)
    if control:
        return _control_linear(control, x, weight, bias)
    return linear_kernels.linear(x, weight, bias)


def _control_linear(control: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """$RL_KERNEL_FAST_CONTROL=split-k: the K range cut in two halves, each half's product rounded and the two
    added: a split-K, another reduction order, which the gate must catch (the same kernels, so it runs anywhere
    the tier does)."""
    if control not in CONTROLS:
        raise ValueError(f"rl_kernel.fast: unknown {CONTROL_VAR}={control!r} (known: {', '.join(CONTROLS)})")
    half = weight.shape[1] // 2
    low = linear_kernels.linear(x[..., :half], weight[:, :half], None)
    high = linear_kernels.linear(x[..., half:], weight[:, half:], bias)
    return (low.float() + high.float()).to(x.dtype)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_start: torch.Tensor,
    scale: float | None = None,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """Causal GQA attention, rl_kernel.ops.decoder.attention's semantics: q [B, Hq, Tq, D]; k, v [B, Hkv, Tk, D]
    (the cache); q_pos [B, Tq] the absolute key index of each query row; k_start [B] the first valid key.
    Row t sees keys k_start[b] .. q_pos[b, t]; a row with q_pos < k_start outputs +0.0. Keys are tiled from
    k_start[b] with one fixed tile per (target, head dim): a row's bits do not depend on the batch, Tq, its
    tile neighbours or the cache's fill. validate=True checks the key ranges (a host sync)."""
    check_tensors("attention", q=q, k=k, v=v, q_pos=q_pos, k_start=k_start)
    require_triton()
    return attention_kernels.attention(q, k, v, q_pos, k_start, scale, validate=validate)


__all__ = [
    "CONFIG_PATH",
    "ConfigError",
    "attention",
    "attention_kernels",
    "check_tensors",
    "config_for",
    "configs",
    "linear",
    "linear_block_k",
    "linear_kernels",
    "target_config",
    "target_of",
]
