"""The container files, read statically: the Dockerfiles (hadolint and their contents), the images
(harness/rlparity/data/images.toml) and compose.yaml (parsed here, and by docker-compose v1).

hadolint and docker-compose are things CI provides (.ci/run): with CI=true their absence is a failure,
elsewhere a skip that names what is missing. Nothing here needs a Docker engine (tests/repo/test_docker_engine.py
and tests/harness/test_docker_backend.py do).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import tomllib
import yaml

from rlparity.config import IMAGES_FILE, REPO
from rlparity.images import load_images

from tooling import find_tool, require

DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile*"))
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
    data = tomllib.loads(IMAGES_FILE.read_text())["images"]
    # the seed's generation on a real ROCm 6.0 tag (no ROCm 6.0 + PyTorch 2.2 image is published)
    seed = [n for n, e in data.items() if e["rocm"] == "6.0" and e["tag"].startswith("rocm6.0_")]
    current = [n for n, e in data.items() if e["flavour"] == "rocm" and re.match(r"^(6\.4|7\.)", e["rocm"])]
    assert seed and "gfx90a" in data[seed[0]]["targets"] and "not published" in data[seed[0]]["description"]
    assert current and any("gfx950" in data[n]["targets"] and data[n]["rocm"].startswith("7.") for n in current)
    for name, e in data.items():
        assert {"tag", "digest", "digest_source", "verified", "rocm", "torch", "python", "targets"} <= set(e), name
        assert e["digest"] == "" or re.fullmatch(r"sha256:[0-9a-f]{64}", e["digest"]), name
        assert imgs[name].reference.startswith(e["base"])


def _compose() -> dict:
    return yaml.safe_load((REPO / "compose.yaml").read_text())


def _default(value: str, var: str) -> str:
    m = re.search(rf"\$\{{{var}:?-([^}}]*)\}}", value)
    assert m, f"{var} has no default in {value!r}"
    return m.group(1)


def test_compose_defaults_follow_images_toml():
    services = _compose()["services"]
    data = tomllib.loads(IMAGES_FILE.read_text())["images"]
    rocm = data["rocm64-torch26"]
    args = services["test"]["build"]["args"]
    pinned = f"{rocm['base']}:{rocm['tag']}@{rocm['digest']}"
    assert _default(args["BASE_IMAGE"], "ROCM_BASE_IMAGE") == pinned
    assert _default(args["BASE_DIGEST"], "ROCM_BASE_DIGEST") == rocm["digest"]
    dockerfile_default = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / "docker/Dockerfile").read_text(), re.M)
    assert dockerfile_default and dockerfile_default.group(1) == pinned
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
    # host-aware: cpu + this host's GPUs (tests/harness/test_compose_command.py runs it on synthetic hosts)
    assert "--targets ${TARGETS:-auto}" in cmd and "--filter" not in cmd
    assert {"test", "test-cpu", "report"} <= set(s)
    assert s["report"]["command"][0] == "report"
    assert s["report"]["build"] == s["test-cpu"]["build"]  # `compose run report` can build rlparity:cpu


def test_docker_compose_v1_reads_compose_yaml():
    require("docker-compose", find_tool("docker-compose"))
    proc = subprocess.run(["docker-compose", "-f", str(REPO / "compose.yaml"), "config", "-q"], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
