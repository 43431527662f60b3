"""The matrix instructions of a compiled sm_90 kernel's SASS (cuobjdump, as Triton's wheel ships it), for
compile_check's scan. Kept per (kernel, cuobjdump's bytes) in the user's cache: the disassembly is most of a target's
scan (0.3 s a kernel, 72 kernels on sm_90), while Triton's own cache makes the compile itself free the second time."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from rl_kernel import build_flags


def sass_instructions(kernel: Any, pattern: re.Pattern) -> list[str]:
    """The distinct matches of `pattern` in the SASS of a Triton CompiledKernel's cubin, sorted; [] where cuobjdump
    does not run here (never kept: a later run with the tool disassembles). The kernel is known by Triton's own
    cache key (its `hash`: the source, options, target and Triton's version), not by the cubin's bytes, whose line
    table names the folder of whichever clone compiled it first."""
    try:
        from triton.tools.disasm import get_sass, path_to_cuobjdump

        key = hashlib.sha256(f"{kernel.hash}:{_digest(path_to_cuobjdump())}:{pattern.pattern}".encode())
        kept = cache_dir() / f"{key.hexdigest()[:32]}.json"
        if kept.is_file():
            return json.loads(kept.read_text())
        found = sorted(set(pattern.findall(get_sass(kernel.asm["cubin"]))))
    except Exception:
        return []
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_suffix(f".{os.getpid()}")
    partial.write_text(json.dumps(found))
    partial.replace(kept)  # whole or absent for a concurrent reader
    return found


@functools.lru_cache
def _digest(tool: str) -> str:
    """sha256 of the cuobjdump binary: the same tool in another venv (another clone's) keys alike."""
    return hashlib.sha256(Path(tool).read_bytes()).hexdigest()


def cache_dir() -> Path:
    return build_flags.user_cache("sass")
