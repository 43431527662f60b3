"""What every toolchain's check of kernels_check shares: the contract's flags (build_flags, imported by path: pure
Python, no extension needed), the translation unit each target compiles, how a tool is run and the result of one
target."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "rl_kernel"))
import build_flags  # noqa: E402  (pure-Python flag lists, no extension needed)


@dataclass
class TargetResult:
    target: str
    toolchain: str
    ok: bool
    kernels: int = 0
    violations: list[str] = field(default_factory=list)
    error: str = ""


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def write_unit(tmp: Path) -> Path:
    """One translation unit that includes every family's <tier>/<family>/<family>_check.cu (found by name),
    so each target is compiled once and every kernel of every family is scanned."""
    unit = tmp / "kernels_check.cu"
    unit.write_text("".join(f'#include "{p}"\n' for p in build_flags.check_sources()))
    return unit
