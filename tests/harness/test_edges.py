"""The edges workload: an episode that reaches every code path of every kernel (odd vocabulary, rows at odd
element offsets, the edge rows, ignored edge rows), in the quick matrix for every target and dtype, with
committed golden digests."""

from __future__ import annotations

import pytest
import torch

from rl_kernel.bitwise import bits_equal
from rl_kernel.inputs import DTYPE_NAMES
from rlparity import cells, golden
from rlparity.cell import episodes, workloads
from rlparity.cell.workloads.edges import episode as W
from rlparity.matrix import load_axes, load_matrix

from harness.factories import MATRICES, write

DTYPES = cells.DTYPES


def test_every_workload_a_shape_set_names_is_offered_here():
    """axes.toml's shape sets name workloads the cell side finds (the host keeps no list of them)."""
    offered = workloads.workloads()
    assert {w.name for w in load_axes().workloads.values()} <= set(offered)
    assert cells.DEFAULT_WORKLOAD in offered


def test_each_logits_workload_builds_its_episodes_through_its_descriptor():
    """build_episode finds the builder in the workload's own folder (no central list); one without any says so."""
    assert workloads.get("plain").episode is episodes.make_episode
    assert workloads.get("edges").episode is W.make_edge_episode
    built = workloads.build_episode("edges", 2, 32, 4099, "fp32", seed=1)
    assert bits_equal(built.logits, W.make_edge_episode(2, 32, 4099, "fp32", 1).logits)  # NaN rows: bits
    with pytest.raises(ValueError, match="workload 'model' builds no episode of logits"):
        workloads.build_episode("model", 1, 4, 64, "fp32")


def test_the_edges_shape_set_is_odd_and_names_its_workload():
    axes = load_axes()
    assert axes.workloads["edges"].name == "edges"
    assert all(axes.workloads[name].name == "plain" for name in ("smoke", "quick", "llm", "selftest"))
    assert all(v % 8 for _, _, v in axes.shapes["edges"]), "every edges vocabulary leaves a partial last chunk"


def test_a_workload_name_that_is_no_identifier_is_bad_configuration(tmp_path):
    from rlparity.config import ConfigError

    text = (MATRICES / "axes.toml").read_text() + '\n[shapes.bad]\nworkload = "ed gy"\nshapes = [[1, 2, 3]]\n'
    with pytest.raises(ConfigError, match="a workload is named by an identifier, got 'ed gy'"):
        load_axes(write(tmp_path, text, "axes.toml"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_episode_reaches_every_path(dtype):
    batch, seq, vocab = 2, 32, 4099
    ep = W.make_edge_episode(batch, seq, vocab, dtype)
    x = ep.logits.reshape(-1, vocab)
    assert x.stride(0) == vocab + W.EDGE_PAD and x.stride(1) == 1 and ep.logits.storage_offset() == W.EDGE_OFFSET
    starts = {(r * x.stride(0) + x.storage_offset()) * x.element_size() % 16 for r in range(x.shape[0])}
    assert 0 not in starts or len(starts) > 1, "rows at several alignments: the scalar path"
    assert len(starts) > 1
    flat = x.float()
    running = ep.tokens.reshape(-1) != episodes.IGNORE
    for what, rows in (
        ("NaN", flat.isnan().any(-1)),
        ("+inf", (flat == float("inf")).any(-1)),
        ("all -inf", (flat == float("-inf")).all(-1)),
        ("subnormal", ((flat != 0) & (flat.abs() < torch.finfo(DTYPE_NAMES[dtype]).smallest_normal)).any(-1)),
        ("huge", (flat.abs() > torch.finfo(DTYPE_NAMES[dtype]).max / 2).any(-1)),
        ("one finite value", (flat.isfinite().sum(-1) == 1)),
    ):
        assert (rows & running).any(), f"no running {what} row"
        if batch > 1:
            assert (rows & ~running).any(), f"no ignored {what} row"
    assert ep.lengths[-1] < seq
    assert float(ep.advantages.reshape(-1).max()) >= W.TIE_ADVANTAGE[dtype]


def test_the_tie_row_lands_on_a_rounding_tie():
    """grad = adv * (1 - 1/2) at the tied token: with TIE_ADVANTAGE exactly halfway between two bf16/fp16
    values, so a kernel that rounds ties away from even gives other bits."""
    for dtype, mant in (("bf16", 7), ("fp16", 10)):
        half = W.TIE_ADVANTAGE[dtype] / 2
        assert half == 1 + 2.0 ** -(mant + 1)


def test_to_device_keeps_a_views_layout():
    ep = W.make_edge_episode(2, 32, 4099, "fp32")
    moved = episodes.to_device(ep.logits, "cpu")
    assert moved.stride() == ep.logits.stride() and moved.storage_offset() == ep.logits.storage_offset()
    # the path a GPU takes: the whole storage moved, the view rebuilt on it
    again = episodes.to_device(ep.logits, "meta")
    assert again.stride() == ep.logits.stride() and again.storage_offset() == W.EDGE_OFFSET


def test_every_quick_target_has_an_edges_cell_per_dtype():
    quick = load_matrix("quick").cells
    targets = {c.target for c in quick}
    have = {(c.target, c.dtype) for c in quick if c.shapes == "edges" and c.workload == "edges"}
    assert have == {(t, d) for t in targets for d in DTYPES}
    assert all(c.profile == "baseline" and c.placement == "single" for c in quick if c.shapes == "edges")


def test_every_quick_cell_has_golden_digests():
    from rlparity.cell.workloads import model

    table = golden.load("exact")
    for c in load_matrix("quick").cells:
        outputs = golden.OUTPUTS
        if c.workload == "model":
            outputs = tuple(f"{f}/{what}" for f in model.FAMILIES for what in model.GOLDEN_OUTPUTS)
        for shape in c.shape_list:
            for what in outputs:
                assert golden.key(c.dtype, shape, c.seed, what, c.workload) in table, (c.id, shape, what)


def test_golden_keys_of_another_workload_are_prefixed():
    assert golden.key("fp32", (2, 32, 4099), 0, "grad", "edges") == "fp32/edges:2x32x4099/seed0/grad"
    assert golden.key("fp32", (2, 32, 4099), 0, "grad") == "fp32/2x32x4099/seed0/grad"
