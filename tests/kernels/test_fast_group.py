"""rl_kernel.fast.linear_group (a decode step's q/k/v or gate/up in one launch of the group kernel) in Triton's
interpreter (a subprocess): one launch with the separate linears' bits where the target groups its launches, a
launch each where it cannot or does not; the GPU's bits are in tests/integrations/test_transformers.py and
tests/kernels/test_fast_plan.py."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import failed, interpret, serve

import rl_kernel.fast as fast
from rl_kernel.bitwise import bits_equal


@pytest.mark.slow
def test_interpreter_group() -> None:
    found = interpret(__file__, "group")
    assert len(found) >= 10
    assert not failed(found), failed(found)


@pytest.mark.slow
def test_interpreter_group_of_equal_widths() -> None:
    """Three linears of one width, grouping forced on: each output in its place, by its bits (a process of its own:
    with unequal widths an output swapped with another is written past its buffer, a crash rather than a check)."""
    found = interpret(__file__, "equal")
    assert len(found) == 1 and not failed(found), failed(found)


def _check_equal_widths() -> dict[str, bool]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 168, generator=g).bfloat16()
    ws = tuple((torch.randn(64, 168, generator=g) * 0.2).bfloat16() for _ in range(3))
    real = fast.group_kernels.grouped_launches
    fast.group_kernels.grouped_launches = lambda target: True
    try:
        ys = fast.linear_group(x, ws, (None,) * 3)
    finally:
        fast.group_kernels.grouped_launches = real
    return {"group of 3 equal widths: each output in its place (bits)": all(
        bits_equal(y, fast.linear(x, w)) for y, w in zip(ys, ws, strict=True))}  # fmt: skip


def _check_group() -> dict[str, bool]:
    """linear_group (a decode step's q/k/v or gate/up): on a target that groups its launches, one launch of the group
    kernel for decode rows with the bits of the separate linears (a K tail and three K steps, N not a multiple of
    the tile, with and without biases, leading dims); a launch each where it cannot group (the TMA bucket, some
    biases only, a gradient) or the target does not (configs.toml's linear.group), the same bits."""
    g = torch.Generator().manual_seed(0)
    lin, grp = fast.linear_kernels, fast.group_kernels
    k = 168
    x = torch.randn(4, 8, k, generator=g).bfloat16()
    ws = tuple((torch.randn(n, k, generator=g) * 0.2).bfloat16() for n in (80, 48, 112))
    bs = tuple(torch.randn(w.shape[0], generator=g).bfloat16() for w in ws)
    launched: list[str] = []
    real_launch, real_replay, pinned = lin.launch, lin.launch_replay, grp.grouped_launches

    def counting(fn):
        def counted(kernel, *args, **kwargs):
            launched.append(kernel.fn.__name__)
            return fn(kernel, *args, **kwargs)

        return counted

    def group(x, weights, biases) -> tuple[bool, list[str]]:
        fast.group_kernels.plans.clear()  # the full path (test_fast_plan.py: the plans')
        launched.clear()
        ys = fast.linear_group(x, weights, biases)
        seen = list(launched)
        same = all(bits_equal(y, fast.linear(x, w, b)) for y, w, b in zip(ys, weights, biases, strict=True))
        return same and len(ys) == len(weights), seen

    res = {}
    lin.launch, grp.launch = counting(real_launch), counting(real_launch)
    lin.launch_replay, grp.launch_replay = counting(real_replay), counting(real_replay)
    try:
        same, seen = group(x, ws, (None,) * 3)
        res[f"target's pinned group = {pinned('sm_90')}: the launches it pins, the same bits"] = same and seen == (
            ["_gemm_group_kernel"] if pinned("sm_90") else ["_gemm_kernel"] * 3
        )
        res["launches_once follows the pinned knob"] = grp.launches_once(x) == pinned("sm_90")
        grp.grouped_launches = lambda target: True
        res["launches_once where the target groups"] = grp.launches_once(x)
        for n in (2, 3):
            same, seen = group(x, ws[:n], (None,) * n)
            res[f"group of {n} == the linears (bits), one launch"] = same and seen == ["_gemm_group_kernel"]
            same, seen = group(x, ws[:n], bs[:n])
            res[f"group of {n} with biases == the linears (bits), one launch"] = same and seen == ["_gemm_group_kernel"]
        same, seen = group(x, ws, (bs[0], None, bs[2]))
        res["some biases: a launch each, the same bits"] = same and seen == ["_gemm_kernel"] * 3
        x_big = torch.randn(300, k, generator=g).bfloat16()  # M = 300: the TMA bucket on sm_90
        same, seen = group(x_big, ws, (None,) * 3)
        res["TMA bucket: a launch each, the same bits"] = same and "_gemm_group_kernel" not in seen
        xg = x.clone().requires_grad_()
        launched.clear()
        ys = fast.linear_group(xg, ws, (None,) * 3)
        res["a gradient: the linears, each with its autograd"] = (
            all(y.grad_fn is not None for y in ys) and "_gemm_group_kernel" not in launched
        )
    finally:
        lin.launch = grp.launch = real_launch
        lin.launch_replay = grp.launch_replay = real_replay
        grp.grouped_launches = pinned
    return res


if __name__ == "__main__":
    serve({"group": _check_group, "equal": _check_equal_widths})
