#!/usr/bin/env bash
# Tuning run: build the CUDA extension with several launch/unroll settings (which
# change scheduling only, never the arithmetic) and time token_logprobs for each.
# Usage (on the GPU machine, from the repository root): bash bench/variants_h200.sh "$OUT"
set -u
out=${1:-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
variants=(${VARIANTS:-"minblocks6:-DRL_MIN_BLOCKS=6" "minblocks5:-DRL_MIN_BLOCKS=5"})
for v in "${variants[@]}"; do
  name=${v%%:*}; flags=${v#*:}
  dir=/tmp/variant-$name
  rm -rf "$dir" && mkdir -p "$dir" && cp -r kernels setup.py pyproject.toml README.md bench "$dir"/ 2>/dev/null
  (cd "$dir" && RL_KERNEL_EXTRA_FLAGS="$flags" python3 setup.py build_ext --inplace > /tmp/build-$name.log 2>&1) \
    || { echo "$name: build failed"; tail -20 /tmp/build-$name.log; continue; }
  echo "== $name ($flags)"
  (cd "$dir" && PYTHONPATH=$dir/kernels python3 bench/bench_token_logprobs.py --reps 30 --json "$out/bench-$name.json" \
    | grep -E "token_logprobs|copy ")
done
