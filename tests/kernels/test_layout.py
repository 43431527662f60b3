"""The kernels' layout: sources and families are discovered, never listed (docs/architecture.md)."""

from __future__ import annotations

import importlib
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rl_kernel
from rl_kernel import build_flags, tiers
from rl_kernel.contract.families import all_specs, families

ROOT = Path(__file__).resolve().parents[2]
EXACT = ROOT / "kernels" / "rl_kernel" / "exact"


def test_sources_are_discovered_relative_to_the_repository() -> None:
    cpu, gpu = build_flags.sources(gpu=False), build_flags.sources(gpu=True)
    assert cpu == [
        "kernels/rl_kernel/exact/common/module.cpp",
        "kernels/rl_kernel/exact/decoder/decoder_cpu.cpp",
        "kernels/rl_kernel/exact/sampling/sampling_cpu.cpp",
        "kernels/rl_kernel/exact/softmax/softmax_cpu.cpp",
    ]
    assert gpu == [
        *cpu,
        "kernels/rl_kernel/exact/decoder/decoder_gpu.cu",
        "kernels/rl_kernel/exact/sampling/sampling_gpu.cu",
        "kernels/rl_kernel/exact/softmax/softmax_gpu.cu",
    ]
    assert all((ROOT / p).is_file() for p in gpu)


def test_a_new_family_folder_is_picked_up(tmp_path: Path) -> None:
    made = ("common/module.cpp", "softmax/softmax_cpu.cpp", "norm/norm_cpu.cpp", "norm/norm_gpu.cu", "norm/norm.cuh")
    for rel in made:
        path = tmp_path / "kernels" / "rl_kernel" / "exact" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    assert build_flags.sources(gpu=True, root=tmp_path) == [
        "kernels/rl_kernel/exact/common/module.cpp",
        "kernels/rl_kernel/exact/norm/norm_cpu.cpp",
        "kernels/rl_kernel/exact/softmax/softmax_cpu.cpp",
        "kernels/rl_kernel/exact/norm/norm_gpu.cu",
    ]


def test_check_sources_are_every_family_check_file() -> None:
    assert build_flags.check_sources() == sorted(EXACT.glob("*/*_check.cu"))
    assert [p.parent.name for p in build_flags.check_sources()] == ["decoder", "sampling", "softmax"]


def test_build_flags_load_without_the_extension() -> None:
    flags = runpy.run_path(str(ROOT / "kernels" / "rl_kernel" / "build_flags.py"))
    assert flags["sources"](False) == build_flags.sources(False)
    assert "-ffp-contract=off" in flags["CXX_FLAGS"]


# What the Hugging Face patch takes from a tier (integrations/transformers.py: Tier.namespace()).
LAYER_NAMES = ("linear", "embedding", "rms_norm", "rope_inv_freq", "rope_table", "silu_mul", "attention",
               "positions_from_mask")  # fmt: skip


@pytest.mark.parametrize("name", sorted(tiers.tiers()))
def test_every_tier_declares_its_parts(name: str) -> None:
    """A tier's descriptor holds together: its own operators exist, with its fallback's it has what the patch swaps,
    it has families (each with SPECS), its fused-head GEMMs and controls load, and its scan is callable (or the
    compiled tier's contract scan)."""
    tier = tiers.get(name)
    api = tier.api()
    assert all(callable(getattr(api, op)) for op in tier.operators), tier.operators
    ops = tier.namespace()
    assert [n for n in LAYER_NAMES if not callable(getattr(ops, n, None))] == []
    assert tier.families(), f"the {name} tier ({tier.folder}) has no family folder with a checks.py"
    for spec in all_specs(tier):  # a differentiable spec's case carries the gradient it takes
        case = spec.check_case((spec.sizes or spec.golden_vocabs)[0], torch.bfloat16, 1)
        if spec.differentiable:
            assert spec.upstream_grad(case).shape, spec.name
    assert callable(tier.head_gemms().logits)
    for control in tier.controls.values():
        assert importlib.import_module(control).__name__ == control
    if tier.compiled:
        assert tier.scan == "compiled"
    else:
        module, _, func = (tier.scan or "").partition(":")
        assert callable(getattr(importlib.import_module(module), func)), tier.scan


def test_every_family_of_a_compiled_tier_is_one_folder() -> None:
    """A family folder holds everything of the family: kernels (each GPU kernel beside its CPU reference), its
    operators, its numpy reference, its checks and its golden digests; and its behaviour tests exist."""
    compiled = [t for t in tiers.tiers().values() if t.compiled]
    assert [t.name for t in compiled] == ["exact"]
    for tier in compiled:
        for family in tier.families():
            folder = tier.folder / family
            for name in (f"{family}.cuh", f"{family}_cpu.cpp", f"{family}_gpu.cu", f"{family}_check.cu", "ops.py",
                         "reference.py", "checks.py", "golden.json"):  # fmt: skip
                assert (folder / name).is_file(), f"{folder / name} is missing"
            assert (ROOT / "tests" / "kernels" / f"test_{family}.py").is_file()


def test_specs_are_unique_and_named_by_family() -> None:
    specs = all_specs()
    assert [s.name for s in specs] == [
        "linear",
        "linear.weight",
        "rms_norm",
        "rms_norm.weight",
        "rope_table",
        "rotary",
        "silu_mul",
        "silu_mul.up",
        "attention",
        "attention.grad_q",
        "attention.grad_kv",
        "attention.stats",
        "attention.window",
        "attention.window.stats",
        "attention.window.grad_q",
        "attention.window.grad_kv",
        "gumbel_argmax",
        "log_softmax",
        "token_logprobs",
        "entropy",
        "row_stats",
    ]
    assert len({s.name for s in specs}) == len(specs)
    assert {s.family for s in specs} == set(families()) == {"decoder", "sampling", "softmax"}


def test_public_api_and_submodules_are_attributes() -> None:
    for name in rl_kernel.__all__:
        assert hasattr(rl_kernel, name), name


def test_submodules_need_no_import_of_their_own() -> None:
    code = (
        "import torch, rl_kernel; "
        "assert rl_kernel.bitwise.diff(torch.ones(2), torch.ones(2)).equal; "
        "assert rl_kernel.exact.reference.CHUNK == 8 and callable(rl_kernel.exact.reference.row_stats)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_finding_the_tiers_imports_no_triton_until_a_kernel_is_asked_for() -> None:
    """Every harness process finds the tiers (the probe, each cell): Triton and the fast tier's kernels cost it a
    quarter of a second, so they are imported on first use; the mode's CPU sums import no Triton kernel either. The
    control: asking for the fast linear imports them."""
    code = (
        "import sys, torch, rl_kernel; from rl_kernel import tiers; tiers.tiers(); "
        "from rl_kernel.aten import ops; x = torch.ones(64, 8); ops.tree_sum(x); "
        "ops.index_add(x, 0, torch.tensor([1]), x[:1]); "
        "print(sorted(m for m in ('triton', 'rl_kernel.fast.ops', 'rl_kernel.aten.tree') if m in sys.modules)); "
        "tiers.get('fast').op('linear'); print(sorted(m for m in ('triton', 'rl_kernel.fast.ops') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "['rl_kernel.fast.ops', 'triton']"], proc.stdout


def test_the_fast_packages_lazy_names_are_fast_ops_public_names() -> None:
    """rl_kernel.fast lists the names it serves from fast.ops on first use (it cannot read fast.ops' list without
    importing it): the two lists are one, each name resolves there, and an unknown one is an AttributeError."""
    from rl_kernel import fast
    from rl_kernel.fast import ops

    assert sorted(fast._OPS) == sorted(ops.__all__) and set(fast.OPERATORS) <= set(fast._OPS)
    assert all(getattr(fast, name) is getattr(ops, name) for name in fast._OPS)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fast.nope  # noqa: B018


def _bare_torch_checks(text: str) -> list[int]:
    """Lines that call TORCH_CHECK( directly (comments aside)."""
    return [n for n, line in enumerate(text.splitlines(), 1) if "TORCH_CHECK(" in line.split("//")[0]]


def test_argument_checks_build_their_message_without_ostream() -> None:
    """Every check of the compiled sources goes through RL_CHECK (common/check.h): a TORCH_CHECK that formats a number
    crashed the process on the H200 machine instead of raising (docs/benchmarks.md, 2026-12-02)."""
    assert _bare_torch_checks('  TORCH_CHECK(n > 0, "at most ", n);\n  RL_CHECK(n > 0, "x");') == [1]  # control
    assert _bare_torch_checks("// TORCH_CHECK(x) in a comment\n") == []
    found = {
        str(p.relative_to(EXACT)): lines
        for p in build_flags.contract_files()
        if p.suffix in {".h", ".cuh", ".cpp", ".cu"} and p.name != "check.h"
        if (lines := _bare_torch_checks(p.read_text()))
    }
    assert not found, f"use RL_CHECK (common/check.h), not TORCH_CHECK: {found}"
    assert sum(p.read_text().count("RL_CHECK(") for p in EXACT.glob("*/*_ops.h")) > 40
