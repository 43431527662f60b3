"""actionlint over .github/workflows/ (with shellcheck for the run: scripts), and a control that it can fail.

actionlint must be installed (`.ci/run` and the workflows install it): under CI=true a missing binary is a
failure, elsewhere a skip.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from repo.workflow_rules import ACTIONLINT_CONFIG, ROOT, workflow_files
from tooling import find_tool, require


def actionlint() -> str | None:
    return find_tool("actionlint")


def test_workflows_exist() -> None:
    names = {p.name for p in workflow_files()}
    assert {"ci.yml", "nightly.yml"} <= names, names
    assert ACTIONLINT_CONFIG.is_file(), "the self-hosted runner labels are declared in .github/actionlint.yaml"


def test_actionlint_passes() -> None:
    binary = actionlint()
    require("actionlint", binary)
    files = [str(p.relative_to(ROOT)) for p in workflow_files()]
    proc = subprocess.run(
        [binary, "-no-color", "-config-file", str(ACTIONLINT_CONFIG.relative_to(ROOT)), *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    """Negative control: the binary found really lints (a stub that always exits 0 would pass the test above)."""
    binary = actionlint()
    require("actionlint", binary)
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    timeout-minutes: 5\n"
        "    steps:\n      - run: echo ${{ github.event.no_such_thing.oops( }}\n"
        "      - uses: actions/checkout@v4\n        with:\n          no-such-input: 1\n"
    )
    proc = subprocess.run([binary, "-no-color", str(bad)], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "bad.yml:7:" in proc.stdout, proc.stdout


def test_shellcheck_available_to_actionlint() -> None:
    """actionlint checks run: scripts with shellcheck only where shellcheck is on PATH (it is on GitHub's runners)."""
    require("shellcheck", find_tool("shellcheck"))
