"""`rlparity selftest --mutations`: mutation testing of the gate, through a stand-in for the kernel engineer's
builder (`python -m rl_kernel.contract.mutations build` prints the mutated library's path). A mutation the gate lets
through fails selftest; a caught one names the comparisons that caught it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rlparity import gate, results, selftest
from rlparity.commands.selftest import cmd_mutations
from rlparity.config import ConfigError


def stand_in_builder(library: Path) -> list[str]:
    """A builder that chats a little, then prints the library's path on its last line, as the real one will."""
    return [sys.executable, "-c", f"print('building...'); print({str(library)!r})"]


def edges_fp32_cell():
    (cell,) = [c for c in selftest.mutation_cells() if c.shapes == "edges" and c.dtype == "fp32"]
    return cell


def test_the_representative_cells_are_the_quick_gates_cpu_cells():
    cells = selftest.mutation_cells()
    assert {(c.shapes, c.dtype) for c in cells} == {("edges", d) for d in ("fp32", "bf16", "fp16")} | {
        ("quick", "fp32")
    }
    assert all(c.target == "cpu" and c.profile == "baseline" and c.placement == "single" for c in cells)


@pytest.mark.slow(minutes=True)
def test_a_mutation_the_gate_catches(tmp_path):
    """Stand-in: the FMA-contracted build as 'the mutated library' (it differs from the contract's bits)."""
    from rlparity.cell.controls import build_fma_variant

    lib = build_fma_variant()
    outcomes = selftest.run_mutations(
        tmp_path, builder=stand_in_builder(lib), names=["stand-in-fma"], cells=[edges_fp32_cell()]
    )
    (o,) = outcomes
    assert o.caught and o.code == gate.MISMATCH and "golden" in o.caught_by, o
    res = results.read(results.cell_dir(tmp_path / "stand-in-fma", edges_fp32_cell()))
    assert res.fingerprint["rl_kernel"]["library"] == "rl_kernel_fma.so"
    assert res.fingerprint["env"].get("RL_KERNEL_MUTATION") == "stand-in-fma"


@pytest.mark.slow
def test_a_mutation_that_passes_the_gate_fails_selftest(tmp_path, capsys):
    """Stand-in: the unmodified library under a mutation's name, which the gate cannot catch: exit 1."""
    code = cmd_mutations(
        tmp_path, builder=stand_in_builder(_built_library()), names=["no-op"], cells=[edges_fp32_cell()]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert "no-op" in out and "MISSED" in out and "passed the gate" in out


def _built_library() -> Path:
    from rl_kernel._library import EXTENSION

    return EXTENSION


def test_a_builder_that_fails_is_bad_configuration(tmp_path):
    with pytest.raises(ConfigError, match="building the mutated library"):
        selftest.build_mutated_library([sys.executable, "-c", "import sys; sys.exit(4)"])
    with pytest.raises(ConfigError, match="building the mutated library"):
        selftest.build_mutated_library([sys.executable, "-c", f"print({str(tmp_path / 'missing.so')!r})"])
    with pytest.raises(ConfigError, match="listing the mutations"):
        selftest.mutation_names([sys.executable, "-c", "print('[]')"])
    assert selftest.mutation_names([sys.executable, "-c", 'print(\'["a", "b"]\')']) == ["a", "b"]


def test_the_builder_is_rl_kernels_and_gpu_cells_ask_for_the_gpu_build(monkeypatch):
    """The one command (selftest.MUTATION_BUILDER) is rl_kernel's builder; a GPU target adds --gpu."""
    assert selftest.MUTATION_BUILDER == ("-m", "rl_kernel.contract.mutations", "build")
    seen = []

    def fake_run(argv, **kw):
        seen.append(argv)
        raise SystemExit("stop")

    monkeypatch.setattr(selftest.subprocess, "run", fake_run)
    for gpu in (False, True):
        with pytest.raises(SystemExit):
            selftest.build_mutated_library(gpu=gpu)
    assert seen[0][1:] == ["-m", "rl_kernel.contract.mutations", "build"] and seen[1][-1] == "--gpu"


def test_the_equivalent_mutations_are_the_kernels():
    """The host's copy (it never imports rl_kernel) equals rl_kernel.build_flags.EQUIVALENT_MUTATIONS."""
    from rl_kernel import build_flags

    assert selftest.EQUIVALENT_MUTATIONS == build_flags.EQUIVALENT_MUTATIONS
    assert set(selftest.EQUIVALENT_MUTATIONS) <= set(build_flags.mutation_names())


@pytest.mark.slow
def test_an_equivalent_mutation_that_passes_is_reported_with_its_guard(tmp_path, capsys, monkeypatch):
    """No output can show max_no_nan: passing the gate is then 'equivalent' with the guard named, not a miss;
    an ordinary mutation passing is still a miss."""
    monkeypatch.setattr(selftest, "EQUIVALENT_MUTATIONS", {"no-op": "a static rule"})
    code = cmd_mutations(
        tmp_path, builder=stand_in_builder(_built_library()), names=["no-op"], cells=[edges_fp32_cell()]
    )
    out = capsys.readouterr().out
    assert code == 0 and "equivalent" in out and "a static rule" in out


@pytest.mark.slow(minutes=True)
@pytest.mark.skipif(os.environ.get("CI") != "true" and not os.environ.get("RL_KERNEL_TEST_MUTATIONS"),
                    reason="builds the mutated rl_kernel and runs 20 cells (minutes): CI=true or "
                    "RL_KERNEL_TEST_MUTATIONS=1")  # fmt: skip
def test_every_real_mutation_fails_the_quick_gate(tmp_path, capsys):
    """The real thing: rl_kernel's mutated build, every mutation over the quick gate's representative CPU
    cells. Each must fail the gate (exit 1), but the equivalent ones, which must pass and name their guard."""
    code = cmd_mutations(tmp_path)
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("tree_order", "flush_boundary", "tie_rounding", "exp_constant"):
        assert f"{name}" in out
    assert out.count("caught  (gate exit 1)") == 4, out
