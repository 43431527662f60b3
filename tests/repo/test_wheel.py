"""The built wheel, installed in a fresh venv, runs the quick matrix from a directory that is not the checkout.

The wheel is built once per session (every xdist worker shares it, behind a file lock) from a copy of the
working tree, CPU only (RL_KERNEL_BUILD=cpu), so no earlier build's leftovers in build/ can hide a file the
package data forgot. One thing is reused: the compiled extension, when make build's in-place one is what compiling
the copy would give (setup.py's RL_KERNEL_PREBUILT: its build record equals the copy's but for the revision, the
same digest of the compiled sources, setup.py and build_flags.py, the same flags, torch and compiler, and it was
linked after that record was written); the wheel ships it instead of compiling it again (minutes on 2 cores).
RLPARITY_WHEEL_COMPILE=1, or any difference (setup.py's log says which), compiles it afresh.

The venv gets the pinned CPU torch (torch==2.13.0: the local wheel PIP_FIND_LINKS names; never a CUDA build),
then the wheel alone: rl_kernel imports and none of the harness's dependencies are installed; then the wheel's
`harness` extra, and `rlparity run --matrix quick` on the CPU baseline single-device fp32 cells, one per
workload (a subset: the other quick cells differ in dtype, env profile or placement, not in what the package
must ship) passes: the cells compare with the golden digests shipped in the wheel; and the fast tier's cells are
found and skipped for want of a GPU.

With CI=true a failure to build or install fails; elsewhere, where pip cannot reach an index, it skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from filelock import FileLock

from rlparity import config

from tooling import require

ROOT = config.REPO
TORCH = "torch==2.13.0"  # requirements-cpu.txt's pin
SUBSET = "target=cpu profile=baseline placement=single"
RUN = f"{SUBSET} dtype=fp32"  # the cells that run: one of each workload (quick, edges, model)
HARNESS_ONLY = ("rich", "junitparser", "docker", "matplotlib", "pytest", "transformers")

pytestmark = pytest.mark.slow(minutes=True)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "RL_KERNEL_BUILD": "cpu", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(cmd: list[str], cwd: Path, timeout: int = 600, extra: dict | None = None) -> subprocess.CompletedProcess[str]:
    env = {**_env(), **(extra or {})}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    return f"$ {' '.join(map(str, proc.args))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


# What pip says when it cannot reach an index (or the index lacks the release): outside CI, a skip.
UNREACHABLE = re.compile(r"No matching distribution|Could not find a version|NewConnectionError|ConnectTimeout|"
                         r"Temporary failure in name resolution|Network is unreachable|ProxyError")  # fmt: skip


def _pip(venv: Path, *args: str, what: str) -> None:
    """pip install into the venv: with CI=true any failure fails; elsewhere an unreachable index skips. No byte
    compiling (--no-compile): torch's thousands of modules took 18 of the 25 s of its install on 2 cores, and a
    module the run imports is compiled then anyway."""
    proc = _run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-compile", *args], cwd=venv)
    if proc.returncode != 0 and UNREACHABLE.search(proc.stdout + proc.stderr):
        require(what, False, _tail(proc))
    assert proc.returncode == 0, _tail(proc)


def _source_copy(dest: Path) -> Path:
    """The working tree's files (tracked, and untracked ones git does not ignore), without build/ or .so."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    # Under xdist every worker's basetemp is a folder of this session's one: the wheel goes there, once.
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "rlparity-wheel"
    shared.mkdir(exist_ok=True)
    with FileLock(str(shared) + ".lock"):
        done = sorted(shared.glob("dist/rlparity-*.whl"))
        if done:
            return done[0]
        src = _source_copy(shared / "src")
        revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "-w", "dist", str(src)]
        extra = {"RLPARITY_REVISION": revision.strip()}
        if os.environ.get("RLPARITY_WHEEL_COMPILE") != "1":  # setup.py ships it only if it is what it would compile
            extra["RL_KERNEL_PREBUILT"] = str(ROOT / f"kernels/rl_kernel/_C{sysconfig.get_config_var('EXT_SUFFIX')}")
        proc = _run(cmd, cwd=shared, timeout=1500, extra=extra)
        assert proc.returncode == 0, _tail(proc)  # building needs no network (no isolation, no deps)
        log = proc.stdout + proc.stderr
        (shared / "build.log").write_text(log)
        assert "project.license" not in log and "License classifiers" not in log, "setuptools warns on the license"
        return next(shared.glob("dist/rlparity-*.whl"))


@pytest.fixture(scope="session")
def core_venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the CPU torch and the wheel, no extras."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    proc = _run([sys.executable, "-m", "venv", str(venv)], cwd=venv.parent)
    assert proc.returncode == 0, _tail(proc)
    _pip(venv, TORCH, what=f"{TORCH} (the local CPU wheel) in a fresh venv")
    _pip(venv, str(wheel), what="the wheel's core dependencies (numpy)")
    return venv


def test_the_wheel_ships_the_data_and_its_core_needs_no_harness(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = Parser().parsestr(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
    for data in ("data/matrices/quick.toml", "data/matrices/axes.toml", "data/images.toml", "data/golden/exact.json",
                 "cell/suite/pytest.ini", "cell/suite/test_bitwise.py"):  # fmt: skip
        assert f"rlparity/{data}" in names, f"{data} is not in the wheel"
    for tier_data in ("exact/softmax/golden.json", "exact/common/numerics.h", "fast/decoder/golden/sm_90.json",
                      "fast/configs.toml", "_build.json"):  # fmt: skip
        assert f"rl_kernel/{tier_data}" in names, f"{tier_data} is not in the wheel"
    assert any(n.startswith("rl_kernel/_C") and n.endswith(".so") for n in names)
    assert meta["License-Expression"] == "Apache-2.0"
    requires = meta.get_all("Requires-Dist")
    core = sorted(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r)
    assert core == ["numpy", "torch"], requires
    assert {"harness", "docker", "report", "all", "dev"} <= set(meta.get_all("Provides-Extra"))


# Handed out after the minutes-long tests (tests/conftest.py's order), by when the other wheel test has built the
# wheel: scheduled next to it, this one's worker sat idle behind the build's lock for over a minute.
@pytest.mark.slow
def test_the_wheel_runs_the_quick_matrix_from_another_directory(wheel, core_venv, tmp_path):
    venv, py, cwd = core_venv, str(core_venv / "bin/python"), tmp_path / "elsewhere"
    cwd.mkdir()
    # The core alone: rl_kernel computes, none of the harness's dependencies came with it, and the console
    # script names the extra it needs.
    probe = "import importlib.util as u, torch, rl_kernel\nfrom rl_kernel import inputs\n"
    probe += "print(sorted(rl_kernel.tiers.tiers()))\n"
    probe += f"print(sorted(m for m in {HARNESS_ONLY!r} if u.find_spec(m)))\nprint(rl_kernel.__file__)"
    proc = _run([py, "-c", probe], cwd=cwd)
    assert proc.returncode == 0, _tail(proc)
    _tier, harness_deps, where = proc.stdout.splitlines()[:3]
    assert harness_deps == "[]", f"the core installed harness dependencies: {harness_deps}"
    assert Path(where).is_relative_to(venv), f"rl_kernel imported from {where}, not the venv"
    proc = _run([str(venv / "bin/rlparity"), "run"], cwd=cwd)
    assert proc.returncode == 4 and "rlparity[harness]" in proc.stderr, _tail(proc)

    # The harness extra, then the quick matrix's CPU baseline cells from a directory that is not the checkout.
    _pip(venv, f"{wheel}[harness]", what="the harness extra's dependencies (rich, junitparser, pytest)")
    out = tmp_path / "out"
    cmd = [str(venv / "bin/rlparity"), "run", "--matrix", "quick", "--filter", RUN, "--out", str(out)]
    proc = _run(cmd, cwd=cwd)
    assert proc.returncode == 0, _tail(proc)
    found = [json.loads(p.read_text()) for p in sorted(out.rglob("result.json"))]
    assert sorted(r["cell"]["shapes"] for r in found) == ["edges", "model", "quick"], _tail(proc)
    # The wheel carries the fast tier too: its cpu cells are found and skipped for want of a GPU.
    skip = tmp_path / "fast"
    cmd = [str(venv / "bin/rlparity"), "run", "--matrix", "quick", "--filter", f"{SUBSET} tier=fast"]
    cmd += ["--out", str(skip), "--min-ran", "0"]
    proc = _run(cmd, cwd=cwd)
    assert proc.returncode == 0, _tail(proc)
    fast = [json.loads(p.read_text()) for p in sorted(skip.rglob("result.json"))]
    assert len(fast) == 3 and all(r["status"] == "skipped" and r["reason"].startswith("no GPU") for r in fast)
    for res in found:
        assert res["status"] == "passed", res.get("reason")
        golden = [c for c in res["comparisons"] if " golden " in c["name"]]
        assert golden and all(c["equal"] for c in golden), "the shipped golden digests were not compared"
        assert res["fingerprint"]["rl_kernel"]["build"], "the wheel's build record (_build.json) is missing"
