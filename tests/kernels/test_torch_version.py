"""`import rl_kernel` compares the torch the extension was built against (the build record, _build.json) with
the installed one: another major.minor is refused with both versions named and how to rebuild, another patch
release or local tag is warned about. Checked end to end on a copy of the package whose build record is faked,
imported in a fresh interpreter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rl_kernel
from rl_kernel import _library

PACKAGE = Path(rl_kernel.__file__).parent
RUNNING = torch.__version__


def _copy_with_record(tmp_path: Path, record: dict | None) -> Path:
    """The rl_kernel package copied under tmp_path (the extension linked, not copied), its _build.json replaced
    by record (or removed for None)."""
    dest = tmp_path / "rl_kernel"
    shutil.copytree(PACKAGE, dest, ignore=shutil.ignore_patterns("*.so", "__pycache__", "_build.json"))
    (dest / _library.EXTENSION.name).symlink_to(_library.EXTENSION)
    if record is not None:
        (dest / "_build.json").write_text(json.dumps(record))
    return tmp_path


def _import(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("RL_KERNEL_LIBRARY", None)
    code = "import torch, rl_kernel; print(rl_kernel.__file__); print(rl_kernel.log_softmax(torch.zeros(1, 8)).sum())"
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


def _other_minor(version: str) -> str:
    major, minor = version.split("+")[0].split(".")[:2]
    return f"{major}.{int(minor) - 1 if int(minor) else int(minor) + 1}.0+cpu"


def test_another_minor_release_is_refused_naming_both(tmp_path: Path) -> None:
    built = _other_minor(RUNNING)
    proc = _import(_copy_with_record(tmp_path, {"torch": built}))
    assert proc.returncode != 0, proc.stdout
    assert "ImportError" in proc.stderr and f"built against torch {built}" in proc.stderr, proc.stderr
    assert f"torch {RUNNING} is installed" in proc.stderr and "make build" in proc.stderr, proc.stderr


def test_another_patch_release_is_warned_about(tmp_path: Path) -> None:
    major_minor = ".".join(RUNNING.split("+")[0].split(".")[:2])
    built = f"{major_minor}.99+cu999"
    proc = _import(_copy_with_record(tmp_path, {"torch": built}))
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path) in proc.stdout, proc.stdout  # the copy was imported, not the checkout
    assert "RuntimeWarning" in proc.stderr and built in proc.stderr and RUNNING in proc.stderr, proc.stderr


@pytest.mark.parametrize("record", [{"torch": RUNNING}, None], ids=["same torch", "no record"])
def test_the_same_torch_or_no_record_imports_silently(tmp_path: Path, record: dict | None) -> None:
    proc = _import(_copy_with_record(tmp_path, record))
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path) in proc.stdout and "Warning" not in proc.stderr, (proc.stdout, proc.stderr)


def test_this_build_recorded_the_running_torch() -> None:
    """The checkout's own build record names the torch it runs with (else every test here would warn)."""
    assert _library.built_torch() == RUNNING


def test_the_check_itself() -> None:
    with pytest.raises(ImportError, match=r"built against torch 2\.12\.0\+cpu, but torch 2\.13\.0\+cpu"):
        _library.check_torch_version("2.12.0+cpu", "2.13.0+cpu")
    with pytest.raises(ImportError, match=r"3\.13\.0"):
        _library.check_torch_version("3.13.0", "2.13.0")
    with pytest.warns(RuntimeWarning, match=r"2\.13\.0\+cu128.*2\.13\.0\+cpu"):
        _library.check_torch_version("2.13.0+cu128", "2.13.0+cpu")
    _library.check_torch_version("2.13.0+cpu", "2.13.0+cpu")
    _library.check_torch_version(None, "2.13.0+cpu")
