#!/usr/bin/env bash
# Tuning only (no bit changes): rebuild the CUDA extension with each RL_KERNEL_EXTRA_FLAGS setting and time the
# quick shapes of bench_row.py, with the registers per thread of the row kernels. Usage: bash bench/tune_h200.sh OUT FLAGS...
set -u
out=$1
shift
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONPATH=$PWD/kernels:$PWD/harness
mkdir -p "$out"
for flags in "$@"; do
  name=$(echo "$flags" | tr -c 'A-Za-z0-9=_' '_')
  rm -f kernels/rl_kernel/_C*.so
  t0=$(date +%s)
  RL_KERNEL_EXTRA_FLAGS="$flags" python3 setup.py build_ext --inplace > "$out/build_$name.log" 2>&1 || { tail -20 "$out/build_$name.log"; continue; }
  so=$(ls kernels/rl_kernel/_C*.so)
  echo "== flags [$flags] build $(( $(date +%s) - t0 )) s"
  cuobjdump --dump-resource-usage "$so" 2>/dev/null | grep -A1 -E "token_logprobs_kernelINS_4BF16|entropy_kernelINS_4BF16|node_stats_kernelINS_4BF16" | grep -oE "Function [^:]+|REG:[0-9]+|SHARED:[0-9]+|LOCAL:[0-9]+" | paste -sd' ' | head -c 800
  echo
  python3 bench/bench_row.py --quick --json "$out/quick_$name.json" 2>&1 | grep -E "rl |copy" | grep -v "^$"
done
