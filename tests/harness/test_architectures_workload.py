"""The architectures workload (rlparity.cell.workloads.architectures) through `rlparity run`: the nightly matrix's
CPU exact-tier fp32 cell runs every architecture of rl_kernel.models and the plain PyTorch decoder unpatched under
rl_kernel.mode, and passes; its gated comparisons are generate() vs the forward per architecture, and its stock
control (the same comparison without the mode, informational) differs for every architecture: the check can fail."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

from rl_kernel import models
from rlparity import results

from harness.scripted import rlparity, show
from tooling import require

CELL = "local/cpu/baseline/single/fp32/architectures/exact"


@pytest.mark.slow
def test_every_architecture_holds_under_the_mode_and_the_stock_control_differs(tmp_path) -> None:
    require("transformers (requirements.txt)", find_spec("transformers") is not None)
    out = tmp_path / "res"
    proc = rlparity("run", "--matrix", "nightly", "--filter", "target=cpu shapes=architectures tier=exact dtype=fp32",
                    "--strict", "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, show(proc)
    res = results.read(out / "cells" / CELL.replace("/", "__"))
    gated = [c for c in res.comparisons if not c["informational"]]
    names = " ".join(c["name"] for c in gated)
    for arch in ("llama", "qwen3_moe", "gemma2", "gemma3", "olmoe", "gpt_oss", "plain"):
        for view in ("batch, left padded", "batch, left padded, the mask's positions", "each sequence alone"):
            assert f" {arch} generate vs {view}" in names, names
    assert gated and all(c["equal"] for c in gated)
    stock = [c for c in res.comparisons if c["informational"]]
    assert len(stock) == len(models.ARCHITECTURES) + 1, [c["name"] for c in stock]  # and the plain decoder
    assert not any(c["equal"] for c in stock), [c["name"] for c in stock if c["equal"]]
