"""The docker backend: one container per cell, from the project image `rlparity:<image>`.

DockerBackend is the policy: which images must exist (and, with --strict, be pinned), the cell's env
(base.cell_env, the same as the local backend's), which devices a container gets, and how a container's
end becomes a result (base.judge). CellContainer holds every docker SDK call for one cell: create with
the cell file put in through the API, start, wait (a timeout kills it), logs, the out dir copied back
through the API (no bind mount or host path), and removal. A lost container or a daemon error is an
ERROR for that cell only; containers are always removed.
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
from rlparity.backends.base import VISIBILITY, Backend, Running, cell_command, cell_env, judge, prepare_cell_dir
from rlparity.cells import HOST_BUILT_CONTROLS, Cell
from rlparity.config import ConfigError, EnvError, import_extra
from rlparity.images import Image, load_images, project_tag, require_pinned
from rlparity.inventory import Inventory

CELL_DIR = "/tmp/rlparity-cell"  # inside the container: writable by the image's non-root user
ROCM_DEVICES = ("/dev/kfd", "/dev/dri")
LABEL = "org.rlparity.cell"  # on every cell container: `docker ps -a --filter label=org.rlparity.cell`
OUT_LABEL = "org.rlparity.out"  # the host dir the cell's results go to: which run a container belongs to
# Controls whose env names a file built on the host: it does not exist inside the image.


def rocm_host() -> bool:
    return os.path.exists("/dev/kfd")


def container_exit(status: int, oom: bool) -> int:
    """Docker's exit status as a process return code: 128+N means killed by signal N."""
    if oom:
        return -9
    return -(status - 128) if status > 128 else status


def inherited_visibility(environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """The GPUs this job was handed (the cell's device indices map through them, as on the local backend)."""
    return {var: environ[var] for var in VISIBILITY.values() if var in environ}


class CellContainer:
    """Every docker SDK call the backend makes: one cell's container (the instance), and the engine-wide
    calls before any cell (the static methods: connect, image_built, run_once, nvidia, gpu_request)."""

    @staticmethod
    def connect(client=None):
        """(the SDK module, a pinged client)."""
        docker = import_extra("docker", "docker")
        client = client or docker.from_env()
        client.ping()
        return docker, client

    @staticmethod
    def image_built(sdk, client, tag: str) -> bool:
        try:
            client.images.get(tag)
        except sdk.errors.ImageNotFound:
            return False
        return True

    @staticmethod
    def run_once(client, tag: str, entrypoint: list[str], options: dict, settle_s: float = 5.0) -> bytes:
        """A throwaway container's stdout (the inventory probe, which always prints). The engine can answer
        `wait` before the json-file log holds the output (containers.run(remove=True) returned b'' two
        times in four on Debian's Docker 20.10 here), so the log is read again until it is there or settle_s passes."""
        box = client.containers.create(tag, entrypoint=entrypoint, **options)
        try:
            box.start()
            code = box.wait().get("StatusCode", -1)
            deadline = time.monotonic() + settle_s
            out = box.logs(stdout=True, stderr=False)
            while not out and time.monotonic() < deadline:
                time.sleep(0.05)
                out = box.logs(stdout=True, stderr=False)
            if code != 0:
                err = box.logs(stdout=False, stderr=True).decode(errors="replace")
                raise RuntimeError(f"exit {code}: {err[-2000:]}")
            return out
        finally:
            box.remove(force=True)

    @staticmethod
    def nvidia(client) -> bool:
        try:
            return "nvidia" in (client.info().get("Runtimes") or {})
        except Exception:
            return False

    @staticmethod
    def gpu_request(sdk):
        """Every GPU of the host (the cell env's visibility variable picks the cell's)."""
        return sdk.types.DeviceRequest(count=-1, capabilities=[["gpu"]])

    def __init__(self, sdk, client, image: str, entrypoint: list[str], env: dict[str, str], labels: dict,
                 options: dict):  # fmt: skip
        self._sdk = sdk
        self.container = client.containers.create(
            image,
            entrypoint=entrypoint,
            environment=env,
            labels=labels,
            init=True,  # an init as PID 1: signals behave as on the host, zombies are reaped
            **options,
        )

    def start(self, cell: Cell) -> None:
        self.container.put_archive("/tmp", _tar_cell(cell))
        self.container.start()

    def wait(self, timeout_s: float) -> tuple[int | None, bool]:
        """(return code, OOM-killed); None when the cell ran past its timeout and was killed."""
        try:
            status = self.container.wait(timeout=timeout_s)
        except Exception as exc:  # requests' ReadTimeout / ConnectionError: the cell ran past its timeout
            if "timed out" not in str(exc).lower() and "timeout" not in type(exc).__name__.lower():
                raise
            self.container.kill()
            return None, False
        self.container.reload()
        oom = bool(self.container.attrs.get("State", {}).get("OOMKilled"))
        return container_exit(int(status.get("StatusCode", 0)), oom), oom

    def logs(self) -> bytes:
        return self.container.logs(stdout=True, stderr=True)

    def copy_out(self, out: Path) -> None:
        """The cell's out dir from the container into `out` (a missing dir means the cell wrote nothing)."""
        try:
            stream, _ = self.container.get_archive(f"{CELL_DIR}/out")
        except self._sdk.errors.NotFound:
            return
        _untar_out(b"".join(stream), out)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.container.kill()

    def remove(self) -> None:
        with contextlib.suppress(Exception):  # already gone
            self.container.remove(force=True)


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, client=None, images: dict[str, Image] | None = None, render_gid: str | None = None) -> None:
        try:
            self._docker, self.client = CellContainer.connect(client)
        except EnvError:  # the docker SDK is not installed: the message names the extra
            raise
        except Exception as exc:
            host = os.environ.get("DOCKER_HOST", "")
            raise EnvError(f"no Docker engine reachable (DOCKER_HOST={host!r}): {exc}") from exc
        self.images = images if images is not None else load_images()
        self.render_gid = render_gid or os.environ.get("RENDER_GID", "")
        self._running: Running[CellContainer] = Running(CellContainer.kill)
        self._probe_image: str | None = None

    # ---- before any cell ----------------------------------------------------------------------------
    def prepare(self, cells: list[Cell], strict: bool) -> None:
        """Every image a cell needs must be built (rlparity:<name>), or pulled (a prebuilt entry's base@digest);
        with --strict, pinned by digest."""
        names = sorted({c.image for c in cells})
        if strict:
            require_pinned([self.images[n] for n in names if n in self.images])
        missing = [n for n in names if not self._built(n)]
        if missing:
            raise EnvError(
                f"image(s) not built: {', '.join(self._reference(n) for n in missing)} "
                f"(build with `rlparity images build NAME` or `docker compose build`; pull a prebuilt one)"
            )
        # Probe in a GPU image when there is one: the cpu image's torch sees no GPU, and --targets auto would
        # then select only the cpu cells on a GPU host.
        gpu = [n for n in names if n in self.images and self.images[n].flavour != "cpu"]
        self._probe_image = (gpu or names or [None])[0]

    def control_env(self, control: str, gpu: bool = False) -> dict[str, str]:
        """A control's library would be built on the host, and its host path means nothing in the image."""
        if control in HOST_BUILT_CONTROLS:
            raise ConfigError(
                f"control {control!r} loads a library built on the host, which a container cannot see: "
                "run it with --backend local"
            )
        return {}

    def probe(self) -> Inventory:
        """Run the inventory inside the (first) image, with the host's GPUs passed in."""
        name = self._probe_image
        if name is None:
            return Inventory(error="no image to probe (prepare() was not called)")
        platform = "rocm" if rocm_host() else "cuda" if CellContainer.nvidia(self.client) else "cpu"
        try:
            entrypoint = ["python", "-m", "rlparity.cell.inventory"]
            out = CellContainer.run_once(self.client, self._reference(name), entrypoint, self._gpu_options(platform))
            return Inventory.from_dict(json.loads(out))
        except Exception as exc:
            return Inventory(error=f"inventory in {self._reference(name)} failed: {exc}")

    # ---- one cell -----------------------------------------------------------------------------------
    def run_cell(
        self, cell: Cell, devices: list[int], out: Path, control: str = "none", extra_env: dict[str, str] | None = None
    ) -> results.CellResult:
        prepare_cell_dir(cell, out)
        started, t0 = results.now(), time.monotonic()
        box = None
        try:
            env = self.env(cell, devices, control, extra_env)
            box = CellContainer(
                self._docker, self.client, self._reference(cell.image), self.entrypoint(), env,
                {LABEL: cell.id, OUT_LABEL: str(out.resolve())}, self._gpu_options(cell.platform),
            )  # fmt: skip
            box.start(cell)
            self._running.add(box)  # after start: a box that cancel() kills before it starts would start anyway
            rc, oom = box.wait(cell.timeout_s)
            (out / results.LOG_FILE).write_bytes(box.logs())
            box.copy_out(out)
        except Exception as exc:  # the daemon failed or the container vanished: this cell errors
            wall = round(time.monotonic() - t0, 3)
            return results.errored(cell, f"container lost: {type(exc).__name__}: {exc}", "", started, wall)
        finally:
            if box is not None:
                self._running.discard(box)
                box.remove()
        res = judge(cell, out, rc, round(time.monotonic() - t0, 3), started, cell.timeout_s)
        if oom:
            res.reason = "out of memory: the container was OOM-killed"
        return res

    def entrypoint(self) -> list[str]:
        """What a cell's container runs (tests substitute misbehaving commands here)."""
        return cell_command("python", f"{CELL_DIR}/cell.json", f"{CELL_DIR}/out")

    def env(self, cell: Cell, devices: list[int], control: str = "none", extra: dict[str, str] | None = None):
        """base.cell_env (as the local backend) from the inherited visibility only (the image has its own
        env), plus the image's digest for the fingerprint."""
        env = cell_env(cell, devices, inherited_visibility(), control, extra)
        image = self.images.get(cell.image)
        if image is not None:
            env["RLPARITY_IMAGE_DIGEST"] = image.digest or image.reference
        return env

    def cancel(self) -> None:
        """Kill every running cell's container (the run was interrupted), and any cell started after."""
        self._running.cancel()

    def _reference(self, name: str) -> str:
        """The image a cell of entry `name` runs: rlparity:<name>, or a prebuilt entry's pinned reference."""
        image = self.images.get(name)
        return image.run_reference if image is not None else project_tag(name)

    def _built(self, name: str) -> bool:
        return CellContainer.image_built(self._docker, self.client, self._reference(name))

    def _gpu_options(self, platform: str) -> dict:
        """Every GPU of the host goes in; the cell env's visibility variable picks the cell's (as on the host)."""
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
            return {"device_requests": [CellContainer.gpu_request(self._docker)], "ipc_mode": "host", "shm_size": "8g"}
        return {"shm_size": "2g"}  # the split placement's gloo ranks use shared memory


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


def _untar_out(data: bytes, out: Path) -> None:
    """The files of a tar of the container's out/ dir into `out` (nothing outside it)."""
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
