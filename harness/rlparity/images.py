"""harness/rlparity/data/images.toml: the pinned base images (package data: a matrix's image axis names its
entries). `rlparity images list|lock|build`.

lock resolves each tag to its registry digest through the docker SDK (where a registry is reachable) and
writes digest + digest_source back into the file, keeping its comments and layout. build makes the
project image `rlparity:<name>` from an entry (docker/Dockerfile for rocm, docker/Dockerfile.cpu for cpu).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from rlparity.config import IMAGES_FILE, REPO, ConfigError, TomlFile, checkout

DOCKERFILES = {"rocm": "docker/Dockerfile", "cpu": "docker/Dockerfile.cpu"}


@dataclass(frozen=True)
class Image:
    name: str
    flavour: str
    targets: tuple[str, ...]
    reference: str  # base:tag or base@sha256:...
    digest: str


def load_images(path: Path = IMAGES_FILE) -> dict[str, Image]:
    if not path.exists():
        return {}
    f = TomlFile.load(path)
    f.check_keys(f.data, {"images"}, "")
    allowed = {"flavour", "base", "tag", "digest", "digest_source", "rocm", "torch", "python", "targets"}
    images = {}
    for name, e in f.data.get("images", {}).items():
        table = f"images.{name}"
        f.check_keys(e, allowed | {"description"}, table)
        base, tag, digest = f.require(e, "base", str, table), f.require(e, "tag", str, table), e.get("digest", "")
        if digest and not digest.startswith("sha256:"):
            raise f.error("must look like sha256:<64 hex digits>", table, "digest")
        ref = f"{base}@{digest}" if digest else f"{base}:{tag}"
        images[name] = Image(name, f.require(e, "flavour", str, table), tuple(e.get("targets", ())), ref, digest)
    return images


def project_tag(name: str) -> str:
    """The tag of the image built from entry `name` (what the docker backend and compose.yaml run)."""
    return f"rlparity:{name}"


def require_pinned(images: list[Image]) -> None:
    """--strict: every image must be pinned by digest."""
    loose = [i.name for i in images if not i.digest]
    if loose:
        raise ConfigError(
            f"--strict: image(s) {', '.join(loose)} are not pinned by digest in {IMAGES_FILE} "
            "(run `rlparity images lock` where the registry is reachable)"
        )


@dataclass(frozen=True)
class LockOutcome:
    name: str
    reference: str
    digest: str
    error: str


def resolve(client, reference: str) -> str:
    """The registry's manifest digest for a tag (docker SDK: the distribution endpoint, no pull)."""
    return client.images.get_registry_data(reference).id


def lock(client, path: Path = IMAGES_FILE, names: list[str] | None = None) -> list[LockOutcome]:
    """Resolve tags to digests and write them into the file; unreachable registries are reported, not fatal."""
    f = TomlFile.load(path)
    entries = f.data.get("images", {})
    unknown = [n for n in names or [] if n not in entries]
    if unknown:
        raise ConfigError(f"unknown image(s) {', '.join(unknown)}", path)
    text = f.text
    outcomes = []
    for name, e in entries.items():
        if names and name not in names:
            continue
        if e.get("flavour") == "cpu" and str(e.get("base", "")).startswith("rlparity/"):
            outcomes.append(LockOutcome(name, e["base"], "", "built locally: no registry digest exists"))
            continue
        ref = f"{e['base']}:{e['tag']}"
        try:
            digest = resolve(client, ref)
        except Exception as exc:  # registry unreachable, tag unknown, auth: reported per image
            outcomes.append(LockOutcome(name, ref, "", f"{type(exc).__name__}: {exc}"))
            continue
        source = f"{ref} resolved by `rlparity images lock` (docker SDK get_registry_data) on {date.today()}"
        text = set_field(text, name, "digest", digest)
        text = set_field(text, name, "digest_source", source)
        outcomes.append(LockOutcome(name, ref, digest, ""))
    if text != f.text:
        path.write_text(text)
    return outcomes


def set_field(text: str, image: str, key: str, value: str) -> str:
    """Replace `key = "..."` inside [images.<image>] (the rest of the file untouched)."""
    lines = text.splitlines(keepends=True)
    inside = False
    for i, line in enumerate(lines):
        head = re.match(r"^\s*\[([^\]]+)\]", line)
        if head:
            inside = head.group(1).strip() == f"images.{image}"
            continue
        if inside and re.match(rf"^\s*{re.escape(key)}\s*=", line):
            lines[i] = f'{key} = "{value}"\n'
            return "".join(lines)
    raise ConfigError(f"[images.{image}] has no {key} line to update", IMAGES_FILE)


def build_args(image: Image, entry: dict, revision: str) -> dict[str, str]:
    args = {
        "BASE_IMAGE": image.reference,
        "BASE_DIGEST": image.digest,
        "IMAGE_NAME": image.name,
        "REVISION": revision,
    }
    if image.flavour == "rocm":
        args["GPU_TARGETS"] = ";".join(t for t in entry.get("targets", ()) if t.startswith("gfx"))
    return args


def revision() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def build(client, name: str, extra_args: dict[str, str] | None = None, path: Path = IMAGES_FILE) -> str:
    """Build rlparity:<name> from its entry with the docker SDK; returns the image id."""
    root = checkout()
    if root is None:  # an installed wheel carries neither the Dockerfiles nor the build context
        raise ConfigError("building an image needs a checkout of rlparity (docker/Dockerfile*, the build context)")
    images = load_images(path)
    if name not in images:
        raise ConfigError(f"unknown image {name!r} (known: {', '.join(images)})", path)
    image = images[name]
    entry = TomlFile.load(path).data["images"][name]
    args = {**build_args(image, entry, revision()), **(extra_args or {})}
    built, _logs = client.images.build(
        path=str(root), dockerfile=DOCKERFILES[image.flavour], buildargs=args, tag=project_tag(name), rm=True
    )
    return built.id
