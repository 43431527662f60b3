"""`rlparity env`: this environment's fingerprint as JSON (collected on the cell side, in a subprocess)."""

from __future__ import annotations

import argparse
import subprocess
import sys


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("env", help="print this environment's fingerprint (JSON)")
    e.set_defaults(func=cmd_env)


def cmd_env(args: argparse.Namespace) -> int:
    proc = subprocess.run([sys.executable, "-m", "rlparity.cell.fingerprint"], capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode
