#!/usr/bin/env bash
# One device call on the NVIDIA machine: build rl_kernel with CUDA, then run the harness for real on sm90
# (and the CPU cells beside it): the quick matrix, the nightly's sm90 cells, and a planted mismatch.
# Usage (from the repository root on the GPU machine): bash bench/harness_h200.sh "$OUT"
# Needs rich and junitparser: carried as wheels in .whl/ (no network there).
set -u
out=${1:-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/kernels:$PWD/harness TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
python3 -c 'import rich, junitparser' 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/*.whl
{
  date -u +%FT%TZ
  git rev-parse HEAD 2>/dev/null || echo "commit: unknown"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
if ! ls kernels/rl_kernel/_C*.so >/dev/null 2>&1; then
  t0=$(date +%s)
  python3 setup.py build_ext --inplace > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
python3 -m rlparity.cli env > "$out/fingerprint.json"
run() {  # name, expected exit code, rlparity run arguments...
  local name=$1 expect=$2; shift 2
  local t0=$(date +%s)
  python3 -m rlparity.cli run --out "$out/$name" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  { echo "== $name: exit $rc (expected $expect) in $(( $(date +%s) - t0 )) s"
    grep -E "passed, |gate:" "$out/$name.log"; } | tee -a "$out/progress.txt"
  tar -C "$out" -czf "$out/$name.tar.gz" "$name" && rm -rf "${out:?}/$name"  # (deep trees do not come back)
}
case ${RUNS:-all} in
  all)
    run quick 0 --matrix quick --jobs 2
    run planted-ulp-flip 1 --matrix quick --filter 'target=sm90 profile=baseline' --control ulp-flip
    run nightly-sm90-small 0 --matrix nightly --filter 'target=sm90 tier=exact shapes=smoke|quick' --jobs 2
    run nightly-sm90-llm 0 --matrix nightly --filter 'target=sm90 tier=exact shapes=llm profile=baseline' --jobs 2
    ;;
  split-llm)  # what the first call did not reach: the split placement over two H200s, the llm shapes
    run split-sm90 0 --matrix nightly --filter 'target=sm90 placement=split profile=baseline shapes=smoke|quick' \
      --timeout 300
    run nightly-sm90-llm 0 --matrix nightly --filter 'target=sm90 tier=exact shapes=llm profile=baseline placement=single' \
      --jobs 2 --timeout 400
    ;;
esac
