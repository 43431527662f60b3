"""The engines workload's plumbing: an import string to a callable, what an engine returned against the
interface (workload.py's docstring), and the versions of the package a callable comes from. Every problem is a
message for Recorder.config_error (the matrix's fault, exit 3), never an exception the suite would report as a
crash."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
ROLLOUT_KEYS = ("tokens", "logprobs")
TRAIN_KEYS = ("logprobs",)
OPTIONAL_KEYS = ("logits_digest", "layer_digests")


class EngineConfigError(ValueError):
    """A parameter of the engines workload that cannot work: its message says why."""


def resolve(spec: Any) -> Callable:
    """`pkg.module:attr` (attr may be dotted: `pkg.module:Class.method`) -> the callable."""
    if not isinstance(spec, str) or not spec:
        raise EngineConfigError(f"must be an import string 'pkg.module:function', got {spec!r}")
    module, sep, attr = spec.partition(":")
    if not sep or not _DOTTED.match(module) or not _DOTTED.match(attr):
        raise EngineConfigError(f"{spec!r} is not an import string 'pkg.module:function'")
    try:
        obj: Any = importlib.import_module(module)
    except Exception as exc:  # the user's module: any failure on import is theirs to fix
        raise EngineConfigError(f"{spec!r}: module {module!r} does not import: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EngineConfigError(f"{spec!r}: {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EngineConfigError(f"{spec!r}: {attr!r} is a {type(obj).__name__}, not callable")
    return obj


def check(out: Any, role: str, shape: tuple[int, int, int]) -> list[str]:
    """What is wrong with an engine's return (role: "rollout" or "train") for a cell's shape [B, T, V]."""
    if not isinstance(out, dict):
        return [f"returned a {type(out).__name__}, not a dict"]
    required = ROLLOUT_KEYS if role == "rollout" else TRAIN_KEYS
    problems = [f"no key {k!r}" for k in required if k not in out]
    extra = sorted(set(out) - set(required) - set(OPTIONAL_KEYS))
    if extra:
        problems.append(f"unknown key(s) {', '.join(map(repr, extra))} (it returns {', '.join(required)}, "
                        f"optionally {', '.join(OPTIONAL_KEYS)})")  # fmt: skip
    want = (shape[0], shape[1])
    for key, dtype in (("tokens", torch.int64), ("logprobs", torch.float32)):
        if key not in required or key not in out:
            continue
        t = out[key]
        if not isinstance(t, torch.Tensor):
            problems.append(f"{key!r} is a {type(t).__name__}, not a tensor")
            continue
        if tuple(t.shape) != want or t.dtype != dtype:
            problems.append(f"{key!r} is {_describe(t)}, must be {_describe_want(dtype, want)}")
    if "logits_digest" in out and not isinstance(out["logits_digest"], str):
        problems.append(f"'logits_digest' is a {type(out['logits_digest']).__name__}, not a str")
    layers = out.get("layer_digests", {})
    if not isinstance(layers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in layers.items()):
        problems.append("'layer_digests' must be a dict of str names to str digests")
    return problems


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def _describe_want(dtype: torch.dtype, shape: tuple[int, int]) -> str:
    return f"{str(dtype).removeprefix('torch.')} {list(shape)} ([B, T] of the cell's shape)"


def package_of(fn: Callable, spec: str) -> dict[str, str]:
    """Where a callable comes from, for result.json: its import string, the distribution that installs its top-level
    module and that distribution's version ("" where the module is not installed as a distribution)."""
    module = spec.partition(":")[0]
    top = module.split(".")[0]
    dists = metadata.packages_distributions().get(top, [])
    found = {"callable": spec, "module_file": str(getattr(sys.modules.get(module), "__file__", "") or "")}
    if dists:
        found["distribution"] = dists[0]
        found["version"] = metadata.version(dists[0])
    else:
        found["distribution"], found["version"] = "", ""
    return found
