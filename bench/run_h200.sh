#!/usr/bin/env bash
# One device call: build the CUDA extension, prove CPU == GPU bits, scan SASS, time.
# Usage (on the GPU machine, from the repository root): bash bench/run_h200.sh "$OUT" (carry .whl/)
set -u
out=${1:-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/kernels:$PWD/harness TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
# The tests import junitparser (the harness's), which the GPU machine lacks: carried as a wheel in .whl/.
if ! python3 -c 'import junitparser' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{
  date -u +%FT%TZ
  git rev-parse HEAD 2>/dev/null || echo "commit: unknown"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -2
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
t0=$(date +%s)
python3 setup.py build_ext --inplace > /tmp/build.log 2>&1 || { tail -40 /tmp/build.log; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
so=$(ls kernels/rl_kernel/_C*.so)
cuobjdump -sass "$so" > /tmp/sass.txt 2>&1
echo "SASS of the built extension: rl kernels $(grep -c 'Function : _ZN2rl' /tmp/sass.txt), FFMA $(grep -cE '\bFFMA\b' /tmp/sass.txt), MUFU $(grep -cE '\bMUFU\b' /tmp/sass.txt)"
python3 kernels/check/kernels_check.py --only cuda --json "$out/kernels_check_cuda.json"
python3 bench/gpu_parity.py --json "$out/gpu_parity.json" 2>&1 | grep -v "mismatches=0"
python3 bench/bench_token_logprobs.py --json "$out/bench.json" 2>&1
python3 -m pytest tests -q -m gpu -p no:cacheprovider 2>&1 | tee "$out/pytest_gpu.log" | tail -5
