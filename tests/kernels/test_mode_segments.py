"""mode_segments' Triton kernel of index_add in source order (run here in Triton's interpreter, on a GPU with `gpu`):
the bits of mode_ops.index_add_'s passes, its reference, for fp32 / bf16 / fp16, rows named 0 to 9 times, widths
around the column block; an index outside the rows flagged (a ModeError at once outside a mode, at its exit inside
one) and nothing written for it; the order shows (a reversed source differs); no host read under the mode (GPU:
CUDA's sync debug mode, a mixture of experts' combine and its gradient), and its control: the passes read."""

from __future__ import annotations

import contextlib

import pytest
import torch
from triton_interpreter import failed, interpret, serve

from rl_kernel.aten import mode as M
from rl_kernel.aten import ops as mode_ops
from rl_kernel.aten import segments as mode_segments
from rl_kernel.bitwise import bits_equal

CASES = [(6, 4, 7), (50, 300, 400), (3, 257, 30), (1, 1, 5)]  # (rows, width, slices)


@pytest.mark.slow
def test_the_kernel_has_the_passes_bits_in_the_interpreter() -> None:
    found = interpret(__file__, "bits")
    assert len(found) == 3 * len(CASES) + 3 and not failed(found), failed(found)


@pytest.mark.gpu
def test_the_kernel_has_the_passes_bits_on_the_gpu_and_the_mode_never_waits() -> None:
    found = _check_bits("cuda", [*CASES, (4096, 2048, 4096 * 8)]) | _check_no_wait()
    assert not failed(found), failed(found)


def test_the_cpu_without_the_interpreter_keeps_the_passes(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not mode_segments.available(torch.zeros(3, 4), 0)


# ---- what the subprocess (or the GPU test) runs --------------------------------------------------------------
@contextlib.contextmanager
def _passes():
    """mode_ops.index_add_'s reference: its passes, the kernel set aside."""
    saved, mode_segments.available = mode_segments.available, lambda out, dim: False
    try:
        yield
    finally:
        mode_segments.available = saved


def _case(rows: int, width: int, slices: int, dtype: torch.dtype, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g).to(dtype).to(device)
    src = torch.randn(slices, width, generator=g) * torch.exp2(torch.randint(-8, 9, (slices, 1), generator=g))
    index = torch.randint(0, rows, (slices,), generator=g)
    index[: min(9, slices)] = 0  # row 0 named at least min(9, slices) times
    return x, index.to(device), src.to(dtype).to(device)


def _check_bits(device: str, cases) -> dict[str, bool]:
    res = {}
    for i, (rows, width, slices) in enumerate(cases):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x, index, src = _case(rows, width, slices, dtype, device, i)
            got = mode_ops.index_add(x, 0, index, src)
            with _passes():
                want = mode_ops.index_add(x, 0, index, src)
            res[f"{rows}x{width} <- {slices} {dtype}"] = bits_equal(got, want)
    x, index, src = _case(40, 300, 200, torch.bfloat16, device, 9)
    res["the order shows: a reversed source differs"] = not bits_equal(
        mode_ops.index_add(x, 0, index, src), mode_ops.index_add(x, 0, index.flip(0), src.flip(0)))  # fmt: skip
    bad = index.clone()
    bad[5] = 40
    try:
        mode_ops.index_add(x, 0, bad, src)
        res["an index outside the rows: a ModeError at once outside a mode"] = False
    except mode_ops.ModeError as exc:
        res["an index outside the rows: a ModeError at once outside a mode"] = "outside the 40 rows" in str(exc)
    checks = mode_ops.Checks()
    out = mode_ops.index_add(x, 0, bad, src, checks=checks)
    keep = torch.arange(200, device=device) != 5
    with _passes():
        want = mode_ops.index_add(x, 0, index[keep], src[keep])
    res["with the mode's checks: reported at its exit, nothing added for it"] = (
        checks.problems() == [mode_ops._OUTSIDE.format(rows=40)] and bits_equal(out, want))  # fmt: skip
    return res


def _check_no_wait() -> dict[str, bool]:
    """A mixture of experts' combine under mode("fast") on the GPU, as transformers runs it (index_add_ of the tokens'
    weighted expert outputs, and the gather's gradient through an accumulating index_put): no host read (CUDA's
    sync debug mode raises on one); the control: the passes sync."""
    g = torch.Generator(device="cuda").manual_seed(3)
    tokens, hidden, top = 512, 256, 8
    x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16().requires_grad_()
    index = torch.randint(0, tokens, (tokens * top,), device="cuda", generator=g)
    out = torch.zeros(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    res = {}
    torch.cuda.synchronize()
    try:
        with M.mode("fast"):
            torch.cuda.set_sync_debug_mode("error")
            combined = out.index_add(0, index, x[index] * 0.5)
            combined.sum().backward()
            torch.cuda.set_sync_debug_mode(0)
        res["the combine and its gradient under the mode: no host read"] = x.grad is not None
    except RuntimeError as exc:
        torch.cuda.set_sync_debug_mode(0)
        res[f"the combine and its gradient under the mode: no host read ({exc})"] = False
    try:
        with _passes():
            torch.cuda.set_sync_debug_mode("error")
            mode_ops.index_add(out, 0, index, x.detach())
        res["the control: the passes read the host"] = False
    except RuntimeError:
        res["the control: the passes read the host"] = True
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return res


if __name__ == "__main__":
    serve({"bits": lambda: _check_bits("cpu", CASES)})
