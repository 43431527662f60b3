"""README: `rl_kernel.bitwise.diff(a, b)` works right after `import rl_kernel`, in a fresh interpreter.

It once raised AttributeError unless `rl_kernel.bitwise` had been imported first; rl_kernel/__init__.py now
imports it. A fresh interpreter is used because within pytest some other test may already have imported it.
"""

from __future__ import annotations

import subprocess
import sys

SNIPPET = """
import sys, torch, rl_kernel
assert "rl_kernel.bitwise" in sys.modules
a = torch.zeros(4)
b = a.clone(); b[2] = 1e-30
d = rl_kernel.bitwise.diff(a, b)
assert not d.equal and d.summary(), d
assert rl_kernel.bitwise.diff(a, a.clone()).equal
print("ok")
"""


def test_bitwise_diff_after_a_plain_import_rl_kernel(tmp_path) -> None:
    res = subprocess.run([sys.executable, "-c", SNIPPET], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
