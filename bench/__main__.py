"""`python -m bench <benchmark> [args]`: run one benchmark of the package; `--list` names them all.

A benchmark is a module of bench/ with a top-level `def main(argv)`; it is found by reading the package's files
(their syntax trees: nothing is imported to list them), so adding one edits no list here.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

PACKAGE = Path(__file__).parent
USAGE = "usage: python -m bench --list | python -m bench <benchmark> [args] (<benchmark> --help for its options)"


def _describes_benchmark(path: Path) -> str | None:
    """The first line of the module's docstring when it defines main(), else None (a helper module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
        return None
    doc = ast.get_docstring(tree) or ""
    return doc.strip().splitlines()[0] if doc.strip() else "(no description)"


def benchmarks() -> dict[str, str]:
    """Every benchmark of the package, name -> its one-line description, in name order."""
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        described = _describes_benchmark(path)
        if described is not None:
            found[path.stem] = described
    return found


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    known = benchmarks()
    if not args or args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\nbenchmarks:")
        args = ["--list"]
    if args[0] == "--list":
        width = max(map(len, known))
        for name, description in known.items():
            print(f"  {name:{width}}  {description}")
        return 0
    name = args[0].replace("-", "_")
    if name not in known:
        print(f"python -m bench: no benchmark {args[0]!r} (benchmarks: {', '.join(known)})", file=sys.stderr)
        return 2
    return importlib.import_module(f"bench.{name}").main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
