#!/usr/bin/env bash
# The recipe both images share (docker/Dockerfile for ROCm, docker/Dockerfile.cpu): build rl_kernel with the
# contract's flags, install rlparity around the image's own torch without touching it, and write the build
# record (/etc/rlparity/build.json) that every cell's fingerprint carries.
# Env: PYTHON, RL_KERNEL_BUILD (cpu|gpu|auto), PYTORCH_ROCM_ARCH, BASE_IMAGE, BASE_DIGEST, IMAGE_NAME, REVISION.
set -euo pipefail
src=${RLPARITY_SRC:-/opt/rlparity}
py=${PYTHON:-python3}

torch_before=$("$py" -c 'import torch; print(torch.__version__)') || {
  echo "install.sh: the base image has no torch for $py; rocm/pytorch images carry one, the CPU flavour installs it first" >&2
  exit 1
}
"$py" -m pip install --no-cache-dir -r "$src/requirements.txt"   # never torch: see requirements.txt
"$py" -m pip install --no-cache-dir --no-build-isolation --no-deps -e "$src"
torch_after=$("$py" -c 'import torch; print(torch.__version__)')
if [ "$torch_before" != "$torch_after" ]; then
  echo "install.sh: torch changed from $torch_before to $torch_after; the image's torch must stay as built" >&2
  exit 1
fi

mkdir -p /etc/rlparity
"$py" - "$src" <<'PY'
import json, os, pathlib, sys
from datetime import datetime, timezone

import torch

src = pathlib.Path(sys.argv[1])
kernel = json.loads((src / "kernels/rl_kernel/_build.json").read_text())
rocm = pathlib.Path("/opt/rocm/.info/version")
record = {
    "image": os.environ.get("IMAGE_NAME", ""),
    "base_image": os.environ.get("BASE_IMAGE", ""),
    "base_digest": os.environ.get("BASE_DIGEST", ""),
    "rocm": rocm.read_text().strip() if rocm.exists() else "",
    "torch": torch.__version__,
    "torch_hip": torch.version.hip,
    "python": sys.version.split()[0],
    "rl_kernel_build": os.environ.get("RL_KERNEL_BUILD", "auto"),
    "gpu_targets": os.environ.get("PYTORCH_ROCM_ARCH", ""),
    "kernel": kernel,
    "revision": os.environ.get("REVISION", ""),
    "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
}
pathlib.Path("/etc/rlparity/build.json").write_text(json.dumps(record, indent=1) + "\n")
print(json.dumps(record, indent=1))
PY
"$py" -c 'import rl_kernel, rlparity; import rl_kernel.tiers as t; print("rl_kernel tiers:", ", ".join(sorted(t.tiers())), "gpu kernels:", rl_kernel.has_gpu_kernels())'
