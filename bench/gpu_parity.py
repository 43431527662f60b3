"""CPU bits == GPU bits for every promised vocab size and dtype, plus GPU run-to-run and batch invariance.

    python -m bench gpu_parity [--json out.json] [rl_kernel.contract.selfcheck's other options]

`python -m rl_kernel.contract.selfcheck --require-gpu`: the exact tier's self-check with a GPU required (CUDA or ROCm).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from rl_kernel.contract import selfcheck

    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):
        print(__doc__)
    return selfcheck.main(["--require-gpu", *args])
