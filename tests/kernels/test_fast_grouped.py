"""rl_kernel.fast.grouped_mm (a mixture of experts' grouped GEMM, every expert in one launch) in Triton's interpreter
(a subprocess): each expert's rows have the bits of rl_kernel.fast.mm of those rows alone, in the forward form (b[g]
a weight's transpose) and the dX form (b[g] row-major); a row's bits do not depend on how many rows its expert got
nor where its group starts; empty experts and rows past the last group; near float64. The control: stock's grouped
GEMM gives other bits. Under rl_kernel.mode("fast") aten::_grouped_mm is this kernel."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import failed, interpret, serve

import rl_kernel.fast as fast
from rl_kernel import mode_ops
from rl_kernel.bitwise import bits_equal


@pytest.mark.slow
def test_interpreter_grouped_gemm() -> None:
    found = interpret(__file__, "grouped")
    assert len(found) == 9 and not failed(found), failed(found)


@pytest.mark.slow
def test_interpreter_grouped_dweight() -> None:
    found = interpret(__file__, "dw")
    assert len(found) == 6 and not failed(found), failed(found)


def test_bad_offsets_are_refused_by_name() -> None:
    a, b = torch.randn(6, 8).bfloat16(), torch.randn(2, 8, 4).bfloat16()
    with pytest.raises(ValueError, match="non-decreasing group ends within the 6 rows"):
        fast.grouped_kernels.grouped_mm(a, b, torch.tensor([4, 3], dtype=torch.int32))


def _check_grouped() -> dict[str, bool]:
    g = torch.Generator().manual_seed(3)
    s, k, n = 70, 1000, 200  # a K tail (1000 = 15 x 64 + 40), N not a multiple of the tile; bf16 output rounding
    a = torch.randn(s, k, generator=g).bfloat16()  # hides most K-order changes: enough outputs for some to show
    w = (torch.randn(5, n, k, generator=g) * 0.2).bfloat16()  # the experts' weights [E, N, K], row-major
    offs = torch.tensor([0, 1, 6, 46, 66], dtype=torch.int32)  # 0, 1, 5, 40 and 20 rows; rows 66.. past the groups
    spans = [(0, 0), (0, 1), (1, 6), (6, 46), (46, 66)]
    res = {}
    for form, b in (("forward", w.transpose(-2, -1)), ("dX", (torch.randn(5, k, n, generator=g) * 0.2).bfloat16())):
        out = fast.grouped_mm(a, b, offs)
        per = all(bits_equal(out[lo:hi], fast.mm(a[lo:hi], b[e])) for e, (lo, hi) in enumerate(spans) if hi > lo)
        res[f"{form}: each expert's rows == fast.mm of them alone"] = per
        res[f"{form}: rows past the last group are zeros"] = bool((out[66:] == 0).all())
        ref = torch.zeros(s, n, dtype=torch.float64)
        for e, (lo, hi) in enumerate(spans):
            ref[lo:hi] = a[lo:hi].double() @ b[e].double()
        res[f"{form}: near float64"] = bool((out.double() - ref).abs().max() < 0.05 * ref.abs().max())
    b = w.transpose(-2, -1)
    among5 = fast.grouped_mm(a, b, offs)  # row 1 is the first of expert 2's 5 rows
    alone = fast.grouped_mm(a, b, torch.tensor([0, 1, 2, 23, 25], dtype=torch.int32))  # and here its only one
    res["a row alone with its expert == among 5 rows"] = bits_equal(alone[1:2], among5[1:2])
    stock = torch._grouped_mm(a.float().contiguous(), b.float().contiguous(), offs=offs).bfloat16()
    res["the control: stock's grouped GEMM differs"] = not bits_equal(stock[:66], among5[:66])
    lin = fast.linear_kernels
    cfg = dict(lin.config_for("linear", lin.target_of(a.device), m=40, n=n, k=k))
    cfg["block_k"] //= 2  # another K order: the case must tell it from the pinned one
    res["the case tells the K order (half the BLOCK_K differs)"] = not bits_equal(
        lin.forward_2d(a[6:46], w[3], None, cfg=cfg), among5[6:46]
    )
    return res


def _check_dw() -> dict[str, bool]:
    """The experts' dW in one launch: out[g] = a[:, tokens of g] @ b[tokens of g] (a the transposed view autograd
    hands aten::_grouped_mm, h^T), each expert's the bits of fast.mm of its tokens alone, whatever the others."""
    g = torch.Generator().manual_seed(4)
    s, m, n = 1300, 200, 272  # token counts 0, 1, 45, 1000 (15 x 64 + 40: a K tail) and 254; M, N not tile multiples
    h = torch.randn(s, m, generator=g).half()  # fp16's output rounding hides fewer K orders than bf16's
    dy = torch.randn(s, n, generator=g).half()
    offs = torch.tensor([0, 1, 46, 1046, 1300], dtype=torch.int32)
    spans = [(0, 0), (0, 1), (1, 46), (46, 1046), (1046, 1300)]
    out = fast.grouped_mm(h.t(), dy, offs)
    alone = [fast.mm(h[lo:hi].t(), dy[lo:hi]) if hi > lo else None for lo, hi in spans]
    res = {"each expert's dW == fast.mm of its tokens alone": all(
        bits_equal(out[e], w) for e, w in enumerate(alone) if w is not None)}  # fmt: skip
    res["an expert of no token: zeros"] = bool((out[0] == 0).all())
    ref = torch.stack([h[lo:hi].double().t() @ dy[lo:hi].double() for lo, hi in spans])
    res["near float64"] = bool((out.double() - ref).abs().max() < 0.05 * ref.abs().max())
    elsewhere = torch.tensor([0, 40, 46, 1046, 1300], dtype=torch.int32)  # expert 1 takes 39 of expert 2's tokens
    moved = fast.grouped_mm(h.t(), dy, elsewhere)
    res["an expert's dW does not depend on the others' tokens"] = bits_equal(moved[3], out[3]) and bits_equal(
        moved[4], out[4])  # fmt: skip
    lin = fast.linear_kernels
    cfg = dict(lin.config_for("linear_dw", lin.target_of(h.device)), tma=False)
    cfg["block_k"] //= 2  # another K order over the tokens: the case must tell it from the pinned one
    res["the case tells the K order (half the BLOCK_K differs)"] = not bits_equal(
        lin.grad_w_2d(dy[46:1046], h[46:1046], cfg=cfg).t(), out[3])  # fmt: skip

    def no_product(*_):
        raise AssertionError("the mode's per-expert loop ran")

    served = mode_ops.grouped_mm(h.t(), dy, offs, no_product, fast.grouped_mm)
    res["the mode serves aten::_grouped_mm's dW form with this kernel"] = bits_equal(served, out)
    return res


if __name__ == "__main__":
    serve({"grouped": _check_grouped, "dw": _check_dw})
