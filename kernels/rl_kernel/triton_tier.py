"""What any Triton tier needs, whatever its kernels: the pinned configuration file (a TOML of per-target tables,
validated by the tier), the target a device compiles for, the argument checks every operator runs first,
when the custom op (with its autograd) is needed, and a launch that costs the host less than Triton's own.

A Triton tier's bits depend on every knob that changes the arithmetic (tile sizes, BLOCK_K, the matrix
instruction, the compiler's fp fusion), so each is pinned per target in the tier's own configs.toml and read
through `load_configs`; none is chosen at run time from the batch.

Importing this module needs neither a GPU nor Triton: a missing Triton is reported when a kernel is called.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rl_kernel import tiers

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TARGET_VAR = "RL_KERNEL_TRITON_TARGET"  # a forced target (the interpreter's, or a compile check's)
INTERPRETER_TARGET = "sm_90"  # what the Triton interpreter (TRITON_INTERPRET=1, no device) takes configs for
DTYPES = (torch.bfloat16, torch.float16)


class ConfigError(ValueError):
    """A tier's configs.toml is malformed (a missing, unknown or ill-typed key)."""


# ---- the pinned configuration ------------------------------------------------------------------------
def require_keys(
    table: Any, keys: set[str], where: str, ints: bool = True, optional: frozenset = frozenset(), free=()
) -> None:
    """Exactly `keys` (plus any of `optional`); with ints, every value (but those named in `free`) a
    non-negative int. `where` names the table in the error, e.g. "rl_kernel.fast configs.toml: targets.sm_90"."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    missing = keys - set(table)
    unknown = set(table) - keys - optional
    if missing:
        raise ConfigError(f"{where} lacks {sorted(missing)}")
    if unknown:
        raise ConfigError(f"{where} has unknown keys {sorted(unknown)}")
    for k, v in table.items():
        if not ints or k in free:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"{where}.{k} must be a non-negative int, got {v!r}")


@functools.cache
def _parsed(path: str, check: Callable[[str, dict], None]) -> dict[str, Any]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    if data.get("schema") != 1 or not isinstance(data.get("targets"), dict):
        raise ConfigError(f"{path}: needs schema = 1 and a [targets] table")
    for name, table in data["targets"].items():
        check(name, table)
    return data


def load_configs(default: Path, override_var: str, check: Callable[[str, dict], None], path=None) -> dict[str, Any]:
    """A tier's parsed configs.toml, {"schema": 1, "targets": {target: {...}}}, each target's table validated by
    `check(name, table)`: `path`, else $override_var (another pinned file: a negative control), else `default`.
    Parsed once per file."""
    return _parsed(str(path or os.environ.get(override_var) or default), check)


# ---- where a kernel runs --------------------------------------------------------------------------------
def interpreting() -> bool:
    """Triton's interpreter runs the kernels on the CPU (TRITON_INTERPRET=1): how CI checks them."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def target_of(device: torch.device | None = None) -> str:
    """The config key of a device (tiers.target_of: sm_90, gfx942, ...). $RL_KERNEL_TRITON_TARGET overrides it;
    the interpreter, which has no device, takes the INTERPRETER_TARGET's configuration."""
    forced = os.environ.get(TARGET_VAR)
    if forced:
        return forced
    if interpreting():
        return INTERPRETER_TARGET
    index = device.index if device is not None and device.type == "cuda" else None
    return _cuda_target(torch.cuda.current_device() if index is None else index)


@functools.lru_cache(maxsize=64)
def _cuda_target(index: int) -> str:
    """tiers.target_of of a GPU by its index, once per index (it runs on every kernel launch)."""
    return tiers.target_of(torch.device("cuda", index))


# ---- the checks every operator runs first ------------------------------------------------------------------
def check_tensors(tier: str, op: str, **tensors: torch.Tensor | None) -> torch.device:
    """One device (a GPU, or the CPU under the Triton interpreter) and one bf16/fp16 dtype for the float
    tensors; clear errors otherwise, naming the tier's operator (rl_kernel.<tier>.<op>). Returns the device.
    Lean: it runs on every call."""
    where = f"rl_kernel.{tier}.{op}"
    device = dtype = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if device is None:
            device = t.device
        elif t.device != device:
            found = ", ".join(f"{n} on {u.device}" for n, u in tensors.items() if u is not None)
            raise ValueError(f"{where}: all tensors must be on one device, got {found}")
        if t.is_floating_point():
            if t.dtype not in DTYPES:
                raise TypeError(
                    f"{where}: {name} is {t.dtype}; the {tier} tier is bfloat16/float16 only (fp32 would "
                    "silently run as TF32): keep fp32 layers on tier='exact'"
                )
            if dtype is None:
                dtype = t.dtype
            elif t.dtype != dtype:
                found = ", ".join(
                    f"{n} {u.dtype}" for n, u in tensors.items() if u is not None and u.is_floating_point()
                )
                raise TypeError(f"{where}: one dtype for all inputs, got {found}")
    if device is not None and device.type != "cuda":
        if device.type == "cpu" and not interpreting():
            raise ValueError(
                f"rl_kernel: the {tier} tier has no CPU kernels ({op} got CPU tensors); use tier='exact' on the CPU"
            )
        if device.type not in ("cpu", "meta"):
            raise ValueError(f"{where}: tensors are on {device}; the {tier} tier runs on CUDA/ROCm GPUs")
    return device


def require_triton(tier: str) -> None:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            f"rl_kernel.{tier} needs Triton (pip install triton==3.6.0 on CUDA; ROCm torch ships its own); "
            "or use tier='exact'"
        ) from exc


# ---- the launch ----------------------------------------------------------------------------------------------
# Triton's `kernel[grid](...)` binds and specializes every argument, builds a cache key and launch metadata, and its
# launcher asks the driver about every tensor's pointer (cuPointerGetAttribute) on each call: at decode sizes more
# host time than the kernel's device time (bench launch_cost). `launch` keeps the CompiledKernel Triton's own launch
# chose, under a key at least as fine as Triton's specialization (each int by the classes Triton specializes it on,
# each other plain argument and every constexpr by type and value; each tensor's dtype, 16-byte alignment and
# device; the options by value), and calls its launcher directly next time, tensors passed as the pointers Triton
# read from them: the same binary, the same arguments, the same bits. An int keyed by its class, not its value, is
# what lets a decode step's attention (a new key count and cache strides every step) keep its launch.
_LAUNCHED: dict[tuple, Any] = {}
_KEPT = 4096  # kept launches before the table starts over
_PLAIN = frozenset({int, float, bool, type(None)})
_I32, _I64 = 2**31, 2**63


class _Uncached(Exception):
    pass


def int_class(v: int) -> tuple[bool, bool, int]:
    """What Triton specializes an int argument on (triton's native_specialize_impl): == 1 (a constant), a multiple
    of 16 (divisibility), and its type (i32, i64, u64). Two ints of one class take one compiled kernel."""
    return v == 1, v % 16 == 0, (-_I32 <= v < _I32) + (-_I64 <= v < _I64)


def _flatten(values: tuple, constexprs: frozenset[int]) -> tuple[list, list]:
    """(the key's part for the arguments, the arguments as the launcher takes them: tensors as device pointers).
    Positions in `constexprs` are keyed by value (Triton compiles their value in)."""
    key, flat = [], []
    for i, v in enumerate(values):
        t = type(v)
        if t is int and i not in constexprs:
            key += (t, int_class(v))
            flat.append(v)
        elif t in _PLAIN:
            key += (t, v)
            flat.append(v)
        elif isinstance(v, torch.Tensor):
            ptr = v.data_ptr()
            key += (v.dtype, ptr % 16 == 0, v.get_device())
            flat.append(ptr)
        else:
            raise _Uncached  # a tensor descriptor, a tuple, ...: Triton's own launch, every call
    return key, flat


_KERNELS: dict[int, tuple[Any, frozenset[int]]] = {}  # id(kernel) -> (the kernel, kept alive: its id stays its own)


def _constexprs(kernel: Any) -> frozenset[int]:
    """The positions of a kernel's constexpr parameters (all of them, keyed by value, where Triton does not say).
    Looked up by id, not by hash: a JITFunction's hash is its source's."""
    kept = _KERNELS.get(id(kernel))
    if kept is None or kept[0] is not kernel:
        found = getattr(kernel, "constexprs", None)
        kept = (kernel, frozenset(range(len(kernel.arg_names))) if found is None else frozenset(found))
        _KERNELS[id(kernel)] = kept
    return kept[1]


@functools.cache
def _runtime_knobs() -> Any:
    from triton import knobs

    return knobs.runtime


def _hooked(kernel: Any) -> bool:
    """Launch hooks (Proton, a debugger) or the kernel's pre-run hooks need Triton's own launch path."""
    rt = _runtime_knobs()
    return bool(rt.launch_enter_hook.calls or rt.launch_exit_hook.calls or kernel.pre_run_hooks)


@functools.cache
def _stream_of() -> Callable[[int], int]:
    """Triton's own getter of a device's current stream (torch's raw stream on CUDA and ROCm)."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """kernel[grid](*args, **kwargs) for a @triton.jit kernel whose parameters are all given (positionally, then by
    name), through the kept CompiledKernel when this specialization was launched before. The interpreter, launch
    hooks and arguments the key cannot describe take Triton's own launch."""
    _launched(kernel, grid, args, kwargs)


def _launched(kernel: Any, grid: tuple[int, ...], args: tuple, kwargs: dict) -> tuple | None:
    """launch(); (the CompiledKernel, the flat arguments, the device) where the launch was kept, else None."""
    if interpreting() or _hooked(kernel):
        kernel[grid](*args, **kwargs)
        return None
    try:
        key, flat = _flatten((*args, *(kwargs[n] for n in kernel.arg_names[len(args) :])), _constexprs(kernel))
        device = torch.cuda.current_device()
        key = (id(kernel), device, tuple(kwargs.items()), *key)
        compiled = _LAUNCHED.get(key)
    except (_Uncached, KeyError, TypeError):  # a descriptor, a parameter left to its default, an unhashable option
        kernel[grid](*args, **kwargs)
        return None
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)  # Triton's launch: compiles or finds the kernel, and runs it
        if len(_LAUNCHED) >= _KEPT:
            _LAUNCHED.clear()
        compiled = _LAUNCHED[key] = compiled.result() if hasattr(compiled, "result") else compiled
        return compiled, flat, device
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    stream = _stream_of()(device)
    compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *flat)
    return compiled, flat, device


class Replay:
    """One launch to run again for other tensors of the same layouts (a plan, rl_kernel.fast.decoder.plan): the
    CompiledKernel, grid and non-tensor arguments of a kept launch, its leading tensor arguments given anew, with
    none of the key's host time. Made only where every tensor was 16-byte aligned (what Triton specialized on), it
    launches nothing for a tensor that is not. `taking(positions)` makes one that also takes some int arguments anew
    (a decode step's key count and cache strides), each in the class Triton specialized the kept one on (int_class).
    Under the interpreter it is Triton's own launch with the same other arguments."""

    __slots__ = ("_classes", "_device", "_fresh", "_grid", "_kernel", "_kwargs", "_rest")

    def __init__(
        self, kernel: Any, grid: tuple[int, ...], device: int | None, rest: tuple, kwargs: dict, fresh: tuple = ()
    ) -> None:
        if not all(type(rest[p]) is int for p in fresh):
            raise TypeError(f"rl_kernel: Replay: the arguments at {fresh} are not all ints")
        self._kernel, self._device, self._rest, self._kwargs = kernel, device, rest, kwargs
        self._grid = grid if device is None else (*grid, 1, 1)[:3]
        self._fresh: tuple[int, ...] = tuple(fresh)
        self._classes = tuple(int_class(rest[p]) for p in fresh)

    def taking(self, positions: tuple[int, ...]) -> Replay:
        """This launch with the ints at `positions` of its non-tensor arguments passed anew by each call."""
        return Replay(self._kernel, self._grid, self._device, self._rest, self._kwargs, positions)

    def __call__(self, *tensors: torch.Tensor, ints: tuple[int, ...] = ()) -> bool:
        """Launch with these tensors (and the ints `taking` named, in its order); False, and nothing launched, where
        a pointer is not 16-byte aligned or an int is not of its kept class."""
        pointers = [t.data_ptr() for t in tensors]
        if any(p % 16 for p in pointers):
            return False
        rest = self._rest
        if self._fresh:
            if len(ints) != len(self._fresh) or tuple(map(int_class, ints)) != self._classes:
                return False
            rest = list(rest)
            for p, v in zip(self._fresh, ints, strict=True):
                rest[p] = v
        c = self._kernel
        if self._device is None:
            c[self._grid](*tensors, *rest, **self._kwargs)
        else:
            c.run(*self._grid, _stream_of()(self._device), c.function, c.packed_metadata, None, None, None, *pointers,
                  *rest)  # fmt: skip
        return True


def launch_replay(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> Replay | None:
    """launch(kernel, grid, *args, **kwargs), and its Replay where the launch can be replayed: kept (or the
    interpreter's), no hook, every tensor argument before the others and 16-byte aligned. Else None."""
    values = (*args, *(kwargs.get(n) for n in kernel.arg_names[len(args) :]))
    lead = next((i for i, v in enumerate(values) if not isinstance(v, torch.Tensor)), len(values))
    replayable = not _hooked(kernel) and not any(isinstance(v, torch.Tensor) for v in values[lead:])
    replayable = replayable and all(t.data_ptr() % 16 == 0 for t in values[:lead])
    if interpreting():
        kernel[grid](*args, **kwargs)
        return Replay(kernel, grid, None, args[lead:], kwargs) if replayable and lead <= len(args) else None
    kept = _launched(kernel, grid, args, kwargs)
    if kept is None or not replayable:
        return None
    compiled, flat, device = kept
    return Replay(compiled, grid, device, tuple(flat[lead:]), {})
