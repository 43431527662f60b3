"""rl_kernel.fast.sass: compile_check's SASS read, kept per (cubin, cuobjdump) in the user's cache so that a second
scan of the same kernels disassembles nothing; a failed disassembly is never kept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rl_kernel.fast import sass

triton_disasm = pytest.importorskip("triton.tools.disasm", reason="triton (requirements-dev.txt) not installed")
PATTERN = re.compile(r"\bHGMMA[\w.]*")


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
    first = sass.sass_instructions(b"cubin-a", PATTERN)
    assert first == ["HGMMA.64x7x16.F32.BF16"] and len(calls) == 1
    assert sass.sass_instructions(b"cubin-a", PATTERN) == first and len(calls) == 1  # kept: no second disassembly
    assert sass.sass_instructions(b"cubin-bb", PATTERN) == ["HGMMA.64x8x16.F32.BF16"] and len(calls) == 2
    assert sass.sass_instructions(b"broken", PATTERN) == [] and sass.sass_instructions(b"broken", PATTERN) == []
    assert calls.count(b"broken") == 2  # a failure is not kept
    repo = str(sass.build_flags.REPO).encode()
    assert sass.sass_instructions(b"line table: " + repo, PATTERN) == [f"HGMMA.64x{12 + len(repo)}x16.F32.BF16"]
    monkeypatch.setattr(sass.build_flags, "REPO", Path("/another/clone"))  # the same kernel built in another clone
    assert sass.sass_instructions(b"line table: /another/clone", PATTERN) != [] and calls.count(b"broken") == 2
    assert len(calls) == 5  # 4 reads so far (a, bb, broken twice) + the first clone's: the second clone's was kept
    tool.write_text("another cuobjdump")  # another tool: read again
    assert sass.sass_instructions(b"cubin-a", PATTERN) == first and calls.count(b"cubin-a") == 2
