"""rl_kernel.fast.sass: compile_check's SASS read, kept per (kernel, cuobjdump) in the user's cache so that a second
scan of the same kernels disassembles nothing (in this clone or another); a failed disassembly is never kept."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from rl_kernel.fast import sass

triton_disasm = pytest.importorskip("triton.tools.disasm", reason="triton (requirements-dev.txt) not installed")
PATTERN = re.compile(r"\bHGMMA[\w.]*")


def kernel(key: str, cubin: bytes) -> SimpleNamespace:
    """A stand-in for Triton's CompiledKernel: its cache key (`hash`) and its cubin."""
    return SimpleNamespace(hash=key, asm={"cubin": cubin})


def test_a_kernels_sass_is_read_once_then_kept(tmp_path: Path, monkeypatch) -> None:
    tool = tmp_path / "cuobjdump"
    tool.write_text("a stand-in")
    calls: list[bytes] = []

    def get_sass(cubin: bytes) -> str:
        calls.append(cubin)
        if cubin == b"broken":
            raise RuntimeError("cuobjdump failed")
        return f"HGMMA.64x{len(cubin)}x16.F32.BF16 R0 ; HGMMA.64x{len(cubin)}x16.F32.BF16 R1 ; FFMA R2"

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(triton_disasm, "get_sass", get_sass)
    monkeypatch.setattr(triton_disasm, "path_to_cuobjdump", lambda: str(tool))
    first = sass.sass_instructions(kernel("a", b"/work/one/linear.py"), PATTERN)
    assert first == ["HGMMA.64x19x16.F32.BF16"] and len(calls) == 1
    # the same kernel, its cubin built in another clone (another folder in its line table): kept, no second read
    assert sass.sass_instructions(kernel("a", b"/tmp/another-clone/linear.py"), PATTERN) == first and len(calls) == 1
    assert sass.sass_instructions(kernel("b", b"cubin-bb"), PATTERN) == ["HGMMA.64x8x16.F32.BF16"] and len(calls) == 2
    broken = kernel("c", b"broken")
    assert sass.sass_instructions(broken, PATTERN) == [] and sass.sass_instructions(broken, PATTERN) == []
    assert calls.count(b"broken") == 2  # a failure is not kept
    twin = tmp_path / "venv-of-another-clone" / "cuobjdump"  # the same tool elsewhere: kept
    twin.parent.mkdir()
    twin.write_text("a stand-in")
    monkeypatch.setattr(triton_disasm, "path_to_cuobjdump", lambda: str(twin))
    assert sass.sass_instructions(kernel("a", b"/work/one/linear.py"), PATTERN) == first and len(calls) == 4
    twin.write_text("another cuobjdump")  # another tool: read again
    sass._digest.cache_clear()
    assert sass.sass_instructions(kernel("a", b"/work/one/linear.py"), PATTERN) == first and len(calls) == 5
