"""The mode's hand-written norms (rl_kernel.aten.norms): transformers' norms that are Llama's formula word for word are
the tier's fused rms_norm under the mode (patch()'s bits), the others keep their own forward; a class defined inside
the mode is served as well; nothing stays after the last exit."""

from __future__ import annotations

import importlib
import types

import pytest
import torch
from torch import nn

from rl_kernel import models
from rl_kernel.aten import mode as aten_mode
from rl_kernel.aten import norms as mode_norms
from rl_kernel.exact.decoder.ops import rms_norm as exact_rms_norm

LLAMA_FORMULA = ("llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "phi3")
OTHER_FORMULA = ("gemma", "gemma2", "gemma3", "olmo2")


def _norm_class(family: str) -> type:
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    (cls,) = [c for n, c in vars(module).items() if n.endswith("RMSNorm") and isinstance(c, type)]
    return cls


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("family", LLAMA_FORMULA + OTHER_FORMULA)
def test_which_of_transformers_norms_are_llamas_formula(family: str) -> None:
    assert mode_norms.is_llama_norm(_norm_class(family)) == (family in LLAMA_FORMULA)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_models_norms_are_the_tiers_under_the_mode_and_their_own_after(family: str, dtype: str) -> None:
    model = models.tiny_model(family, 97, dtype=dtype)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(5, n.weight.shape[0], generator=g).to(n.weight.dtype) for n in norms]  # q/k norms: head dim
    own = [n(x) for n, x in zip(norms, xs, strict=True)]
    with aten_mode.mode("exact"):
        assert all(mode_norms.served(n) == "exact" for n in norms)
        got = [n(x) for n, x in zip(norms, xs, strict=True)]
        by_ops = [mode_norms.llama_rms_norm(n, x) for n, x in zip(norms, xs, strict=True)]  # op by op, as before
    want = [exact_rms_norm(x, n.weight, n.variance_epsilon) for n, x in zip(norms, xs, strict=True)]
    assert all(torch.equal(_bits(a), _bits(w)) for a, w in zip(got, want, strict=True))
    if dtype == "fp32":  # the control: op by op the formula has other bits (torch's rsqrt is not the contract's;
        # in bf16 the output's rounding can hide that on a sample this small)
        assert not all(torch.equal(_bits(b), _bits(w)) for b, w in zip(by_ops, want, strict=True))
    assert all(mode_norms.served(n) is None for n in norms)
    assert all(torch.equal(_bits(n(x)), _bits(o)) for n, x, o in zip(norms, xs, own, strict=True))


def _with_keepdim_false(fn: types.FunctionType) -> types.FunctionType:
    """fn with its one True constant (mean's keepdim) turned False: Llama's formula but for one constant."""
    consts = tuple(False if c is True else c for c in fn.__code__.co_consts)
    return types.FunctionType(fn.__code__.replace(co_consts=consts), fn.__globals__, fn.__name__)


def _norm_type(name: str, forward: types.FunctionType = mode_norms.llama_rms_norm) -> type:
    """A norm class made in the test (as an engine's own would be), with the given forward."""

    def __init__(self, n: int) -> None:
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.full((n,), 1.5))
        self.variance_epsilon = 1e-6

    return type(name, (nn.Module,), {"__init__": __init__, "forward": forward})


def test_a_class_made_inside_the_mode_is_served_and_a_changed_formula_is_not() -> None:
    with aten_mode.mode("exact"):
        same = _norm_type("SameNorm")(8)
        changed = _norm_type("ChangedNorm", _with_keepdim_false(mode_norms.llama_rms_norm))(8)
        assert mode_norms.served(same) == "exact" and mode_norms.served(changed) is None
        x = torch.randn(8)  # a vector: keepdim=False broadcasts the same, so the changed one still runs
        assert torch.equal(_bits(same(x)), _bits(exact_rms_norm(x, same.weight, same.variance_epsilon)))
        assert changed(x).shape == (8,)
    assert mode_norms.served(same) is None and "__init_subclass__" not in nn.Module.__dict__
    late = _norm_type("LateNorm")(8)  # made after the mode: its own forward
    assert mode_norms.served(late) is None


def test_a_weight_of_another_dtype_keeps_the_classes_own_forward() -> None:
    norm = _norm_class("qwen3")(16)  # fp32 weight
    x = torch.randn(3, 16).to(torch.bfloat16)
    with aten_mode.mode("exact"):
        assert mode_norms.served(norm) == "exact"
        got = norm(x)  # promoted as the class computes it: fp32 weight times a bf16 row
    assert got.dtype == torch.float32


def test_nested_modes_keep_the_norms_served_until_the_last_exit() -> None:
    cls = _norm_class("llama")
    own = cls.__dict__["forward"]
    with aten_mode.mode("exact"):
        with aten_mode.mode("exact"):
            assert cls.__dict__["forward"] is not own
        assert cls.__dict__["forward"] is not own and mode_norms.served(cls(4)) == "exact"
    assert cls.__dict__["forward"] is own


def test_anothers_subclass_hook_is_kept() -> None:
    """A hook on nn.Module's subclass creation that is not the mode's stays: the mode leaves it and the classes made
    under it alone (their bits do not depend on who hooked first)."""
    calls = []
    nn.Module.__init_subclass__ = classmethod(lambda cls, **kw: calls.append(cls.__name__))
    try:
        with aten_mode.mode("exact"):
            made = _norm_type("HookedNorm")(4)
            assert mode_norms.served(made) is None and calls == ["HookedNorm"]
        assert "__init_subclass__" in nn.Module.__dict__
    finally:
        del nn.Module.__init_subclass__
