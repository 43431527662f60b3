"""The Triton interpreter for the fast tier's tests: a check module run as a subprocess with TRITON_INTERPRET=1 (it
must be set before Triton is imported), which prints {check: bool} as JSON; and the interpreter's shims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

from tooling import require


def need_triton() -> None:
    require("triton (pip install triton==3.6.0)", find_spec("triton") is not None, "not installed")


def interpret(module_file: str, check: str) -> dict:
    """Run `python module_file check` under the interpreter; its last line of output, as JSON."""
    need_triton()
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, module_file, check], capture_output=True, text=True, env=env, timeout=600,
        cwd=Path(module_file).parent,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def serve(checks: dict) -> None:
    """The subprocess side of `interpret`: run the check named by argv[1] under the interpreter, print its JSON."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through the tests (TRITON_INTERPRET=1)"
    shim()
    print(json.dumps(checks[sys.argv[1]]()))


def failed(found: dict) -> dict:
    """The checks of an interpreter run that did not hold."""
    return {k: v for k, v in found.items() if v is not True}


def shim() -> None:
    """Triton 3.6's interpreter with numpy >= 2.4: int() of a 1-element array raises (loop bounds), tl.dot of bf16
    multiplies the raw uint16 storage, and fp32 -> bf16 truncates. All patched here, in the interpreter only. And
    tl.dot's fp32 sum: the interpreter's np.matmul in float32 runs OpenBLAS, whose order of the K sum depends on the
    tile's M (its small-matrix kernels), so a row's bits would move with BLOCK_M in the interpreter alone. Here a
    dot of bf16 / fp16 operands is summed in float64 (exact: each product has at most 22 significant bits) and added
    to the fp32 accumulator with one rounding, so each K step's rounding, the property the tests check, is what
    shows."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter as it

    patch_tensor = it._patch_lang_tensor

    def patched(tensor, scope) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    it._patch_lang_tensor = patched
    create_dot = it.InterpreterBuilder.create_dot

    def as_fp32(h):
        if h.dtype.scalar == tl.bfloat16:
            return it.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return h

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        narrow = a.dtype.scalar in (tl.bfloat16, tl.float16) and b.dtype.scalar in (tl.bfloat16, tl.float16)
        a, b = as_fp32(a), as_fp32(b)
        if narrow and d.data.dtype == np.float32:
            exact = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64)) + d.data
            return it.TensorHandle(exact.astype(np.float32), d.dtype.scalar)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    it.InterpreterBuilder.create_dot = dot
    cast_impl = it.InterpreterBuilder.cast_impl

    def cast(self, src, dst_type):
        """fp32 -> bf16 rounded to nearest even, as the GPUs' conversion (and torch's) rounds: the interpreter's own
        truncates, so a bf16 result would differ from torch's in its last bit."""
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).bfloat16()
            return it.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast_impl(self, src, dst_type)

    it.InterpreterBuilder.cast_impl = cast
    patch_once_per_launch(it, tl)


def patch_once_per_launch(it, tl) -> None:
    """Triton's interpreter patches triton.language's builtins for a launch (restored after it) and again at every
    call of a @triton.jit helper inside it (never restored: a helper's patch of a module the launch did not patch,
    tl.core for the standard library's helpers, outlives the launch). Each patch walks tl, tl.tensor and tl.math by
    inspect.getmembers; once a module is patched the walk finds no builtin left and re-sets the rest to equal
    closures: a third of a window check's time. Here a helper whose modules are patched already (by the running
    launch, or by an earlier helper's patch that no launch's restore has undone since) runs without the walk."""
    import inspect

    launch, helper = it.GridExecutor.__call__, it.InterpretedFunction.__call__
    running: list[frozenset[int]] = []  # the modules each running launch patched
    kept: set[int] = set()  # the modules helpers patched, not restored since

    def langs(fn) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def launch_call(self, *args, **kwargs):
        running.append(langs(self.fn))
        try:
            return launch(self, *args, **kwargs)
        finally:
            kept.difference_update(running.pop())  # its restore put those modules' own builtins back

    def helper_call(self, *args, **kwargs):
        mine = langs(self.fn)
        if not running or not mine <= running[-1] | kept:
            kept.update(mine)
            return helper(self, *args, **kwargs)
        fn = self.rewrite()  # the rest of the interpreter's own helper call
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise it.InterpreterError(repr(e)) from e

    it.GridExecutor.__call__, it.InterpretedFunction.__call__ = launch_call, helper_call
