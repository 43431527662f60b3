"""A tier and a workload from outside the repository: a temporary package, installed as a real distribution (a
dist-info with entry points on the path), adds both, and `rlparity run` runs their cells without an edit to any
list of this repository. Removing an entry point leaves a clear reason (and a --strict failure), a parameter
the workload does not take is exit 3 at its line. docs/architecture.md's "How to add a tier" and "How to add a
workload" follow these steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.factories import ROOT

pytestmark = pytest.mark.slow  # every test runs cells or builds in subprocesses

# The package's three modules: its tier (rl_kernel.tiers), its workload (rlparity.cell.workloads) and the
# workload's suite, written against the suite plugin's fixtures (cell, control, record, shape, params).
TIER = """
from rl_kernel.tiers import Tier

TIER = Tier(
    name="toy",
    scope="per-target",
    cpu_reference=False,
    platforms=("cpu",),
    package="toy_rl.ops",
    operators=("token_logprobs",),
    fallback="exact",
    description="log-probs through float64 (a toy: one device, its own bits)",
)
"""
OPS = """
import torch

def token_logprobs(logits, tokens, ignore_index=-100):
    lp = torch.log_softmax(logits.double(), -1)
    keep = tokens != ignore_index
    picked = lp.gather(-1, tokens.clamp(min=0)[..., None])[..., 0]
    return torch.where(keep, picked, torch.zeros_like(picked)).float()
"""
WORKLOAD = """
from pathlib import Path
from rlparity.cell.workloads import Workload

WORKLOAD = Workload(
    name="toy",
    suite=(Path(__file__).parent / "test_toy.py",),
    params={"rows": 2, "scale": 1.0},
    needs=("token_logprobs",),
    description="a user's workload: its tier's log-probs, rows alone vs in a batch",
)
"""
SUITE = """
import rl_kernel
import torch

def test_rows_alone_equal_the_batch(cell, record, shape, params):
    batch, seq, vocab = shape
    op = rl_kernel.tiers.get(cell.tier).op("token_logprobs")
    g = torch.Generator().manual_seed(cell.seed)
    x = torch.randn(params["rows"] * batch, vocab, generator=g) * params["scale"]
    t = torch.randint(0, vocab, (x.shape[0],), generator=g)
    full = op(x, t)
    alone = torch.cat([op(x[i : i + 1], t[i : i + 1]) for i in range(x.shape[0])])
    record.output("toy/logprobs", full)
    assert record.compare("toy rows alone == batch", alone, full).equal
"""
ENTRY_POINTS = {
    "rl_kernel.tiers": "toy = toy_rl.tier:TIER",
    "rlparity.workloads": "toy = toy_rl.workload:WORKLOAD",
}
MATRIX = """
[matrix]
description = "a user's tier and workload"
repeats = 2

[tiers.toy]
scope = "per-target"

[shapes.toyset]
workload = "toy"
params = { rows = 3 }
shapes = [[2, 4, 50]]

[axes]
image = ["cpu"]
target = ["cpu"]
profile = ["baseline"]
placement = ["single"]
dtype = ["fp32"]
shapes = ["toyset"]
tier = ["toy"]
"""


def install(site: Path, groups: dict[str, str]) -> Path:
    """The package toy_rl and its dist-info (METADATA, entry_points.txt with `groups`) in site: what pip leaves
    behind, so importlib.metadata finds its entry points with site on the path."""
    pkg = site / "toy_rl"
    pkg.mkdir(parents=True)
    for name, text in {"__init__": "", "tier": TIER, "ops": OPS, "workload": WORKLOAD, "test_toy": SUITE}.items():
        (pkg / f"{name}.py").write_text(textwrap.dedent(text))
    info = site / "toy_rl-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-rl\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(f"[{g}]\n{ep}\n\n" for g, ep in groups.items()))
    return site


def rlparity(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "rlparity.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    path = tmp_path / "toy.toml"
    path.write_text(MATRIX)
    return path


def test_a_packages_tier_and_workload_run_as_cells(tmp_path, matrix):
    site = install(tmp_path / "site", ENTRY_POINTS)
    out = tmp_path / "results"
    proc = rlparity(site, "run", "--matrix", str(matrix), "--strict", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (cell_dir,) = (out / "cells").iterdir()
    result = json.loads((cell_dir / "result.json").read_text())
    assert result["status"] == "passed" and result["cell"]["tier"] == "toy" and result["cell"]["workload"] == "toy"
    assert result["cell"]["tier_scope"] == "per-target" and result["cell"]["params"] == {"rows": 3}
    assert "toy/logprobs" in result["digests"]
    assert [c["name"] for c in result["comparisons"]] == ["toy rows alone == batch"]
    # The fingerprint names the tier and where it came from; nothing in this repository names the package.
    assert "entry point toy_rl.tier:TIER" in json.dumps(result["fingerprint"])
    repo_text = "\n".join(p.read_text() for p in (ROOT / "harness").rglob("*.py"))
    assert "toy_rl" not in repo_text


@pytest.mark.parametrize(
    ("removed", "reason"),
    [
        ("rl_kernel.tiers", "this image's rl_kernel offers no tier 'toy' (it offers: exact"),
        (
            "rlparity.workloads",
            "this image offers no workload 'toy' (it offers: architectures, edges, engines, model, plain)",
        ),
    ],
)
def test_without_its_entry_point_the_cell_is_skipped_and_strict_fails(tmp_path, matrix, removed, reason):
    site = install(tmp_path / "site", {g: ep for g, ep in ENTRY_POINTS.items() if g != removed})
    out = tmp_path / "results"
    proc = rlparity(site, "run", "--matrix", str(matrix), "--out", str(out), "--min-ran", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    (cell_dir,) = (out / "cells").iterdir()
    result = json.loads((cell_dir / "result.json").read_text())
    assert result["status"] == "skipped" and result["reason"].startswith(reason), result["reason"]
    strict = rlparity(site, "run", "--matrix", str(matrix), "--strict", "--out", str(tmp_path / "s"), cwd=tmp_path)
    assert strict.returncode == 2, strict.stdout[-3000:]
    text = " ".join(strict.stdout.split())  # the console wraps long lines
    assert "required but not run (--strict)" in text and reason in text


def test_a_parameter_the_workload_does_not_take_is_exit_3_at_its_line(tmp_path, matrix):
    site = install(tmp_path / "site", ENTRY_POINTS)
    matrix.write_text(MATRIX.replace("params = { rows = 3 }", "params = { rows = 3, colour = 1 }"))
    proc = rlparity(site, "run", "--matrix", str(matrix), "--out", str(tmp_path / "r"), cwd=tmp_path)
    line = MATRIX.splitlines().index("params = { rows = 3 }") + 1
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = " ".join((proc.stdout + proc.stderr).split())  # the console wraps long lines
    assert f"{matrix}:{line}" in text and "workload 'toy' takes no parameter 'colour' (it takes: rows, scale)" in text
