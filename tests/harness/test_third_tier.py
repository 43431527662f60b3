"""Adding a tier edits no shared module: a third tier built from a folder in a temporary directory (the exact tier's
log-prob operators under another name, everything else from its fallback, and one negative control), installed as a
real distribution (a dist-info with an `rl_kernel.tiers` entry point), runs through patch(), the fused LM head, its
golden digests, selfcheck and a harness cell, and its control is caught by the golden check, selftest and the gate.

Nothing in this repository names the tier; docs/architecture.md's "How to add a tier" follows these files."""

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

pytestmark = pytest.mark.slow  # every test runs cells or builds in subprocesses

FILES = {
    "third_tier/__init__.py": '''
        """The third tier's own operators: the exact tier's log-prob kernels, under this tier's name."""
        from rl_kernel.exact import entropy, log_softmax, row_stats, token_logprobs

        OPERATORS = ("entropy", "log_softmax", "row_stats", "token_logprobs")
    ''',
    "third_tier/tier.py": """
        from rl_kernel.tiers import Tier
        from third_tier import OPERATORS

        TIER = Tier(
            name="third",
            scope="all-devices",
            cpu_reference=True,
            platforms=("cpu", "cuda", "rocm"),
            package="third_tier",
            operators=OPERATORS,
            fallback="exact",
            rows="third_tier.rows:ROWS",
            controls={"reversed": "third_tier.reversed"},
            description="a third tier from a folder of its own",
        )
    """,
    "third_tier/rows.py": '''
        """The third tier's row operators for the fused head: the exact tier's compiled kernels, each call counted
        (the probe's proof that the fused and the vocab-parallel head walk with this tier's, not the exact tier's)."""
        from rl_kernel._library import ops as _exact

        CALLS = {}


        class _Counted:
            def __getattr__(self, name):
                fn = getattr(_exact, name)

                def counted(*args, **kwargs):
                    CALLS[name] = CALLS.get(name, 0) + 1
                    return fn(*args, **kwargs)

                return counted


        ROWS = _Counted()
    ''',
    "third_tier/reversed.py": '''
        """The control: token log-probs reduced over the reversed vocabulary (the same math, another order)."""
        import torch

        from rl_kernel.exact import token_logprobs as exact_token_logprobs


        def token_logprobs(logits, tokens, ignore_index=-100, validate=True):
            flipped = torch.where(tokens == ignore_index, tokens, logits.shape[-1] - 1 - tokens)
            return exact_token_logprobs(logits.flip(-1), flipped, ignore_index, validate=validate)
    ''',
    "third_tier/softmax/__init__.py": "",
    "third_tier/softmax/checks.py": """
        from rl_kernel import tiers
        from rl_kernel.exact.softmax.checks import check_case, golden_case
        from rl_kernel.spec import OpSpec


        def _logprobs(x, c):
            return tiers.get("third").op("token_logprobs")(x, c.tokens, c.ignore_index)


        SPECS = (OpSpec("token_logprobs", "softmax", _logprobs, "row", golden_case, check_case, (7, 257, 32000)),)
    """,
}
# patch(), the fused head and the golden digests' agreement with the exact tier's, in one process.
PROBE = """
import json, torch, rl_kernel
from rl_kernel import head, tiers
from rl_kernel.contract import golden
from rl_kernel.bitwise import bits_equal
from rl_kernel.locate import locate
from rl_kernel.models import sequences, tiny_model

third = tiers.get("third")
out = {"origin": third.origin, "operators": list(third.all_operators())}
model = tiny_model("qwen3", 64, layers=2, hidden=32, heads=4, tier="third")
ids, mask = sequences(3, 6, 3, 64, seed=1)
report = locate(model, ids, mask, 3)
out["patch: rollout == training"] = report.equal
exact = tiny_model("qwen3", 64, layers=2, hidden=32, heads=4, tier="exact")
with torch.no_grad():
    out["patch: third == exact logits"] = bits_equal(model(ids, attention_mask=mask).logits,
                                                      exact(ids, attention_mask=mask).logits)
g = torch.Generator().manual_seed(0)
h, w = torch.randn(5, 16, generator=g), torch.randn(100, 16, generator=g)
t = torch.randint(0, 100, (5,), generator=g)
from third_tier.rows import CALLS
hg = h.clone().requires_grad_()
fused = head.lm_head_logprobs(hg, w, t, tier="third", vocab_chunk=32)
fused.sum().backward()
out["the fused head walks the third tier's row operators, forward and backward"] = (
    any(k.startswith("token_logprobs") or k.startswith("node_stats") for k in CALLS)
    and any(k.endswith("backward_slice") for k in CALLS))
CALLS.clear()
parallel = head.vocab_parallel(h, w, t, None, vocab_start=0, vocab_size=100, tier="third", vocab_chunk=32)
out["the vocab-parallel head walks them too"] = bool(CALLS) and bits_equal(parallel, fused.detach())
CALLS.clear()
exact_fused = head.lm_head_logprobs(h, w, t, tier="exact", vocab_chunk=32)
out["the exact tier's head does not (the count's control)"] = not CALLS
fused = fused.detach()
out["fused head == unfused"] = bits_equal(fused, head.unfused(h, w, t, tier="third"))
out["fused head == exact tier's"] = bits_equal(fused, exact_fused)
mine, theirs = golden.load("softmax", tier=third), golden.load("softmax")
out["golden == exact's"] = bool(mine) and all(theirs[k] == v for k, v in mine.items())
print(json.dumps(out))
"""
MATRIX = """
[matrix]
description = "the third tier's plain cells"
repeats = 2

[tiers.third]
scope = "all-devices"

[axes]
image = ["cpu"]
target = ["cpu"]
profile = ["baseline"]
placement = ["single"]
dtype = ["fp32"]
shapes = ["selftest"]
tier = ["third"]
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tier's folder and its dist-info, as pip leaves them; the harness's golden tables in a directory of the
    test's own (RLPARITY_GOLDEN_DIR), the third tier's being the exact tier's (the same kernels)."""
    root = tmp_path_factory.mktemp("third")
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    info = root / "third_tier-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: third-tier\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rl_kernel.tiers]\nthird = third_tier.tier:TIER\n")
    tables = root / "golden-tables"
    tables.mkdir()
    shutil.copy(ROOT / "harness/rlparity/data/golden/exact.json", tables / "third.json")
    (root / "third.toml").write_text(MATRIX)
    return root


def run(site: Path, *argv: str, control: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    env["RLPARITY_GOLDEN_DIR"] = str(site / "golden-tables")
    env.pop("RL_KERNEL_CONTROL", None)
    if control:
        env["RL_KERNEL_CONTROL"] = control
    return subprocess.run([sys.executable, *argv], cwd=site, env=env, capture_output=True, text=True, timeout=900)


def said(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_its_golden_digests_are_written_and_checked_and_its_control_is_caught(site: Path) -> None:
    wrote = run(site, "-m", "rl_kernel.contract.golden", "--tier", "third", "--update")
    assert wrote.returncode == 0 and (site / "third_tier/softmax/golden.json").is_file(), said(wrote)
    assert run(site, "-m", "rl_kernel.contract.golden", "--tier", "third").returncode == 0
    caught = run(site, "-m", "rl_kernel.contract.golden", "--tier", "third", control="reversed")
    assert caught.returncode == 1 and "changed: " in caught.stdout, said(caught)
    wrong = run(site, "-m", "rl_kernel.contract.golden", "--tier", "third", control="split-k")
    assert wrong.returncode != 0 and "not a control of the third tier" in wrong.stderr, said(wrong)


def test_patch_the_fused_head_and_selfcheck_take_it(site: Path) -> None:
    run(site, "-m", "rl_kernel.contract.golden", "--tier", "third", "--update")
    probe = run(site, "-c", PROBE)
    assert probe.returncode == 0, said(probe)
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["origin"] == "entry point third_tier.tier:TIER"
    assert {"token_logprobs", "linear", "attention"} <= set(found["operators"])  # its own and its fallback's
    checks = {k: v for k, v in found.items() if isinstance(v, bool)}
    assert checks and all(checks.values()), checks
    selfcheck = run(site, "-m", "rl_kernel.contract.selfcheck", "--tier", "third", "--vocabs", "257")
    assert selfcheck.returncode == 0, said(selfcheck)


def test_a_harness_cell_passes_and_selftest_catches_its_control(site: Path, tmp_path: Path) -> None:
    matrix = str(site / "third.toml")
    passed = run(site, "-m", "rlparity.cli", "run", "--matrix", matrix, "--strict", "--out", str(tmp_path / "ok"))
    assert passed.returncode == 0, said(passed)
    (cell,) = (tmp_path / "ok" / "cells").iterdir()
    assert json.loads((cell / "result.json").read_text())["cell"]["tier"] == "third"
    st = run(site, "-m", "rlparity.cli", "selftest", "--only", "third:reversed", "--matrix", matrix,
             "--out", str(tmp_path / "st"))  # fmt: skip
    assert st.returncode == 0, said(st)
    text = " ".join(st.stdout.split())
    assert "third:reversed caught (gate exit 1) caught by: golden" in text, said(st)
    repo_text = "\n".join(p.read_text() for p in (ROOT / "kernels").rglob("*.py"))
    assert "third_tier" not in repo_text
