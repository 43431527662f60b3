"""rl_kernel.mode's operators written in torch's own elementwise ops, the same on every device whatever the tier
(rl_kernel.aten.ops): sums and means as the contract's plain-sum tree, softmax over a row's nonzero terms, topk's ties,
index_add's order, LayerNorm and logsumexp by the tree; the grouped GEMM per expert, bad offs reported at the mode's
exit. Every equality is on integer views of the bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bit_checks import assert_bits as same

import rl_kernel
from rl_kernel.aten import mode as M
from rl_kernel.bitwise import bits_equal

DTYPES = [torch.float32, torch.bfloat16]


# ---- sums and means ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 17, 64, 65, 72, 1000, 2049])
def test_the_tree_is_the_contracts_row_sum_at_every_length(n: int) -> None:
    """tree_sum == contract.row_sum bit for bit whatever the length: chunk counts odd, even, a power of two or one
    past it (the padded nodes add +0 as the contract's empty node), a partial last chunk, a row of -0.0."""
    import numpy as np

    from rl_kernel.exact.common import contract

    x = torch.randn(3, n, generator=torch.Generator().manual_seed(n)) * torch.logspace(-3, 3, n)
    x[2] = -0.0
    want = torch.from_numpy(np.array([contract.row_sum(r.numpy()) for r in x], dtype=np.float32))
    same(M.tree_sum(x), want, f"n={n}")
    same(M.tree_sum(x.t().contiguous(), 0), want, f"n={n}, over the first dim")
    same(M.tree_sum(x.t().contiguous().unsqueeze(-1), 0), want.unsqueeze(-1), f"n={n}, over the first of three dims")


def test_sums_and_means_follow_the_contracts_plain_sum() -> None:
    """A row's sum is contract.row_sum (numerics.md section 2) bit for bit: odd chunk counts, a partial chunk, a row
    of -0.0 (+0.0, as the tree adds the empty node); a mean is that sum / n; a row alone == in the batch."""
    import numpy as np

    from rl_kernel.exact.common import contract

    g = torch.Generator().manual_seed(12)
    x = torch.randn(5, 173, generator=g) * torch.logspace(-3, 3, 173)  # magnitudes whose sum order shows
    x[4] = -0.0
    want = torch.from_numpy(np.array([contract.row_sum(r.numpy()) for r in x], dtype=np.float32))
    with rl_kernel.mode("exact"):
        got, mean, alone = x.sum(-1), x.mean(-1), x[2:3].sum(-1)
        bf = x.bfloat16().sum(-1, dtype=torch.float32)
        whole, kept = x.sum(), x.sum((0, 1), keepdim=True)
        columns = x.t().reshape(173, 1, 5).sum((0, 1))  # the leading dims: a weight's gradient over the tokens
        ints = torch.arange(10).reshape(2, 5).sum(1)
    same(got, want, "sum over the last dim")
    same(mean, want / 173, "mean")
    same(alone, got[2:3], "a row alone == in the batch")
    same(bf, torch.from_numpy(np.array([contract.row_sum(r.float().numpy()) for r in x.bfloat16()], np.float32)),
         "bf16 summed in fp32")  # fmt: skip
    same(whole, kept.view(()), "every dim, keepdim")
    same(columns, want, "over the leading dims: each column's tree")
    same(whole, torch.tensor(contract.row_sum(x.reshape(-1).numpy())), "every dim: the row-major elements' tree")
    assert ints.tolist() == [10, 35] and ints.dtype == torch.int64
    assert not bits_equal(x.sum(-1), got), "the case must tell the tree from stock's sum"


# ---- softmax, topk, index_add: the mixture of experts' and eager attention's operators -------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_sums_a_rows_nonzero_terms_whatever_masks_them_first(dtype) -> None:
    """torch.softmax under the mode: exp(x - max) over the tree's sum of the row's nonzero terms, rounded once; a row
    alone == in the batch; and a row behind masked keys (-inf or finfo.min, as eager attention masks a left padding)
    gives its real keys the bits of the unpadded row: the plain tree over the padded row (the control) does not."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(33, 301, generator=g) * 4).to(dtype)
    with M.mode("exact"):
        y = torch.softmax(x, -1)
        rows = [torch.softmax(x[i : i + 1], -1) for i in (0, 17, 32)]
        y32 = torch.softmax(x, -1, dtype=torch.float32)
        padded = {fill: torch.softmax(torch.cat([torch.full((33, 5), fill).to(dtype), x], -1), -1)
                  for fill in (float("-inf"), torch.finfo(dtype).min)}  # fmt: skip
    same(y32, M.softmax(x.float()), f"{dtype} the definition, fp32")
    same(y, M.softmax(x.float()).to(dtype), f"{dtype} the definition")
    for i, r in zip((0, 17, 32), rows, strict=True):
        same(r, y[i : i + 1], f"{dtype} row {i} alone")
    for fill, p in padded.items():
        same(p[:, 5:], y, f"{dtype} behind 5 keys masked with {fill}")
        assert bool((p[:, :5] == 0).all())
    e = torch.exp(x.float() - x.float().amax(-1, keepdim=True))
    plain = e / M.tree_sum(torch.cat([torch.zeros(33, 5), e], -1)).unsqueeze(-1)
    assert not bits_equal(plain, M.softmax(x.float())), "the padded row's plain tree must differ here"


def softmax_grad(rows: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient of torch.softmax over the last dim under mode("exact"), for upstream g."""
    xg = rows.clone().requires_grad_()
    with M.mode("exact"):
        torch.softmax(xg, -1).backward(g)
    return xg.grad


def test_softmax_backward_is_the_trees_row_sum() -> None:
    """y * (g - sum(g * y)) with the row's sum of nonzero terms by the contract's tree: a row alone == in the batch,
    and near float64; a torch.sum in its place (another order) is told apart."""
    gen = torch.Generator().manual_seed(4)
    x, gy = torch.randn(40, 523, generator=gen) * 3, torch.randn(40, 523, generator=gen)

    full = softmax_grad(x, gy)
    same(softmax_grad(x[5:6], gy[5:6]), full[5:6], "row 5 alone")
    y = M.softmax(x)
    same(full, y * (gy - M.nonzero_sum(gy * y).unsqueeze(-1)), "the definition")
    assert not bits_equal(full, y * (gy - (gy * y).sum(-1, keepdim=True))), "a plain torch.sum must differ here"
    ref = x.double().softmax(-1)
    ref = ref * (gy.double() - (gy.double() * ref).sum(-1, keepdim=True))
    assert (full.double() - ref).abs().max() < 1e-5


def test_topk_breaks_ties_to_the_lower_index() -> None:
    x = torch.tensor([[0.5, 2.0, 2.0, -1.0, 2.0], [3.0, 3.0, 3.0, 3.0, 3.0]])
    with M.mode("exact"):
        v, i = torch.topk(x, 3)
        lo_v, lo_i = torch.topk(x, 2, largest=False)
    assert i.tolist() == [[1, 2, 4], [0, 1, 2]] and v.tolist() == [[2.0, 2.0, 2.0], [3.0, 3.0, 3.0]]
    assert lo_i.tolist() == [[3, 0], [0, 1]] and lo_v.tolist() == [[-1.0, 0.5], [3.0, 3.0]]


@pytest.mark.parametrize("width", [8, 64, 128, 256])  # routers' expert counts: an unstable sort reorders ties there
def test_topk_ties_at_a_routers_width_go_to_the_lower_index(width: int, device: str) -> None:
    """Router logits with many ties (bf16 rounds close logits together; here values from 3 levels): the k picked, and
    their order, are the lower indices first among equals, on every device (a sort without stable=True picks
    [54, 108, 30, ...] for [0, 3, 6, ...] on a 128-wide row of the CPU)."""
    g = torch.Generator().manual_seed(width)
    x = torch.randint(0, 3, (16, width), generator=g).to(torch.bfloat16).to(device)
    with M.mode("exact"):
        v, i = torch.topk(x, 8)
    for row in range(16):
        vals = x[row].float().cpu().tolist()
        want = sorted(range(width), key=lambda j: (-vals[j], j))[:8]  # by value, ties by index: the definition
        assert i[row].cpu().tolist() == want, f"row {row}: {i[row].tolist()} != {want}"
        assert v[row].cpu().tolist() == [vals[j] for j in want]


def test_the_softmax_backward_of_a_padded_row_is_the_unpadded_rows() -> None:
    """A row behind masked keys (eager attention's in a left-padded batch): its real keys' gradient has the bits of
    the same row unpadded, as its forward does (the row's sum over its nonzero terms; the plain tree over the padded
    row, the control, moves them)."""
    gen = torch.Generator().manual_seed(6)
    x, gy = torch.randn(24, 301, generator=gen) * 3, torch.randn(24, 301, generator=gen)
    masked, upstream = torch.full((24, 7), float("-inf")), torch.randn(24, 7, generator=gen)
    padded = softmax_grad(torch.cat([masked, x], -1), torch.cat([upstream, gy], -1))
    same(padded[:, 7:], softmax_grad(x, gy), "behind 7 masked keys")
    y = torch.cat([torch.zeros(24, 7), M.softmax(x)], -1)
    g = torch.cat([torch.zeros(24, 7), gy], -1)
    plain = y * (g - M.tree_sum(g * y).unsqueeze(-1))
    assert not bits_equal(plain[:, 7:], softmax_grad(x, gy)), "the padded row's plain tree must differ here"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_index_add_adds_a_rows_slices_in_source_order(dtype) -> None:
    """Row 2 named three times gets ((x + s0) + s3) + s5, one rounding per add, in place and not; every other row
    its one add; alpha scales the source first."""
    g = torch.Generator().manual_seed(5)
    x, src = torch.randn(6, 4, generator=g).to(dtype), (torch.randn(7, 4, generator=g) * 100).to(dtype)
    idx = torch.tensor([2, 0, 4, 2, 1, 2, 5])
    want = x.clone()
    for j in range(7):  # the definition, one slice at a time
        want[idx[j]] = want[idx[j]] + src[j]
    with M.mode("exact"):
        out = x.index_add(0, idx, src)
        inplace = x.clone().index_add_(0, idx, src)
        cols = x.t().contiguous().index_add(1, idx, src.t().contiguous())
        scaled = x.index_add(0, idx, src, alpha=2)
    same(out, want, f"{dtype} index_add")
    same(inplace, want, f"{dtype} index_add_")
    same(cols, want.t(), f"{dtype} index_add over dim 1")
    twice = x.clone()
    for j in range(7):
        twice[idx[j]] = twice[idx[j]] + src[j] * 2
    same(scaled, twice, f"{dtype} alpha = 2")
    assert not bits_equal(want, x.clone().index_add_(0, idx.flip(0), src.flip(0))), "the order must show"


def test_the_grouped_gemm_is_the_tiers_product_per_expert() -> None:
    """torch._grouped_mm under the mode: each expert's rows are the tier's linear of those rows (a row has the same
    bits in a group of 1 or of 5); the dW form (2-d x 2-d over the tokens) each expert's product over its tokens in
    order; 3-d x 3-d each pair's product; stock's grouped GEMM (the control) gives other bits here."""
    g = torch.Generator().manual_seed(8)
    a, b = torch.randn(9, 300, generator=g), torch.randn(3, 300, 8, generator=g)
    offs = torch.tensor([1, 6, 9], dtype=torch.int32)  # groups of 1, 5 and 3 rows
    with M.mode("exact"):
        out = torch._grouped_mm(a, b, offs=offs)
        among5 = torch._grouped_mm(a, b, offs=torch.tensor([5, 6, 9], dtype=torch.int32))
        dw = torch._grouped_mm(a.t(), out, offs=offs)
        batched = torch._grouped_mm(a[:6].reshape(3, 2, 300), b)
    for e, (s, t) in enumerate([(0, 1), (1, 6), (6, 9)]):
        same(out[s:t], rl_kernel.linear(a[s:t], b[e].t().contiguous()), f"expert {e}'s rows")
        same(dw[e], rl_kernel.linear(a[s:t].t().contiguous(), out[s:t].t().contiguous()), f"expert {e}'s dW")
        same(batched[e], rl_kernel.linear(a[2 * e : 2 * e + 2], b[e].t().contiguous()), f"pair {e}")
    same(among5[:1], out[:1], "row 0 with expert 0: alone, and among 5 rows")
    assert not bits_equal(out, torch._grouped_mm(a, b, offs=offs)), "the case must tell the tier from stock"


def test_the_grouped_gemm_refuses_what_it_cannot_state() -> None:
    """Bad offs (a decreasing end, an end past the rows or tokens): the groups are taken as the fast tier's kernels
    take them without reading offs on the host (ends clamped into range, a decreasing end an empty group) and the
    problem is a ModeError when the mode exits, in every tier (test_fast_grouped.py: the fast tier's device-side
    flag); good offs raise nothing; an error of the block itself is not replaced; a nested mode's problem is its own
    exit's, enable() / disable()'s too. A form the tier cannot state (3-d x 2-d) is refused at once."""
    a, b = torch.randn(6, 8), torch.randn(2, 8, 4)
    for ends, bounds in (([4, 3], [(0, 4), (4, 4)]), ([3, 7], [(0, 3), (3, 6)])):
        offs = torch.tensor(ends, dtype=torch.int32)
        problem = "offs that are not 2 non-decreasing group ends within the 6 rows"
        with pytest.raises(M.ModeError, match=problem), M.mode("exact"):
            out = torch._grouped_mm(a, b, offs=offs)
        assert M.active() is None
        for e, (s, t) in enumerate(bounds):
            same(out[s:t], rl_kernel.linear(a[s:t], b[e].t().contiguous()), f"{ends}: expert {e}'s clamped rows")
        assert not out[bounds[-1][1] :].any(), "rows past the clamped groups are zeros"
    with pytest.raises(M.ModeError, match="within the 6 tokens"), M.mode("exact"):
        torch._grouped_mm(a.t(), torch.randn(6, 5), offs=torch.tensor([2, 9], dtype=torch.int32))
    good, bad = torch.tensor([2, 6], dtype=torch.int32), torch.tensor([4, 3], dtype=torch.int32)
    with M.mode("exact"):  # good offs: nothing at the exit (the control of the raises above)
        torch._grouped_mm(a, b, offs=good)
    with pytest.raises(KeyError, match="the block's own"), M.mode("exact"):
        torch._grouped_mm(a, b, offs=bad)
        raise KeyError("the block's own")
    assert M.active() is None
    with M.mode("exact"):  # the inner mode's problem is its exit's, not the outer's
        with pytest.raises(M.ModeError, match="non-decreasing"), M.mode("exact"):
            torch._grouped_mm(a, b, offs=bad)
        torch._grouped_mm(a, b, offs=good)
    M.enable("exact")
    torch._grouped_mm(a, b, offs=bad)
    with pytest.raises(M.ModeError, match="non-decreasing"):
        M.disable()
    assert M.active() is None
    with M.mode("exact"), pytest.raises(M.ModeError, match="3-d by 2-d"):
        torch._grouped_mm(b, a.t().contiguous(), offs=torch.tensor([4], dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_scatter_add_over_a_repeated_row_adds_in_source_order(dtype, device: str) -> None:
    """index_put(accumulate=True) (a gather's backward: a token picked by top-k experts) under the mode: a row named
    twice gets its values one add at a time in source order (index_add's bits), covered by the audit; over distinct
    rows the stock kernel (one add each); two index tensors over a repeated element are refused by name. (The CPU's
    stock kernel adds in source order too; CUDA's sorts the indices and sums a row's values in fp32 before one
    rounding: the GPU run is where stock's order shows.)"""
    g = torch.Generator().manual_seed(9)
    base, vals = (torch.randn(4, 3, generator=g).to(dtype).to(device),
                  (torch.randn(5, 3, generator=g) * 100).to(dtype).to(device))  # fmt: skip
    rows = torch.tensor([0, 2, 0, 3, 0], device=device)
    with M.mode("exact"):
        got = base.index_put((rows,), vals, accumulate=True)
        distinct = base.index_put((rows[1:4],), vals[:3], accumulate=True)
        with pytest.raises(M.ModeError, match="accumulate=True over repeated elements"):
            base.index_put((rows[:3:2], rows[:3:2]), vals[0, :2], accumulate=True)
    want = base.clone()
    for j in range(5):
        want[rows[j]] = want[rows[j]] + vals[j]
    same(got, want, "source order")
    same(distinct, torch.index_put(base, (rows[1:4],), vals[:3], accumulate=True), "distinct rows")
    assert M.audit(lambda: base.index_put((rows,), vals, accumulate=True)).covered
    assert not bits_equal(want, base.clone().index_put_((rows.flip(0),), vals.flip(0), accumulate=True)), "order"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_norm_is_the_trees_statistics_and_batch_invariant(dtype) -> None:
    """F.layer_norm under the mode: mean and variance by the contract's tree in fp32, one rounding; a row alone ==
    in the batch, forward and dX; near float64; the weight's and bias's gradients run to run; covered by the audit."""
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(4, 7, 300, generator=g) * 3 + 1).to(dtype)
    w, b = (1 + 0.1 * torch.randn(300, generator=g)).to(dtype), (0.1 * torch.randn(300, generator=g)).to(dtype)
    dy = torch.randn(4, 7, 300, generator=g).to(dtype)

    def run(xs: torch.Tensor, dys: torch.Tensor):
        xg, wg, bg = (t.clone().requires_grad_() for t in (xs, w, b))
        with M.mode("exact"):
            y = F.layer_norm(xg, (300,), wg, bg)
            y.backward(dys)
        return y, xg.grad, wg.grad, bg.grad

    y, dx, dw, db = run(x, dy)
    rows = x.float().reshape(-1, 300)
    mean = M.tree_sum(rows) / 300
    rstd = torch.rsqrt(M.tree_sum((rows - mean[:, None]) ** 2) / 300 + 1e-5)
    want = ((rows - mean[:, None]) * rstd[:, None] * w.float() + b.float()).reshape(x.shape).to(dtype)
    same(y, want, f"{dtype} the definition")
    alone = run(x[1:2, 3:4], dy[1:2, 3:4])
    same(alone[0], y[1:2, 3:4], f"{dtype} a row alone, forward")
    same(alone[1], dx[1:2, 3:4], f"{dtype} a row alone, dX")
    again = run(x, dy)
    for name, a, c in zip(("y", "dx", "dw", "db"), again, (y, dx, dw, db), strict=True):
        same(a, c, f"{dtype} {name} run to run")
    ref = [t.double().requires_grad_() for t in (x, w, b)]
    F.layer_norm(ref[0], (300,), ref[1], ref[2]).backward(dy.double())
    tol = 1e-5 if dtype == torch.float32 else 0.05
    for name, got, r in (("dx", dx, ref[0].grad), ("dw", dw, ref[1].grad), ("db", db, ref[2].grad)):
        assert (got.double() - r).abs().max() <= tol * max(1.0, r.abs().max().item()), name
    found = M.audit(lambda: F.layer_norm(x.clone().requires_grad_(), (300,), w, b).sum().backward())
    assert found.covered and "native_layer_norm" in found.served, found.summary()


def test_logsumexp_is_the_max_and_the_trees_sum_of_nonzero_terms() -> None:
    """torch.logsumexp under the mode: a row alone == in the batch, any dims, -inf and +inf rows as torch's, near
    float64; its gradient (autograd's exp(x - result)) is softmax-like."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(5, 7, 300, generator=g) * 3
    with M.mode("exact"):
        full, alone = torch.logsumexp(x, -1), torch.logsumexp(x[2:3], -1)
        over = torch.logsumexp(x, (0, 2), keepdim=True)
        edges = torch.logsumexp(torch.tensor([[float("-inf")] * 4, [1.0, float("inf"), 0.0, 0.0]]), -1)
    same(alone, full[2:3], "a row alone")
    rows = x.float()
    m = rows.amax(-1, keepdim=True)
    same(full, torch.log(M.nonzero_sum(torch.exp(rows - m))) + m.squeeze(-1), "the definition")
    assert over.shape == (1, 7, 1)
    assert (over.double() - torch.logsumexp(x.double(), (0, 2), keepdim=True)).abs().max() < 1e-5
    assert edges.tolist() == [float("-inf"), float("inf")]
    assert (full.double() - torch.logsumexp(x.double(), -1)).abs().max() < 1e-5
