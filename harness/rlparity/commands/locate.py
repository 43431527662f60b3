"""`rlparity locate [ARGS...]`: where a model's rollout path (a prefill, then decode steps over the KV cache) and its
training path (one teacher-forced forward) first part. Every argument goes to `python -m rl_kernel.locate`
(rl_kernel/locate.py owns the options: `rlparity locate --help` prints its help), run as a subprocess because the
host never imports torch or rl_kernel; its output is passed through as it comes.

Exit codes, rl_kernel.locate's: 0 the two paths agree bit for bit, 1 they differ (the report names the module),
3 bad arguments, 2 it crashed (an exception rl_kernel.locate did not catch is a crash here, never 1)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from rlparity import gate
from rlparity.ui import console

# `python -m rl_kernel.locate`, except that an uncaught exception exits 2 (a crash), not Python's 1 ("differ").
RUN_LOCATE = (
    "import runpy, sys, traceback\n"
    "try:\n"
    "    runpy.run_module('rl_kernel.locate', run_name='__main__', alter_sys=True)\n"
    "except SystemExit:\n"
    "    raise\n"
    "except BaseException:\n"
    "    traceback.print_exc()\n"
    f"    sys.exit({gate.ERROR})\n"
)
VERDICTS = (gate.OK, gate.MISMATCH, gate.ERROR, gate.CONFIG)
# No option of its own: with no prefix character, argparse takes every argument (--help too) as one of ARGS.
NO_PREFIX = "\0"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "locate",
        help="name the first module where a model's rollout and training paths differ (rlparity locate --help)",
        add_help=False,
        prefix_chars=NO_PREFIX,
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="python -m rl_kernel.locate's arguments")
    p.set_defaults(func=cmd_locate)


def cmd_locate(args: argparse.Namespace) -> int:
    code = subprocess.run([sys.executable, "-c", RUN_LOCATE, *args.args]).returncode
    if code in VERDICTS:
        return code
    console.print(f"[red]rl_kernel.locate ended with exit {code}:[/] a crash")
    return gate.ERROR
