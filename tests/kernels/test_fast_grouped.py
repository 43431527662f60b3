"""rl_kernel.fast.grouped_mm (a mixture of experts' grouped GEMM, every expert in one launch) in Triton's interpreter
(a subprocess): each expert's rows have the bits of rl_kernel.fast.mm of those rows alone, in the forward form (b[g]
a weight's transpose) and the dX form (b[g] row-major); a row's bits do not depend on how many rows its expert got
nor where its group starts; empty experts (first and last), a group over several row tiles, rows past the last group
(zeros, every element of the output written); near float64. The control: stock's grouped GEMM gives other bits.
Under rl_kernel.mode("fast") (served on the CPU in the interpreter) aten::_grouped_mm is this kernel, reading nothing
of offs on the host (bad offs raise at the mode's exit), and aten::bmm is its batched form in one launch, each element
the bits of fast.mm of that element alone, in both forms of transformers' batched_mm experts."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from triton_interpreter import failed, interpret, serve

import rl_kernel.fast as fast
from rl_kernel._validate import clamped_groups
from rl_kernel.aten import mode as M
from rl_kernel.bitwise import bits_equal


@pytest.mark.slow
def test_interpreter_grouped_gemm() -> None:
    found = interpret(__file__, "grouped")
    assert len(found) == 17 and not failed(found), failed(found)


@pytest.mark.slow
def test_interpreter_grouped_dweight() -> None:
    found = interpret(__file__, "dw")
    assert len(found) == 12 and not failed(found), failed(found)


@pytest.mark.slow
def test_interpreter_bmm_under_the_mode_is_one_launch_of_each_elements_bits() -> None:
    found = interpret(__file__, "bmm")
    assert len(found) == 7 and not failed(found), failed(found)


@pytest.mark.slow
def test_interpreter_the_modes_grouped_gemm_reads_no_offs_and_checks_them_at_exit() -> None:
    found = interpret(__file__, "offs")
    assert len(found) == 8 and not failed(found), failed(found)


@pytest.mark.gpu
def test_the_modes_experts_never_make_the_host_wait() -> None:
    """Under mode("fast") the experts' products (the forward, dX and dW forms of aten::_grouped_mm, and aten::bmm,
    transformers' batched_mm) launch without a host sync (CUDA's sync debug mode raises on one), and still give each
    expert fast.mm's bits. Control: the public fast.grouped_mm, which checks offs eagerly, does sync."""
    g = torch.Generator(device="cuda").manual_seed(8)
    e, s, k, n = 8, 300, 256, 192
    a = torch.randn(s, k, generator=g, device="cuda").bfloat16()
    w = torch.randn(e, n, k, generator=g, device="cuda").bfloat16()
    offs = torch.tensor([0, 10, 10, 90, 200, 201, 260, 300], dtype=torch.int32, device="cuda")
    dy = torch.randn(s, n, generator=g, device="cuda").bfloat16()
    with M.mode("fast"):
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
            dx = torch._grouped_mm(dy, w, offs=offs)
            dw = torch._grouped_mm(a.t(), dy, offs=offs)
            bmm = torch.bmm(a[:64, None], w[torch.arange(64, device="cuda") % e].transpose(-2, -1))
            with pytest.raises(RuntimeError, match="synchroniz"):
                fast.grouped_mm(a, w.transpose(-2, -1), offs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    ends = [0, *offs.tolist()]
    for x, (lo, hi) in enumerate(itertools.pairwise(ends)):
        if hi > lo:
            assert bits_equal(out[lo:hi], fast.mm(a[lo:hi], w[x].t())), f"expert {x}'s forward"
            assert bits_equal(dx[lo:hi], fast.mm(dy[lo:hi], w[x])), f"expert {x}'s dX"
            assert bits_equal(dw[x], fast.mm(a[lo:hi].t(), dy[lo:hi])), f"expert {x}'s dW"
    assert all(bits_equal(bmm[i], fast.mm(a[i : i + 1], w[i % e].t())) for i in range(64)), "bmm's elements"


def test_bad_offsets_are_refused_by_name() -> None:
    a, b = torch.randn(6, 8).bfloat16(), torch.randn(2, 8, 4).bfloat16()
    with pytest.raises(ValueError, match="non-decreasing group ends within the 6 rows"):
        fast.grouped_kernels.grouped_mm(a, b, torch.tensor([4, 3], dtype=torch.int32))


# ---- the checks, in the interpreter's subprocess ----------------------------------------------------------------
SWEPT = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2}  # bench grouped_gemm --tiles: speed only


def _swept(call) -> bool:
    """call()'s grouped launch took SWEPT's tile (so a sweep's timing is of the tile it names)."""
    from rl_kernel.fast.decoder import grouped

    seen, saved = [], grouped.launch

    def record(kernel, grid, *args, **kwargs):
        seen.append({k: kwargs[k.upper() if k.startswith("block") else k] for k in SWEPT})
        return saved(kernel, grid, *args, **kwargs)

    grouped.launch = record
    try:
        call()
    finally:
        grouped.launch = saved
    return seen == [SWEPT]


@contextlib.contextmanager
def _launches():
    """{module: launches} of the grouped and the linear kernels while the block runs."""
    from rl_kernel.fast.decoder import grouped, linear

    count = {"grouped": 0, "linear": 0}
    saved = [(m, n, getattr(m, n)) for m in (grouped, linear) for n in ("launch", "launch_replay") if hasattr(m, n)]

    def counted(module, name, fn):
        def run(*args, **kwargs):
            count[module.__name__.rsplit(".", 1)[1]] += 1
            return fn(*args, **kwargs)

        return run

    for m, n, fn in saved:
        setattr(m, n, counted(m, n, fn))
    try:
        yield count
    finally:
        for m, n, fn in saved:
            setattr(m, n, fn)


@contextlib.contextmanager
def _kernels():
    """The names of the grouped kernels launched while the block runs."""
    from rl_kernel.fast.decoder import grouped

    names, saved = [], grouped.launch

    def named(kernel, *args, **kwargs):
        names.append(kernel.fn.__name__)
        return saved(kernel, *args, **kwargs)

    grouped.launch = named
    try:
        yield names
    finally:
        grouped.launch = saved


@contextlib.contextmanager
def _without_tma():
    """The pointer kernels, as a target without TMA (AMD's) runs them: no descriptors are made."""
    from rl_kernel.fast.decoder import grouped

    saved, grouped._tma_pair = grouped._tma_pair, lambda *args: None
    try:
        yield
    finally:
        grouped._tma_pair = saved


def _tma_and_pointer(call, kernel: str) -> tuple[torch.Tensor, bool]:
    """call()'s result on the interpreter's target (sm_90: the TMA kernel) and whether the pointer kernel gives its
    bits, each kernel the one launched."""
    with _kernels() as tma:
        out = call()
    with _without_tma(), _kernels() as pointer:
        same = bits_equal(call(), out)
    return out, same and tma == [f"{kernel}_tma_kernel"] and pointer == [f"{kernel}_kernel"]


def _nan(*shape: int) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=torch.bfloat16)


def _check_grouped() -> dict[str, bool]:
    g = torch.Generator().manual_seed(3)
    s, k, n = 150, 1000, 200  # a K tail (1000 = 15 x 64 + 40), N not a multiple of the tile; bf16 output rounding
    a = torch.randn(s, k, generator=g).bfloat16()  # hides most K-order changes: enough outputs for some to show
    w = (torch.randn(6, n, k, generator=g) * 0.2).bfloat16()  # the experts' weights [E, N, K], row-major
    offs = torch.tensor([0, 1, 6, 76, 146, 146], dtype=torch.int32)  # 0, 1, 5, 70 (over two row tiles), 70, 0 rows
    spans = [(0, 0), (0, 1), (1, 6), (6, 76), (76, 146), (146, 146)]  # rows 146.. past the groups
    res = {}
    for form, b in (("forward", w.transpose(-2, -1)), ("dX", (torch.randn(6, k, n, generator=g) * 0.2).bfloat16())):
        out, same = _tma_and_pointer(lambda b=b: fast.grouped_kernels.grouped_mm(a, b, offs, out=_nan(s, n)),
                                     "_grouped_gemm")  # every element written by the kernel  # fmt: skip
        res[f"{form}: the TMA kernel's bits == the pointer kernel's (targets without TMA)"] = same
        per = all(bits_equal(out[lo:hi], fast.mm(a[lo:hi], b[e])) for e, (lo, hi) in enumerate(spans) if hi > lo)
        res[f"{form}: each expert's rows == fast.mm of them alone"] = per
        res[f"{form}: rows past the last group are zeros"] = bool((out[146:] == 0).all())
        ref = torch.zeros(s, n, dtype=torch.float64)
        for e, (lo, hi) in enumerate(spans):
            ref[lo:hi] = a[lo:hi].double() @ b[e].double()
        res[f"{form}: near float64"] = bool((out.double() - ref).abs().max() < 0.05 * ref.abs().max())
        swept = fast.grouped_kernels.grouped_mm(a, b, offs, tiles=SWEPT)
        res[f"{form}: the sweep's tile is the one launched"] = _swept(
            lambda b=b: fast.grouped_kernels.grouped_mm(a, b, offs, tiles=SWEPT))  # fmt: skip
        res[f"{form}: a sweep's other tile (block_m, block_n, warps, stages) gives the same bits"] = bits_equal(
            swept, out
        )
    dx = (torch.randn(6, k, n, generator=g) * 0.2).bfloat16()
    dx[4, 0, 0] = float("inf")  # past expert 3's K: its last partial K step reads expert 4's rows
    rows = fast.grouped_kernels.grouped_mm(a, dx, offs)[6:76]
    res["dX: a neighbour's non-finite weight past K stays out of an expert's rows"] = bits_equal(
        rows, fast.mm(a[6:76], dx[3]))  # fmt: skip
    b = w.transpose(-2, -1)
    among5 = fast.grouped_mm(a, b, offs)  # row 1 is the first of expert 2's 5 rows
    alone = fast.grouped_mm(a, b, torch.tensor([0, 1, 2, 23, 25, 150], dtype=torch.int32))  # and here its only one
    res["a row alone with its expert == among 5 rows"] = bits_equal(alone[1:2], among5[1:2])
    stock = torch._grouped_mm(a.float().contiguous(), b.float().contiguous(), offs=offs).bfloat16()
    res["the control: stock's grouped GEMM differs"] = not bits_equal(stock[:146], among5[:146])
    lin = fast.linear_kernels
    cfg = dict(lin.config_for("linear", lin.target_of(a.device), m=70, n=n, k=k))
    cfg["block_k"] //= 2  # another K order: the case must tell it from the pinned one
    res["the case tells the K order (half the BLOCK_K differs)"] = not bits_equal(
        lin.forward_2d(a[6:76], w[3], None, cfg=cfg), among5[6:76]
    )
    with _launches() as count:
        fast.grouped_mm(a, b, offs)
    res["one launch"] = count == {"grouped": 1, "linear": 0}
    return res


def _check_dw() -> dict[str, bool]:
    """The experts' dW in one launch: out[g] = a[:, tokens of g] @ b[tokens of g] (a the transposed view autograd
    hands aten::_grouped_mm, h^T), each expert's the bits of fast.mm of its tokens alone, whatever the others."""
    g = torch.Generator().manual_seed(4)
    s, m, n = 1300, 200, 272  # token counts 0, 1, 45, 1000 (15 x 64 + 40: a K tail), 254, 0; M, N not tile multiples
    h = torch.randn(s, m, generator=g).half()  # fp16's output rounding hides fewer K orders than bf16's
    dy = torch.randn(s, n, generator=g).half()
    offs = torch.tensor([0, 1, 46, 1046, 1300, 1300], dtype=torch.int32)
    spans = [(0, 0), (0, 1), (1, 46), (46, 1046), (1046, 1300), (1300, 1300)]
    nan = torch.full((6, m, n), float("nan"), dtype=torch.half)
    out, same = _tma_and_pointer(lambda: fast.grouped_kernels.grouped_dw(h.t(), dy, offs, out=nan.clone()),
                                 "_grouped_dw")  # every element written by the kernel  # fmt: skip
    alone = [fast.mm(h[lo:hi].t(), dy[lo:hi]) if hi > lo else None for lo, hi in spans]
    res = {"each expert's dW == fast.mm of its tokens alone": all(
        bits_equal(out[e], w) for e, w in enumerate(alone) if w is not None)}  # fmt: skip
    res["the TMA kernel's bits (h read in place) == the pointer kernel's (h copied)"] = same
    h_inf, dy_inf = h.clone(), dy.clone()
    h_inf[46, 0], dy_inf[46, 0] = float("inf"), float("inf")  # expert 3's first token: in expert 2's last K step
    res["a neighbour's non-finite token stays out of an expert's dW (h, dY)"] = bits_equal(
        fast.grouped_kernels.grouped_dw(h_inf.t(), dy, offs)[2], out[2]) and bits_equal(
        fast.grouped_kernels.grouped_dw(h.t(), dy_inf, offs)[2], out[2])  # fmt: skip
    res["an expert of no token (the first, the last): zeros"] = bool((out[0] == 0).all() and (out[5] == 0).all())
    swept = fast.grouped_kernels.grouped_dw(h.t(), dy, offs, tiles=SWEPT)
    launched = _swept(lambda: fast.grouped_kernels.grouped_dw(h.t(), dy, offs, tiles=SWEPT))
    res["the sweep's tile is the one launched"] = launched
    res["a sweep's other tile (block_m, block_n, warps, stages) gives the same bits"] = bits_equal(swept, out)
    try:
        fast.grouped_kernels.grouped_dw(h.t(), dy, offs, tiles={"block_k": 32})
        res["a sweep may not set BLOCK_K (it pins the bits)"] = False
    except ValueError as exc:
        res["a sweep may not set BLOCK_K (it pins the bits)"] = "BLOCK_K" in str(exc)
    ref = torch.stack([h[lo:hi].double().t() @ dy[lo:hi].double() for lo, hi in spans])
    res["near float64"] = bool((out.double() - ref).abs().max() < 0.05 * ref.abs().max())
    elsewhere = torch.tensor([0, 40, 46, 1046, 1300, 1300], dtype=torch.int32)  # expert 1 takes 39 of expert 2's
    moved = fast.grouped_mm(h.t(), dy, elsewhere)
    res["an expert's dW does not depend on the others' tokens"] = bits_equal(moved[3], out[3]) and bits_equal(
        moved[4], out[4])  # fmt: skip
    lin = fast.linear_kernels
    cfg = dict(lin.config_for("linear_dw", lin.target_of(h.device)), tma=False)
    cfg["block_k"] //= 2  # another K order over the tokens: the case must tell it from the pinned one
    res["the case tells the K order (half the BLOCK_K differs)"] = not bits_equal(
        lin.grad_w_2d(dy[46:1046], h[46:1046], cfg=cfg).t(), out[3])  # fmt: skip
    with M.mode("fast"), _launches() as count:
        served = torch._grouped_mm(h.t(), dy, offs=offs)
    res["the mode serves aten::_grouped_mm's dW form with this kernel"] = bits_equal(served, out)
    res["in one launch"] = count == {"grouped": 1, "linear": 0}
    return res


def _check_bmm() -> dict[str, bool]:
    """torch.bmm under mode("fast"): one launch, each element the bits of fast.mm of that element alone (the mode's
    loop before), in transformers' two batched_mm forms (x.unsqueeze(1) @ W[ids] for 256 rows of one token, W[ids] @
    x.unsqueeze(-1)) and for a small batch of 3-row elements in the forward and dW layouts; empty batches."""
    g = torch.Generator().manual_seed(5)
    s, k, n = 256, 136, 72  # a K tail (136 = 2 x 64 + 8), N not a tile multiple
    # K's second 64 cancel its first 64 exactly: what is left is the first K step's fp32 rounding, so the outputs
    # show the K order (bf16's rounding of random sums would hide it at this K).
    x = torch.randn(s, k, generator=g).bfloat16()
    x[:, 64:128] = x[:, :64]
    w = (torch.randn(s, k, n, generator=g) * 0.2).bfloat16()
    w[:, 64:128] = -w[:, :64]
    w[:, 128:] *= 2**-12
    cases = {
        "x.unsqueeze(1) @ W[ids] (is_transposed)": (x.unsqueeze(1), w),
        "W[ids] @ x.unsqueeze(-1)": ((torch.randn(64, 40, k, generator=g) * 0.2).bfloat16(), x[:64].unsqueeze(-1)),
        "3 rows @ a weight's transpose (forward)": (
            torch.randn(5, 3, k, generator=g).bfloat16(),
            torch.randn(5, n, k, generator=g).bfloat16().transpose(-2, -1),
        ),
        "a transposed @ 3 rows (dW)": (
            torch.randn(5, k, n, generator=g).bfloat16().transpose(-2, -1),
            torch.randn(5, k, 3, generator=g).bfloat16(),
        ),
    }
    res, outs = {}, {}
    for name, (a, b) in cases.items():
        with M.mode("fast"), _launches() as count:
            outs[name] = out = torch.bmm(a, b)
        one = count == {"grouped": 1, "linear": 0}
        res[f"{name}: one launch, each element == fast.mm of it alone"] = one and all(
            bits_equal(out[i], fast.mm(a[i], b[i])) for i in range(a.shape[0])
        )
    a, b = x.unsqueeze(1), w
    out = outs["x.unsqueeze(1) @ W[ids] (is_transposed)"]
    lin = fast.linear_kernels
    cfg = dict(lin.config_for("linear_dx", lin.target_of(a.device), m=1, n=n, k=k))
    cfg["block_k"] //= 2  # another K order: the case must tell it from the pinned one
    res["the case tells the K order (half the BLOCK_K differs)"] = not all(
        bits_equal(lin.grad_x_2d(a[i], b[i], cfg=cfg), out[i]) for i in range(16)
    )
    res["the control: stock's bmm differs"] = not bits_equal(torch.bmm(a.float(), b.float()).bfloat16(), out)
    with M.mode("fast"), _launches() as count:
        empty = torch.bmm(a[:0], b[:0]), torch.bmm(a[:, :0], b)
    res["B = 0 and M = 0: empty, nothing launched"] = [tuple(e.shape) for e in empty] == [(0, 1, n), (s, 0, n)] and (
        count == {"grouped": 0, "linear": 0}
    )
    return res


_READS = ("tolist", "item", "numpy", "cpu", "__int__", "__float__", "__bool__", "__index__", "__iter__", "__array__")


@contextlib.contextmanager
def _host_reads(offs: torch.Tensor):
    """The host reads of offs (a tensor over its storage: a value turned into Python's or copied to the host) while
    the block runs, by name."""
    reads, storage = [], offs.untyped_storage().data_ptr()
    saved = {name: getattr(torch.Tensor, name) for name in _READS}

    def watched(name, fn):
        def read(self, *args, **kwargs):
            if self.untyped_storage().data_ptr() == storage:
                reads.append(name)
            return fn(self, *args, **kwargs)

        return read

    for name, fn in saved.items():
        setattr(torch.Tensor, name, watched(name, fn))
    try:
        yield reads
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


def _check_offs() -> dict[str, bool]:
    """aten::_grouped_mm under mode("fast"): no host read of offs (the tiles found on the device); bad offs (a
    decreasing end, an end past the rows or tokens) give each group's rows as the kernel clamps them, and a ModeError
    naming the problem at the mode's exit; good offs none; an error of the block itself is not replaced. The control:
    the public call with its eager check reads offs."""
    g = torch.Generator().manual_seed(6)
    a, w = torch.randn(20, 64, generator=g).bfloat16(), torch.randn(3, 64, 24, generator=g).bfloat16()
    good = torch.tensor([4, 4, 17], dtype=torch.int32)
    res = {}
    with M.mode("fast"), _host_reads(good) as reads:
        torch._grouped_mm(a, w, offs=good)
        torch._grouped_mm(a.t(), a[:, :24], offs=good)
    res["the mode reads no offs on the host (forward, dW)"] = reads == []
    with _host_reads(good) as reads:
        fast.grouped_mm(a, w, good)
    res["the control: the public call's eager check reads offs"] = "tolist" in reads

    def raised(offs: torch.Tensor, call=lambda o: torch._grouped_mm(a, w, offs=o)) -> tuple[str, object]:
        out = None
        try:
            with M.mode("fast"):
                out = call(offs)
        except M.ModeError as exc:
            return str(exc), out
        return "", out

    msg, out = raised(good)
    res["good offs: no error at the exit"] = msg == "" and M.active() is None
    bad = torch.tensor([9, 5, 30], dtype=torch.int32)  # a decreasing end, an end past the 20 rows
    msg, out = raised(bad)
    res["bad offs: a ModeError at the exit naming the problem"] = (
        "aten::_grouped_mm with offs that are not 3 non-decreasing group ends within the 20 rows" in msg
    )
    bounds, _ = clamped_groups(bad, 20)  # (0, 9), (9, 9), (9, 20): the groups as the kernel clamps them
    res["bad offs: each clamped group's rows == fast.mm of them"] = out is not None and all(
        bits_equal(out[lo:hi], fast.mm(a[lo:hi], w[e])) for e, (lo, hi) in enumerate(bounds) if hi > lo
    )
    msg, _ = raised(bad, lambda o: torch._grouped_mm(a.t(), a[:, :24], offs=o))
    res["bad offs, dW form: named at the exit"] = "3 non-decreasing group ends within the 20 tokens" in msg
    msg, _ = raised(bad, lambda o: torch._grouped_mm(a[:, :0], w[:, :0], offs=o))  # K = 0: no kernel runs
    res["bad offs where no kernel runs: named at the exit"] = "within the 20 rows" in msg
    try:
        with M.mode("fast"):
            torch._grouped_mm(a, w, offs=bad)
            raise KeyError("the block's own")
    except KeyError:
        res["the block's own error is not replaced"] = M.active() is None
    except M.ModeError:
        res["the block's own error is not replaced"] = False
    return res


if __name__ == "__main__":
    serve({"grouped": _check_grouped, "dw": _check_dw, "bmm": _check_bmm, "offs": _check_offs})
