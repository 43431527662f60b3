"""rl_kernel.fast's plans (fast.decoder.plan): a decode step's linear, or group of linears, launched again for
operands of the layouts it was checked and launched with, through the kept launch's Replay (no checks, no config,
no key). In Triton's interpreter (a subprocess): a repeat launches nothing through launch / launch_replay and gives
the first call's bits; new tensors of the same layouts give their own bits (the pointers are passed anew); every
other layout (M, dtype, strides, a bias or none), a pointer not 16-byte aligned, a gradient or a non-contiguous
operand takes the full path, with its bits. On a GPU: the planned linears of a decode step == the full path's bits.
"""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import failed, interpret, serve

import rl_kernel.fast as fast
from rl_kernel.bitwise import bits_equal


@pytest.mark.slow
def test_interpreter_plans() -> None:
    found = interpret(__file__, "plans")
    assert len(found) >= 14
    assert not failed(found), failed(found)


@pytest.mark.slow
def test_interpreter_attention_plans() -> None:
    found = interpret(__file__, "attention")
    assert len(found) >= 10
    assert not failed(found), failed(found)


def _counting(launched: list[str]):
    """Wrap the linear's, the group's and the attention's launch and launch_replay so each launch names its kernel
    in `launched`."""
    mods = (fast.linear_kernels, fast.group_kernels, fast.attention_kernels)
    real = {(m, n): getattr(m, n) for m in mods for n in ("launch", "launch_replay")}

    def counted(fn):
        def run(kernel, *args, **kwargs):
            launched.append(kernel.fn.__name__)
            return fn(kernel, *args, **kwargs)

        return run

    for (m, n), fn in real.items():
        setattr(m, n, counted(fn))
    return lambda: [setattr(m, n, fn) for (m, n), fn in real.items()]


def _check_plans() -> dict[str, bool]:
    from rl_kernel.fast.decoder import plan as plans

    g = torch.Generator().manual_seed(0)
    k = 168  # a K tail: 168 = 2 x 64 + 40
    x = torch.randn(4, 1, k, generator=g).bfloat16()  # a decode step's rows
    w, w2 = ((torch.randn(80, k, generator=g) * 0.2).bfloat16() for _ in range(2))
    b = torch.randn(80, generator=g).bfloat16()
    launched: list[str] = []
    restore = _counting(launched)

    def call(fn, *args) -> tuple[object, list[str]]:
        launched.clear()
        return fn(*args), list(launched)

    def full(fn, *args):  # the full path's result: every plan forgotten first
        plans.clear()
        out = fn(*args)
        plans.clear()
        return out

    res = {}
    try:
        for bias in (None, b):
            tag = "with a bias" if bias is not None else "no bias"
            ref = full(fast.linear, x, w, bias)
            first, seen = call(fast.linear, x, w, bias)
            kept = seen == ["_gemm_kernel"] and bits_equal(first, ref)
            res[f"{tag}: the first call launches once and keeps its plan"] = kept
            again, seen = call(fast.linear, x, w, bias)
            res[f"{tag}: a repeat launches nothing (its plan), the same bits"] = seen == [] and bits_equal(again, ref)
            x2 = torch.randn(4, 1, k, generator=g).bfloat16()
            other, seen = call(fast.linear, x2, w2, bias)
            res[f"{tag}: new tensors of the same layouts: the plan, their own bits"] = seen == [] and bits_equal(
                other, full(fast.linear, x2, w2, bias)
            )
        # Every other layout takes the full path (a launch), with the full path's bits.
        buf = torch.randn(4 * k + 1, generator=g).bfloat16()
        cases = {
            "another M": torch.randn(6, 1, k, generator=g).bfloat16(),
            "fp16": torch.randn(4, 1, k, generator=g).half(),
            "a pointer not 16-byte aligned": buf[1:].view(4, 1, k),
            "x not contiguous": torch.randn(4, 2, k, generator=g).bfloat16()[:, :1],
        }
        fast.linear(x, w)  # the plan of (x, w) is there
        for name, xs in cases.items():
            ws = w.half() if xs.dtype == torch.float16 else w
            ref = full(fast.linear, xs, ws)
            fast.linear(x, w)
            (y, seen), (y2, _) = call(fast.linear, xs, ws), call(fast.linear, xs, ws)  # the second: its own plan?
            bits = bits_equal(y, ref) and bits_equal(y2, ref)
            res[f"{name}: the full path, its bits, twice"] = seen == ["_gemm_kernel"] and bits
        fast.linear(x, w)
        xg = x.clone().requires_grad_()
        y, seen = call(fast.linear, xg, w)
        res["a gradient: the custom op with its autograd"] = y.grad_fn is not None and seen == ["_gemm_kernel"]
        # A group (the target grouping its launches): its plan, the separate linears' bits, its own operands.
        grp, pinned = fast.group_kernels, fast.group_kernels.grouped_launches
        grp.grouped_launches = lambda target: True
        ws3 = tuple((torch.randn(n, k, generator=g) * 0.2).bfloat16() for n in (80, 48, 112))
        bs3 = tuple(torch.randn(n, generator=g).bfloat16() for n in (80, 48, 112))
        for n, biases in ((2, (None, None)), (3, bs3)):
            group = (x, ws3[:n], biases[:n])
            plans.clear()
            _, seen = call(fast.linear_group, *group)
            res[f"group of {n}: the first call launches once"] = seen == ["_gemm_group_kernel"]
            ys, seen = call(fast.linear_group, *group)
            singles = [full(fast.linear, x, wi, bi) for wi, bi in zip(*group[1:], strict=True)]
            res[f"group of {n}: a repeat launches nothing, the linears' bits"] = seen == [] and all(
                bits_equal(y, s) for y, s in zip(ys, singles, strict=True)
            )
            swapped = (x, tuple(reversed(ws3[:n])) if n == 2 else ws3[:n], biases[:n])  # 80/48 swapped: another layout
            ys, seen = call(fast.linear_group, *swapped)
            res[f"group of {n}: weights of other layouts launch again"] = n == 3 or seen == ["_gemm_group_kernel"]
        grp.grouped_launches = pinned
    finally:
        restore()
    return res


def _decode_step(b: int, hq: int, hkv: int, d: int, gen: torch.Generator, device: str = "cpu"):
    """A decode step's attention operands at each key count: q [b, hq, 1, d], the cache as a decode step's
    DynamicCache gives it (a new contiguous k and v of t keys each step), q_pos = t - 1, k_start per sequence."""
    kf, vf = (torch.randn(b, hkv, 512, d, generator=gen, device=device).bfloat16() for _ in range(2))
    k_start = torch.arange(b, device=device) * 3

    def at(t: int):
        q = torch.randn(b, hq, 1, d, generator=gen, device=device).bfloat16()
        q_pos = torch.full((b, 1), t - 1, device=device)
        return q, kf[:, :, :t].contiguous(), vf[:, :, :t].contiguous(), q_pos, k_start

    return at


def _check_attention_plans() -> dict[str, bool]:
    from rl_kernel.fast.decoder import plan as plans

    g = torch.Generator().manual_seed(1)
    at = _decode_step(3, 4, 2, 32, g)
    launched: list[str] = []
    restore = _counting(launched)

    def call(*args, **kw):
        launched.clear()
        return fast.attention(*args, **({"validate": False} | kw)), list(launched)

    def full(*args, **kw):
        plans.clear()
        out = fast.attention(*args, **({"validate": False} | kw))
        plans.clear()
        return out

    res = {}
    try:
        step = at(20)
        ref = full(*step)
        plans.clear()
        first, seen = call(*step)
        res["the first decode step launches once and keeps its plan"] = seen == ["_attn_fwd_kernel"] and bits_equal(
            first, ref
        )
        # Key counts 21..40: a new Tk and new cache strides every step. 32 (a multiple of 16) is another int class:
        # it launches once and keeps a plan of its own; every other count takes the kept plan.
        steps = {t: at(t) for t in range(21, 41)}
        refs = {t: full(*s) for t, s in steps.items()}
        call(*step)
        seen_at = {}
        for t, s in steps.items():
            out, seen_at[t] = call(*s)
            res[f"{t} keys: the full path's bits"] = bits_equal(out, refs[t])
        res["a key more each step: the plan, nothing launched (32 keys: its own class, one launch)"] = all(
            seen_at[t] == (["_attn_fwd_kernel"] if t == 32 else []) for t in steps
        )
        again, seen = call(*steps[32])
        res["32 keys again: the plan of its class"] = seen == [] and bits_equal(again, refs[32])
        # Every other call takes the full path, with its bits.
        q, k, v, q_pos, k_start = at(24)
        buf = torch.randn(q.numel() + 1, generator=g).bfloat16()
        cases = {
            "validate=True": ((q, k, v, q_pos, k_start), {"validate": True}),
            "another scale": ((q, k, v, q_pos, k_start), {"scale": 0.5}),
            "int32 positions": ((q, k, v, q_pos.int(), k_start.int()), {}),
            "another batch": ((q[:2], k[:2], v[:2], q_pos[:2], k_start[:2]), {}),
            "a pointer not 16-byte aligned": ((buf[1:].view(q.shape), k, v, q_pos, k_start), {}),
            "k not contiguous": ((q, torch.cat([k, k], dim=-1)[..., :32], v, q_pos, k_start), {}),
            "k and v slices of a longer cache (strides over batch and head not theirs)": (
                (q, at(30)[1][:, :, :24], at(30)[2][:, :, :24], q_pos, k_start),
                {},
            ),
        }
        for name, (args, kw) in cases.items():
            ref = full(*args, **kw)
            call(*at(24))  # the decode step's plan is there
            y, seen = call(*args, **kw)
            res[f"{name}: the full path, its bits"] = seen == ["_attn_fwd_kernel"] and bits_equal(y, ref)
        call(*at(24))
        try:
            call(q, k, at(25)[2], q_pos, k_start)
            res["v of another key count than k: the full path's error"] = False
        except ValueError as e:
            res["v of another key count than k: the full path's error"] = "do not match" in str(e) or "must be" in str(
                e
            )
        qg = q.clone().requires_grad_()
        y, seen = call(qg, k, v, q_pos, k_start)
        res["a gradient: the custom op with its autograd"] = y.grad_fn is not None and seen == ["_attn_fwd_kernel"]
    finally:
        restore()
    return res


@pytest.mark.parametrize("grad", [True, False])
def test_what_is_not_a_tensor_is_named_by_the_checks_with_or_without_a_plan(grad: bool) -> None:
    w = torch.randn(4, 8).bfloat16()
    with torch.set_grad_enabled(grad):
        with pytest.raises(TypeError, match=r"rl_kernel\.fast\.linear: x must be a torch\.Tensor, got str"):
            fast.linear("x", w)
        with pytest.raises(TypeError, match=r"rl_kernel\.fast\.linear: weight must be a torch\.Tensor, got list"):
            fast.linear(torch.zeros(2, 8).bfloat16(), [1.0])
        with pytest.raises(TypeError, match=r"rl_kernel\.fast\.linear: weight1 must be a torch\.Tensor, got int"):
            fast.linear_group(torch.zeros(2, 8).bfloat16(), (w, 3), (None, None))
        q = torch.zeros(1, 2, 1, 8).bfloat16()
        with pytest.raises(TypeError, match=r"rl_kernel\.fast\.attention: k must be a torch\.Tensor, got str"):
            fast.attention(q, "k", q, torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                           validate=False)  # fmt: skip


@pytest.mark.gpu
def test_planned_decode_linears_have_the_full_paths_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU: a decode step's linears and groups (1.7B sizes, batch 32) through their plans == the full path,
    for the tensors the plan was made with and for others of the same layouts."""
    from rl_kernel.fast.decoder import plan as plans

    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen) * scale

    def full(fn, *args):
        plans.clear()
        return fn(*args)

    x, x2 = rand(32, 1, 2048), rand(32, 1, 2048)
    weights = [rand(n, 2048, scale=0.02) for n in (2048, 1024, 1024, 6144, 6144)]
    biases = [rand(n) for n in (2048, 1024, 1024)]
    calls = [(w, None) for w in weights] + list(zip(weights[:3], biases, strict=True))
    monkeypatch.setattr(fast.group_kernels, "grouped_launches", lambda target: True)  # whatever configs.toml pins
    groups = [(tuple(weights[:3]), tuple(biases)), (tuple(weights[3:]), (None, None))]
    with torch.no_grad():
        singles = {id(xs): [full(fast.linear, xs, w, b) for w, b in calls] for xs in (x, x2)}
        grouped = {id(xs): [full(fast.linear_group, xs, ws, bs) for ws, bs in groups] for xs in (x, x2)}
        plans.clear()
        for xs in (x, x2):  # x's first calls keep the plans; x2 (other pointers) takes them
            for _ in range(3):
                for (w, b), f in zip(calls, singles[id(xs)], strict=True):
                    assert bits_equal(fast.linear(xs, w, b), f)
                for (ws, bs), f in zip(groups, grouped[id(xs)], strict=True):
                    assert all(bits_equal(y, r) for y, r in zip(fast.linear_group(xs, ws, bs), f, strict=True))
            assert all(bits_equal(y, singles[id(xs)][i]) for y, i in zip(grouped[id(xs)][0], (5, 6, 7), strict=True))
        assert len(plans._PLANS) >= 4


@pytest.mark.gpu
def test_planned_decode_attention_has_the_full_paths_bits() -> None:
    """On the GPU: a decode step's attention (1.7B sizes, batch 32) through its plans, the cache a key longer each
    step (two int classes: 304, 320 and 336 keys are multiples of 16), == the full path's bits."""
    from rl_kernel.fast.decoder import plan as plans

    at = _decode_step(32, 16, 8, 128, torch.Generator(device="cuda").manual_seed(0), device="cuda")
    steps = [at(t) for t in range(300, 340)]
    with torch.no_grad():
        refs = []
        for s in steps:
            plans.clear()
            refs.append(fast.attention(*s, validate=False))
        plans.clear()
        for _ in range(2):
            for s, ref in zip(steps, refs, strict=True):
                assert bits_equal(fast.attention(*s, validate=False), ref)
    assert sum(key[0] == "attention" for key in plans._PLANS) == 2  # 320 keys' class and every other count's


if __name__ == "__main__":
    serve({"plans": _check_plans, "attention": _check_attention_plans})
