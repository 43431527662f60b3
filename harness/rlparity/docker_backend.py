"""The docker backend: one container per cell (docker SDK), from the project image `rlparity:<image>`.

The cell's env is set on the container, so it is in place before python (and the GPU runtime) starts;
ROCm cells get /dev/kfd and /dev/dri with the video/render groups and HIP_VISIBLE_DEVICES, CUDA cells a
device request. The cell file goes in and the results come out through the API (put_archive /
get_archive), so no bind mount or host path is needed. Timeouts kill the container; a lost container or a
daemon error is an ERROR for that cell only; containers are always removed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
import time
from pathlib import Path

from rlparity import results
from rlparity.backend import judge, prepare_cell_dir
from rlparity.config import ConfigError
from rlparity.images import project_tag, require_pinned
from rlparity.inventory import Inventory
from rlparity.matrix import Cell, Image, load_images

CELL_DIR = "/tmp/rlparity-cell"  # inside the container: writable by the image's non-root user
ROCM_DEVICES = ("/dev/kfd", "/dev/dri")
LABEL = "org.rlparity.cell"  # on every cell container: `docker ps -a --filter label=org.rlparity.cell`


def rocm_host() -> bool:
    return os.path.exists("/dev/kfd")


def container_exit(status: int, oom: bool) -> int:
    """Docker's exit status as a process return code: 128+N means killed by signal N."""
    if oom:
        return -9
    return -(status - 128) if status > 128 else status


class DockerBackend:
    name = "docker"

    def __init__(self, client=None, images: dict[str, Image] | None = None, render_gid: str | None = None) -> None:
        try:
            import docker
        except ImportError as exc:  # pragma: no cover - docker is a dependency
            raise ConfigError(f"the docker backend needs the docker SDK: {exc}") from exc
        self._docker = docker
        try:
            self.client = client or docker.from_env()
            self.client.ping()
        except Exception as exc:
            host = os.environ.get("DOCKER_HOST", "")
            raise ConfigError(f"no Docker engine reachable (DOCKER_HOST={host!r}): {exc}") from exc
        self.images = images if images is not None else load_images()
        self.render_gid = render_gid or os.environ.get("RENDER_GID", "")
        self._running: set = set()

    # ---- before any cell ----------------------------------------------------------------------------
    def prepare(self, cells: list[Cell], strict: bool) -> None:
        """Every image a cell needs must be built (rlparity:<name>); with --strict, pinned by digest."""
        names = sorted({c.image for c in cells})
        if strict:
            require_pinned([self.images[n] for n in names if n in self.images])
        missing = []
        for n in names:
            try:
                self.client.images.get(project_tag(n))
            except self._docker.errors.ImageNotFound:
                missing.append(n)
        if missing:
            raise ConfigError(
                f"image(s) not built: {', '.join(project_tag(n) for n in missing)} "
                f"(build with `rlparity images build NAME` or `docker compose build`)"
            )
        self._probe_image = names[0] if names else None

    def probe(self) -> Inventory:
        """Run the inventory inside the (first) image, with the host's GPUs passed in."""
        name = getattr(self, "_probe_image", None)
        if name is None:
            return Inventory(error="no image to probe (prepare() was not called)")
        try:
            out = self.client.containers.run(
                project_tag(name),
                entrypoint=["python", "-m", "rlparity.inventory"],
                remove=True,
                stdout=True,
                stderr=False,
                **self._gpu_options("rocm" if rocm_host() else "cuda" if self._nvidia() else "cpu", []),
            )
            return Inventory.from_dict(json.loads(out))
        except Exception as exc:
            return Inventory(error=f"inventory in {project_tag(name)} failed: {exc}")

    # ---- one cell -----------------------------------------------------------------------------------
    def run_cell(
        self, cell: Cell, devices: list[int], out: Path, variant: str = "none", extra_env: dict[str, str] | None = None
    ) -> results.CellResult:
        prepare_cell_dir(cell, out)
        started, t0 = results.now(), time.monotonic()
        container = None
        try:
            container = self.client.containers.create(
                project_tag(cell.image),
                entrypoint=self.entrypoint(),
                environment=self._env(cell, devices, variant, extra_env),
                labels={LABEL: cell.id},
                init=True,  # an init as PID 1: signals behave as on the host, zombies are reaped
                **self._gpu_options(cell.platform, devices),
            )
            self._running.add(container)
            container.put_archive("/tmp", _tar_cell(cell))
            container.start()
            rc, oom = self._wait(container, cell.timeout_s)
            (out / results.LOG_FILE).write_bytes(container.logs(stdout=True, stderr=True))
            self._copy_out(container, out)
        except Exception as exc:  # the daemon failed or the container vanished: this cell errors
            wall = round(time.monotonic() - t0, 3)
            return results.errored(cell, f"container lost: {type(exc).__name__}: {exc}", "", started, wall)
        finally:
            if container is not None:
                self._running.discard(container)
                with contextlib.suppress(Exception):  # already gone
                    container.remove(force=True)
        res = judge(cell, out, rc, round(time.monotonic() - t0, 3), started, cell.timeout_s)
        if oom:
            res.reason = "out of memory: the container was OOM-killed"
        return res

    def entrypoint(self) -> list[str]:
        """What a cell's container runs (tests substitute misbehaving commands here)."""
        return ["python", "-m", "rlparity.cellrun", f"{CELL_DIR}/cell.json", f"{CELL_DIR}/out"]

    def cancel(self) -> None:
        for c in list(self._running):
            with contextlib.suppress(Exception):
                c.kill()

    def _wait(self, container, timeout_s: float) -> tuple[int | None, bool]:
        """(return code, OOM-killed); None when the cell ran past its timeout and was killed."""
        try:
            status = container.wait(timeout=timeout_s)
        except Exception as exc:  # requests' ReadTimeout / ConnectionError: the cell ran past its timeout
            if "timed out" not in str(exc).lower() and "timeout" not in type(exc).__name__.lower():
                raise
            container.kill()
            return None, False
        container.reload()
        oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
        return container_exit(int(status.get("StatusCode", 0)), oom), oom

    def _copy_out(self, container, out: Path) -> None:
        """The cell's out dir from the container into `out` (a missing dir means the cell wrote nothing)."""
        try:
            stream, _ = container.get_archive(f"{CELL_DIR}/out")
        except self._docker.errors.NotFound:
            return
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                if not member.isfile():
                    continue
                rel = Path(member.name).relative_to("out") if member.name.startswith("out/") else Path(member.name)
                if rel.is_absolute() or ".." in rel.parts:
                    continue
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                extracted = tar.extractfile(member)
                if extracted is not None:
                    target.write_bytes(extracted.read())

    def _env(self, cell: Cell, devices: list[int], variant: str, extra: dict[str, str] | None) -> dict[str, str]:
        env = {**cell.env, **(extra or {}), "RLPARITY_VARIANT": variant, "PYTHONUNBUFFERED": "1"}
        image = self.images.get(cell.image)
        if image is not None:
            env["RLPARITY_IMAGE_DIGEST"] = image.digest or image.reference
        if cell.platform == "rocm":
            env["HIP_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        if cell.platform == "cuda":
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env

    def _gpu_options(self, platform: str, devices: list[int]) -> dict:
        if platform == "rocm":
            groups = ["video"] + ([self.render_gid] if self.render_gid else [])
            return {
                "devices": [f"{d}:{d}:rwm" for d in ROCM_DEVICES],
                "group_add": groups,
                "security_opt": ["seccomp=unconfined"],
                "ipc_mode": "host",
                "shm_size": "8g",
            }
        if platform == "cuda":
            ids = [str(d) for d in devices] or None
            request = self._docker.types.DeviceRequest(
                device_ids=ids, count=None if ids else -1, capabilities=[["gpu"]]
            )
            return {"device_requests": [request], "ipc_mode": "host", "shm_size": "8g"}
        return {"shm_size": "2g"}  # the split placement's gloo ranks use shared memory

    def _nvidia(self) -> bool:
        try:
            return "nvidia" in (self.client.info().get("Runtimes") or {})
        except Exception:
            return False


def _tar_cell(cell: Cell) -> bytes:
    """A tar holding rlparity-cell/cell.json, world-readable (the container user is not root)."""
    payload = json.dumps(cell.to_dict(), indent=1).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo("rlparity-cell")
        d.type, d.mode = tarfile.DIRTYPE, 0o777
        tar.addfile(d)
        f = tarfile.TarInfo("rlparity-cell/cell.json")
        f.size, f.mode = len(payload), 0o644
        tar.addfile(f, io.BytesIO(payload))
    return buf.getvalue()
