"""Engines from the user's package (the engines workload, docs/architecture.md "Engines from your package"):
examples/rl_engines installed for real (pip install --target), then `rlparity run --matrix examples/engines.toml`
as a user runs it. The patched engine passes (digests and the package's version in result.json), the stock one is
informational with its mismatch metrics, the batch-variant one fails the gate (exit 1); a bad import string and an
engine that returns the wrong shape or keys are exit 3 naming the matrix file, line and key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.factories import ROOT

EXAMPLE = ROOT / "examples" / "rl_engines"
MATRIX = ROOT / "examples" / "engines.toml"

# Engines that break the interface, each in its own way (the test's own module, next to the installed package).
BAD_ENGINES = """
import torch

PAD = 0

def _lp(b, t):
    return torch.zeros(b, t, dtype=torch.float32)

def short_rollout(shape, dtype, seed, device, tier, **engine):
    b, t, v = shape
    return {"tokens": torch.ones(b, t - 1, dtype=torch.int64), "logprobs": _lp(b, t - 1)}

def rollout(shape, dtype, seed, device, tier, **engine):
    b, t, v = shape
    return {"tokens": torch.ones(b, t, dtype=torch.int64), "logprobs": _lp(b, t)}

def keyless_train(tokens, shape, dtype, seed, device, tier, **engine):
    return {"logps": _lp(*tokens.shape)}

def train(tokens, shape, dtype, seed, device, tier, **engine):
    return {"logprobs": _lp(*tokens.shape)}
"""
BAD_MATRIX = """
[matrix]
repeats = 2

[shapes.bad]
workload = "engines"
params = { rollout = "ROLLOUT", train = "TRAIN" }
shapes = [[2, 3, 16]]

[axes]
image = ["cpu"]
target = ["cpu"]
profile = ["baseline"]
placement = ["single"]
dtype = ["fp32"]
shapes = ["bad"]
tier = ["exact"]
"""
PARAMS_LINE = BAD_MATRIX.splitlines().index('params = { rollout = "ROLLOUT", train = "TRAIN" }') + 1


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """examples/rl_engines installed with pip into a fresh target directory (from a copy: pip's build files stay
    out of the checkout), plus the bad engines' module."""
    base = tmp_path_factory.mktemp("engines")
    src, site = base / "src", base / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-compile",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(site),
    ]
    proc = subprocess.run([*pip, str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "rl_engines" / "hf.py").is_file() and list(site.glob("rl_engines-0.1.0.dist-info"))
    (site / "bad_engines.py").write_text(textwrap.dedent(BAD_ENGINES))
    return site


def rlparity(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "rlparity.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def results_of(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (out / "cells").glob("*/result.json")}


@pytest.mark.slow
def test_patched_engine_passes_and_stock_is_informational_with_mismatch_metrics(site, tmp_path):
    out = tmp_path / "r"
    proc = rlparity(site, "run", "--matrix", str(MATRIX), "--filter", "shapes=hf|hf-stock", "--jobs", "2",
                    "--strict", "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = {r["cell"]["shapes"]: r for r in results_of(out).values()}
    assert set(found) == {"hf", "hf-stock"}
    hf, stock = found["hf"], found["hf-stock"]
    # patched: passed, every comparison equal (rollout vs trainer log-probs and logits digest, the repeat)
    assert hf["status"] == "passed" and hf["required"] is True
    names = [c["name"] for c in hf["comparisons"]]
    assert "engines:hf:4x6x256 rollout vs train logprobs" in names and "engines:hf:4x6x256 repeat 1 tokens" in names
    assert all(c["equal"] for c in hf["comparisons"]) and hf["metrics"] == {}
    assert {"engines:hf:4x6x256/tokens", "engines:hf:4x6x256/train logprobs"} <= set(hf["digests"])
    assert hf["digests"]["engines:hf:4x6x256/rollout logprobs"] == hf["digests"]["engines:hf:4x6x256/train logprobs"]
    packages = hf["info"]["engine_packages"]
    assert packages["rollout"]["distribution"] == "rl-engines" and packages["rollout"]["version"] == "0.1.0"
    assert packages["train"]["callable"] == "rl_engines.hf:train"
    assert packages["train"]["module_file"].startswith(str(site))  # the installed copy ran, not the checkout's
    # stock: its log-probs differ, reported and never gated
    assert stock["status"] == "failed" and stock["required"] is False
    m = {k.split(" ", 1)[1]: v for k, v in stock["metrics"].items()}
    assert m["tokens"] == 24 and m["max_abs_dlogp"] > 0 and m["mean_abs_dlogp"] > 0 and m["k3_kl"] >= 0
    assert 0 <= m["clipped_share"] <= 1
    assert sum(v for k, v in m.items() if k.startswith("hist_dlogp/")) == 24 and m["hist_dlogp/eq_0"] < 24
    assert (
        stock["digests"]["engines:hf-stock:4x6x256/rollout logprobs"]
        != stock["digests"]["engines:hf-stock:4x6x256/train logprobs"]
    )


@pytest.mark.slow
def test_a_batch_variant_engine_fails_the_gate(site, tmp_path):
    out = tmp_path / "r"
    proc = rlparity(site, "run", "--matrix", str(MATRIX), "--filter", "shapes=variant", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    (res,) = results_of(out).values()
    assert res["status"] == "failed" and res["required"] is True
    assert res["reason"] == "bitwise mismatch in engines:variant:4x6x256 rollout vs train logprobs"
    assert res["metrics"]["engines:variant:4x6x256 max_abs_dlogp"] > 0


@pytest.mark.parametrize(
    ("rollout", "train", "key", "message"),
    [
        ("rl_engines.hf", "rl_engines.hf:train", "rollout",
         "'rl_engines.hf' is not an import string 'pkg.module:function'"),
        ("rl_engines.hf:rollout", "rl_engines.nowhere:train", "train",
         "'rl_engines.nowhere:train': module 'rl_engines.nowhere' does not import: ModuleNotFoundError"),
        ("rl_engines.hf:rollout", "rl_engines.hf:trian", "train",
         "'rl_engines.hf:trian': 'rl_engines.hf' has no attribute 'trian'"),
        ("rl_engines.hf:PAD", "rl_engines.hf:train", "rollout", "'rl_engines.hf:PAD': 'PAD' is a int, not callable"),
        ("bad_engines:short_rollout", "bad_engines:train", "rollout",
         "bad_engines:short_rollout returned 'tokens' is int64 [2, 2], must be int64 [2, 3] ([B, T] of the cell's "
         "shape); 'logprobs' is float32 [2, 2], must be float32 [2, 3]"),
        ("bad_engines:rollout", "bad_engines:keyless_train", "train",
         "bad_engines:keyless_train returned no key 'logprobs'; unknown key(s) 'logps'"),
    ],
    ids=["no-colon", "no-module", "no-attribute", "not-callable", "wrong-shape", "wrong-keys"],
)  # fmt: skip
def test_bad_engine_configuration_is_exit_3_at_the_matrix_file_line_and_key(site, tmp_path, rollout, train, key,
                                                                            message):  # fmt: skip
    matrix = tmp_path / "bad.toml"
    matrix.write_text(BAD_MATRIX.replace("ROLLOUT", rollout).replace("TRAIN", train))
    out = tmp_path / "r"
    proc = rlparity(site, "run", "--matrix", str(matrix), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = " ".join(proc.stdout.split())  # the console wraps long lines
    where = f"{matrix}:{PARAMS_LINE}: shapes.bad.params.{key}: "
    assert where + message in text, text[-3000:]
    (res,) = results_of(out).values()
    assert res["status"] == "error" and res["config_error"].startswith(where + message)
    assert json.loads((out / "summary.json").read_text())["exit_code"] == 3


@pytest.mark.slow
def test_trls_grpo_trainer_as_cells(site, tmp_path):
    """examples/trl.toml (TRL installed: requirements-trl.txt): one GRPO step, patched through
    rl_kernel.integrations.trl.ExactGRPOTrainer or through TRL's own GRPOTrainer after install() (rl_kernel's fused
    head in TRL's place), gives the rollout's log-probs bit for bit in the training forward, run to run; stock
    GRPOTrainer (its fused LM head) is informational, with its mismatch metrics."""
    if not os.environ.get("RLPARITY_REQUIRE_TRL"):  # make test's TRL passes: TRL must be there
        pytest.importorskip("trl")
    out = tmp_path / "r"
    proc = rlparity(site, "run", "--matrix", str(ROOT / "examples" / "trl.toml"), "--jobs", "2", "--strict", "--out",
                    str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = {r["cell"]["shapes"]: r for r in results_of(out).values()}
    stock = found["trl-stock"]
    compared = ("rollout vs train logprobs", "repeat 1 tokens", "repeat 1 rollout logprobs", "repeat 1 train logprobs")
    for name in ("trl", "trl-installed"):
        patched = found[name]
        assert patched["status"] == "passed" and patched["required"] is True, (name, patched["status"])
        names = [c["name"] for c in patched["comparisons"]]
        assert names == [f"engines:{name}:8x6x96 {n}" for n in compared]
    assert stock["status"] == "failed" and stock["required"] is False
    assert stock["metrics"]["engines:trl-stock:8x6x96 max_abs_dlogp"] > 0
