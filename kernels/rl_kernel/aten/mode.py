"""A tier for every module of a process, at the aten level: `rl_kernel.mode(tier)` (this module's `mode`).

`patch(model, tier=...)` swaps a Hugging Face model's layers for the tier's; it knows the families it was written
for. The mode reaches code that knows nothing of rl_kernel (an engine's own model classes, a plain PyTorch module):
for its duration the aten operators below are served by the tier's kernels through torch.library, in every thread
of the process (the dispatcher is process-wide), on the devices the tier has kernels for:

    with rl_kernel.mode("exact"):
        logits = model(ids)          # every mm / addmm / bmm / log_softmax the model runs is the tier's
        loss.backward()              # autograd's formulas call mm again: the tier's as well

Served now (SERVED): the matrix products (`mm`, `addmm` with beta = alpha = 1 and a bias over the columns, `bmm`;
`linear` and `matmul` decompose into them), `_log_softmax` with its backward, `_softmax` (over a row's nonzero
terms) with its backward, `scaled_dot_product_attention` as the tier's `attention` where the mask is a key range per
row (key_ranges), `rms_norm` (F.rms_norm, nn.RMSNorm) as the tier's fused `rms_norm` with its own backward, and the
embedding's weight gradient (`embedding_dense_backward`) as the tier's fixed-order sum;
and, in torch's own elementwise operators on every device whatever the tier: `sum` / `mean` as numerics.md section
2's plain-sum tree (tree_sum), `topk` with ties to the lower index (a router's experts) and `index_add` one add at a
time in source order (a mixture of experts' combine), LayerNorm and `logsumexp` by the tree; a mixture of experts'
`_grouped_mm` (transformers' default experts implementation) as the tier's product per expert
(mode_ops.grouped_mm: forward, dX and dW, each row the tier's linear whatever rows its expert got; the fast tier's in
one launch that reads nothing of offs on the host, and its `bmm`, transformers' batched_mm experts at decode, in one
launch too, each element its own product's bits).
Above the aten level, a hand-written norm whose forward is Llama's RMSNorm word for word (transformers'
Llama, Qwen2, Qwen3, Qwen3-MoE, Mistral, Phi-3) is the tier's fused `rms_norm` too (rl_kernel.aten.norms), as patch()
serves it. An mm is the tier's `linear` of the second operand's transpose (or the tier's own `mm`, the fast
tier's: its linear's forward, dX or dW kernel by the operands' layouts), so `F.linear` under the mode gives the tier's
`linear`'s bits, forward and dX / dW (autograd's dW = x^T dy is a chain over the rows in order, the
patch's products in the same order). A dtype the tier lacks is served by its fallback tier's kernels (the fast
tier's fp32 by the exact tier's); what no tier serves raises a ModeError naming the form (a scaled addmm, float64, a
device the tier lacks), never stock.

Nesting: an inner mode serves until it exits, then the outer one again; `enable(tier)` / `disable()` are the
pair for code that cannot be wrapped. Nothing stays registered after the last exit. What a mode's calls cannot check
without a host sync (a grouped GEMM's offs, which the fast tier's kernels check on the device) is reported when that
mode exits: a ModeError from disable() (mode_ops.Checks; one read, unless the block raised: its error is the one).

`audit(fn)` runs fn under the mode and names every aten operator it ran that the mode did not serve and that can
change bits with the batch (a reduction, a matrix product, an attention): what must still move to the tier before
the model is covered (docs/architecture.md, "The mode").
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rl_kernel import tiers
from rl_kernel.aten import norms as mode_norms
from rl_kernel.aten import positions as mode_positions
from rl_kernel.aten.masks import RangesMemo, key_ranges
from rl_kernel.aten.ops import (
    Checks,
    ModeError,
    bmm,
    grouped_mm,
    index_add,
    index_add_,
    index_put_server,
    layer_norm,
    layer_norm_backward,
    logsumexp,
    names_each_once,
    nonzero_sum,
    reduce,
    softmax,
    softmax_backward,
    tier_product,
    topk,
    tree_sum,
)
from rl_kernel.triton_tier import interpreting

__all__ = ["SERVED", "Audit", "ModeError", "active", "audit", "disable", "enable", "key_ranges", "mode",
           "nonzero_sum", "reduce", "softmax", "tree_sum"]  # fmt: skip

# aten operator -> the function serving it (below autograd: autograd's derivative formulas call these too).
SERVED = ("mm", "addmm", "bmm", "_log_softmax", "_log_softmax_backward_data", "_softmax", "_softmax_backward_data",
          "scaled_dot_product_attention", "embedding_dense_backward", "sum", "sum.dim_IntList", "mean", "mean.dim",
          "topk", "index_add", "index_add_", "_grouped_mm", "native_layer_norm",
          "native_layer_norm_backward", "logsumexp", "rms_norm", "index_put")  # fmt: skip
WITH_STOCK = {"index_put"}  # served on every device, over the stock kernel for calls with no order to fix
ABOVE_AUTOGRAD = {"scaled_dot_product_attention", "rms_norm"}  # composites: served with the tier's own autograd
# Defined in torch's own elementwise operators (the contract's tree, a stable order, one add at a time): any device.
EVERY_DEVICE = {
    "sum",
    "sum.dim_IntList",
    "mean",
    "mean.dim",
    "topk",
    "index_add",
    "index_add_",
    "native_layer_norm",
    "native_layer_norm_backward",
    "logsumexp",
}
_DEVICE_KEYS = {"cpu": "CPU", "cuda": "CUDA", "rocm": "CUDA"}  # ROCm's torch dispatches HIP tensors as CUDA
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Operators whose floating-point result can depend on how a batch is cut (they add in some order): what an audit
# names when the mode left them to stock. Matched on the operator's name, overload stripped; max / min / amax / amin
# and integer or boolean inputs are exact in any order.
BATCH_VARIANT = re.compile(
    r"^(mm|addmm|bmm|baddbmm|addbmm|addmv|mv|dot|vdot|matmul|linear|_?convolution|conv\w*|einsum|tensordot|"
    r"sum|nansum|mean|nanmean|prod|var|std|var_mean|std_mean|norm|linalg_vector_norm|"
    r"logsumexp|cumsum|cumprod|_softmax|_log_softmax|_softmax_backward_data|_log_softmax_backward_data|"
    r"native_layer_norm|native_layer_norm_backward|_fused_rms_norm|_fused_rms_norm_backward|native_group_norm|"
    r"native_batch_norm|_batch_norm\w*|embedding_dense_backward|index_add|scatter_add|scatter_reduce|"
    r"index_reduce|_scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*|topk|sort|kthvalue|"
    r"_?grouped_mm|_scaled_grouped_mm|_scaled_mm|_int_mm)$"
)
ACCUMULATING = {"index_put", "index_put_", "_index_put_impl_"}  # batch-variant only with accumulate=True


@dataclass
class _Active:
    tier: tiers.Tier
    library: torch.library.Library
    checks: Checks  # what its calls deferred to its exit (mode_ops.Checks)


_LOCK = threading.Lock()
_STACK: list[_Active] = []


def active() -> str | None:
    """The tier the mode serves now (the innermost), or None."""
    with _LOCK:
        return _STACK[-1].tier.name if _STACK else None


@contextlib.contextmanager
def mode(tier: str | tiers.Tier = "exact") -> Iterator[None]:
    """The tier's kernels for SERVED's aten operators, in the whole process, until the block exits (then a ModeError
    for what its calls deferred: disable()); an exception from the block is the one raised."""
    enable(tier)
    try:
        yield
    except BaseException:
        _pop()  # the block's own error, not the deferred checks', is what the caller must see
        raise
    disable()


def enable(tier: str | tiers.Tier = "exact") -> None:
    """Start serving SERVED's operators by `tier` (over any mode already on) until the matching disable()."""
    t = tiers.resolve(tier)
    library = torch.library.Library("aten", "IMPL")  # a process-wide override is the point
    checks = Checks()
    # Triton's interpreter runs a Triton tier's kernels on the CPU: the mode serves it there too (the tests' way).
    platforms = (*t.platforms, "cpu") if interpreting() and "triton" in t.build else t.platforms
    with warnings.catch_warnings():  # torch warns that a registered kernel is overridden: that is the intent
        warnings.simplefilter("ignore")
        served = _served(t, checks)
        for key in sorted(set(_DEVICE_KEYS.values())):
            mine = any(_DEVICE_KEYS[p] == key for p in platforms)
            for name, serve in served.items():
                keys = (key, f"Autograd{key}") if name in ABOVE_AUTOGRAD else (key,)
                for k in keys:
                    if name in WITH_STOCK:  # a server that leaves some calls to the stock kernel it replaces
                        library.impl(name, serve(torch.library.get_kernel(f"aten::{name}", k)), k, with_keyset=True)
                    else:
                        library.impl(name, serve if mine or name in EVERY_DEVICE else _refuse(t, name, key), k)
    with _LOCK:
        if not _STACK:
            _hold_compiles()
        _STACK.append(_Active(t, library, checks))
        mode_norms.serve(t)


def disable() -> None:
    """Stop the innermost mode (the one before it serves again); an error when none is on. Then a ModeError for the
    problems its calls deferred to this exit (a grouped GEMM's bad offs, checked on the device: read here, once)."""
    problems = _pop().checks.problems()
    if problems:
        raise ModeError(f"rl_kernel.mode: {'; '.join(problems)} (found while the mode served; reported at its exit)")


def _pop() -> _Active:
    with _LOCK:
        if not _STACK:
            raise ModeError("rl_kernel.mode: disable() without an enabled mode")
        top = _STACK.pop()
        mode_norms.serve(_STACK[-1].tier if _STACK else None)
        if not _STACK:
            _release_compiles()
    top.library._destroy()
    return top


# torch.compile under the mode: inductor lowers aten's operators to kernels of its own (its GEMMs, fused reductions),
# below the dispatcher the mode serves at, so a compiled model would run stock arithmetic, or fail on the served
# operators' strides (an AssertionError from the compiled code). While a mode is on, compiled functions run eagerly
# (torch.compiler's force_eager stance): every operator reaches the mode. For a compiled rollout, patch() the model.
_SAVED_STANCE: list = []


def _hold_compiles() -> None:
    from torch._dynamo import eval_frame

    _SAVED_STANCE.append(eval_frame._stance)
    torch.compiler.set_stance("force_eager")


def _release_compiles() -> None:
    saved = _SAVED_STANCE.pop()
    torch.compiler.set_stance(saved.stance, skip_guard_eval_unsafe=saved.skip_guard_eval_unsafe,
                              force_backend=saved.backend)  # fmt: skip


def _embedding_grad(t: tiers.Tier) -> Callable:
    """The weight gradient behind the tier's `embedding` (its module's embedding_grad: the exact tier's fixed-order
    sum, the fast tier's through its fallback)."""
    import importlib

    embedding = t.op("embedding")
    return importlib.import_module(embedding.__module__).embedding_grad


def _refuse(t: tiers.Tier, op: str, key: str) -> Callable:
    def refuse(*_args, **_kwargs):
        raise ModeError(f"rl_kernel.mode({t.name!r}): aten::{op} on {key.lower()}: the {t.name} tier runs on "
                        f"{', '.join(t.platforms)}")  # fmt: skip

    return refuse


# ---- the operators, in the tier's kernels ------------------------------------------------------------------
def _served(t: tiers.Tier, checks: Checks) -> dict[str, Callable]:
    """The tier's servers, and for the dtypes it lacks its fallback's (the fast tier has bf16 and fp16: a bf16
    model's fp32 rotary frequencies are the exact tier's products), as its operators fall back (rl_kernel.tiers);
    checks: the mode's, which they defer to its exit."""
    own = _servers(t, checks)
    if not t.fallback:
        return own
    below, mine = _served(t.below(), checks), {_DTYPES[d] for d in t.dtypes}
    return {name: by_dtype(mine, serve, below[name]) for name, serve in own.items()}


def by_dtype(mine: set[torch.dtype], own: Callable, below: Callable) -> Callable:
    """own for a call whose floating-point tensor arguments are all of `mine`, below for any other."""

    def serve(*args, **kwargs):
        floats = [a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        return (own if all(d in mine for d in floats) else below)(*args, **kwargs)

    return serve


def _servers(t: tiers.Tier, checks: Checks) -> dict[str, Callable]:
    linear, log_softmax, log_softmax_backward = t.op("linear"), t.op("log_softmax"), t.op("log_softmax_backward")
    embedding_grad = _embedding_grad(t)
    dtypes = {_DTYPES[d] for d in t.dtypes}

    def check(op: str, *tensors: torch.Tensor) -> None:
        for x in tensors:
            if x.dtype not in dtypes:
                raise ModeError(f"rl_kernel.mode({t.name!r}): aten::{op} in {x.dtype}: the {t.name} tier has "
                                f"{', '.join(t.dtypes)}")  # fmt: skip

    # A tier with its own `mm` picks the linear's forward / dX / dW kernel by the operands' layouts (the fast
    # tier: patch's bits, no transposed copies); else every product is the tier's linear of b's transpose.
    product = tier_product(linear, t.op("mm") if "mm" in t.all_operators() else None)
    # Every expert (bmm: every element) in one launch, no host read of offs (their check deferred to `checks`).
    own_grouped = t.op("grouped_mm") if "grouped_mm" in t.all_operators() else None

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check("mm", a, b)
        return product(a, b)

    def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
        check("addmm", bias, a, b)
        if beta != 1 or alpha != 1:
            raise ModeError(f"rl_kernel.mode({t.name!r}): aten::addmm with beta={beta}, alpha={alpha}: only "
                            "bias + a @ b (beta = alpha = 1) is a linear")  # fmt: skip
        if bias.dim() == 2 and bias.shape[0] == 1:
            bias = bias[0]
        if bias.dim() != 1 or bias.shape[0] != b.shape[1]:
            raise ModeError(f"rl_kernel.mode({t.name!r}): aten::addmm with a bias of shape {tuple(bias.shape)}: "
                            f"only a bias over the {b.shape[1]} columns is a linear's")  # fmt: skip
        return product(a, b, bias.contiguous())

    def _grouped_mm(a, b, offs=None, bias=None, out_dtype=None) -> torch.Tensor:
        check("_grouped_mm", a, b)
        if bias is not None or out_dtype not in (None, a.dtype):
            raise ModeError(f"rl_kernel.mode({t.name!r}): aten::_grouped_mm with a bias or out_dtype={out_dtype}: "
                            "the tier's products take neither (add a bias after, in their dtype)")  # fmt: skip
        return grouped_mm(a, b, offs, product, own_grouped, checks)

    def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        check("bmm", a, b)
        return bmm(a, b, product, own_grouped)

    def _log_softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
        check("_log_softmax", x)
        with torch.no_grad():
            out = log_softmax(x, dim)  # fp32, the contract's
        return out if half_to_float else out.to(x.dtype)

    def _log_softmax_backward_data(grad: torch.Tensor, out: torch.Tensor, dim: int, input_dtype) -> torch.Tensor:
        check("_log_softmax_backward_data", grad, out)
        with torch.no_grad():
            return log_softmax_backward(grad, out.float(), dim, input_dtype)

    def embedding_dense_backward(grad, ids, num_weights: int, padding_idx: int, scale_grad_by_freq: bool):
        check("embedding_dense_backward", grad)
        if scale_grad_by_freq:
            raise ModeError(f"rl_kernel.mode({t.name!r}): embedding backward with scale_grad_by_freq: the tier's "
                            "embedding gradient sums each token's positions unscaled")  # fmt: skip
        shape = torch.Size((num_weights, grad.shape[-1]))
        return embedding_grad(ids, grad, shape, None if padding_idx < 0 else padding_idx)

    def _softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
        check("_softmax", x)
        with torch.no_grad():
            out = softmax(x.float().movedim(dim, -1)).movedim(-1, dim)
        return out if half_to_float else out.to(x.dtype)

    def _softmax_backward_data(grad: torch.Tensor, out: torch.Tensor, dim: int, input_dtype) -> torch.Tensor:
        check("_softmax_backward_data", grad, out)
        with torch.no_grad():
            return softmax_backward(grad, out, dim, input_dtype)

    served = {"mm": mm, "addmm": addmm, "bmm": _bmm, "_log_softmax": _log_softmax,
              "_log_softmax_backward_data": _log_softmax_backward_data, "_softmax": _softmax,
              "_softmax_backward_data": _softmax_backward_data, "topk": topk,
              "index_add": functools.partial(index_add, checks=checks),
              "index_add_": functools.partial(index_add_, checks=checks),
              "index_put": functools.partial(index_put_server, checks=checks),
              "_grouped_mm": _grouped_mm, "native_layer_norm": layer_norm,
              "native_layer_norm_backward": layer_norm_backward, "logsumexp": logsumexp,
              "scaled_dot_product_attention": _sdpa_server(t, check),
              "rms_norm": _rms_norm_server(t, check),
              "embedding_dense_backward": embedding_dense_backward,
              "sum": lambda x, *, dtype=None: reduce(x, None, False, dtype, mean=False),
              "sum.dim_IntList": lambda x, dim, keepdim=False, *, dtype=None: reduce(x, dim, keepdim, dtype, False),
              "mean": lambda x, *, dtype=None: reduce(x, None, False, dtype, mean=True),
              "mean.dim": lambda x, dim, keepdim=False, *, dtype=None: reduce(x, dim, keepdim, dtype, True),
              }  # fmt: skip
    assert set(served) == set(SERVED)
    return served


# ---- attention: SDPA is a composite above autograd, so it is served at the autograd keys (and the backend keys,
# for inference mode) by the tier's attention, whose own autograd differentiates it -------------------------------
def _sdpa_server(t: tiers.Tier, check: Callable) -> Callable:
    attention = t.op("attention")
    windowed = "window" in inspect.signature(attention).parameters  # a third tier's attention may have none
    memo = RangesMemo()  # the mode's: one mask per forward, read by its first layer

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        check("scaled_dot_product_attention", q, k, v)
        if dropout_p:
            raise ModeError(f"rl_kernel.mode({t.name!r}): scaled_dot_product_attention with dropout_p={dropout_p}: "
                            "dropout draws from torch's generator, not the tier's")  # fmt: skip
        if q.dim() != 4:
            raise ModeError(f"rl_kernel.mode({t.name!r}): scaled_dot_product_attention on {q.dim()}-d q: the tier "
                            "takes [batch, heads, len, head_dim]")  # fmt: skip
        q_pos, k_start, window = memo.key_ranges(q, k, attn_mask, is_causal, t.name)
        if not window:
            return attention(q, k, v, q_pos, k_start, scale)
        if not windowed:
            raise ModeError(f"rl_kernel.mode({t.name!r}): scaled_dot_product_attention with a sliding window of "
                            f"{window} keys: the {t.name} tier's attention has no window")  # fmt: skip
        return attention(q, k, v, q_pos, k_start, scale, window=window)

    return sdpa


# ---- RMSNorm: F.rms_norm / nn.RMSNorm (torchtitan's, an engine's) is a composite too; torch's formula is the tier's
# (x * rsqrt(mean(x^2) + eps)) in fp32, rounded to x's dtype, times the weight in x's dtype), so the tier's fused
# kernel and its own backward serve it. A hand-written RMSNorm (Hugging Face's) reaches the mode as its ops instead.
def _rms_norm_server(t: tiers.Tier, check: Callable) -> Callable:
    rms_norm = t.op("rms_norm")

    def serve(x, normalized_shape, weight=None, eps=None):
        check("rms_norm", x)
        if len(normalized_shape) != 1 or normalized_shape[0] != x.shape[-1]:
            raise ModeError(f"rl_kernel.mode({t.name!r}): rms_norm over {list(normalized_shape)} of a "
                            f"{tuple(x.shape)} input: the tier normalises the last dimension only")  # fmt: skip
        if weight is None:
            weight = x.new_ones(x.shape[-1])  # times 1: exact
        elif weight.dtype != x.dtype:
            raise ModeError(f"rl_kernel.mode({t.name!r}): rms_norm of {x.dtype} with a {weight.dtype} weight: the "
                            "tier multiplies in the input's dtype (keep the norm's weight in it)")  # fmt: skip
        return rms_norm(x, weight, torch.finfo(x.dtype).eps if eps is None else eps)

    return serve


# ---- the audit: what a model still leaves to stock ---------------------------------------------------------
@dataclass
class Audit:
    """Every aten operator a call ran under the mode, by name: served by the tier, left to stock though it can
    change bits with the batch (`unserved`: the model is not covered while this is non-empty), or other (views,
    elementwise arithmetic: no reduction order to fix)."""

    tier: str
    served: Counter = field(default_factory=Counter)
    unserved: Counter = field(default_factory=Counter)
    other: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)  # above aten: a forward generate() would not compute so

    @property
    def covered(self) -> bool:
        return not self.unserved and not self.calls

    def summary(self) -> str:
        if self.covered:
            return f"mode({self.tier!r}) covers it: {sum(self.served.values())} served calls, none left to stock"
        named = [f"aten::{n} x{c}" for n, c in self.unserved.most_common()]
        named += [f"{n} x{c} ({mode_positions.FIX})" for n, c in self.calls.most_common()]
        return f"mode({self.tier!r}) leaves to stock, batch-variant: {', '.join(named)}"


class _Recorder(TorchDispatchMode):
    def __init__(self, audit: Audit) -> None:
        super().__init__()
        self.audit = audit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name.startswith("rl_kernel"):  # a tier's own operator (the patch's layers, an attention the mode serves)
            self.audit.served[name] += 1
        out = func(*args, **(kwargs or {}))
        if name.startswith("aten::"):
            op = name[len("aten::") :]
            getattr(self.audit, _kind(op, args, kwargs or {}, out))[op] += 1
        return out


def _kind(op: str, args: tuple, kwargs: dict, out) -> str:
    """served, unserved (a float computation whose order can follow the batch, left to stock) or other."""
    if op in SERVED:
        return "served"
    floats = any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args)
    results = out if isinstance(out, (tuple, list)) else (out,)
    float_out = any(isinstance(r, torch.Tensor) and r.is_floating_point() for r in results)
    if op in ACCUMULATING:  # index_put(..., accumulate=True): a scatter-add, exact when it names no element twice
        accumulate = kwargs.get("accumulate", args[3] if len(args) > 3 else False)
        return "unserved" if floats and accumulate and not names_each_once(args[1]) else "other"
    # A count's cumsum into integers, a sort of integer ids: exact in any order.
    return "unserved" if floats and float_out and BATCH_VARIANT.match(op) else "other"


def audit(fn: Callable[[], object], tier: str | tiers.Tier = "exact") -> Audit:
    """Run fn (a forward and backward, say) under mode(tier) and record every aten operator it runs."""
    t = tiers.resolve(tier)
    found = Audit(t.name)
    with mode(t), _Recorder(found):
        mode_positions.RECORDING.append(found.calls)
        try:
            fn()
        finally:
            mode_positions.RECORDING.pop()
    return found
