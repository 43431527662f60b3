"""The container side: Dockerfiles (hadolint and static checks), images.toml, compose.yaml, and, with a
Docker engine, the CPU image built from this checkout running cells through the docker backend and
through `docker-compose run test-cpu`, with the same digests as the local backend.

A Docker engine, hadolint and docker-compose are things CI provides (.ci/run): with CI=true their absence
is a failure, elsewhere a skip that names what is missing. The ROCm image cannot be built here (no
registry, no AMD GPU): its Dockerfile is checked statically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from tooling import find_tool, require

from rlparity import images, results
from rlparity.config import REPO, ConfigError
from rlparity.docker_backend import LABEL, DockerBackend
from rlparity.matrix import load_images, load_matrix, select

DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile*"))
CPU_TAG = images.project_tag("cpu")
CELL_FILTER = "profile=baseline placement=single"


HADOLINT = find_tool("hadolint")


# ---- static: Dockerfiles, compose.yaml, images.toml ----------------------------------------------------
def test_hadolint_passes_every_dockerfile():
    require("hadolint", HADOLINT)
    assert len(DOCKERFILES) >= 2
    proc = subprocess.run([HADOLINT, *map(str, DOCKERFILES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    """The linter can fail: a Dockerfile with an unpinned base and `apt-get` without cleanup."""
    require("hadolint", HADOLINT)
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\n")
    assert subprocess.run([HADOLINT, str(bad)], capture_output=True).returncode != 0


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_rocm_dockerfile_builds_kernels_for_the_pinned_base_and_targets():
    """What cannot be built here is checked statically: base and targets are build args, the kernels are
    built at image build time for PYTORCH_ROCM_ARCH, torch is left alone, a build record is written, the
    user is not root, the entrypoint is rlparity."""
    ins = _instructions(REPO / "docker/Dockerfile")
    first_from = next(i for i, (w, _) in enumerate(ins) if w == "FROM")
    assert ("ARG", next(r for w, r in ins[:first_from] if w == "ARG")) and ins[first_from][1] == "${BASE_IMAGE}"
    args = {r.split("=")[0] for w, r in ins if w == "ARG"}
    assert {"BASE_IMAGE", "BASE_DIGEST", "GPU_TARGETS", "REVISION"} <= args
    env = " ".join(r for w, r in ins if w == "ENV")
    assert "PYTORCH_ROCM_ARCH=${GPU_TARGETS}" in env and "RL_KERNEL_BUILD=gpu" in env
    runs = " ".join(r for w, r in ins if w == "RUN")
    assert "docker/install.sh" in runs and "--groups video,render" in runs
    users = [r for w, r in ins if w == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert ("ENTRYPOINT", '["rlparity"]') in ins
    install = (REPO / "docker/install.sh").read_text()
    assert "requirements.txt" in install and "torch_before" in install and "/etc/rlparity/build.json" in install
    assert "--no-build-isolation --no-deps" in install


def test_no_requirement_file_used_in_images_installs_torch():
    for name in ("requirements.txt",):
        lines = [ln.split("#")[0].strip() for ln in (REPO / name).read_text().splitlines()]
        assert not [ln for ln in lines if re.match(r"^torch\b", ln)], f"{name} must not install torch"


def test_both_dockerfiles_accept_an_extra_ca():
    for path in DOCKERFILES:
        text = path.read_text()
        assert "COPY docker/ca/ /usr/local/share/ca-certificates/" in text and "update-ca-certificates" in text
        assert "PIP_CERT=/etc/ssl/certs/ca-certificates.crt" in text


def test_images_toml_pins_the_seed_and_a_current_rocm():
    imgs = load_images()
    data = tomllib.loads((REPO / "docker/images.toml").read_text())["images"]
    seed = [n for n, e in data.items() if e["rocm"].startswith("6.0") and e["torch"].startswith("2.2")]
    current = [n for n, e in data.items() if e["flavour"] == "rocm" and re.match(r"^(6\.4|7\.)", e["rocm"])]
    assert seed and "gfx90a" in data[seed[0]]["targets"]
    assert current
    for name, e in data.items():
        assert {"tag", "digest", "digest_source", "rocm", "torch", "python", "targets"} <= set(e), name
        assert e["digest"] == "" or re.fullmatch(r"sha256:[0-9a-f]{64}", e["digest"]), name
        assert imgs[name].reference.startswith(e["base"])


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


def _compose() -> dict:
    return yaml.safe_load((REPO / "compose.yaml").read_text())


def _default(value: str, var: str) -> str:
    m = re.search(rf"\$\{{{var}:?-([^}}]*)\}}", value)
    assert m, f"{var} has no default in {value!r}"
    return m.group(1)


def test_compose_defaults_follow_images_toml():
    services = _compose()["services"]
    data = tomllib.loads((REPO / "docker/images.toml").read_text())["images"]
    rocm = data["rocm64-torch26"]
    args = services["test"]["build"]["args"]
    assert _default(args["BASE_IMAGE"], "ROCM_BASE_IMAGE") == f"{rocm['base']}:{rocm['tag']}"
    assert _default(args["GPU_TARGETS"], "GPU_TARGETS") == ";".join(t for t in rocm["targets"] if t != "cpu")
    assert services["test"]["build"]["dockerfile"] == "docker/Dockerfile"
    assert services["test-cpu"]["build"]["dockerfile"] == "docker/Dockerfile.cpu"


def test_compose_test_service_is_set_up_for_rocm():
    s = _compose()["services"]
    test = s["test"]
    assert test["devices"] == ["/dev/kfd", "/dev/dri"]
    assert "video" in test["group_add"] and any("RENDER_GID" in str(g) for g in test["group_add"])
    assert test["security_opt"] == ["seccomp:unconfined"] and test["ipc"] == "host" and test["shm_size"]
    cmd = " ".join(test["command"])
    assert "--strict" in cmd and "${MATRIX:-quick}" in cmd and "/work/results" in " ".join(test["volumes"])
    assert {"test", "test-cpu", "report"} <= set(s)
    assert s["report"]["command"][0] == "report"


def test_docker_compose_v1_reads_compose_yaml():
    require("docker-compose", find_tool("docker-compose"))
    proc = subprocess.run(["docker-compose", "-f", str(REPO / "compose.yaml"), "config", "-q"], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()


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
