"""harness/rlparity/data/images.toml (or $RLPARITY_IMAGES): the pinned base images. `rlparity images
list|lock|check|build`.

- lock resolves each tag to its registry digest through the docker SDK and writes digest, digest_source and
  verified back into the file, keeping its comments and layout. It writes all or nothing: a registry that
  is down or answers garbage, or a tag that moved away from its pinned digest, leaves the file untouched.
- check says, per entry, what is pinned, from where, verified or not, and whether the built image's
  labels (docker/Dockerfile*: org.rlparity.base-digest) say it was built from that digest.
- build makes the project image `rlparity:<name>` (docker/Dockerfile for rocm, docker/Dockerfile.cpu for cpu).

An entry with `prebuilt = true` is itself an rlparity image pushed to a registry (built once, pulled by
digest on each runner): the docker backend runs `base@digest` instead of building rlparity:<name>.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from rlparity.config import IMAGES_FILE, REPO, ConfigError, EnvError, TomlFile, checkout

DOCKERFILES = {"rocm": "docker/Dockerfile", "cpu": "docker/Dockerfile.cpu"}
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
VERIFIED_SUFFIX = re.compile(r"; verified by `rlparity images lock` on [0-9-]+$")
KEYS = {"flavour", "base", "tag", "digest", "digest_source", "verified", "prebuilt", "rocm", "torch", "python",
        "targets", "description"}  # fmt: skip
# The labels docker/Dockerfile and docker/Dockerfile.cpu put on the project image.
LABEL_BASE_IMAGE, LABEL_BASE_DIGEST = "org.rlparity.base-image", "org.rlparity.base-digest"


@dataclass(frozen=True)
class Image:
    name: str
    flavour: str
    targets: tuple[str, ...]
    reference: str  # base:tag or base@sha256:...
    digest: str
    tag_reference: str = ""  # base:tag, what lock resolves
    source: str = ""
    verified: bool = False
    prebuilt: bool = False

    @property
    def run_reference(self) -> str:
        """What a container of this entry starts from: the pulled image itself, or the project image."""
        return self.reference if self.prebuilt else project_tag(self.name)


def load_images(path: Path = IMAGES_FILE) -> dict[str, Image]:
    if not path.exists():
        return {}
    f = TomlFile.load(path)
    f.check_keys(f.data, {"images"}, "")
    return {name: _entry(f, name, e) for name, e in f.data.get("images", {}).items()}


def _entry(f: TomlFile, name: str, e: dict) -> Image:
    table = f"images.{name}"
    f.check_keys(e, KEYS, table)
    base, tag = f.require(e, "base", str, table), f.require(e, "tag", str, table)
    digest = f.typed(e, "digest", str, table) if "digest" in e else ""
    if digest and not DIGEST.fullmatch(digest):
        raise f.error("must look like sha256:<64 hex digits>", table, "digest")
    flags = {k: f.typed(e, k, bool, table) if k in e else False for k in ("verified", "prebuilt")}
    if flags["verified"] and not digest:
        raise f.error("verified = true needs a digest", table, "verified")
    return Image(
        name,
        f.require(e, "flavour", str, table),
        tuple(e.get("targets", ())),
        f"{base}@{digest}" if digest else f"{base}:{tag}",
        digest,
        f"{base}:{tag}",
        str(e.get("digest_source", "")),
        flags["verified"],
        flags["prebuilt"],
    )


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


# ---- lock -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LockOutcome:
    name: str
    reference: str
    digest: str  # what the registry answered ("" when nothing was resolved)
    pinned: str  # what the file pinned before
    note: str  # "verified", "pinned", "moved", "updated", or why nothing was resolved
    source: str = ""  # the digest_source the file had

    @property
    def moved(self) -> bool:
        return self.note == "moved"


def is_local_build(entry: dict) -> bool:
    """The cpu entry's base is made on the build host (docker/make-debian-base.sh): no registry has it."""
    return str(entry.get("base", "")).startswith("rlparity/") and not entry.get("prebuilt", False)


def resolve(client, reference: str) -> str:
    """The registry's manifest digest for a tag (docker SDK: the engine's distribution endpoint, no pull)."""
    try:
        digest = client.images.get_registry_data(reference).id
    except Exception as exc:  # down, unknown tag, auth, a server that is not a registry
        raise EnvError(f"{reference}: the registry did not resolve it: {type(exc).__name__}: {exc}") from exc
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise EnvError(f"{reference}: the registry answered {digest!r}, not a sha256 manifest digest")
    return digest


def lock(client, path: Path = IMAGES_FILE, names: list[str] | None = None, update: bool = False) -> list[LockOutcome]:
    """Resolve every named entry's tag; write the file once, and only if every entry resolved and none moved.

    A pinned digest the registry confirms becomes verified; an empty one is filled; one the registry
    contradicts is a moved tag: an error naming both digests, unless `update` pins the registry's answer."""
    f = TomlFile.load(path)
    entries = f.data.get("images", {})
    unknown = [n for n in names or [] if n not in entries]
    if unknown:
        raise ConfigError(f"unknown image(s) {', '.join(unknown)} (known: {', '.join(entries)})", path)
    outcomes, failures = [], []
    for name, e in entries.items():
        if names and name not in names:
            continue
        ref = f"{e['base']}:{e['tag']}"
        if is_local_build(e):
            outcomes.append(LockOutcome(name, ref, "", "", "built locally: no registry digest exists"))
            continue
        try:
            digest = resolve(client, ref)
        except EnvError as exc:
            failures.append(str(exc))
            continue
        outcomes.append(_outcome(name, ref, digest, e, update))
    if failures:
        raise EnvError(f"images lock wrote nothing to {path}:\n  " + "\n  ".join(failures))
    moved = [o for o in outcomes if o.moved]
    if moved:
        lines = [
            f"[images.{o.name}] {o.reference} now resolves to {o.digest}, but {path} pins {o.pinned}" for o in moved
        ]
        raise ConfigError(
            "tag(s) moved since they were pinned; images lock wrote nothing (check the new image, then "
            "`rlparity images lock --update` pins the registry's digest):\n  " + "\n  ".join(lines)
        )
    text = f.text
    for o in outcomes:
        text = _write_outcome(text, o)
    if text != f.text:
        write_atomically(path, text)
    return outcomes


def _outcome(name: str, ref: str, digest: str, entry: dict, update: bool) -> LockOutcome:
    pinned, source = str(entry.get("digest", "")), str(entry.get("digest_source", ""))
    note = "pinned" if not pinned else "verified" if pinned == digest else "updated" if update else "moved"
    return LockOutcome(name, ref, digest, pinned, note, source)


def _write_outcome(text: str, o: LockOutcome) -> str:
    if not o.digest:
        return text
    today = date.today()
    if o.note == "verified":
        source = f"{VERIFIED_SUFFIX.sub('', o.source)}; verified by `rlparity images lock` on {today}"
    else:
        source = f"{o.reference} resolved by `rlparity images lock` (docker SDK get_registry_data) on {today}"
    text = set_field(text, o.name, "digest", f'"{o.digest}"')
    text = set_field(text, o.name, "digest_source", _toml_string(source))
    return set_field(text, o.name, "verified", "true")


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def set_field(text: str, image: str, key: str, value: str) -> str:
    """Set `key = value` (value as TOML) inside [images.<image>]: replace its line, or add one after the
    table's last key line; the rest of the file untouched."""
    lines = text.splitlines(keepends=True)
    inside, last = False, None
    for i, line in enumerate(lines):
        head = re.match(r"^\s*\[([^\]]+)\]", line)
        if head:
            if inside:
                break
            inside = head.group(1).strip() == f"images.{image}"
            last = i if inside else last
            continue
        if inside and re.match(rf"^\s*{re.escape(key)}\s*=", line):
            lines[i] = f"{key} = {value}\n"
            return "".join(lines)
        if inside and re.match(r"^\s*[A-Za-z_]", line):
            last = i
    if last is None:
        raise ConfigError(f"no [images.{image}] table to update", IMAGES_FILE)
    lines.insert(last + 1, f"{key} = {value}\n")
    return "".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """A reader (or a crash) sees the old file or the new one, never half of it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- check ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckRow:
    name: str
    pinned: str  # the digest, or "" (not pinned)
    source: str
    verified: bool
    built: str  # what the local image says: "matches", "not built", or the mismatch
    ok: bool


def check(client, images: dict[str, Image]) -> list[CheckRow]:
    """Each entry against the image built (or pulled) from it. A mismatch: a built image whose labels name
    another base digest, or none at all; an entry not built yet is not one."""
    return [_check_one(client, img) for img in images.values()]


def _check_one(client, img: Image) -> CheckRow:
    built, ok = _built_state(client, img)
    return CheckRow(img.name, img.digest, img.source, img.verified, built, ok)


def _built_state(client, img: Image) -> tuple[str, bool]:
    local = _local_image(client, img.run_reference)
    if local is None:
        return f"not built ({img.run_reference})", True
    if img.prebuilt:  # pulled by digest: the engine lists the digest it came from
        repo_digests = set(local.attrs.get("RepoDigests") or ())
        ok = img.reference in repo_digests
        return ("matches" if ok else f"{img.run_reference} is not {img.reference}"), ok
    labels = local.labels or {}
    if LABEL_BASE_DIGEST not in labels:
        return f"{img.run_reference} has no {LABEL_BASE_DIGEST} label (built before labels: rebuild it)", False
    built_digest = labels[LABEL_BASE_DIGEST]
    if built_digest == img.digest:
        return ("matches" if img.digest else "matches (built from the tag: the entry pins no digest)"), True
    was = built_digest or f"the unpinned tag {labels.get(LABEL_BASE_IMAGE, '?')}"
    return f"{img.run_reference} was built from {was}, the entry pins {img.digest or 'no digest'}", False


def _local_image(client, reference: str):
    try:
        return client.images.get(reference)
    except Exception as exc:
        if type(exc).__name__ == "ImageNotFound":
            return None
        raise EnvError(f"the Docker engine could not look up {reference}: {exc}") from exc


# ---- build ------------------------------------------------------------------------------------------------
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


# pyproject.toml's requires-python and torch floor: an image below them cannot install rlparity.
MIN_PYTHON, MIN_TORCH = (3, 10), (2, 2)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def unsupported_by_rlparity(entry: dict) -> str:
    """Why an entry's Python or torch is too old for rlparity ("" when both are new enough, or unknown)."""
    py, torch = _version(str(entry.get("python", ""))), _version(str(entry.get("torch", "")))
    why = []
    if py and py < MIN_PYTHON:
        why.append(f"Python {entry['python']} < {'.'.join(map(str, MIN_PYTHON))}")
    if torch and torch < MIN_TORCH:
        why.append(f"torch {entry['torch']} < {'.'.join(map(str, MIN_TORCH))}")
    return ", ".join(why)


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
    unsupported = unsupported_by_rlparity(entry)
    if unsupported:
        raise ConfigError(f"image {name!r} cannot carry rlparity: {unsupported}", path)
    if image.prebuilt:
        raise ConfigError(f"image {name!r} is prebuilt (pulled by digest: docker pull {image.reference}), not built")
    args = {**build_args(image, entry, revision()), **(extra_args or {})}
    built, _logs = client.images.build(
        path=str(root), dockerfile=DOCKERFILES[image.flavour], buildargs=args, tag=project_tag(name), rm=True
    )
    return built.id
