"""What every backend shares (rlparity.backends.base): the cell env, visible devices, judge, the output tail."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlparity import results
from rlparity.backends import base
from rlparity.config import ConfigError
from rlparity.matrix import load_matrix
from rlparity.results import CellResult

from harness.factories import (
    make_cell,
    make_result,
    write_log,
)

# ---- cell env, visible devices, judge ------------------------------------------------------------------
CALLER = {
    "PATH": "/usr/local/bin:/usr/bin",
    "HOME": "/root",
    "HSA_ENABLE_SDMA": "0",
    "OMP_NUM_THREADS": "7",
    "MIOPEN_FIND_MODE": "FAST",
    "PYTORCH_TUNABLEOP_ENABLED": "1",
    "ROCBLAS_LAYER": "2",
    "RL_KERNEL_BUILD": "cpu",
    "ROCM_PATH": "/opt/rocm",
    "HIP_VISIBLE_DEVICES": "2,3",
    "CUDA_VISIBLE_DEVICES": "4,5,6",
}


def test_cell_env_baseline_drops_numerics_vars():
    env = base.cell_env(make_cell("gfx942"), [1], CALLER)
    for var in ("HSA_ENABLE_SDMA", "OMP_NUM_THREADS", "MIOPEN_FIND_MODE", "PYTORCH_TUNABLEOP_ENABLED", "ROCBLAS_LAYER"):
        assert var not in env, var
    assert "RL_KERNEL_BUILD" not in env
    assert env["PATH"] == CALLER["PATH"] and env["HOME"] == "/root" and env["ROCM_PATH"] == "/opt/rocm"
    assert env["HIP_VISIBLE_DEVICES"] == "3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["RLPARITY_CONTROL"] == "none" and env["PYTHONUNBUFFERED"] == "1"


def test_cell_env_applies_the_profile():
    sdma = make_cell("gfx942", "sdma-off", env={"HSA_ENABLE_SDMA": "0"})
    env = base.cell_env(sdma, [0], {**CALLER, "HSA_ENABLE_SDMA": "1"})
    assert env["HSA_ENABLE_SDMA"] == "0"
    assert "MIOPEN_FIND_MODE" not in env and "OMP_NUM_THREADS" not in env
    threads = make_cell("cpu", "threads-1", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    env = base.cell_env(threads, [], CALLER, control="no-fixed-order", extra={"RL_KERNEL_LIBRARY": "/x.so"})
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("1", "1")
    assert env["RL_KERNEL_LIBRARY"] == "/x.so" and env["RLPARITY_CONTROL"] == "no-fixed-order"
    assert "HSA_ENABLE_SDMA" not in env


def test_cell_env_matches_the_profile_env_from_the_matrix():
    quick = {c.id: c for c in load_matrix("quick").cells}
    cell = quick["local/gfx1100/gfx-override/single/fp32/quick/exact"]
    env = base.cell_env(cell, [0], {"PATH": "/bin", "HSA_OVERRIDE_GFX_VERSION": "9.4.2"})
    assert env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    baseline = quick["local/gfx1100/baseline/single/fp32/quick/exact"]
    assert "HSA_OVERRIDE_GFX_VERSION" not in base.cell_env(baseline, [0], {"HSA_OVERRIDE_GFX_VERSION": "9.4.2"})


def test_cell_env_cuda_visibility():
    env = base.cell_env(make_cell("sm90"), [2, 0], CALLER)
    assert env["CUDA_VISIBLE_DEVICES"] == "6,4"
    env = base.cell_env(make_cell("sm90"), [1], {"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_visible_devices():
    assert base.visible_devices("2,3", [1]) == "3"
    assert base.visible_devices(" 2, 3 ,", [0, 1]) == "2,3"
    assert base.visible_devices(None, [0, 3]) == "0,3"
    assert base.visible_devices("", [1]) == "1"
    with pytest.raises(ValueError, match="device index 2"):
        base.visible_devices("2,3", [2])
    with pytest.raises(ValueError):
        base.cell_env(make_cell("gfx942"), [5], CALLER)


def test_judge_no_result_file(tmp_path):
    write_log(tmp_path)
    res = base.judge(make_cell(), tmp_path, 0, 3.0, "t0", 240.0)
    assert res.status == "error"
    assert "result.json" in res.reason and "exited with code 0" in res.reason
    assert "Traceback: boom" in res.output_tail


def test_judge_keeps_wall_time_when_result_is_missing(tmp_path):
    write_log(tmp_path)
    assert base.judge(make_cell(), tmp_path, 0, 3.0, "t0", 240.0).timings["wall_s"] == 3.0
    results.write(make_result(make_cell(), "passed"), tmp_path)
    assert base.judge(make_cell(), tmp_path, 1, 3.0, "t0", 240.0).timings["wall_s"] == 3.0


def test_judge_timeout(tmp_path):
    write_log(tmp_path, "still running\n")
    res = base.judge(make_cell(), tmp_path, None, 240.2, "t0", 240.0)
    assert res.status == "error"
    assert "timed out after 240 s" in res.reason
    assert res.output_tail == "still running\n"
    assert res.timings["wall_s"] == 240.2


def test_judge_signal(tmp_path):
    write_log(tmp_path)
    results.write(make_result(make_cell()), tmp_path)
    res = base.judge(make_cell(), tmp_path, -11, 1.0, "t0", 240.0)
    assert res.status == "error"
    assert "SIGSEGV" in res.reason and "after writing its results" in res.reason


def test_judge_unexpected_exit_code(tmp_path):
    write_log(tmp_path)
    res = base.judge(make_cell(), tmp_path, 139, 1.0, "t0", 240.0)
    assert res.status == "error" and "exited with code 139" in res.reason


def test_judge_status_disagrees_with_rc(tmp_path):
    write_log(tmp_path)
    results.write(make_result(make_cell(), "passed"), tmp_path)
    res = base.judge(make_cell(), tmp_path, 1, 1.0, "t0", 240.0)
    assert res.status == "error"
    assert "exited with code 1" in res.reason and "passed" in res.reason


def test_judge_accepts_a_consistent_result(tmp_path):
    write_log(tmp_path, "log text")
    results.write(make_result(make_cell(), "failed", reason="bitwise mismatch in x"), tmp_path)
    res = base.judge(make_cell(), tmp_path, 1, 1.0, "t0", 240.0)
    assert (res.status, res.reason) == ("failed", "bitwise mismatch in x")
    results.write(make_result(make_cell(), "error", reason="suite crashed"), tmp_path)
    res = base.judge(make_cell(), tmp_path, 2, 1.0, "t0", 240.0)
    assert (res.status, res.output_tail) == ("error", "log text")  # the log fills an empty tail


def test_judge_unreadable_result(tmp_path):
    write_log(tmp_path)
    (tmp_path / results.RESULT_FILE).write_text("{not json")
    res = base.judge(make_cell(), tmp_path, 0, 1.0, "t0", 240.0)
    assert res.status == "error" and "unreadable result.json" in res.reason


def test_tail_keeps_the_end(tmp_path):
    write_log(tmp_path, "a" * 100 + "END")
    assert base.tail(tmp_path / results.LOG_FILE, 10) == "a" * 7 + "END"
    assert base.tail(tmp_path / "missing.log") == ""


# ---- one cell env, one command line, one exit map for every backend ------------------------------
class _FakeDockerClient:
    """Enough of docker.DockerClient for DockerBackend's constructor and env (no engine needed)."""

    def ping(self) -> bool:
        return True


@pytest.mark.parametrize(("target", "devices"), [("cpu", []), ("sm90", [1]), ("gfx942", [0, 1]), ("gfx90a", [1])])
def test_local_and_docker_backends_give_a_cell_the_same_env(monkeypatch, target, devices):
    """The docker backend builds the env with base.cell_env from the inherited visibility only; the
    local backend from the whole caller env. On the variables that reach the cell they agree."""
    from rlparity.backends.docker import DockerBackend

    visibility = {"CUDA_VISIBLE_DEVICES": "4,5,6", "HIP_VISIBLE_DEVICES": "2,3"}
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        monkeypatch.setenv(var, visibility[var])
    cell = make_cell(target, "sdma-off", env={"HSA_ENABLE_SDMA": "0"})
    docker_env = DockerBackend(client=_FakeDockerClient(), images={}).env(cell, devices, "ulp-flip", {"X": "1"})
    local_env = base.cell_env(cell, devices, visibility, "ulp-flip", {"X": "1"})
    assert docker_env == local_env
    assert docker_env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and docker_env["RLPARITY_CONTROL"] == "ulp-flip"


def test_docker_env_adds_only_the_image_digest(monkeypatch):
    from rlparity.backends.docker import DockerBackend
    from rlparity.images import Image

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    image = Image("cpu", "cpu", ("cpu",), "debian@sha256:" + "a" * 64, "sha256:" + "a" * 64)
    cell = make_cell("cpu", image="cpu")
    env = DockerBackend(client=_FakeDockerClient(), images={"cpu": image}).env(cell, [])
    assert env.pop("RLPARITY_IMAGE_DIGEST") == "sha256:" + "a" * 64
    assert env == base.cell_env(cell, [], {})


def test_every_backend_runs_the_one_cell_command_line(tmp_path):
    from rlparity.backends.docker import CELL_DIR, DockerBackend
    from rlparity.backends.local import LocalBackend

    local = LocalBackend(python="/py").command(tmp_path / "cell.json", tmp_path / "out")
    assert local == base.cell_command("/py", str(tmp_path / "cell.json"), str(tmp_path / "out"))
    assert local[1:3] == ["-m", "rlparity.cell.cellrun"]
    docker = DockerBackend(client=_FakeDockerClient(), images={}).entrypoint()
    assert docker == base.cell_command("python", f"{CELL_DIR}/cell.json", f"{CELL_DIR}/out")


def test_the_exit_map_is_the_cells_and_the_judges():
    from rlparity.cell import cellrun

    assert cellrun.EXIT_CODES is base.EXIT_CODES
    assert set(base.EXIT_CODES) == set(results.STATUSES)


def test_backends_prepare_and_cancel_are_no_ops_where_nothing_is_needed():
    from rlparity.backends.local import LocalBackend

    backend = LocalBackend()
    assert backend.prepare([make_cell()], strict=True) is None
    backend.cancel()


def test_the_docker_backend_refuses_a_host_built_control():
    """fma-build's library is built on the host: its path means nothing inside the image."""
    from rlparity.backends.docker import DockerBackend

    backend = DockerBackend(client=_FakeDockerClient(), images={})
    with pytest.raises(ConfigError, match="--backend local"):
        backend.control_env("fma-build")
    assert backend.control_env("ulp-flip") == {} and backend.control_env("none") == {}


# ---- the docker backend's flow against a fake engine (the real one: test_docker_backend.py) -------
class _FakeContainer:
    def __init__(self, engine: _FakeEngine, image: str, **kw) -> None:
        self.engine, self.image, self.kw = engine, image, kw
        self.attrs = {"State": {"OOMKilled": False}}
        self.calls: list[str] = []

    def put_archive(self, path: str, data: bytes) -> None:
        self.calls.append(f"put_archive {path}")

    def start(self) -> None:
        self.calls.append("start")

    def wait(self, timeout: float) -> dict:
        self.calls.append("wait")
        return {"StatusCode": self.engine.status}

    def reload(self) -> None:
        pass

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return b"cell output\n"

    def get_archive(self, path: str):
        return iter([self.engine.archive]), {}

    def kill(self) -> None:
        self.calls.append("kill")

    def remove(self, force: bool) -> None:
        self.calls.append("remove")


class _FakeEngine(_FakeDockerClient):
    """containers.create hands out _FakeContainers that exit with `status` and hold `archive` as out/."""

    def __init__(self, status: int, archive: bytes) -> None:
        self.status, self.archive, self.created = status, archive, []
        self.containers = self

    def create(self, image: str, **kw) -> _FakeContainer:
        self.created.append(_FakeContainer(self, image, **kw))
        return self.created[-1]


def _out_archive(res: CellResult, tmp: Path) -> bytes:
    """A tar of the container's out/ dir holding res as result.json (what get_archive streams)."""
    import io
    import tarfile

    results.write(res, tmp / "out")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(tmp / "out" / results.RESULT_FILE, arcname="out/result.json")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("status", "rc", "expect"), [("passed", 0, "passed"), ("failed", 1, "failed"), ("passed", 139, "error")]
)
def test_docker_backend_runs_a_cell_through_one_container(tmp_path, monkeypatch, status, rc, expect):
    from rlparity.backends.docker import LABEL, OUT_LABEL, DockerBackend

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cell = make_cell("cpu", image="cpu")
    engine = _FakeEngine(rc, _out_archive(make_result(cell, status), tmp_path / "made"))
    res = DockerBackend(client=engine, images={}).run_cell(cell, [], tmp_path / "cell", "ulp-flip")
    assert res.status == expect, res.reason
    if expect == "error":
        assert "SIGSEGV" in res.reason and "cell output" in res.output_tail
    (box,) = engine.created
    assert box.image == "rlparity:cpu" and box.kw["init"] is True
    assert box.kw["labels"] == {LABEL: cell.id, OUT_LABEL: str((tmp_path / "cell").resolve())}
    assert box.kw["environment"] == base.cell_env(cell, [], {}, "ulp-flip")
    assert box.kw["entrypoint"][:3] == ["python", "-m", "rlparity.cell.cellrun"]
    assert box.calls == ["put_archive /tmp", "start", "wait", "remove"]
    assert (tmp_path / "cell" / results.LOG_FILE).read_bytes() == b"cell output\n"
