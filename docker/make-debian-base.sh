#!/usr/bin/env bash
# Makes the CPU flavour's base image without a registry: a minimal Debian bookworm root file system
# (debootstrap) imported as `rlparity/debian-base:bookworm`. Used by .ci/run, where nothing can be pulled;
# anywhere a registry is reachable, `debian:bookworm-slim` does the same job (BASE_IMAGE build arg).
# Usage: docker/make-debian-base.sh [image-name] [mirror]
set -euo pipefail
name=${1:-rlparity/debian-base:bookworm}
mirror=${2:-http://deb.debian.org/debian}
if docker image inspect "$name" >/dev/null 2>&1; then
  echo "$name exists"
  exit 0
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates bookworm "$root" "$mirror" >/dev/null
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$name" >/dev/null
echo "built $name"
