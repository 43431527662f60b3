"""The gate: exit codes from cell statuses, and digest agreement across targets in the exact tier."""

from __future__ import annotations

from rlparity import gate

from harness.factories import (
    D1,
    D2,
    make_cell,
    make_result,
)

# ---- gate -------------------------------------------------------------------------------------------------


def test_gate_all_passed():
    v = gate.decide([make_result(make_cell("cpu")), make_result(make_cell("gfx942"))])
    assert v.code == gate.OK == 0 and v.reasons == ()


def test_gate_required_failed():
    bad = make_result(make_cell("gfx942"), "failed", reason="bitwise mismatch in x")
    v = gate.decide([make_result(make_cell()), bad])
    assert v.code == gate.MISMATCH == 1
    assert any(bad.cell.id in r and "bitwise mismatch in x" in r for r in v.reasons)


def test_gate_informational_failure_and_error_do_not_count():
    cells = [make_result(make_cell())]
    cells.append(make_result(make_cell("gfx1201", required=False), "failed"))
    cells.append(make_result(make_cell("gfx1201", dtype="bf16", required=False), "error"))
    assert gate.decide(cells).code == 0
    assert gate.decide(cells, strict=True).code == 0


def test_gate_required_error():
    v = gate.decide([make_result(make_cell()), make_result(make_cell("gfx942"), "error", reason="timed out")])
    assert v.code == gate.ERROR == 2
    assert v.reasons == ("local/gfx942/baseline/single/fp32/quick/exact: timed out",)


def test_gate_mismatch_wins_over_error_and_reports_both():
    v = gate.decide(
        [make_result(make_cell(), "error", reason="crash"), make_result(make_cell("gfx942"), "failed", reason="bits")]
    )
    assert v.code == 1
    assert len(v.reasons) == 2 and any("crash" in r for r in v.reasons)


def test_gate_skipped_strict_and_not():
    cells = [make_result(make_cell()), make_result(make_cell("gfx942"), "skipped", reason="no GPU")]
    assert gate.decide(cells).code == 0
    v = gate.decide(cells, strict=True)
    assert v.code == 2 and "--strict" in v.reasons[0] and "no GPU" in v.reasons[0]
    optional = [make_result(make_cell("gfx942", required=False), "skipped")]
    assert gate.decide(optional, strict=True, min_ran=0).code == 0
    assert gate.decide(optional, strict=True).code == gate.ENVIRONMENT  # nothing ran: not a pass


def test_digest_disagreement_in_the_exact_tier():
    a = make_result(make_cell("cpu", "baseline"), digests={"1x128x4096/logprobs": D1})
    b = make_result(make_cell("cpu", "threads-1"), digests={"1x128x4096/logprobs": D2})
    msgs = gate.digest_disagreements([a, b])
    assert len(msgs) == 1
    assert a.cell.id in msgs[0] and b.cell.id in msgs[0] and "1x128x4096/logprobs" in msgs[0]
    v = gate.decide([a, b])
    assert v.code == 1 and v.reasons == tuple(msgs)


def test_exact_tier_targets_must_agree():
    a = make_result(make_cell("cpu"), digests={"x/grad": D1})
    b = make_result(make_cell("gfx942"), digests={"x/grad": D2})
    assert gate.decide([a, b]).code == 1
    same = make_result(make_cell("gfx942"), digests={"x/grad": D1})
    assert gate.decide([a, same]).code == 0


def test_digests_of_different_dtypes_or_names_are_not_compared():
    a = make_result(make_cell("cpu", dtype="fp32"), digests={"x/grad": D1})
    b = make_result(make_cell("cpu", dtype="bf16"), digests={"x/grad": D2})
    c = make_result(make_cell("gfx942", dtype="fp32"), digests={"y/grad": D2})
    assert gate.digest_disagreements([a, b, c]) == []


def test_fast_tier_targets_may_differ_but_not_within_a_target():
    a = make_result(make_cell("gfx942", tier="fast"), digests={"x/logprobs": D1})
    b = make_result(make_cell("gfx90a", tier="fast"), digests={"x/logprobs": D2})
    assert gate.digest_disagreements([a, b]) == []
    assert gate.decide([a, b]).code == 0
    c = make_result(make_cell("gfx942", "sdma-off", tier="fast"), digests={"x/logprobs": D2})
    msgs = gate.digest_disagreements([a, b, c])
    assert len(msgs) == 1 and "on gfx942" in msgs[0] and a.cell.id in msgs[0] and c.cell.id in msgs[0]


def test_digest_disagreement_ignores_optional_variant_and_errored_cells():
    a = make_result(make_cell("cpu"), digests={"x/grad": D1})
    optional = make_result(make_cell("gfx1201", required=False), digests={"x/grad": D2})
    variant = make_result(make_cell("gfx942"), digests={"x/grad": D2}, variant="no-fixed-order")
    errored = make_result(make_cell("gfx90a"), "error", digests={"x/grad": D2})
    assert gate.digest_disagreements([a, optional, variant, errored]) == []


def test_gate_a_cells_configuration_error_is_exit_3_and_wins():
    """A cell that found its configuration bad (an engine's import string, its return) makes the run exit 3 naming
    the file, line and key, over a mismatch elsewhere, and whether or not the cell is required."""
    where = "m.toml:12: shapes.e.params.rollout: no module named 'nope'"
    for required in (True, False):
        bad = make_result(make_cell("gfx942", required=required), "error", reason="configuration", config_error=where)
        mismatch = make_result(make_cell(), "failed", reason="bitwise mismatch in x")
        v = gate.decide([mismatch, bad])
        assert v.code == gate.CONFIG == 3
        assert v.reasons == (f"{bad.cell.id}: {where}",)
    plain_error = make_result(make_cell("gfx942"), "error", reason="configuration-ish but not flagged")
    assert gate.decide([make_result(make_cell()), plain_error]).code == gate.ERROR
