"""Mismatch metrics past the cell: a cell's summary (CellResult.mismatch), the junit properties, the report's
table and its |dlogp| histogram per workload, and the nightly history's largest k3 KL per target."""

from __future__ import annotations

import dataclasses

from rlparity import collect
from rlparity.report import history, markdown, plots, rules
from rlparity.report.model import Entry, Night

from harness.factories import make_cell, make_result

# What rlparity.cell.mismatch records for two compared paths of one cell ("<what> <metric>").
METRICS = {
    "model:8x6x512 llama stock tokens": 48.0,
    "model:8x6x512 llama stock mean_abs_dlogp": 0.01,
    "model:8x6x512 llama stock max_abs_dlogp": 0.03,
    "model:8x6x512 llama stock k3_kl": 1e-4,
    "model:8x6x512 llama stock clipped_share": 0.0,
    "model:8x6x512 llama stock hist_dlogp/eq_0": 8.0,
    "model:8x6x512 llama stock hist_dlogp/1e-3_1e-2": 40.0,
    "model:8x6x512 qwen3 stock tokens": 48.0,
    "model:8x6x512 qwen3 stock mean_abs_dlogp": 0.03,
    "model:8x6x512 qwen3 stock max_abs_dlogp": 0.09,
    "model:8x6x512 qwen3 stock k3_kl": 3e-4,
    "model:8x6x512 qwen3 stock clipped_share": 0.25,
    "model:8x6x512 qwen3 stock hist_dlogp/1e-3_1e-2": 48.0,
    "model:8x6x512 llama mean next-token entropy (nats)": 5.7,  # not a mismatch metric
}


def _model_result(target: str = "cpu", metrics: dict | None = None):
    cell = dataclasses.replace(make_cell(target), workload="model", shapes="model")
    return make_result(cell, metrics=dict(METRICS if metrics is None else metrics))


def test_a_cells_mismatch_summary_adds_the_tokens_and_bins_and_keeps_the_worst() -> None:
    m = _model_result().mismatch
    assert m["tokens"] == 96 and m["hist_dlogp/1e-3_1e-2"] == 88 and m["hist_dlogp/eq_0"] == 8
    assert m["max_abs_dlogp"] == 0.09 and m["k3_kl"] == 3e-4 and m["clipped_share"] == 0.25
    assert abs(m["mean_abs_dlogp"] - 0.02) < 1e-12
    assert "entropy" not in " ".join(m) and make_result(make_cell()).mismatch == {}


def test_the_junit_properties_carry_it() -> None:
    props = collect.cell_properties(_model_result())
    assert props["mismatch_k3_kl"] == "0.0003" and props["mismatch_max_abs_dlogp"] == "0.09"
    assert not [k for k in props if "hist" in k]
    assert not [k for k in collect.cell_properties(make_result(make_cell())) if k.startswith("mismatch_")]


def test_the_report_has_its_table_and_a_histogram_per_workload() -> None:
    entries = [Entry("a", "r", _model_result()), Entry("b", "r", make_result(make_cell("sm90")))]
    rep = rules.build(entries)
    text = markdown.render_markdown(rep)
    assert "Rollout/training mismatch (informational)" in text and "local/cpu/baseline/single/fp32/model/exact" in text
    hist = plots._mismatch_histograms(rep.entries)
    assert hist == {"model": {"eq_0": 8.0, "1e-3_1e-2": 88.0}}
    assert any(t.startswith("|dlogp| between rollout and training, workload model") for t in plots.make_plots(rep))


def test_the_history_shows_the_largest_k3_per_target_and_night() -> None:
    quiet = _model_result(metrics={})
    nights = [Night("n1", (Entry("a", "n1", _model_result()),)), Night("n2", (Entry("a", "n2", quiet),))]
    h = history.trend(nights[:1], nights[1])
    (cpu,) = h.by_target.values()
    assert cpu[0].k3 == 3e-4 and cpu[1].k3 is None
