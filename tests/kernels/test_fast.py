"""rl_kernel.fast (the fast tier) on a machine without a GPU.

- compile_check: every fast kernel compiled for sm_90, gfx90a, gfx942, gfx950, gfx1100 and gfx1201 uses exactly
  its pinned matrix instruction family and K step and no atomics; every negative control (another BLOCK_K,
  BLOCK_M=16 -> mma.sync on sm_90, matrix_instr_nonkdim=32 on gfx942, an atomic split-K) is flagged.
- the Triton interpreter (TRITON_INTERPRET=1, in a subprocess: it must be set before Triton is imported):
  the linear against float64 and bitwise batch invariant (M=1 vs larger M, another M bucket included), dX
  batch invariant, dW/db run to run, autograd and torch.compile through the custom ops; the fused head (the
  attention's checks: test_fast_attention.py).
- clear errors: CPU tensors (-> tier='exact'), fp32, mixed devices or dtypes, a missing Triton, bad configs.
Without Triton the Triton tests skip, except with CI=true, where a missing Triton fails.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from triton_interpreter import interpret, serve

import rl_kernel.fast as fast
import rl_kernel.fast.configs as fast_configs
from rl_kernel import tiers

from tooling import require

try:
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

TARGETS = ("sm_90", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201")


def need_triton() -> None:
    require("triton (pip install triton==3.6.0)", HAVE_TRITON, "not installed")


# ---- errors and configs (no Triton needed) ----------------------------------------------------------------
@pytest.fixture
def no_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_signatures_match_the_exact_tier() -> None:
    """A Hugging Face patch swaps the exact tier's functions for these: the same parameters, kinds and defaults."""
    import inspect

    from rl_kernel.exact.decoder import ops as decoder

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(fast.linear) == params(decoder.linear)
    assert params(fast.attention) == params(decoder.attention)


def test_cpu_tensors_name_the_exact_tier(no_interpreter) -> None:
    x, w = torch.randn(2, 8).bfloat16(), torch.randn(4, 8).bfloat16()
    with pytest.raises(ValueError, match=r"no CPU kernels.*tier='exact'"):
        fast.linear(x, w)
    q = torch.randn(1, 2, 3, 8).bfloat16()
    k = torch.randn(1, 1, 3, 8).bfloat16()
    pos, start = torch.arange(3)[None], torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match=r"no CPU kernels.*tier='exact'"):
        fast.attention(q, k, k, pos, start)


def test_no_group_is_made_for_cpu_tensors(no_interpreter) -> None:
    """Without the interpreter the fast tier has no CPU kernels: its group form says it launches nothing once (a patched
    model's linears then make their own calls, which name the exact tier)."""
    assert fast.linear.group.launches_once(torch.zeros(2, 8).bfloat16()) is False


def test_fp32_is_refused(no_interpreter) -> None:
    with pytest.raises(TypeError, match=r"bfloat16/float16 only.*TF32"):
        fast.linear(torch.randn(2, 8), torch.randn(4, 8))
    with pytest.raises(TypeError, match="TF32"):
        fast.attention(*(torch.randn(1, 1, 3, 8),) * 3, torch.arange(3)[None], torch.zeros(1, dtype=torch.long))


def test_mixed_devices_and_dtypes_are_refused(no_interpreter) -> None:
    x = torch.randn(2, 8).bfloat16()
    with pytest.raises(ValueError, match="one device"):
        fast.linear(x, torch.empty(4, 8, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(TypeError, match="one dtype"):
        fast.linear(x, torch.randn(4, 8).half())
    q = torch.randn(1, 2, 3, 8).bfloat16()
    with pytest.raises(ValueError, match="one device"):
        fast.attention(q, q, q, torch.arange(3, device="meta")[None], torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize(
    "out", [torch.empty(6, 4, dtype=torch.float32), torch.empty(4, 6, dtype=torch.bfloat16)], ids=["dtype", "shape"]
)
def test_dweight_into_a_wrong_buffer_is_refused(out: torch.Tensor) -> None:
    from rl_kernel.fast.decoder import linear as fl

    dy, x = torch.zeros(3, 6, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"grad_w_2d: out must be torch.bfloat16 \[6, 4\]"):
        fl.grad_w_2d(dy, x, out=out)


def test_import_without_triton_fails_only_at_the_call() -> None:
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, rl_kernel.fast as f\n"
        "x = torch.empty(2, 8, dtype=torch.bfloat16, device='meta')\n"
        "try:\n    f.linear(x, torch.empty(4, 8, dtype=torch.bfloat16, device='meta'))\n"
        "except RuntimeError as e:\n    print('ERR', e)\n"
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ERR rl_kernel.fast needs Triton" in out.stdout


def test_configs_pin_every_knob() -> None:
    cfg = fast_configs.configs()
    assert set(TARGETS) <= set(cfg["targets"])
    for name, t in cfg["targets"].items():
        assert isinstance(t["launch"]["enable_fp_fusion"], bool)
        if t["backend"] == "hip":
            assert t["launch"]["matrix_instr_nonkdim"] == 16 and t["launch"]["kpack"] == 1
        for key in ("buckets", "dx_buckets"):
            for b in t["linear"].get(key, ()):
                if name == "sm_90":
                    assert b["block_m"] >= 64 and b["num_warps"] % 4 == 0
    # the K step depends on (N, K) only; only the tile changes with M
    ks = {fast_configs.config_for("linear", "sm_90", m=m, n=4096, k=4096)["block_k"] for m in (1, 16, 256, 4096, 16384)}
    assert ks == {64}
    a = fast_configs.config_for("attention", "sm_90", head_dim=128)
    assert a["block_d"] == 128 and fast_configs.config_for("attention", "sm_90", head_dim=96) == a


_SMALL_M = "  { max_m = 64, block_m = 32, block_n = 64, num_warps = 4, num_stages = 2, group_m = 8 },\n"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("block_m = 64, block_n = 64, num_warps = 4, num_stages = 6", "block_m = 16, block_n = 64, num_warps = 4, num_stages = 6"), "mma.sync"),  # noqa: E501
        (("launch = { enable_fp_fusion = false }", "launch = {}"), "enable_fp_fusion"),
        (("schema = 1", "schema = 2"), "schema = 1"),
        (("block_k = 64\nblock_k_by_nk = {}", "block_k = 64\nblock_k_by_nk = {}\nsplit_k = 4"), "unknown keys"),
        (("tma = true\nblock_m = 128", "tma = 1\nblock_m = 128"), "tma must be true or false"),
        (("group = true", "group = 1"), "group must be true or false"),
        (("[targets.gfx942.linear_dw]\n", "[targets.gfx942.linear_dw]\ntma = true\n"), "sm_90 or later"),
        (("block_m = 64, block_n = 64, num_warps = 4, num_stages = 6", "block_m = 64, block_n = 64, num_warps = 2, num_stages = 6"), "mma.sync"),  # noqa: E501
        ((_SMALL_M, _SMALL_M * 2), "max_m must increase"),
        (("[targets.sm_90", "[targets.sm_80"), "sm_90 or later"),  # every sm_90 table renamed: its tma = true
    ],
)  # fmt: skip
def test_config_loader_rejects(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    text = fast_configs.CONFIG_PATH.read_text()
    assert edit[0] in text
    bad = tmp_path / "configs.toml"
    bad.write_text(text.replace(*edit))  # every occurrence: each target that has it
    with pytest.raises(fast_configs.ConfigError, match=message):
        fast_configs.configs(bad)


def test_unknown_target_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no pinned config for target 'sm_61'"):
        fast_configs.config_for("linear", "sm_61", m=1, n=8, k=8)


# ---- compile_check: the static proof ---------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_compile_check_target(target: str) -> None:
    need_triton()
    from rl_kernel.fast import compile_check

    reports = compile_check.check_target(target)
    bad = [(r.kernel, r.dtype, r.problems) for r in reports if not r.ok]
    assert not bad, bad
    mma = [r for r in reports if r.instructions]
    assert len(mma) >= 8  # the linear's GEMMs and the three attention kernels per head dim
    family = {"sm_90": "wgmma", "gfx1100": "v_wmma", "gfx1201": "v_wmma"}.get(target, "v_mfma_f32_16x16x")
    assert all(i.startswith(family) for r in mma for i in r.instructions)


@pytest.mark.slow
def test_compile_check_negative_controls_are_flagged() -> None:
    need_triton()
    from rl_kernel.fast import compile_check

    controls = compile_check.negative_controls()
    assert len(controls) == 5
    assert all(c["flagged"] for c in controls), controls
    by_name = {c["control"]: " ".join(c["problems"]) for c in controls}
    assert any("mma.sync" in p for n, p in by_name.items() if "BLOCK_M=16" in n)
    assert any("32x32x8" in p for n, p in by_name.items() if "nonkdim=32" in n)
    assert any("K steps [32]" in p for n, p in by_name.items() if "BLOCK_K=32" in n)
    assert all("atomics" in p for n, p in by_name.items() if "split-K" in n)


# ---- the Triton interpreter (a subprocess: TRITON_INTERPRET must be set before Triton is imported) -------
@pytest.mark.slow
def test_interpreter_linear() -> None:
    r = interpret(__file__, "linear")
    failed = {k: v for k, v in r.items() if v is not True}
    assert not failed, failed


@pytest.mark.slow
def test_interpreter_fused_head() -> None:
    r = interpret(__file__, "head")
    failed = {k: v for k, v in r.items() if v is not True}
    assert not failed, failed


# ---- what the subprocess runs --------------------------------------------------------------------------
def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


def _check_linear() -> dict[str, bool]:
    lin = fast.linear_kernels
    g = torch.Generator().manual_seed(0)
    m, n, k = 300, 80, 96  # M = 300 is in another sm_90 bucket than M <= 256
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * 0.2).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    y = fast.linear(x, w, b)
    ref = x.double() @ w.double().t() + b.double()
    res = {"fwd vs float64 within bf16 rounding": bool(((y.double() - ref).abs() <= ref.abs() * 2**-7 + 1e-3).all())}
    res["fwd M=1,7,200 rows == M=300 rows (bits)"] = all(_same(fast.linear(x[:r], w, b), y[:r]) for r in (1, 7, 200))

    # BLOCK_K is pinned per (N, K), never per M: the unrounded fp32 accumulator of a row is the same at M = 1, 7, 200
    # and in the M = 300 launch (another M bucket), forward and dX. (A bf16 output's rounding can hide a K order.)
    def acc(rows: torch.Tensor) -> torch.Tensor:
        cfg = fast_configs.config_for("linear", "sm_90", m=rows.shape[0], n=n, k=k)
        return lin._launch_gemm(rows, (w.stride(1), w.stride(0)), w, n, cfg, None, out_dtype=torch.float32)

    full, dy = acc(x), torch.randn(m, n, generator=g).bfloat16()
    dfull = lin.grad_x_2d(dy, w, out_dtype=torch.float32)
    res["fp32 accumulator: fwd rows at M=1,7,200 == at M=300 (bits)"] = all(
        torch.equal(acc(x[:r]).view(torch.int32), full[:r].view(torch.int32)) for r in (1, 7, 200)
    )
    res["fp32 accumulator: dX rows at M=1,7,200 == at M=300 (bits)"] = all(
        torch.equal(lin.grad_x_2d(dy[:r], w, out_dtype=torch.float32).view(torch.int32), dfull[:r].view(torch.int32))
        for r in (1, 7, 200)
    )
    base = torch.randn(m, k, generator=g) * 4  # fp32 sums of both signs and magnitudes: each add rounds
    into = base.clone()
    lin.add_grad_x_2d(dy, w, into)
    res["dX added as it is stored == base + the fp32 dX (bits)"] = torch.equal(
        into.view(torch.int32), (base + dfull).view(torch.int32)
    )
    res["fwd leading dims [3, 100, K]"] = _same(fast.linear(x.view(3, 100, k), w, b).view(m, n), y)
    res["fwd non-contiguous x"] = _same(fast.linear(x.t().contiguous().t(), w, b), y)
    dy = torch.randn(m, n, generator=g).bfloat16()
    dx = lin.grad_x_2d(dy, w)
    res["dX M=1,200 rows == M=300 rows (bits)"] = all(_same(lin.grad_x_2d(dy[:r], w), dx[:r]) for r in (1, 200))
    res["dX vs float64"] = bool(((dx.double() - dy.double() @ w.double()).abs() < 0.1).all())
    dw = [lin.grad_w_2d(dy, x) for _ in range(2)]
    res["dW run to run"] = _same(dw[0], dw[1])
    db = [lin.grad_b_2d(dy) for _ in range(2)]
    res["db run to run, vs float64"] = _same(db[0], db[1]) and bool(
        ((db[0].double() - dy.double().sum(0)).abs() < 0.5).all()
    )
    # autograd through the custom op
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    fast.linear(xg.view(3, 100, k), wg, bg).backward(dy.view(3, 100, n))
    refs = (dy.double() @ w.double(), dy.double().t() @ x.double(), dy.double().sum(0))
    errs = [((t.grad.double() - r).abs().max() / r.abs().max()).item() for t, r in zip((xg, wg, bg), refs, strict=True)]
    res["autograd dx/dW/db vs float64"] = max(errs) < 0.01
    res["autograd dx == the dX kernel (bits)"] = _same(xg.grad, dx)
    # the mode's products: fast.mm by layout, each the linear's kernel (fp32 shows the K order: dW reduces over M)
    res["mm(x, W.t()) (+ bias) == the forward (bits)"] = _same(fast.mm(x, w.t()), fast.linear(x, w)) and _same(
        fast.mm(x, w.t(), b), y
    )
    res["mm(dY, W) == the dX kernel (bits)"] = _same(fast.mm(dy, w), dx)
    res["mm(dY.t(), X) == the dW kernel (bits)"] = _same(fast.mm(dy.t(), x), dw[0])
    # torch.compile: the op is traced (fake) and the config chosen at run time, per call
    comp = torch.compile(lambda a: fast.linear(a, w, b), backend="aot_eager", dynamic=True, fullgraph=True)
    res["torch.compile == eager (M=1, 300)"] = _same(comp(x[:1]), y[:1]) and _same(comp(x), y)
    # the gate's negative control: a split-K moves bits (and stays near float64)
    os.environ[tiers.CONTROL_VAR] = "split-k"
    try:
        y_split = tiers.get("fast").op("linear")(x, w, b)
    finally:
        del os.environ[tiers.CONTROL_VAR]
    res["split-k control moves bits, stays accurate"] = not _same(y_split, y) and bool(
        (y_split.double() - ref).norm() / ref.norm() < 1e-2
    )
    res.update(_check_tma(g))
    return res


def _check_tma(g: torch.Generator) -> dict[str, bool]:
    """The persistent TMA kernel (a config's tma = true) against the pointer kernel, fp32 outputs (the K order shows):
    forward (B read as the [N, K] weight), dX (B as [K, N]), dW (A read column-major as A^T), the fp32 add into C,
    a bias; edges in M, N and a K tail (K = 168: three K steps, the last 40 wide and zero-filled; two steps would hide
    the order, fp32 adds commute); 3 programs looping over the tiles."""
    lin = fast.linear_kernels
    m, n, k = 150, 136, 168  # dX reduces over n = 136 and dW over m = 150: three K steps each too
    x, dy = torch.randn(m, k, generator=g).bfloat16(), torch.randn(m, n, generator=g).bfloat16()
    w, b = (torch.randn(n, k, generator=g) * 0.2).bfloat16(), torch.randn(n, generator=g).bfloat16()
    cfg = dict(block_m=64, block_n=32, block_k=64, num_warps=4, num_stages=3, group_m=2, launch={})
    tma = dict(cfg, tma=True)
    f32 = torch.float32

    def both(fn) -> tuple[torch.Tensor, torch.Tensor]:
        return fn(cfg), fn(tma)

    def bits(pair: tuple[torch.Tensor, torch.Tensor]) -> bool:
        a, b_ = pair
        return a.shape == b_.shape and torch.equal(a.view(torch.int32), b_.view(torch.int32))

    wt = (w.stride(1), w.stride(0))
    base = torch.randn(m, n, generator=g) * 4
    res = {
        "tma: operands described (not the pointer fallback)": lin._tma_operands(x, w, wt, tma) is not None
        and lin._tma_operands(dy.t(), x, (x.stride(0), x.stride(1)), tma) is not None,
        "tma fwd + bias == pointer kernel (fp32 bits)": bits(both(lambda c: lin._launch_gemm(x, wt, w, n, c, b, f32))),
        "tma dX == pointer kernel (fp32 bits)": bits(both(lambda c: lin.grad_x_2d(dy, w, c, out_dtype=f32))),
        "tma dW (dY read as A^T) == pointer kernel (bits)": bits(both(lambda c: lin.grad_w_2d(dy, x, c))),
        "tma dW's fp32 sum == pointer kernel (bits)": bits(
            both(lambda c: lin._launch_gemm(dy.t(), (x.stride(0), x.stride(1)), x, k, c, out_dtype=f32))
        ),
        "tma fp32 add into C == pointer kernel (bits)": bits(
            both(lambda c: lin._launch_gemm(x, wt, w, n, c, into=base.clone()))
        ),
    }
    # A stride TMA cannot take (K = 100: 200-byte rows) falls back to the pointer kernel, with its bits.
    xo, wo = x[:, :100].contiguous(), w[:, :100].contiguous()
    res["tma: unaligned rows fall back, same bits"] = lin._tma_operands(xo, wo, (1, 100), tma) is None and bits(
        both(lambda c: lin._launch_gemm(xo, (1, 100), wo, n, c, out_dtype=f32))
    )
    return res


def _check_head() -> dict[str, bool]:
    """The fused LM head in the fast tier: the fast unfused path's bits (forward, dW), dHidden batch invariant."""
    from rl_kernel import head

    g = torch.Generator().manual_seed(3)
    rows, hid, vocab = 9, 32, 600
    h = torch.randn(rows, hid, generator=g).bfloat16()
    w = (torch.randn(vocab, hid, generator=g) * 0.3).bfloat16()
    tok = torch.randint(0, 597, (rows,), generator=g)
    tok[2] = -100
    res = {}

    def both(fn, hh, tt, **kw):
        hg, wg = hh.clone().requires_grad_(), w.clone().requires_grad_()
        logp, ent = fn(hg, wg, tt, tier="fast", entropy=True, vocab_size=597, temperature=0.8, **kw)
        (logp.sum() + 0.5 * ent.sum()).backward()
        return logp, ent, hg.grad, wg.grad

    fused = both(head.lm_head_logprobs, h, tok, vocab_chunk=128)
    plain = both(head.unfused, h, tok)
    for name, i in (("log-probs", 0), ("entropy", 1), ("dWeight", 3)):
        res[f"fused {name} == unfused (bits)"] = _same(fused[i], plain[i])  # int16 views: fp32 as pairs
    res["fused dHidden vs unfused within bf16"] = bool(
        ((fused[2].double() - plain[2].double()).abs() <= plain[2].double().abs().max() * 2**-6).all()
    )
    from rl_kernel.fast import head as fast_head

    calls = fast_head.CALL_ELEMENTS
    fast_head.CALL_ELEMENTS = 0  # one chunk per call
    try:
        narrow = both(head.lm_head_logprobs, h, tok, vocab_chunk=128)
    finally:
        fast_head.CALL_ELEMENTS = calls
    res["the whole vocabulary in one call == a chunk per call (all outputs, bits)"] = all(
        _same(a, b) for a, b in zip(fused, narrow, strict=True)
    )
    gemms = fast_head.gemms
    fast_head.gemms = lambda: dataclasses.replace(gemms(), dx_add=None)  # the head adds each fp32 partial itself
    try:
        added = both(head.lm_head_logprobs, h, tok, vocab_chunk=128)
    finally:
        fast_head.gemms = gemms
    res["dHidden: the dX kernel adding each chunk as it stores == the head adding it"] = _same(added[2], fused[2])
    part = both(head.lm_head_logprobs, h[3:7], tok[3:7], vocab_chunk=128)
    res["dHidden rows 3..6 alone == in the batch (bits)"] = _same(part[2], fused[2][3:7])
    res["log-probs rows 3..6 alone == in the batch (bits)"] = _same(part[0], fused[0][3:7])
    return res


if __name__ == "__main__":
    serve({"linear": _check_linear, "head": _check_head})
