"""The container side with a Docker engine: the CPU image built from this checkout running cells through the
docker backend and through `docker-compose run test-cpu`, with the same digests as the local backend; and
images.toml through rlparity.images (the digest lock, --strict).

A Docker engine and docker-compose are things CI provides (.ci/run): with CI=true their absence is a
failure, elsewhere a skip that names what is missing. The Dockerfiles, images.toml and compose.yaml are
checked statically in tests/repo/test_dockerfiles.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from tooling import find_tool, require

from rlparity import images, results
from rlparity.config import REPO, ConfigError
from rlparity.docker_backend import LABEL, DockerBackend
from rlparity.matrix import load_images, load_matrix, select

CPU_TAG = images.project_tag("cpu")
CELL_FILTER = "profile=baseline placement=single"


# ---- images.toml through rlparity.images --------------------------------------------------------------
def test_strict_refuses_an_image_without_a_digest():
    unpinned = [i for i in load_images().values() if not i.digest]
    assert unpinned  # none can be resolved here (no registry)
    with pytest.raises(ConfigError, match="not pinned by digest"):
        images.require_pinned(unpinned)
    pinned = [images.Image("x", "rocm", ("gfx942",), "rocm/pytorch@sha256:" + "a" * 64, "sha256:" + "a" * 64)]
    images.require_pinned(pinned)


class _FakeRegistry:
    """docker SDK stand-in: resolves one tag, refuses the rest."""

    def __init__(self, known: dict[str, str]) -> None:
        self.known = known
        self.images = self

    def get_registry_data(self, ref: str):
        if ref not in self.known:
            raise ConnectionError(f"registry unreachable for {ref}")
        return type("RegistryData", (), {"id": self.known[ref]})()


def test_images_lock_writes_digests_and_their_source_keeping_comments(tmp_path):
    path = tmp_path / "images.toml"
    shutil.copy(REPO / "docker/images.toml", path)
    before = path.read_text()
    ref = "rocm/pytorch:rocm6.4.1_ubuntu22.04_py3.10_pytorch_release_2.6.0"
    digest = "sha256:" + "b" * 64
    outcomes = images.lock(_FakeRegistry({ref: digest}), path)
    by_name = {o.name: o for o in outcomes}
    assert by_name["rocm64-torch26"].digest == digest
    assert "unreachable" in by_name["rocm60-torch22"].error and not by_name["rocm60-torch22"].digest
    assert "built locally" in by_name["cpu"].error
    after = path.read_text()
    assert after.count("\n") == before.count("\n") and after.splitlines()[0] == before.splitlines()[0]
    pinned = load_images(path)["rocm64-torch26"]
    assert pinned.digest == digest and pinned.reference == f"rocm/pytorch@{digest}"
    assert "get_registry_data" in tomllib.loads(after)["images"]["rocm64-torch26"]["digest_source"]


# ---- with a Docker engine ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def client():
    try:
        import docker

        c = docker.from_env()
        c.ping()
    except Exception as exc:
        require("a Docker engine", False, f"none reachable: {exc}")
    return c


@pytest.fixture(scope="session")
def cpu_image(client):
    """rlparity:cpu built from this checkout (by .ci/run, or here once, under a lock for xdist workers)."""
    with open("/tmp/rlparity-cpu-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return client.images.get(CPU_TAG)
        except Exception:
            pass
        extra = {"TORCH_INDEX_URL": os.environ.get("TORCH_INDEX_URL", "")}
        images.build(client, "cpu", extra)
        return client.images.get(CPU_TAG)


def _in_image(client, *cmd: str) -> str:
    return client.containers.run(CPU_TAG, entrypoint=list(cmd), remove=True).decode()


def test_cpu_image_carries_its_build_record_and_runs_as_non_root(client, cpu_image):
    record = json.loads(_in_image(client, "cat", "/etc/rlparity/build.json"))
    assert record["image"] == "cpu" and record["torch"].startswith("2.13.0")
    assert record["rl_kernel_build"] == "cpu"
    assert "-ffp-contract=off" in record["kernel"]["cxx_flags"]
    assert _in_image(client, "id", "-u").strip() != "0"
    assert cpu_image.attrs["Config"]["Entrypoint"] == ["rlparity"]


def _run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlparity.cli", "run", *args], capture_output=True, text=True, cwd=cwd, timeout=900
    )


def _digests(out: Path) -> dict[str, dict[str, str]]:
    """Each cell's digests, keyed by the cell id without its image (local and docker cells line up)."""
    return {r.cell.id.split("/", 1)[1]: r.digests for r in results.read_all(out) if r.status == "passed"}


def test_quick_matrix_in_containers_gives_the_local_backends_digests(client, cpu_image, tmp_path):
    """Every cell of the quick matrix that the cpu image carries (both env profiles, single and split),
    one container each, against the same cells on the local backend: the same digests."""
    docker_out, local_out = tmp_path / "docker", tmp_path / "local"
    d = _run_cli("--backend", "docker", "--matrix", "quick", "--filter", "image=cpu", "--out", str(docker_out),
                 "--jobs", "2")  # fmt: skip
    assert d.returncode == 0, d.stdout[-3000:] + d.stderr[-3000:]
    loc = _run_cli("--matrix", "quick", "--filter", "target=cpu", "--out", str(local_out), "--jobs", "2")
    assert loc.returncode == 0, loc.stdout[-3000:]
    in_docker, local = _digests(docker_out), _digests(local_out)
    # 2 profiles x 2 placements x fp32/bf16 (quick's fp16 include names the rocm image, which has the cpu
    # target too but is not built here)
    assert len(in_docker) == 8 and set(in_docker) <= set(local), (sorted(in_docker), sorted(local))
    assert all(in_docker[k] and in_docker[k] == local[k] for k in in_docker), (in_docker, local)
    fp = results.read_all(docker_out)[0].fingerprint
    assert fp["image"]["name"] == "cpu" and fp["image"]["record"]["torch"].startswith("2.13.0")
    left = client.containers.list(all=True, filters={"label": LABEL})
    assert not left, f"containers left behind: {[c.name for c in left]}"


class _Misbehaving(DockerBackend):
    def __init__(self, command: list[str]) -> None:
        super().__init__()
        self.command = command

    def entrypoint(self) -> list[str]:
        return self.command


@pytest.mark.parametrize(
    ("command", "timeout", "reason"),
    [
        (["sleep", "60"], 3.0, "timed out after 3 s"),
        (["python", "-c", "import ctypes; print('about to crash', flush=True); ctypes.string_at(0)"], 60.0, "SIGSEGV"),
        (["python", "-c", "print('bye')"], 60.0, "without writing result.json"),
    ],
    ids=["hang", "segfault", "silent"],
)  # fmt: skip
def test_docker_backend_turns_a_misbehaving_container_into_an_error(client, cpu_image, tmp_path, command, timeout,
                                                                    reason):  # fmt: skip
    cell = next(iter(select(load_matrix("quick", backend="docker").cells, f"image=cpu {CELL_FILTER} dtype=fp32")))
    cell = dataclasses.replace(cell, timeout_s=timeout)
    backend = _Misbehaving(command)
    res = backend.run_cell(cell, [], tmp_path / "cell")
    assert res.status == "error" and reason in res.reason, res.reason
    if "crash" in " ".join(command):
        assert "about to crash" in res.output_tail
    left = client.containers.list(all=True, filters={"label": f"{LABEL}={cell.id}"})
    assert not left


def test_docker_compose_runs_test_cpu(client, cpu_image, tmp_path):
    require("docker-compose", find_tool("docker-compose"))
    out = tmp_path / "results"
    out.mkdir()
    env = {**os.environ, "RESULTS_DIR": str(out), "RLPARITY_UID": str(os.getuid()), "RLPARITY_GID": str(os.getgid())}
    proc = subprocess.run(
        ["docker-compose", "-f", str(REPO / "compose.yaml"), "run", "--rm", "test-cpu",
         "run", "--matrix", "quick", "--filter", f"target=cpu {CELL_FILTER} dtype=bf16", "--out", "/work/results"],
        capture_output=True, text=True, env=env, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "junit.xml").exists() and json.loads((out / "summary.json").read_text())["exit_code"] == 0
    with contextlib.suppress(Exception):
        subprocess.run(["docker-compose", "-f", str(REPO / "compose.yaml"), "down"], capture_output=True, cwd=REPO)


def test_docker_compose_report_service_renders_a_results_dir(client, cpu_image, tmp_path):
    require("docker-compose", find_tool("docker-compose"))
    res_dir, rep_dir = tmp_path / "results", tmp_path / "report"
    rep_dir.mkdir()
    cell = next(iter(select(load_matrix("quick").cells, f"target=cpu {CELL_FILTER} dtype=fp32")))
    res = results.CellResult(cell, "failed", "bitwise mismatch in planted", digests={"x/logprobs": "ab" * 32})
    results.write(res, results.cell_dir(res_dir, cell))
    env = {**os.environ, "RESULTS_DIR": str(res_dir), "REPORT_DIR": str(rep_dir),
           "RLPARITY_UID": str(os.getuid()), "RLPARITY_GID": str(os.getgid())}  # fmt: skip
    proc = subprocess.run(
        ["docker-compose", "-f", str(REPO / "compose.yaml"), "run", "--rm", "report"],
        capture_output=True, text=True, env=env, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert cell.id in (rep_dir / "report.md").read_text()
    assert "data:image/png;base64" in (rep_dir / "report.html").read_text()
