"""The mode's classes above aten (and mode_positions' base models, served and restored with them here).

The hand-written RMSNorms: a module class whose forward is Llama's RMSNorm, instruction for instruction, is
served by the tier's fused `rms_norm` for as long as rl_kernel.mode is on, as patch() serves it.

Why: Hugging Face writes its norms by hand (`pow`, `mean`, `rsqrt`, `mul`, casts), so at the aten level the mode sees
only their pieces and serves them op by op: on the H200 at the Qwen3-1.7B shape that cost the mode's training step
+24 ms of norm kernels and +56 ms of the decomposition's backward against patch()'s fused norm (docs/benchmarks.md,
2026-12-04 third session). Which classes: those whose `forward` compiles to the same code (instructions, names,
constants, locals) as llama_rms_norm below, with `torch` the torch module: transformers' Llama, Qwen2, Qwen3,
Qwen3-MoE, Mistral and Phi-3 norms copy Llama's, so that identity is their formula; Gemma's (1 + w) and OLMo 2's
order of the weight multiply differ and keep the op-by-op path. A call whose weight is not a vector of x's dtype takes
the class's own forward.

Classes are served when the mode starts and, for a class defined while it is on (a model module imported inside the
mode), when the class is created (nn.Module.__init_subclass__), so the same model class is served whichever came first:
a rollout process and a trainer process get the same bits. Everything is restored when the last mode exits.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import nn

from rl_kernel import tiers
from rl_kernel.aten import positions as mode_positions


def llama_rms_norm(self, hidden_states: torch.Tensor) -> torch.Tensor:  # transformers' code, verbatim
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)


_ORIGINAL: dict[type, Callable] = {}  # served class -> its own forward, while a mode is on
_HOOK = "__init_subclass__"


def _code(fn: types.FunctionType) -> tuple:
    c = fn.__code__
    return c.co_code, c.co_names, c.co_consts, c.co_varnames, c.co_argcount, c.co_kwonlyargcount


def is_llama_norm(cls: type) -> bool:
    """Whether cls defines a forward that is llama_rms_norm's code over the torch module."""
    forward = cls.__dict__.get("forward")
    return (
        isinstance(forward, types.FunctionType)
        and forward.__globals__.get("torch") is torch
        and _code(forward) == _code(llama_rms_norm)
    )


def _served_forward(tier: tiers.Tier, original: Callable) -> Callable:
    rms_norm = tier.op("rms_norm")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not isinstance(w, torch.Tensor) or w.dim() != 1 or w.dtype != hidden_states.dtype:
            return original(self, hidden_states)
        return rms_norm(hidden_states, w, self.variance_epsilon)

    forward._rl_kernel_mode_norm = tier.name  # what tests and locate read: served, by which tier
    return forward


def _serve(cls: type, tier: tiers.Tier) -> None:
    if cls in _ORIGINAL or not is_llama_norm(cls):
        return
    _ORIGINAL[cls] = cls.__dict__["forward"]
    cls.forward = _served_forward(tier, _ORIGINAL[cls])


def _serve_class(cls: type, tier: tiers.Tier) -> None:
    """Whatever the mode serves of a class above aten: a Llama-formula norm, a base model's positions."""
    _serve(cls, tier)
    mode_positions.serve_class(cls)


def _subclasses(root: type) -> set[type]:
    found, todo = set(), [root]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def serve(tier: tiers.Tier | None) -> None:
    """Every Llama-formula norm class served by `tier` (the innermost mode's), or all restored (None). The caller
    (aten_mode's enable / disable) holds its lock."""
    for cls, forward in _ORIGINAL.items():
        cls.forward = forward
    _ORIGINAL.clear()
    mode_positions.restore()
    if _HOOK in nn.Module.__dict__ and getattr(nn.Module.__dict__[_HOOK], "_rl_kernel_mode_norm", False):
        delattr(nn.Module, _HOOK)
    if tier is None:
        return
    for cls in _subclasses(nn.Module):
        _serve_class(cls, tier)
    if _HOOK in nn.Module.__dict__:  # someone else's hook: theirs stays, classes made later keep their own forward
        return

    def init_subclass(cls, **kwargs) -> None:
        super(nn.Module, cls).__init_subclass__(**kwargs)
        _serve_class(cls, tier)

    hook = classmethod(init_subclass)
    hook._rl_kernel_mode_norm = True
    setattr(nn.Module, _HOOK, hook)


def served(module: nn.Module) -> str | None:
    """The tier serving this module's norm under the mode, or None (its own forward runs)."""
    return getattr(type(module).forward, "_rl_kernel_mode_norm", None)
