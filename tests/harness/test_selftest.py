"""`rlparity selftest`: every negative control is caught by the comparison it targets; the outcome logic;
a vacuous detector makes selftest fail naming its control; `--mutations` with a stand-in builder."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rlparity import results, selftest
from rlparity.selftest import EXPECTED, NEGATIVE, PAIRED, outcome

from harness.factories import comparison, make_result
from harness.scripted import (
    rlparity,
    show,
    squash,
)


# ---- selftest ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def fma_library() -> Path:
    """The fma-build control's library: compiled once (cached under ~/.cache/rlparity), before its cell runs."""
    from rlparity.cell.controls import build_fma_variant

    lib = build_fma_variant()
    assert lib.is_file()
    return lib


@pytest.mark.slow
def test_the_unmodified_kernel_passes_selftest(tmp_path):
    out = tmp_path / "st"
    proc = rlparity("selftest", "--only", "none", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    clean = results.read(out / "none")
    assert clean.status == "passed", clean.reason
    assert clean.fingerprint["rl_kernel"]["library"] != "rl_kernel_fma.so"


@pytest.mark.slow
@pytest.mark.parametrize("control", NEGATIVE)
def test_selftest_catches_each_negative_control_by_its_comparison(control, tmp_path, request):
    if control == "fma-build":
        request.getfixturevalue("fma_library")
    out = tmp_path / "st"
    proc = rlparity("selftest", "--only", control, "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "every control caught" in proc.stdout
    line = squash(proc.stdout).split(squash(f"{control} caught"), 1)[1].split("mustbecaughtby", 1)[0]
    assert all(e in line for e in EXPECTED[control]), show(proc)
    res = results.read(out / control)
    assert res.variant == control  # result.json keeps the field's name
    assert res.status == "failed", f"{res.status}: {res.reason}\n{res.output_tail}"
    assert any(not c["equal"] for c in res.gated)
    assert res.reason.startswith("bitwise mismatch in ")
    if control in PAIRED:  # the pair's baseline cell passes: only the gate's cross-cell comparison sees it
        assert results.read(out / f"{control}.baseline").status == "passed"
    if control == "fma-build":
        assert res.fingerprint["rl_kernel"]["library"] == "rl_kernel_fma.so"


def test_selftest_unknown_control_is_bad_configuration(tmp_path):
    proc = rlparity("selftest", "--only", "ulp-flop", "--out", str(tmp_path / "st"), cwd=tmp_path)
    assert proc.returncode == 3, show(proc)


@pytest.mark.parametrize(("target", "says"), [("gfx942", "gfx942"), ("gfx9999", "unknown target")])
def test_selftest_on_a_target_this_host_lacks_is_bad_configuration(tmp_path, target, says):
    """--target must name a known target that this machine has: never a silent CPU run instead."""
    proc = rlparity("selftest", "--target", target, "--only", "none", "--out", str(tmp_path / "st"), cwd=tmp_path)
    assert proc.returncode == 3 and says in proc.stdout + proc.stderr, show(proc)
    assert not (tmp_path / "st" / "none").exists()


def _hand_result(
    status: str, comparisons: list[tuple[str, bool, bool]], control: str = "none", test: str = "test_x"
) -> results.CellResult:
    from rlparity.selftest import selftest_cell

    cmps = [comparison(n, eq, count=0 if eq else 1, informational=info) for n, eq, info in comparisons]
    for c in cmps:
        c["test"] = test
    return make_result(selftest_cell(), status, reason="by hand", variant=control, comparisons=cmps)


def test_one_control_per_gated_comparison():
    """Every gated comparison (each suite test, and the gate's two across cells) is the target of a control,
    and every control names comparisons that exist."""
    assert set(EXPECTED) == set(NEGATIVE)
    targeted = {c for names in EXPECTED.values() for c in names}
    assert targeted == set(selftest.COMPARISONS)
    assert set(PAIRED) <= set(NEGATIVE)


def test_every_gated_suite_test_has_a_comparison_name():
    from rlparity.cell.suite import test_bitwise

    tests = {n for n in dir(test_bitwise) if n.startswith("test_")} - {"test_stock_pytorch_control"}
    assert tests == set(selftest.COMPARISON_OF_TEST)
    assert selftest.comparison_of("test_run_to_run[2x64x32000]") == "run-to-run"


def test_selftest_outcome_requires_the_targeted_comparison():
    # batch-variant caught only by golden: its own detector (batch invariance) missed it
    res = _hand_result("failed", [("a", False, False)], "batch-variant", test="test_golden_digests[1x2x3]")
    o = outcome("batch-variant", res)
    assert not o.caught and o.caught_by == ("golden",) and o.expected == ("batch-invariance",)
    res = _hand_result("failed", [("a", False, False)], "batch-variant", test="test_batch_invariance[1x2x3]")
    assert outcome("batch-variant", res).caught
    # a pair control: caught only when the gate flagged the pair across cells
    res = _hand_result("failed", [("a", False, False)], "profile-variant", test="test_golden_digests[1x2x3]")
    assert not outcome("profile-variant", res).caught
    assert outcome("profile-variant", res, ("across-profiles",)).caught
    # every expected comparison is needed
    res = _hand_result("failed", [("a", False, False)], "ulp-flip", test="test_golden_digests[1x2x3]")
    assert not outcome("ulp-flip", res).caught


def test_selftest_outcome_logic():
    # a control whose cell passed slipped through: not caught
    o = outcome("ulp-flip", _hand_result("passed", [("a", True, False)], "ulp-flip"))
    assert not o.caught and o.status == "passed" and o.caught_by == ()
    # caught: failed with a gated comparison of its target that differs, named in caught_by
    hand = _hand_result("failed", [("a", True, False), ("b", False, False), ("c", False, True)], test="test_run_to_run")
    o = outcome("atomics", hand)
    assert o.caught and o.caught_by == ("run-to-run",) and o.differed == ("b",)
    # failed only on an informational comparison (stock PyTorch drift): not a catch
    assert not outcome("atomics", _hand_result("failed", [("stock", False, True)])).caught
    # an errored cell is not a catch, whatever its comparisons say
    assert not outcome("wave-tree", _hand_result("error", [("b", False, False)])).caught
    assert not outcome("reversed-order", _hand_result("skipped", [])).caught
    # the unmodified kernel must pass
    assert outcome("none", _hand_result("passed", [("a", True, False)])).caught
    assert not outcome("none", _hand_result("failed", [("b", False, False)])).caught
    assert not outcome("none", _hand_result("error", [])).caught


# ---- a vacuous detector is caught by selftest ----------------------------------------------------------
VACUOUS = (
    '("logprobs", got, reference[index]), ("row stats", got_stats, reference_stats[index])',
    '("logprobs", reference[index], reference[index]), ("row stats", reference_stats[index], reference_stats[index])',
)


@pytest.mark.slow
def test_a_vacuous_batch_invariance_check_fails_selftest_naming_batch_variant(tmp_path):
    """In a copy of the harness whose batch-invariance comparison compares a result with itself (every
    other test stays green), selftest must fail and name batch-variant, even if another comparison
    still catches that control."""
    import shutil

    from harness.factories import ROOT

    pkg = tmp_path / "harness"  # the repository's layout: the package finds its data files beside it
    shutil.copytree(ROOT / "harness" / "rlparity", pkg / "rlparity", ignore=shutil.ignore_patterns("__pycache__"))
    for data in ("docker",):  # the data files travel inside the package (rlparity/data)
        if (ROOT / data).exists():
            (tmp_path / data).symlink_to(ROOT / data)
    suite = pkg / "rlparity" / "cell" / "suite" / "test_bitwise.py"
    text = suite.read_text()
    assert VACUOUS[0] in text
    suite.write_text(text.replace(*VACUOUS))
    out = tmp_path / "st"
    proc = rlparity("selftest", "--only", "batch-variant", "--out", str(out), cwd=tmp_path, pythonpath=str(pkg))
    assert proc.returncode == 1, show(proc)
    text = squash(proc.stdout)
    assert squash("batch-variant MISSED") in text and squash("must be caught by: batch-invariance") in text, show(proc)
    assert all(c["equal"] for c in results.read(out / "batch-variant").gated if "vs batch" in c["name"])


def test_a_control_whose_pair_cannot_run_here_is_not_applicable_not_caught(monkeypatch, capsys):
    """On one GPU the split placement cannot run: placement-variant is reported with the reason and counts
    neither as caught nor as missed; a real miss still fails selftest."""
    from rlparity.commands import selftest as command

    na = selftest.not_applicable("placement-variant", "split shards over two sm_90 devices; this host has 1")
    assert na.ok and not na.caught and not na.applicable and na.status == "skipped"
    caught = selftest.ControlOutcome("ulp-flip", "failed", True, ("golden",), "", ("golden",))
    missed = selftest.ControlOutcome("wave-tree", "passed", False, (), "", ("golden",))
    args = argparse.Namespace(out=None, mutations=False, only=None, target="cpu", matrix="quick")
    monkeypatch.setattr(selftest, "run_tier_controls", lambda *a, **k: [])
    for outcomes, code in (([caught, na], 0), ([caught, na, missed], 1)):

        def fake_run(out, controls, on_result=None, target="cpu", o=outcomes):
            for one in o:
                on_result(one)
            return o

        monkeypatch.setattr(selftest, "run", fake_run)
        assert command.cmd_selftest(args) == code
    out = squash(capsys.readouterr().out)
    assert "notapplicablehere:splitshards" in out and "(1notapplicableonthishost)" in out
