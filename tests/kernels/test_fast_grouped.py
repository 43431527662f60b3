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
from rl_kernel.bitwise import bits_equal


@pytest.mark.slow
def test_interpreter_grouped_gemm() -> None:
    found = interpret(__file__, "grouped")
    assert len(found) == 9 and not failed(found), failed(found)


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


if __name__ == "__main__":
    serve({"grouped": _check_grouped})
