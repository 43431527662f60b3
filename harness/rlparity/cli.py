"""rlparity: run the bitwise matrix and gate on it; compare results; print the fingerprint; self-test.

What each check proves:
  rlparity run        device parity of the harness's matrix: every cell's outputs bitwise equal
                      (rollout vs training, batch invariance, run to run, the golden digests)
  rlparity selftest   negative controls: every deliberately wrong kernel is caught (the harness can fail)
  make selfcheck      rl_kernel's own device parity: CPU vs GPU bits (python -m rl_kernel.contract.selfcheck)
  make kernels-check  an assembly scan of the built kernels: no contracted FMA where the contract forbids it

Exit codes (README): 0 every required cell passed; 1 a bitwise mismatch; 2 a cell errored (or, with
--strict, a required cell of this host's targets could not run); 3 bad configuration; 4 an environment
problem (no Docker engine, an image or device missing, fewer cells ran than --min-ran).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

# The console script is installed with the package, the harness's dependencies with its extra: without them,
# say which extra to install (exit 4: this environment lacks it), not a traceback.
HARNESS_EXTRA = {"rich", "junitparser", "pytest", "tomli"}
try:
    from rlparity import commands, gate
    from rlparity.config import ConfigError, EnvError
    from rlparity.ui import console
except ModuleNotFoundError as exc:
    if (exc.name or "").split(".")[0] not in HARNESS_EXTRA:
        raise
    print(
        f"rlparity: {exc.name} is not installed: the harness needs the 'harness' extra: "
        "pip install 'rlparity[harness]' (and [docker] for the docker backend, [report] for rlparity report)",
        file=sys.stderr,
    )
    raise SystemExit(4) from exc

ORDER = ("run", "compare", "env", "selftest", "golden", "images", "report", "locate")  # the help lists them so


class _Parser(argparse.ArgumentParser):
    """Bad arguments are bad configuration: exit 3, not argparse's 2 (which means a cell errored)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(gate.CONFIG, f"{self.prog}: error: {message}\n")


def command_modules() -> list[ModuleType]:
    """Every module of rlparity.commands (each has register(sub)), in ORDER, then any new ones by name."""
    names = [m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")]
    names.sort(key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    return [importlib.import_module(f"rlparity.commands.{n}") for n in names]


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rlparity", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for module in command_modules():
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "jobs", 1) < 1:
        console.print("[red]error:[/] --jobs must be >= 1")
        return gate.CONFIG
    try:
        return args.func(args)
    except ConfigError as exc:
        console.print(f"[red]configuration error:[/] {exc}")
        return gate.CONFIG
    except EnvError as exc:
        console.print(f"[red]environment error:[/] {exc}")
        return gate.ENVIRONMENT
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: finished cells are saved; rerun with --resume")
        return gate.ERROR


if __name__ == "__main__":
    sys.exit(main())
