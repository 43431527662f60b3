"""The fast tier's pinned configuration (configs.toml): per target, the linear's M buckets and BLOCK_K, dW's tile,
attention's tile per head-dim bucket, the matrix instruction and the compiler options. Every knob that changes the
arithmetic is here, and none is chosen from the batch; config_for() gives one call's launch configuration."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch

from rl_kernel.tiers import target_of
from rl_kernel.triton_tier import ConfigError, load_configs, require_keys

__all__ = [
    "CONFIG_PATH",
    "CONFIG_VAR",
    "HEAD_DIM_BUCKETS",
    "ConfigError",
    "config_for",
    "configs",
    "fingerprint",
    "linear_block_k",
    "target_config",
]

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


# ---- the pinned configuration -----------------------------------------------------------------
WHERE = "rl_kernel.fast configs.toml"


def _require(table: dict, keys: set[str], where: str, ints: bool = True, optional: frozenset = frozenset()) -> None:
    require_keys(table, keys, f"{WHERE}: {where}", ints, optional,
                 free=("block_k_by_nk", "buckets", "dx_buckets", "tma", "group"))  # fmt: skip


# tma = true: the GEMM runs persistent and TMA-fed (NVIDIA sm_90 and later): how operands reach shared memory and
# which program runs a tile change no bit (the same tile arithmetic; tests/kernels/test_fast.py and the H200 sweep
# check it).
_TMA = frozenset({"tma"})


def _check_tma(name: str, table: dict, where: str) -> None:
    if "tma" not in table:
        return
    if not isinstance(table["tma"], bool):
        raise ConfigError(f"{WHERE}: {where}.tma must be true or false, got {table['tma']!r}")
    arch = name.removeprefix("sm_")
    if table["tma"] and not (arch.isdigit() and int(arch) >= 90):
        raise ConfigError(f"{WHERE}: {where}.tma: TMA descriptors need an NVIDIA sm_90 or later, not {name}")


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _check_buckets(name: str, buckets: list, where: str) -> None:
    """M buckets: increasing max_m, the last unbounded (max_m = 0); wgmma-only tiles on sm_90."""
    if not isinstance(buckets, list) or not buckets or buckets[-1].get("max_m") != 0:
        raise ConfigError(f"{WHERE}: {where} must be a list ending with max_m = 0 (no bound)")
    for i, b in enumerate(buckets):
        _require(b, _LINEAR_BUCKET_KEYS, f"{where}[{i}]", optional=_TMA)
        _check_tma(name, b, f"{where}[{i}]")
        if name == "sm_90" and (b["block_m"] < 64 or b["num_warps"] % 4):
            raise ConfigError(
                f"{WHERE}: {where}[{i}] needs block_m >= 64 and num_warps % 4 == 0 "
                "(else Triton picks mma.sync instead of wgmma, another summation)"
            )
    bounds = [b["max_m"] for b in buckets[:-1]]
    if bounds != sorted(bounds) or len(set(bounds)) != len(bounds) or 0 in bounds:
        raise ConfigError(f"{WHERE}: {where} max_m must increase, got {bounds}")


def _check_target(name: str, t: dict) -> None:
    where = f"targets.{name}"
    _require(t, _TARGET_KEYS, where, ints=False)
    if not isinstance(t["warp_size"], int) or not isinstance(t["instr"], str):
        raise ConfigError(f"{WHERE}: {where}: warp_size must be an int and instr a regex string")
    backend = t["backend"]
    if backend not in _LAUNCH_KEYS:
        raise ConfigError(f"{WHERE}: {where}.backend must be cuda or hip, got {backend!r}")
    launch = t["launch"]
    if not isinstance(launch, dict) or set(launch) != _LAUNCH_KEYS[backend]:
        raise ConfigError(
            f"{WHERE}: {where}.launch must pin exactly {sorted(_LAUNCH_KEYS[backend])} "
            f"(enable_fp_fusion explicit: its default flips in Triton 3.10), got {sorted(launch)}"
        )
    if not isinstance(launch["enable_fp_fusion"], bool):
        raise ConfigError(f"{WHERE}: {where}.launch.enable_fp_fusion must be true or false")
    lin = t["linear"]
    _require(
        lin, {"block_k", "buckets", "block_k_by_nk"}, f"{where}.linear", optional=frozenset({"dx_buckets", "group"})
    )
    if not isinstance(lin.get("group", False), bool):
        raise ConfigError(f"{WHERE}: {where}.linear.group must be true or false, got {lin['group']!r}")
    for key in ("buckets", "dx_buckets"):
        if key in lin:
            _check_buckets(name, lin[key], f"{where}.linear.{key}")
    for nk, bk in lin["block_k_by_nk"].items():
        parts = nk.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) or not _pow2(bk):
            raise ConfigError(f"{WHERE}: {where}.linear.block_k_by_nk: bad entry {nk!r} = {bk!r}")
    _require(t["linear_dw"], _DW_KEYS, f"{where}.linear_dw", optional=_TMA)
    _check_tma(name, t["linear_dw"], f"{where}.linear_dw")
    att = t["attention"]
    want = {f"d{d}" for d in HEAD_DIM_BUCKETS}
    if set(att) != want:
        raise ConfigError(f"{WHERE}: {where}.attention needs exactly {sorted(want)}")
    for d, a in att.items():
        _require(a, _ATTN_KEYS, f"{where}.attention.{d}")


CONFIG_VAR = "RL_KERNEL_FAST_CONFIGS"  # another pinned file (a negative control: another BLOCK_K), recorded by
# the fingerprint with every RL_KERNEL_ variable


def configs(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The parsed, validated configs.toml (or $RL_KERNEL_FAST_CONFIGS): {"schema": 1, "targets": {target: {...}}}."""
    return load_configs(CONFIG_PATH, CONFIG_VAR, _check_target, path)


def target_config(target: str) -> dict[str, Any]:
    t = configs()["targets"].get(target)
    if t is None:
        known = ", ".join(sorted(configs()["targets"]))
        raise ValueError(f"rl_kernel.fast: no pinned config for target {target!r} in configs.toml (pinned: {known})")
    return t


def grouped_launches(target: str) -> bool:
    """Whether linear_group launches two or three linears of one input at once on this target (linear.group;
    the same bits either way, so a speed knob: on where it was measured faster)."""
    return bool(target_config(target)["linear"].get("group", False))


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
