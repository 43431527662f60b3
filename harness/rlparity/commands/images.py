"""`rlparity images list|lock|check|build`: the images file (harness/rlparity/data/images.toml, or --images /
$RLPARITY_IMAGES), its digests, the project images."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from rlparity import images
from rlparity.config import IMAGES_FILE, ConfigError, EnvError, import_extra
from rlparity.ui import console


def register(sub: argparse._SubParsersAction) -> None:
    i = sub.add_parser(
        "images",
        help="list the pinned images, lock tags to digests, check the built images against them, build rlparity:<name>",
    )
    i.add_argument("action", choices=("list", "lock", "check", "build"))
    i.add_argument("names", nargs="*", help="image names (default for lock and check: all)")
    i.add_argument("--images", type=Path, default=IMAGES_FILE, help=f"the images file (default {IMAGES_FILE})")
    i.add_argument("--update", action="store_true", help="lock: pin a moved tag's new digest instead of failing")
    i.add_argument("--build-arg", action="append", help="KEY=VALUE passed to the image build")
    i.set_defaults(func=cmd_images)


def cmd_images(args: argparse.Namespace) -> int:
    path = args.images
    if not path.exists():
        raise ConfigError("no such images file", path)
    if args.action == "list":
        return _list(path)
    client = _client()
    if args.action == "lock":
        return _lock(client, path, args.names, args.update)
    if args.action == "check":
        return _check(client, path, args.names)
    if not args.names:
        raise ConfigError("images build needs at least one image name")
    extra = dict(kv.split("=", 1) for kv in args.build_arg or [])
    for name in args.names:
        console.print(f"building {images.project_tag(name)} ...")
        console.print(f"  {images.build(client, name, extra, path)}")
    return 0


def _client():
    docker = import_extra("docker", "docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        raise EnvError(f"no Docker engine reachable: {exc}") from exc
    return client


def _lock(client, path: Path, names: list[str], update: bool) -> int:
    outcomes = images.lock(client, path, names or None, update)
    for o in outcomes:
        marks = {
            "verified": f"[green]{o.digest}[/] (verified: the pinned digest)",
            "pinned": f"[green]{o.digest}[/] (newly pinned)",
            "updated": f"[yellow]{o.digest}[/] (updated: was {o.pinned})",
        }
        console.print(f"  {o.name:18} {o.reference}  {marks.get(o.note, o.note)}")
    # lock writes only where a digest was resolved (built-locally entries have none)
    console.print(f"wrote {path}" if any(o.digest for o in outcomes) else f"{path} unchanged: nothing to resolve")
    return 0


def _check(client, path: Path, names: list[str]) -> int:
    known = images.load_images(path)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown image(s) {', '.join(unknown)} (known: {', '.join(known)})", path)
    rows = images.check(client, {n: i for n, i in known.items() if not names or n in names})
    table = Table(title=f"{path}: pins and built images")
    for col in ("name", "pinned", "source", "verified", "built image"):
        table.add_column(col, overflow="fold")
    for r in rows:
        built = r.built if r.ok else f"[red]{r.built}[/]"
        table.add_row(r.name, r.pinned or "[yellow]not pinned[/]", r.source, "yes" if r.verified else "no", built)
    console.print(table)
    bad = [r.name for r in rows if not r.ok]
    if bad:
        console.print(f"[red]mismatch[/]: {', '.join(bad)}")
    return 1 if bad else 0


def _list(path: Path) -> int:
    table = Table(title=str(path))
    for col in ("name", "flavour", "reference", "verified", "targets"):
        table.add_column(col)
    for img in images.load_images(path).values():
        table.add_row(img.name, img.flavour, img.reference, "yes" if img.verified else "no", " ".join(img.targets))
    console.print(table)
    return 0
