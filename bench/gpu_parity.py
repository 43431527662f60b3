"""CPU bits == GPU bits for every promised vocab size and dtype, plus GPU
run-to-run and batch invariance: `rl_kernel.selfcheck` with a GPU required.

    python bench/gpu_parity.py [--json out.json]
"""

import sys

from rl_kernel import selfcheck

if __name__ == "__main__":
    sys.exit(selfcheck.main(["--require-gpu", *sys.argv[1:]]))
