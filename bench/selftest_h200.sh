#!/usr/bin/env bash
# One device call: the negative controls on the GPU itself (`rlparity selftest --target sm90`): a real
# atomics reduction (index_add_), an nvcc --fmad=true rebuild of rl_kernel, and the other controls, each a
# cell on the H200 that the bitwise suite must fail; the unmodified kernel must pass.
# Usage (from the repository root on the GPU machine): bash bench/selftest_h200.sh "$OUT"
set -u
out=${1:-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/kernels:$PWD/harness TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
python3 -c 'import rich, junitparser' 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/*.whl
if ! ls kernels/rl_kernel/_C*.so >/dev/null 2>&1; then
  t0=$(date +%s)
  python3 setup.py build_ext --inplace > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
t0=$(date +%s)
python3 -m rlparity.cli selftest --target sm90 --out "$out/selftest" 2>&1 | tee "$out/selftest.log"
echo "selftest exit ${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s" | tee -a "$out/selftest.log"
for v in "$out"/selftest/*/; do  # flatten: deep trees do not come back
  n=$(basename "$v"); cp "$v/result.json" "$out/result-$n.json" 2>/dev/null; cp "$v/output.log" "$out/output-$n.log" 2>/dev/null
done
rm -rf "$out/selftest"
