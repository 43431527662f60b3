"""No checking code path writes a golden file: only `rlparity golden --update` does. Not the suite in a
cell, not `rlparity golden` without --update, whatever update-style env var is set
(RL_UPDATE_GOLDEN=1 and friends: a checking path that honoured one would turn the gate green by rewriting
what it checks against)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlparity import golden

from harness.factories import ROOT
from harness.scripted import rlparity, show

PACKAGE = ROOT / "harness" / "rlparity"
UPDATE_VARS = {
    "RL_UPDATE_GOLDEN": "1",
    "UPDATE_GOLDEN": "1",
    "RLPARITY_UPDATE_GOLDEN": "1",
    "RL_KERNEL_UPDATE_GOLDEN": "1",
    "GOLDEN_UPDATE": "1",
}
# The golden files a check reads: the harness workloads' and the kernels' per-family digests.
GOLDEN_FILES = [golden.path_for("exact"), *sorted((ROOT / "kernels" / "rl_kernel" / "golden").rglob("*.json"))]


def snapshot() -> dict[Path, tuple[bytes, int]]:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in GOLDEN_FILES}


@pytest.mark.slow
def test_checking_never_writes_a_golden_file_even_when_asked_by_env(tmp_path):
    before = snapshot()
    # the suite inside a cell (its golden test among the others), and the golden check
    run = rlparity(
        "run", "--matrix", "quick", "--filter", "target=cpu shapes=edges dtype=fp16", "--out", str(tmp_path / "r"),
        cwd=tmp_path, env=UPDATE_VARS,
    )  # fmt: skip
    assert run.returncode == 0, show(run)
    check = rlparity("golden", "--shapes", "edges", "--dtypes", "fp16", cwd=tmp_path, env=UPDATE_VARS)
    assert check.returncode == 0, show(check)
    assert snapshot() == before, "a checking path wrote a golden file"


def test_only_the_update_command_calls_the_writer():
    """golden.update is the one writer of harness/rlparity/data/golden/; its only caller is
    `rlparity golden --update`."""
    callers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if _calls(node, "golden", "update"):
                callers.append(path.relative_to(PACKAGE).as_posix())
    assert set(callers) == {"commands/golden.py"}  # --update, and --record (a per-target tier's cells' digests)
    text = (PACKAGE / "commands" / "golden.py").read_text()
    assert "if update:" in text and "_write_or_check(tier, entries, args.update)" in text
    for path in PACKAGE.rglob("*.py"):  # nothing in the harness reads an update switch from the env
        assert "UPDATE_GOLDEN" not in path.read_text(), path


def _calls(node: ast.AST, owner: str, attr: str) -> bool:
    """node is a call of owner.attr(...)."""
    f = getattr(node, "func", None)
    return (
        isinstance(node, ast.Call)
        and isinstance(f, ast.Attribute)
        and f.attr == attr
        and isinstance(f.value, ast.Name)
        and f.value.id == owner
    )
