"""The aten operators rl_kernel.mode defines itself, in torch's own elementwise operators, so that they give the same
bits on every device whatever the tier: numerics.md section 2's plain-sum tree (tree_sum, reduce: sum and mean),
softmax and logsumexp over a row's nonzero terms, LayerNorm by the tree, topk with ties to the lower index and
index_add one add at a time in source order. rl_kernel.aten.mode registers them (docs/architecture.md, "The mode")."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from rl_kernel._validate import clamped_groups
from rl_kernel.exact.common.tree import tree_adds
from rl_kernel.triton_tier import interpreting


# The Triton kernels of this module's references are imported where one can take the tensor (a GPU tensor, or any
# under Triton's interpreter), not above: Triton's import is 0.17 s of the start of every process that imports
# rl_kernel, most of which never launch a kernel. (An import statement, not importlib: dynamo traces it.)
def _mode_segments(out: torch.Tensor, dim: int) -> ModuleType | None:
    if not (out.is_cuda or interpreting()):
        return None
    from rl_kernel.aten import segments

    return segments if segments.available(out, dim) else None


def _mode_tree(x: torch.Tensor) -> ModuleType | None:
    if not (x.is_cuda or interpreting()):
        return None
    from rl_kernel.aten import tree

    return tree if tree.available(x) else None


class ModeError(ValueError):
    """An operator the mode cannot serve exactly, named with the reason."""


# ---- selections and scattered adds: one defined order, in torch's own operators (every device) -----------------
def topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """aten::topk with ties broken by the lower index (a stable sort): the k picked and their order are a function
    of the row alone, on every device (a router's experts, a sampler's top-k)."""
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k).contiguous(), indices.narrow(dim, 0, k).contiguous()


def index_add(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, alpha=1,
              checks: Checks | None = None) -> torch.Tensor:  # fmt: skip
    """aten::index_add: out = x, then each slice of `source` added to its row of out in source order, one add at a
    time (a row named twice gets its first slice, then its second): torch's CUDA kernel adds duplicates atomically,
    in any order. Rounds each add to x's dtype, as torch's does."""
    return index_add_(x.clone(), dim, index, source, alpha=alpha, checks=checks)


def index_add_(out: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, alpha=1,
               checks: Checks | None = None) -> torch.Tensor:  # fmt: skip
    """index_add in place. On a GPU (mode_segments: over dim 0, one launch, no host read; an index outside out's
    rows adds nothing and, with `checks` (the mode's), is reported at the mode's exit, without them raises at
    once); else passes of rows named once each, written back by index_copy_ (not index_add_, which the mode serves:
    the pass would call itself). Both are the same adds in the same order."""
    if index.numel() == 0:
        return out
    src = (source if alpha == 1 else source * alpha).to(out.dtype)
    segments = _mode_segments(out, dim)
    if segments is not None:
        problem = _OUTSIDE.format(rows=out.shape[0])
        fresh = checks is None
        flag = torch.zeros(1, dtype=torch.int32, device=out.device) if fresh else checks.flag(out.device, problem)
        segments.index_add_(out, index, src, flag)
        if fresh and flag.item():  # a host read, where no mode defers the check
            raise ModeError(f"rl_kernel.mode: {problem}")
        return out
    index = index.reshape(-1)
    order = torch.sort(index, stable=True)
    sorted_idx, pos = order.values, order.indices
    first = torch.ones_like(sorted_idx, dtype=torch.bool)
    first[1:] = sorted_idx[1:] != sorted_idx[:-1]
    start = torch.cummax(torch.where(first, torch.arange(len(first), device=index.device), 0), 0).values
    rank = torch.empty_like(pos)
    rank[pos] = torch.arange(len(pos), device=index.device) - start  # which occurrence of its row each slice is
    for r in range(int(rank.max()) + 1):  # one pass per occurrence: no row twice in a pass
        take = (rank == r).nonzero().squeeze(1)
        rows = index[take]
        out.index_copy_(dim, rows, out.index_select(dim, rows) + src.index_select(dim, take))
    return out


_OUTSIDE = "aten::index_add (or an accumulating index_put) with an index outside the {rows} rows"


# ---- LayerNorm: its statistics by the tree, in fp32, rounded once -----------------------------------------------
def _rows(x: torch.Tensor, normalized_shape) -> torch.Tensor:
    """x as fp32 rows [..., n] over its last len(normalized_shape) dims."""
    return x.float().reshape(*x.shape[: x.dim() - len(normalized_shape)], -1)


def _norm_stats(rows: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    n = rows.shape[-1]
    mean = tree_sum(rows) / n
    var = tree_sum((rows - mean[..., None]) ** 2) / n
    return mean, torch.rsqrt(var + eps)


def layer_norm(x: torch.Tensor, normalized_shape, weight, bias, eps: float):
    """aten::native_layer_norm: mean and variance (of x - mean) by tree_sum in fp32, rstd = rsqrt(var + eps), the
    output (x - mean) * rstd * w + b in fp32, rounded once. mean and rstd come back in fp32, unrounded, for the
    backward."""
    rows = _rows(x, normalized_shape)
    mean, rstd = _norm_stats(rows, eps)
    out = (rows - mean[..., None]) * rstd[..., None]
    if weight is not None:
        out = out * weight.float().reshape(-1)
    if bias is not None:
        out = out + bias.float().reshape(-1)
    stat_shape = (*x.shape[: x.dim() - len(normalized_shape)], *([1] * len(normalized_shape)))
    return out.reshape(x.shape).to(x.dtype), mean.reshape(stat_shape), rstd.reshape(stat_shape)


def layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """aten::native_layer_norm_backward in fp32 with the tree's sums: dx = rstd (g - mean(g) - xhat mean(g xhat)) with
    g = dy w (a row alone, whatever the batch), dw = the sum over rows of dy xhat, db = that of dy (each one tree over
    the rows in order); rounded once each."""
    rows = _rows(x, normalized_shape)
    m, r = mean.float().reshape(rows.shape[:-1]), rstd.float().reshape(rows.shape[:-1])  # as the forward saved them
    xhat = (rows - m[..., None]) * r[..., None]
    dy = _rows(grad, normalized_shape)
    n = rows.shape[-1]
    dx = dw = db = None
    if output_mask[0]:
        g = dy * weight.float().reshape(-1) if weight is not None else dy
        dx = r[..., None] * (g - (tree_sum(g) / n)[..., None] - xhat * (tree_sum(g * xhat) / n)[..., None])
        dx = dx.reshape(x.shape).to(x.dtype)
    flat = dy.reshape(-1, n)
    if output_mask[1] and weight is not None:
        dw = tree_sum(flat * xhat.reshape(-1, n), 0).reshape(weight.shape).to(weight.dtype)
    if output_mask[2] and bias is not None:
        db = tree_sum(flat, 0).reshape(bias.shape).to(bias.dtype)
    return dx, dw, db


# ---- softmax: a row's nonzero terms, summed by the tree ----------------------------------------------------------
def nonzero_sum(terms: torch.Tensor) -> torch.Tensor:
    """[..., n] -> [...]: tree_sum of the row's nonzero terms, moved to the front in order. A zero adds nothing, but
    where it stands moves the tree's pairs: a row with masked (zero) terms before its real ones, as eager
    attention's rows in a left-padded batch, sums like the same row unpadded."""
    order = torch.sort((terms == 0).to(torch.int8), dim=-1, stable=True).indices
    return tree_sum(terms.gather(-1, order))


def softmax(x: torch.Tensor) -> torch.Tensor:
    """fp32 softmax over the last dim: exp(x - max) / the nonzero_sum of those terms (a masked key's exp is 0, so
    padding before a row's keys changes no bit); a row of -inf or NaN gives NaN, as torch's."""
    m = x.amax(-1, keepdim=True)
    e = torch.exp(x - m)
    return e / nonzero_sum(e).unsqueeze(-1)


def softmax_backward(grad: torch.Tensor, out: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """softmax's gradient y * (g - sum(g * y)) in fp32, the row's sum over its nonzero terms (nonzero_sum), rounded
    once to dtype."""
    g, y = grad.float().movedim(dim, -1), out.float().movedim(dim, -1)
    dot = nonzero_sum(g * y).unsqueeze(-1)
    return (y * (g - dot)).movedim(-1, dim).to(dtype)


def logsumexp(x: torch.Tensor, dim, keepdim: bool = False) -> torch.Tensor:
    """aten::logsumexp over `dim` in fp32: max + log of the nonzero_sum of exp(x - max) over the reduced elements in
    row-major order, rounded once (a row of -inf gives -inf, one with +inf gives +inf, as torch's)."""
    dims = sorted({d % max(x.dim(), 1) for d in dim}) if dim else list(range(x.dim()))
    kept = [d for d in range(x.dim()) if d not in dims]
    rows = x.float().permute(*kept, *dims).reshape(*[x.shape[d] for d in kept], -1)
    m = rows.amax(-1, keepdim=True)
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    out = torch.log(nonzero_sum(torch.exp(rows - shift))) + shift.squeeze(-1)
    if keepdim:
        for d in dims:
            out = out.unsqueeze(d)
    return out.to(x.dtype if x.is_floating_point() else torch.get_default_dtype())


# ---- sums and means: numerics.md section 2's tree (the plain sum), in elementwise adds every device does alike ----
def tree_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x's sums over `dim` (the last or the first) in section 2's order: chunks of 8 (the last padded with +0) summed
    pairwise, then one perfect binary tree over the chunk index whose nodes past the row are 0 (contract.row_sum).
    Only elementwise adds, in x's dtype: the same bits on every device, each row alone. The row is padded with +0 to
    a power of two of chunks once, so each level of the tree is one add of neighbouring pairs (log2(n) kernels on a
    GPU): a pair with a node past the row adds +0, as the contract's empty node does. Over the first dim (a weight's
    gradient summed over the tokens) the pairs are whole rows: the same adds, contiguous and without a transpose.
    An fp32 x on a GPU takes mode_tree's Triton kernel of the same tree (this is its reference)."""
    if dim not in (0, -1, x.dim() - 1):
        raise ValueError(f"tree_sum: dim must be the first or the last, got {dim} of a {x.dim()}-d tensor")
    first = dim == 0 and x.dim() > 1
    n = x.shape[0] if first else x.shape[-1]
    if n == 0:
        return x.new_zeros(x.shape[1:] if first else x.shape[:-1])
    kernels = _mode_tree(x) if x.dtype == torch.float32 else None
    if kernels is not None:  # the same tree in a few launches (a GPU)
        return kernels.tree_sum(x, first)
    return tree_adds(x, first)


def _tree(rows: torch.Tensor, dim: int) -> torch.Tensor:
    """tree_sum of rows in the accumulating type, or mode_tree's kernel of bf16 / fp16 rows (reduce leaves them
    unwidened only where the kernel reads them: it widens as it reads)."""
    if rows.dtype in (torch.bfloat16, torch.float16):  # reduce kept them so: _mode_tree took them
        return _mode_tree(rows).tree_sum(rows, dim == 0 and rows.dim() > 1)
    return tree_sum(rows, dim)


def reduce(x: torch.Tensor, dim, keepdim: bool, dtype, mean: bool) -> torch.Tensor:
    """aten's sum / mean over `dim` (None or []: every dim) by tree_sum over the reduced elements in row-major order:
    floating inputs added in fp32 (fp64 in fp64) and rounded once to the result's dtype, integers in int64 (exact in
    any order), the mean a true division by the count."""
    if x.is_complex():
        raise ModeError("rl_kernel.mode: a sum or mean of complex numbers has no contract")
    floating = x.is_floating_point()
    if mean and not floating and dtype is None:
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be floating point, got {x.dtype}")
    out_dtype = dtype or (x.dtype if floating else torch.int64)
    acc = torch.float64 if torch.float64 in (x.dtype, dtype) else torch.float32 if floating or mean else torch.int64
    dims = sorted({d % max(x.dim(), 1) for d in dim}) if dim else list(range(x.dim()))
    kept = [d for d in range(x.dim()) if d not in dims]
    # the kernel reads bf16 / fp16 as fp32 itself (exactly): no widened copy
    x = x if acc == torch.float32 and x.numel() and _mode_tree(x) is not None else x.to(acc)
    if kept and dims == list(range(len(dims))):  # the leading dims (a weight's gradient over the tokens): no transpose
        rows = x.reshape(-1, *[x.shape[d] for d in kept])
        out, count = _tree(rows, 0), rows.shape[0]
    else:
        rows = x.permute(*kept, *dims).reshape(*[x.shape[d] for d in kept], -1) if x.dim() else x[None]
        out, count = _tree(rows, -1), rows.shape[-1]
    if mean:
        out = out / count
    if keepdim:
        for d in dims:
            out = out.unsqueeze(d)
    return out.to(out_dtype)


# ---- a mixture of experts' grouped GEMM ----------------------------------------------------------------------------
Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def tier_product(linear: Callable, mm: Callable | None) -> Product:
    """A tier's a [M, K] @ b [K, N] (+ bias [N]) below autograd: its own `mm` where it has one (the fast tier picks
    the linear's forward, dX or dW kernel by the operands' layouts: the patch's bits, no transposed copies), else its
    linear of b's transpose."""

    def product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():  # below autograd: the callers' formulas differentiate the product
            return mm(a, b, bias) if mm else linear(a, b.t().contiguous(), bias)

    return product


class Checks:
    """The checks a mode defers to its exit: a grouped GEMM's offs, which the fast tier's kernels check on the device
    (a flag per problem and device, set by the kernel: no host read, so no sync, per call), read once when the mode
    exits; and the problems a tier's host loop found (it reads offs anyway), reported then as well: one behaviour
    for every tier."""

    def __init__(self) -> None:
        self._flags: dict[tuple[torch.device, str], torch.Tensor] = {}
        self._found: list[str] = []

    def flag(self, device: torch.device, problem: str) -> torch.Tensor:
        """The int32 [1] flag a kernel sets to 1 when `problem` holds (zeros at first, made once per mode)."""
        key = (device, problem)
        if key not in self._flags:
            self._flags[key] = torch.zeros(1, dtype=torch.int32, device=device)
        return self._flags[key]

    def found(self, problem: str) -> None:
        if problem not in self._found:
            self._found.append(problem)

    def problems(self) -> list[str]:
        """Every problem found or flagged (one read of the flags per device: the mode's exit syncs once)."""
        problems = list(self._found)
        for device in dict.fromkeys(d for d, _ in self._flags):
            keys = [key for key in self._flags if key[0] == device]
            values = torch.cat([self._flags[key] for key in keys]).tolist()
            problems += [p for (_, p), v in zip(keys, values, strict=True) if v and p not in problems]
        return problems


def grouped_mm(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, product: Product, grouped: Callable | None = None,
    checks: Checks | None = None, trusted: bool = False,
) -> torch.Tensor:  # fmt: skip
    """aten::_grouped_mm as one `product` (the tier's mm) per group, so that every row of a group has the tier's
    linear bits whatever rows, and however many, its expert received (`grouped`: the tier's own grouped GEMM, one
    launch per call, where it has one: rl_kernel.fast.grouped_mm's signature):
    - a [S, K] (tokens sorted by expert), b [E, K, N], offs [E]: out[rows of g] = a[rows of g] @ b[g] (the experts'
      forward and, with b transposed, their dX); rows past the last group are zeros;
    - a [K, S], b [S, N], offs [E]: out [E, K, N], out[g] = a[:, tokens of g] @ b[tokens of g] (their dW, a sum over
      the group's tokens in token order, the tier's dW chain); an empty group's is zeros;
    - a [E, M, K], b [E, K, N], no offs: out[g] = a[g] @ b[g] (bmm's).
    offs that are not E non-decreasing ends within the rows (tokens): with `checks` (the mode's), the groups are
    taken clamped (a decreasing end an empty group) and the problem is reported at the mode's exit, the grouped
    kernel reading no offs on the host; without, a ModeError at once. trusted: offs made by the caller from the
    sorted experts (the patch's), neither checked nor read on the host by the grouped kernel."""
    if a.dim() == 3 and b.dim() == 3 and offs is None:
        return bmm(a, b, product, grouped, "_grouped_mm")
    if a.dim() != 2 or b.dim() not in (2, 3) or offs is None or offs.dim() != 1:
        raise ModeError(f"rl_kernel.mode: aten::_grouped_mm of {a.dim()}-d by {b.dim()}-d operands "
                        f"{'with' if offs is not None else 'without'} offs is not served (the experts' forward, dX "
                        "and dW forms are: 2-d x 3-d and 2-d x 2-d with 1-d offs, 3-d x 3-d without)")  # fmt: skip
    groups, (total, what) = offs.shape[0], (a.shape[0], "rows") if b.dim() == 3 else (a.shape[1], "tokens")
    if b.dim() == 3 and b.shape[0] != groups:
        raise ModeError(f"rl_kernel.mode: aten::_grouped_mm of {groups} groups (offs) by {b.shape[0]} experts (b)")
    problem = (f"aten::_grouped_mm with offs that are not {groups} non-decreasing group ends within the {total} "
               f"{what}")  # fmt: skip
    if grouped is not None:
        flag = None if checks is None else checks.flag(a.device, problem)
        try:
            return grouped(a, b, offs, validate=checks is None and not trusted, flag=flag)
        except ValueError as exc:  # bad offs (no checks) or shapes, named by the tier's operator
            raise ModeError(str(exc)) from None
    bounds, bad = clamped_groups(offs, total)
    if bad and checks is None:
        raise ModeError(f"rl_kernel.mode: {problem}: {offs.tolist()[:8]}")
    if bad:
        checks.found(problem)
    if b.dim() == 3:
        out = a.new_zeros((a.shape[0], b.shape[2]))
        for g, (s, e) in enumerate(bounds):
            if e > s:
                out[s:e] = product(a[s:e], b[g])
        return out
    out = a.new_zeros((groups, a.shape[0], b.shape[1]))
    for g, (s, e) in enumerate(bounds):
        if e > s:
            out[g] = product(a[:, s:e], b[s:e])
    return out


def bmm(
    a: torch.Tensor, b: torch.Tensor, product: Product, grouped: Callable | None = None, op: str = "bmm"
) -> torch.Tensor:
    """aten::bmm (and _grouped_mm's 3-d form): out[i] = product(a[i], b[i]) for each element, in one launch where
    the tier has a grouped GEMM (`grouped(a, b)`: each element its product's bits), else one product each."""
    if grouped is not None:
        try:
            return grouped(a, b)
        except ValueError as exc:  # shapes, named by the tier's operator
            raise ModeError(f"rl_kernel.mode: aten::{op}: {exc}") from None
    if a.shape[0] == 0:
        return a.new_empty((0, a.shape[1], b.shape[2]))
    return torch.stack([product(a[i], b[i]) for i in range(a.shape[0])])


# ---- index_put with accumulate: a gather's backward (a mixture of experts' tokens, each picked top-k times) ---------
def index_put_server(original: Any, checks: Checks | None = None) -> Callable:
    """aten::index_put, served with its stock kernel `original` (torch.library.get_kernel's, called with the dispatch
    key set) for what has no order to fix (accumulate=False, or indices naming each element once); with accumulate
    and one integer index over the first dim (a gather's backward), index_add_'s one add at a time in source order
    whether or not it repeats (torch's CUDA kernel adds duplicates atomically, in any order; a single add is the same
    either way), with no host read; any other accumulation over repeated elements is refused by name."""

    def serve(keyset, x, indices, values, accumulate=False):
        named = [i for i in indices if i is not None]
        if accumulate and len(indices) == 1 and named and named[0].dim() == 1 and _integer(named[0]):
            index = named[0].long()
            index = torch.where(index < 0, index + x.shape[0], index)  # index_put's negative indices count from the end
            return index_add_(x.clone(), 0, index, values.expand(index.shape[0], *x.shape[1:]), checks=checks)
        if not accumulate or names_each_once(indices):
            return original.call_boxed(keyset, x, indices, values, accumulate)
        raise ModeError(
            "rl_kernel.mode: aten::index_put with accumulate=True over repeated elements by "
            f"{len(indices)} indices: only one index over the first dim is served (index_add's order)"
        )

    return serve


def _integer(index: torch.Tensor) -> bool:
    return not index.dtype.is_floating_point and index.dtype != torch.bool


def names_each_once(indices) -> bool:
    """Whether index_put's indices name each element at most once (then each gets one add: no order to fix)."""
    given = [i for i in indices if i is not None]
    if not given or any(i.dtype == torch.bool for i in given):
        return True  # a mask names each element once
    flat = torch.stack([i.reshape(-1) for i in torch.broadcast_tensors(*given)], dim=1)
    return torch.unique(flat, dim=0).shape[0] == flat.shape[0]
