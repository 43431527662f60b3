"""What every toolchain's check of kernels_check shares: the contract's flags (build_flags, imported by path: pure
Python, no extension needed), the translation unit each target compiles, how a tool is run (a compile through a
cache) and the result of one target."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
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


def cache_dir() -> Path:
    """Where compiles are kept ($RL_KERNEL_CHECK_CACHE, else ~/.cache/rl_kernel/kernels-check)."""
    return Path(os.environ.get("RL_KERNEL_CHECK_CACHE") or build_flags.user_cache("kernels-check"))


@contextlib.contextmanager
def _kept_entry(cmd: list[str], paths: tuple[Path, ...], inputs: list[Path]) -> Iterator[Path]:
    """The cache folder of (cmd with `paths` written <path>, the bytes of `inputs`), held under its lock: concurrent
    callers (xdist workers) wait for the one run. Paths are left out of the key (each run writes its unit in a
    temporary folder), and so is the checkout's own folder (in the flags' include paths and the unit's includes):
    another clone of the same sources finds the same entries."""
    root = str(build_flags.REPO)
    key = hashlib.sha256()
    for arg in cmd:
        key.update((arg if arg not in {str(p) for p in paths} else "<path>").replace(root, "<repo>").encode() + b"\0")
    for path in inputs:
        key.update(path.read_bytes().replace(root.encode(), b"<repo>"))
    entry = cache_dir() / key.hexdigest()[:24]
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield entry


def compile_cached(cmd: list[str], source: Path, out: Path) -> subprocess.CompletedProcess:
    """Run a compile of `source` into `out` once per (command, the source's text, every contract file's text): the
    same compile asked again (another target's reference count, another test, another run) copies the kept output.
    A failed compile is never kept."""
    with _kept_entry(cmd, (source, out), [source, *build_flags.contract_files()]) as entry:
        kept = entry / "output"
        if kept.is_file():
            shutil.copyfile(kept, out)
            return subprocess.CompletedProcess(cmd, 0, "", "")
        proc = run(cmd)
        if proc.returncode == 0 and out.is_file():
            shutil.copyfile(out, kept)
        return proc


def output_cached(cmd: list[str], binary: Path) -> subprocess.CompletedProcess:
    """A disassembler's run over `binary` (cuobjdump -sass: ~90 MB of text and seconds per target), its stdout kept by
    (command, the binary's bytes) like compile_cached's compiles; a failed run is never kept."""
    with _kept_entry(cmd, (binary,), [binary]) as entry:
        kept = entry / "stdout"
        if kept.is_file():
            return subprocess.CompletedProcess(cmd, 0, kept.read_text(), "")
        proc = run(cmd)
        if proc.returncode == 0:
            kept.write_text(proc.stdout)
        return proc


def write_unit(tmp: Path) -> Path:
    """One translation unit that includes every family's <tier>/<family>/<family>_check.cu (found by name),
    so each target is compiled once and every kernel of every family is scanned."""
    unit = tmp / "kernels_check.cu"
    unit.write_text("".join(f'#include "{p}"\n' for p in build_flags.check_sources()))
    return unit
