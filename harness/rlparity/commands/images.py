"""`rlparity images list|lock|build`: harness/rlparity/data/images.toml, its digests, the project images."""

from __future__ import annotations

import argparse

from rich.table import Table

from rlparity import images
from rlparity.config import IMAGES_FILE, ConfigError, EnvError, import_extra
from rlparity.ui import console


def register(sub: argparse._SubParsersAction) -> None:
    i = sub.add_parser(
        "images", help="list the pinned images (rlparity/data/images.toml), lock tags to digests, build rlparity:<name>"
    )
    i.add_argument("action", choices=("list", "lock", "build"))
    i.add_argument("names", nargs="*", help="image names (default for lock: all)")
    i.add_argument("--build-arg", action="append", help="KEY=VALUE passed to the image build")
    i.set_defaults(func=cmd_images)


def cmd_images(args: argparse.Namespace) -> int:
    if args.action == "list":
        return _list()
    docker = import_extra("docker", "docker")
    try:
        client = docker.from_env()
    except Exception as exc:
        raise EnvError(f"no Docker engine reachable: {exc}") from exc
    if args.action == "lock":
        outcomes = images.lock(client, names=args.names or None)
        for o in outcomes:
            mark = f"[green]{o.digest}[/]" if o.digest else f"[yellow]not resolved[/]: {o.error}"
            console.print(f"  {o.name:18} {o.reference}  {mark}")
        return 0 if all(o.digest or "built locally" in o.error for o in outcomes) else 2
    if not args.names:
        raise ConfigError("images build needs at least one image name")
    extra = dict(kv.split("=", 1) for kv in args.build_arg or [])
    for name in args.names:
        console.print(f"building {images.project_tag(name)} ...")
        console.print(f"  {images.build(client, name, extra)}")
    return 0


def _list() -> int:
    table = Table(title=str(IMAGES_FILE))
    for col in ("name", "flavour", "reference", "targets"):
        table.add_column(col)
    for img in images.load_images().values():
        table.add_row(img.name, img.flavour, img.reference, " ".join(img.targets))
    console.print(table)
    return 0
