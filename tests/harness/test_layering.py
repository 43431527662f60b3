"""The layering, as import-linter contracts (pyproject.toml, [tool.importlinter]): the host never imports the cell
side, rl_kernel or torch (one contract, "host"); the cell imports only the plain-data host modules; rl_kernel never
imports the harness; rl_kernel, rlparity and rlparity.cell each in layers (no upward import, so no circle). The
contracts hold, they cover every module, and they can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

from harness.factories import ROOT

PACKAGE = ROOT / "harness" / "rlparity"
HOST = "the host never imports the cell side, rl_kernel or torch (they run in a cell)"
# The host modules a cell may import: plain data and pure logic (no processes, no containers, no console).
PLAIN_HOST = {
    "rlparity.cells", "rlparity.results", "rlparity.config", "rlparity.applicability", "rlparity.golden",
    "rlparity.inventory", "rlparity.fingerprint",
}  # fmt: skip


def lint_imports(cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the config in cwd/pyproject.toml (through this interpreter, without a cache)."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def contracts(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, dict]:
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def host_modules() -> set[str]:
    """Every module and subpackage of rlparity outside rlparity.cell."""
    names = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "cell"}
    return {f"rlparity.{n}" for n in names}


def test_the_contracts_hold():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"{len(contracts())} kept, 0 broken" in proc.stdout  # every contract of pyproject.toml ran and held


def test_every_host_module_is_under_the_host_contract():
    """A new host module must be added to the contract, or the rule would not reach it."""
    host = contracts()["host"]
    assert host["name"] == HOST and host["forbidden_modules"] == ["rlparity.cell", "rl_kernel", "torch"]
    listed = set(host["source_modules"])
    assert host_modules() - listed == set(), "add these to pyproject.toml's import-linter contract 'host'"
    assert listed - host_modules() == set(), "these are listed but do not exist"


def test_the_cell_may_import_only_the_plain_host_modules():
    """Every host module is either plain (the cell may import it) or forbidden to the cell."""
    forbidden = set(contracts()["cell-plain-host"]["forbidden_modules"])
    assert forbidden | PLAIN_HOST == host_modules() and not forbidden & PLAIN_HOST


def copy_packages(tmp_path: Path) -> Path:
    """rlparity and rl_kernel (without builds) and pyproject.toml in tmp_path; returns the packages' folder."""
    pkgs = tmp_path / "pkgs"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "csrc")
    shutil.copytree(PACKAGE, pkgs / "rlparity", ignore=ignore)
    shutil.copytree(ROOT / "kernels" / "rl_kernel", pkgs / "rl_kernel", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return pkgs


def test_a_cell_import_of_a_process_side_host_module_breaks_the_contract(tmp_path):
    """In a copy, cellrun.py imports rlparity.runner (processes): lint-imports fails and names the import."""
    pkgs = copy_packages(tmp_path)
    cellrun = pkgs / "rlparity" / "cell" / "cellrun.py"
    cellrun.write_text(cellrun.read_text() + "\nfrom rlparity import runner  # noqa: E402,F401\n")
    proc = lint_imports(tmp_path, pythonpath=str(pkgs))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "the cell imports only the plain-data host modules" in out and "BROKEN" in out, out[-4000:]
    assert "rlparity.cell.cellrun -> rlparity.runner" in out, out[-4000:]


def test_a_host_import_of_the_cell_side_breaks_the_contract(tmp_path):
    """In a copy of the packages, gate.py imports rlparity.cell: lint-imports fails, names the contract and the import,
    and the chains on through controls to torch and rl_kernel."""
    pkgs = copy_packages(tmp_path)
    gate = pkgs / "rlparity" / "gate.py"
    gate.write_text(gate.read_text() + "\nfrom rlparity.cell import controls  # noqa: E402,F401\n")
    proc = lint_imports(tmp_path, pythonpath=str(pkgs))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert f"{HOST} BROKEN" in out, out[-4000:]
    assert "rlparity.gate -> rlparity.cell.controls" in out, out[-4000:]
    assert "rlparity.gate is not allowed to import rl_kernel" in out, out[-4000:]
    assert "rlparity.gate is not allowed to import torch" in out, out[-4000:]


def layered(contract: str) -> set[str]:
    return {m.strip() for layer in contracts()[contract]["layers"] for m in layer.split(":")}


def children(package: str, folder: Path, skip: set[str] = frozenset()) -> set[str]:
    """The modules and subpackages directly under a package's folder."""
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    return {f"{package}.{n}" for n in names - skip}


def test_every_module_is_in_its_packages_layers():
    """A new module must take a layer, or an upward import from it would pass unseen."""
    kernels = ROOT / "kernels" / "rl_kernel"
    assert layered("kernel-layers") == children("rl_kernel", kernels)
    assert layered("harness-layers") == children("rlparity", PACKAGE, {"data"})
    assert layered("cell-layers") == children("rlparity.cell", PACKAGE / "cell")
    assert layered("aten-layers") == children("rl_kernel.aten", kernels / "aten")
    assert {f"rl_kernel.head.{m}" for m in layered("head-layers")} == children("rl_kernel.head", kernels / "head")


def test_an_upward_import_breaks_the_layers(tmp_path):
    """In a copy, the ground of each package imports a module above it: each layers contract fails, by name."""
    pkgs = copy_packages(tmp_path)
    for path, line in ((pkgs / "rl_kernel" / "inputs.py", "import rl_kernel.head"),
                       (pkgs / "rl_kernel" / "aten" / "tree.py", "from rl_kernel.aten import ops"),
                       (pkgs / "rl_kernel" / "head" / "rowtree.py", "from rl_kernel.head import loss"),
                       (pkgs / "rlparity" / "cell" / "episodes.py", "from rlparity.cell import workloads"),
                       (pkgs / "rlparity" / "config.py", "from rlparity import gate")):  # fmt: skip
        path.write_text(path.read_text() + f"\n{line}  # noqa: E402,F401\n")
    proc = lint_imports(tmp_path, pythonpath=str(pkgs))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out[-4000:]
    for contract in ("kernel-layers", "aten-layers", "head-layers", "harness-layers", "cell-layers"):
        assert f"{contracts()[contract]['name']} BROKEN" in out, (contract, out[-4000:])
