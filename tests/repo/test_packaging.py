"""The package's layout, read without building it: rl_kernel needs none of the harness's dependencies, the
harness's data (matrices, images, golden digests) is package data found through importlib.resources, the
extras name what each part needs, and the images install all of it. tests/repo/test_wheel.py builds and
installs the wheel itself."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest
import tomllib

from rl_kernel import build_flags
from rlparity import config, images, matrix
from rlparity.config import ConfigError, EnvError, import_extra

ROOT = config.REPO
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HARNESS_ONLY = ("rich", "junitparser", "docker", "matplotlib", "pytest", "tomli")

# A subprocess in which the harness's dependencies cannot be imported (as in a venv with only the core).
BLOCKER = textwrap.dedent(
    f"""
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {HARNESS_ONLY!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Block())
    """
)


def _blocked(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_rl_kernel_and_every_module_of_it_import_without_the_harness_dependencies():
    proc = _blocked(
        """
        import importlib, pkgutil
        import rl_kernel
        # the Hugging Face modules are the hf extra's (transformers imports what the blocker blocks)
        hf_extra = {"rl_kernel.integrations.transformers", "rl_kernel.integrations.paged"}
        names = [m.name for m in pkgutil.walk_packages(rl_kernel.__path__, "rl_kernel.") if m.name not in hf_extra]
        for name in names:
            importlib.import_module(name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in {"rlparity", "rich", "pytest", "matplotlib"})
        assert not leaked, leaked
        print(len(names), "modules")
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[0]) >= 10


def test_the_blocker_blocks():
    """The check above can fail: the harness itself does not import under the same blocker."""
    proc = _blocked("import rlparity.ui")
    assert proc.returncode != 0 and "blocked" in proc.stderr


def test_the_console_script_without_the_harness_extra_names_it():
    proc = _blocked("import sys; sys.argv = ['rlparity', 'run']; from rlparity.cli import main; sys.exit(main())")
    assert proc.returncode == 4, proc.stderr[-3000:]  # the environment lacks it (gate.ENVIRONMENT)
    assert "pip install 'rlparity[harness]'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("module", "extra"), [("docker", "docker"), ("matplotlib", "report")])
def test_an_extra_that_is_not_installed_is_named(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import of it fails as if not installed
    with pytest.raises(EnvError, match=re.escape(f"pip install 'rlparity[{extra}]'")):
        import_extra(module, extra)


def test_the_core_depends_on_torch_and_numpy_only_and_the_extras_name_the_rest():
    project = PYPROJECT["project"]
    assert sorted(_name(r) for r in project["dependencies"]) == ["numpy", "torch"]
    extras = project["optional-dependencies"]
    assert {"harness", "docker", "report", "all", "dev"} <= set(extras)
    assert {_name(r) for r in extras["harness"]} == {"rich", "junitparser", "pytest", "tomli", "transformers"}
    assert extras["hf"] == [r for r in extras["harness"] if _name(r) == "transformers"]  # one range
    assert "docker" in {_name(r) for r in extras["docker"]} and "rlparity[harness]" in extras["docker"]
    assert "matplotlib" in {_name(r) for r in extras["report"]} and "rlparity[harness]" in extras["report"]


def test_the_images_install_every_extra_the_harness_needs():
    """docker/install.sh installs requirements.txt (never torch): it must hold the core and the harness,
    docker and report extras, and the setuptools the SPDX license needs."""
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    listed = {_name(ln) for ln in lines if ln and not ln.startswith("-")}
    project = PYPROJECT["project"]
    wanted = [
        *project["dependencies"],
        *(r for e in ("harness", "docker", "report") for r in project["optional-dependencies"][e]),
    ]
    assert {_name(r) for r in wanted if not r.startswith("rlparity")} - {"torch"} <= listed
    assert "setuptools>=77" in lines and "setuptools>=77" in PYPROJECT["build-system"]["requires"]


def test_the_license_is_an_spdx_expression():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"


def test_every_data_file_is_package_data():
    """Each file under rlparity/data/ (and the suite's pytest.ini) matches a package-data pattern, so the
    wheel carries it (the wheel test proves the run; this names the file when one is missed)."""
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]
    data = [p.relative_to(config.DATA_DIR.parent).as_posix() for p in config.DATA_DIR.rglob("*") if p.is_file()]
    assert data
    missed = [f for f in data if not any(fnmatch.fnmatch(f, g) for g in globs["rlparity"])]
    assert not missed, f"add to [tool.setuptools.package-data] rlparity: {missed}"
    assert "pytest.ini" in globs["rlparity.cell.suite"]


def test_the_data_is_read_through_the_package_not_the_checkout():
    assert config.DATA_DIR == (ROOT / "harness" / "rlparity" / "data")  # an editable install: the same files
    assert matrix.resolve_matrix_path("quick") == config.MATRICES_DIR / "quick.toml"
    assert matrix.resolve_matrix_path(str(config.MATRICES_DIR / "quick.toml")).exists()  # a path still works
    assert not (ROOT / "harness" / "matrices").exists() and not (ROOT / "harness" / "golden").exists()


def test_building_an_image_outside_a_checkout_says_it_needs_one(monkeypatch, tmp_path):
    """An installed wheel has no Dockerfiles or build context: `rlparity images build` says so."""
    assert config.checkout() == ROOT
    monkeypatch.setattr(config, "REPO", tmp_path / "site-packages")
    assert config.checkout() is None
    with pytest.raises(ConfigError, match="needs a checkout"):
        images.build(client=None, name="cpu")


def test_a_prebuilt_extension_is_shipped_only_when_it_is_what_the_build_would_compile(tmp_path):
    """setup.py's RL_KERNEL_PREBUILT (the wheel test passes make build's extension): build_flags.prebuilt_differs
    accepts a library whose build record equals the build's but for the revision, linked after that record;
    anything else that differs (the compiled sources' digest, a flag, torch), an older library, a missing
    record or a library for another Python is compiled afresh, and the reason names it."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    record = {"torch": "2.13.0+cpu", "cuda": None, "cxx_flags": ["-O3"], "revision": "a", "sources": "d1"}
    library, written = tmp_path / f"_C{suffix}", tmp_path / "_build.json"
    assert "no library or build record" in build_flags.prebuilt_differs(library, record)
    written.write_text(json.dumps(record))
    library.write_bytes(b"")
    os.utime(written, (1000, 1000))
    assert build_flags.prebuilt_differs(library, record) is None
    assert build_flags.prebuilt_differs(library, {**record, "revision": "b"}) is None
    assert build_flags.prebuilt_differs(library, {**record, "sources": "d2"}) == "its build record differs in sources"
    assert "cuda, cxx_flags" in build_flags.prebuilt_differs(library, {**record, "cuda": "12.8", "cxx_flags": []})
    assert "differs in hip" in build_flags.prebuilt_differs(library, {**record, "hip": "6.4"})  # a key it lacks
    os.utime(library, (500, 500))
    assert "older than its build record" in build_flags.prebuilt_differs(library, record)
    other = tmp_path / "_C.cpython-312-x86_64-linux-gnu.so"
    other.write_bytes(b"")
    assert "not named for this Python" in build_flags.prebuilt_differs(other, record)


def test_the_digest_covers_every_contract_file_setup_py_and_the_flags(tmp_path):
    """build_flags.contract_digest (the build record's "sources") changes with any contract file's bytes or
    name, setup.py or build_flags.py, and with nothing else: a copy of those files gives the checkout's digest."""
    package = ROOT / "kernels/rl_kernel"
    files = [*build_flags.contract_files(), package / "build_flags.py", ROOT / "setup.py"]
    assert any(p.suffix == ".h" for p in files) and any(p.suffix == ".cpp" for p in files)
    for p in files:
        (tmp_path / p.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, tmp_path / p.relative_to(ROOT))

    def digest() -> str:
        return runpy.run_path(str(tmp_path / "kernels/rl_kernel/build_flags.py"))["contract_digest"]()

    first = digest()
    assert first == build_flags.contract_digest() and re.fullmatch(r"[0-9a-f]{64}", first)
    (tmp_path / "kernels/rl_kernel/exact/notes.txt").write_text("not compiled")
    assert digest() == first
    for changed in (files[0], package / "build_flags.py", ROOT / "setup.py"):
        copy = tmp_path / changed.relative_to(ROOT)
        copy.write_bytes(copy.read_bytes() + b"\n")
        assert digest() != first, changed
        copy.write_bytes(changed.read_bytes())
        assert digest() == first
    first_file = tmp_path / files[0].relative_to(ROOT)  # renamed, still the first: only its name differs
    first_file.rename(first_file.with_name("0" + first_file.name))
    assert digest() != first
