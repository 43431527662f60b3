"""`rlparity selftest --mutations`: mutation testing of the gate, through a stand-in for the kernel engineer's
builder (`python -m rl_kernel.mutations build` prints the mutated library's path). A mutation the gate lets
through fails selftest; a caught one names the comparisons that caught it."""

from __future__ import annotations

import importlib.util
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


def test_a_mutation_the_gate_catches(tmp_path):
    """Stand-in: the FMA-contracted build as 'the mutated library' (it differs from the contract's bits)."""
    from rlparity.cell.controls import build_fma_variant

    lib = build_fma_variant()
    outcomes = selftest.run_mutations(
        tmp_path, builder=stand_in_builder(lib), names=["stand-in-fma"], cells=[edges_fp32_cell()]
    )
    (o,) = outcomes
    assert o.caught and o.code == gate.MISMATCH and "golden" in o.caught_by, o
    res = results.read(tmp_path / "stand-in-fma" / edges_fp32_cell().dirname)
    assert res.fingerprint["rl_kernel"]["library"] == "rl_kernel_fma.so"
    assert res.fingerprint["env"].get("RL_KERNEL_MUTATION") == "stand-in-fma"


def test_a_mutation_that_passes_the_gate_fails_selftest(tmp_path, capsys):
    """Stand-in: the unmodified library under a mutation's name, which the gate cannot catch: exit 1."""
    code = cmd_mutations(
        tmp_path, builder=stand_in_builder(_built_library()), names=["no-op"], cells=[edges_fp32_cell()]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert "no-op" in out and "MISSED" in out and "passed the gate" in out


def _built_library() -> Path:
    import rl_kernel

    (so,) = Path(rl_kernel.__file__).parent.glob("_C*.so")
    return so


def test_a_builder_that_fails_is_bad_configuration(tmp_path):
    with pytest.raises(ConfigError, match="building the mutated library"):
        selftest.build_mutated_library([sys.executable, "-c", "import sys; sys.exit(4)"])
    with pytest.raises(ConfigError, match="building the mutated library"):
        selftest.build_mutated_library([sys.executable, "-c", f"print({str(tmp_path / 'missing.so')!r})"])
    with pytest.raises(ConfigError, match="listing the mutations"):
        selftest.mutation_names([sys.executable, "-c", "print('[]')"])
    assert selftest.mutation_names([sys.executable, "-c", 'print(\'["a", "b"]\')']) == ["a", "b"]


@pytest.mark.skipif(importlib.util.find_spec("rl_kernel.mutations") is not None, reason="the real builder exists")
def test_the_default_builder_is_the_kernel_engineers_module():
    """The one command (selftest.MUTATION_BUILDER): until rl_kernel.mutations exists it fails, naming it."""
    assert selftest.MUTATION_BUILDER == ("-m", "rl_kernel.mutations", "build")
    with pytest.raises(ConfigError, match=r"rl_kernel\.mutations"):
        selftest.build_mutated_library()
