"""`rlparity selftest`: every negative control is caught by the bitwise suite; the outcome logic."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlparity import results
from rlparity.selftest import NEGATIVE, outcome

from harness.factories import comparison, make_result
from harness.scripted import (
    rlparity,
    show,
)


# ---- selftest ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def fma_library() -> Path:
    """The fma-build control's library: compiled once (cached under ~/.cache/rlparity), before its cell runs."""
    from rlparity.cell.controls import build_fma_variant

    lib = build_fma_variant()
    assert lib.is_file()
    return lib


@pytest.mark.parametrize("control", NEGATIVE)
def test_selftest_catches_each_negative_control(control, tmp_path, request):
    if control == "fma-build":
        request.getfixturevalue("fma_library")
    out = tmp_path / "st"
    proc = rlparity("selftest", "--only", "none", control, "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "every control caught" in proc.stdout
    clean = results.read(out / "none")
    assert clean.status == "passed", clean.reason
    res = results.read(out / control)
    assert res.variant == control  # result.json keeps the field's name
    assert res.status == "failed", f"{res.status}: {res.reason}\n{res.output_tail}"
    assert any(not c["equal"] for c in res.gated)
    assert res.reason.startswith("bitwise mismatch in ")
    if control == "fma-build":
        assert res.fingerprint["rl_kernel"]["library"] == "rl_kernel_fma.so"
        assert clean.fingerprint["rl_kernel"]["library"] != "rl_kernel_fma.so"


def test_selftest_unknown_control_is_bad_configuration(tmp_path):
    proc = rlparity("selftest", "--only", "ulp-flop", "--out", str(tmp_path / "st"), cwd=tmp_path)
    assert proc.returncode == 3, show(proc)


@pytest.mark.parametrize(("target", "says"), [("gfx942", "gfx942"), ("gfx9999", "unknown target")])
def test_selftest_on_a_target_this_host_lacks_is_bad_configuration(tmp_path, target, says):
    """--target must name a known target that this machine has: never a silent CPU run instead."""
    proc = rlparity("selftest", "--target", target, "--only", "none", "--out", str(tmp_path / "st"), cwd=tmp_path)
    assert proc.returncode == 3 and says in proc.stdout + proc.stderr, show(proc)
    assert not (tmp_path / "st" / "none").exists()


def _hand_result(status: str, comparisons: list[tuple[str, bool, bool]], control: str = "none") -> results.CellResult:
    from rlparity.selftest import selftest_cell

    cmps = [comparison(n, eq, count=0 if eq else 1, informational=info) for n, eq, info in comparisons]
    return make_result(selftest_cell(), status, reason="by hand", variant=control, comparisons=cmps)


def test_selftest_outcome_logic():
    # a control whose cell passed slipped through: not caught
    o = outcome("ulp-flip", _hand_result("passed", [("a", True, False)], "ulp-flip"))
    assert not o.caught and o.status == "passed" and o.caught_by == ()
    # caught: failed with a gated comparison that differs, named in caught_by
    o = outcome("ulp-flip", _hand_result("failed", [("a", True, False), ("b", False, False), ("c", False, True)]))
    assert o.caught and o.caught_by == ("b",)
    # failed only on an informational comparison (stock PyTorch drift): not a catch
    assert not outcome("atomics", _hand_result("failed", [("stock", False, True)])).caught
    # an errored cell is not a catch, whatever its comparisons say
    assert not outcome("wave-tree", _hand_result("error", [("b", False, False)])).caught
    assert not outcome("reversed-order", _hand_result("skipped", [])).caught
    # the unmodified kernel must pass
    assert outcome("none", _hand_result("passed", [("a", True, False)])).caught
    assert not outcome("none", _hand_result("failed", [("b", False, False)])).caught
    assert not outcome("none", _hand_result("error", [])).caught
