"""mode_tree's Triton kernel of the mode's sum tree (run here in Triton's interpreter, on a GPU with `gpu`): the bits of
mode_ops.tree_adds, its torch reference, for both axes, rows of every length class (under a chunk, not a multiple of
8, a power of two, more than one pass), bf16 / fp16 read as fp32, signed zeros, infinities and NaN; and a mutant of
the pairing that the same checks catch."""

from __future__ import annotations

import re

import pytest
import torch
from triton_interpreter import failed, interpret, need_triton, serve

from rl_kernel.aten import ops as mode_ops
from rl_kernel.aten import tree as mode_tree

# (shape, first): rows of the last dim, or a first-dim sum (a weight's gradient over the tokens)
CASES = [((3, 5), False), ((4, 8), False), ((7, 100), False), ((2, 64), False), ((3, 513), False), ((5, 4099), False),
         ((70, 3), True), ((1, 9), True), ((4100, 3), True), ((520, 130), True)]  # fmt: skip
GPU_CASES = [((131072, 128), True), ((8192, 2048), True), ((8192, 2048), False), ((131072, 128), False)]


@pytest.mark.slow
def test_the_kernel_has_the_reference_bits_in_the_interpreter() -> None:
    assert not failed(interpret(__file__, "bits"))


@pytest.mark.slow
def test_a_mutant_of_the_pairing_is_caught_in_the_interpreter() -> None:
    found = interpret(__file__, "mutant")
    assert found and failed(found) == found, found  # every multi-level case differs under the mutant


def test_the_cpu_without_the_interpreter_keeps_torch_adds(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(3, 100)
    assert not mode_tree.available(x) and not mode_tree.available(x.double())
    assert torch.equal(mode_ops.tree_sum(x).view(torch.int32), mode_ops.tree_adds(x, False).view(torch.int32))


# ---- compiled for every target without a GPU: one IEEE add per node, no fused multiply-add, no atomics ------------
FMA = re.compile(r"\bfma\.rn\.f32|\bv_fmac?_f32|\bv_pk_fma_f32|\bv_fma_mix")
ADD = re.compile(r"\badd(\.rn)?\.f32|\bv_(pk_)?add_f32")


def _compiled_asm(kernel, target: str, levels: int, dtype: str = "fp32") -> str:
    from rl_kernel.fast import compile_check

    types = {n: "i32" for n in kernel.arg_names} | {"x_ptr": f"*{dtype}", "out_ptr": "*fp32"}
    backend = compile_check.gpu_target(target).backend
    compiled = compile_check._compile(kernel, types, {"LEVELS": levels, "BLOCK_C": mode_tree.BLOCK}, target,
                                      {"num_warps": 4})  # fmt: skip
    return compiled.asm["ptx" if backend == "cuda" else "amdgcn"]


@pytest.mark.slow
def test_the_kernel_compiles_for_every_target_to_adds_alone() -> None:
    need_triton()
    from rl_kernel.fast import compile_check

    for target in compile_check.all_targets():
        for levels, dtype in ((3, "fp32"), (mode_tree.GROUP_LEVELS, "bf16")):
            asm = _compiled_asm(mode_tree._tree_pass_kernel, target, levels, dtype)
            assert ADD.search(asm) and not FMA.search(asm), (target, levels, FMA.findall(asm)[:3])
            key = "ptx" if "sm_" in target else "amdgcn"
            assert not compile_check.ATOMIC_RE[key].search(asm), target


@pytest.mark.slow
def test_the_scan_catches_a_fused_multiply_add() -> None:
    """The negative control: a tree whose node is left * 1.5 + right compiles to an fma that the scan names."""
    need_triton()
    import triton
    import triton.language as tl

    @triton.jit
    def fused(x_ptr, out_ptr, n, count, blocks, s_n, s_c, o_n, o_c, LEVELS: tl.constexpr, BLOCK_C: tl.constexpr):
        G: tl.constexpr = 1 << LEVELS
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        i = tl.program_id(0).to(tl.int64) * G + tl.arange(0, G)
        t = tl.load(x_ptr + i[:, None] * s_n + c[None, :] * s_c, mask=i[:, None] < n, other=0.0)
        for level in tl.static_range(LEVELS):
            left, right = tl.split(tl.permute(tl.reshape(t, (G >> (level + 1), 2, BLOCK_C)), (0, 2, 1)))
            t = left * 1.5 + right
        tl.store(out_ptr + c * o_c, tl.reshape(t, (BLOCK_C,)), mask=c < count)

    for target in ("sm_90", "gfx942"):
        assert FMA.search(_compiled_asm(fused, target, 3)), target


@pytest.mark.gpu
def test_the_kernel_has_the_reference_bits_on_the_gpu() -> None:
    found = _check_bits("cuda", CASES + GPU_CASES)
    assert not failed(found), failed(found)


# ---- what the subprocess runs -------------------------------------------------------------------------------
def _input(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Magnitudes over 2^-20..2^20 (so the order of the adds shows in the bits), with signed zeros, infinities and
    a NaN in some rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 21, shape, generator=g).float())
    flat = x.view(-1)
    if flat.numel() > 40:
        flat[3], flat[11], flat[17], flat[29] = -0.0, 0.0, float("inf"), float("nan")
    return x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _check_bits(device: str, cases) -> dict[str, bool]:
    res = {}
    for i, (shape, first) in enumerate(cases):
        x = _input(shape, i).to(device)
        name = f"{'x'.join(map(str, shape))} {'first' if first else 'last'}"
        res[f"{name} fp32"] = _same(mode_tree.tree_sum(x, first), mode_ops.tree_adds(x, first))
        h = x.to(torch.bfloat16)  # read as fp32 in the kernel: the bits of the widened copy's sum
        res[f"{name} bf16"] = _same(mode_tree.tree_sum(h, first), mode_ops.tree_adds(h.float(), first))
        res[f"{name} through tree_sum"] = _same(mode_ops.tree_sum(x, 0 if first else -1), mode_ops.tree_adds(x, first))
    neg = -torch.zeros(3, 9, device=device)  # a row of -0: the padding's +0 makes +0, as in the reference
    res["-0 rows"] = _same(mode_tree.tree_sum(neg, False), mode_ops.tree_adds(neg, False))
    return res


PAIRS = "tl.reshape(t, (G >> (level + 1), 2, BLOCK_C)), (0, 2, 1)"  # mode_tree's pairs (2j, 2j + 1)
FAR_PAIRS = "tl.reshape(t, (2, G >> (level + 1), BLOCK_C)), (1, 2, 0)"  # the mutant's (j, j + G/2)


def _check_mutant() -> dict[str, bool]:
    """mode_tree with each level's pairs (j, j + G/2) instead of (2j, 2j + 1), made from its own source: the same
    checks (on multi-level rows) must fail."""
    import importlib.util
    import tempfile
    from pathlib import Path

    source = Path(mode_tree.__file__).read_text()
    assert source.count(PAIRS) == 1, "mode_tree's pairing line moved: update PAIRS / FAR_PAIRS"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "far_pairs_tree.py"  # a file: Triton's jit reads the kernel's source
        path.write_text(source.replace(PAIRS, FAR_PAIRS))
        spec = importlib.util.spec_from_file_location("far_pairs_tree", path)
        mutant = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mutant)
        mode_tree._tree_pass_kernel = mutant._tree_pass_kernel
        cases = [((7, 100), False), ((520, 130), True)]
        return {k: v for k, v in _check_bits("cpu", cases).items() if "-0" not in k}


if __name__ == "__main__":
    serve({"bits": lambda: _check_bits("cpu", CASES), "mutant": _check_mutant})
