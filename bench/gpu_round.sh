#!/usr/bin/env bash
# One device call for a change of the kernels or the gate, on an NVIDIA or an AMD machine: build the extension for
# this GPU, then every GPU-side proof of the round, each step logged under $OUT with its exit status and time.
# The target is the machine's: rl_kernel.tiers.target_of (sm_90, gfx942, ...; the fast tier's configs and golden
# files use it) and the harness's name for it in axes.toml (sm90, gfx942, ...: what `rlparity run` and selftest get);
# TARGET overrides the harness's name.
# Usage (from the repository root on the GPU machine): bash bench/gpu_round.sh "$OUT" [STEP...]
# Steps (default: scan parity golden pytest quick selftest mutations bench):
#   env        rlparity env: the fingerprint of this machine ($OUT/fingerprint.json)
#   compile    kernels_check.py --only cuda|hip: the sources compiled and scanned for every target of the toolchain
#   scan       kernels_check.py --built: the shipped build's device code scanned
#   parity     python -m bench gpu_parity: CPU == GPU bits, GPU run to run and batch invariance
#   golden     rl_kernel.contract.golden --device cuda: the exact tier's digests on the GPU (torch.cuda is ROCm's too)
#   pytest     tests/kernels on the GPU; dtests: its decoder and golden tests; gputests: every gpu-marked test;
#              sel: the tests PYTEST_SEL names (paths and -k/-m flags, split on spaces)
#   quick      the quick matrix on cpu + this host's targets (edges cells included), strict
#   selftest   the negative controls on this target; mutations: the mutation controls
#   planted    a planted ulp flip in this target's baseline cells: the gate must exit 1
#   nightly    the nightly matrix's exact-tier smoke/quick cells of this target; llm: its llm shapes (baseline,
#              single); split: its split placement over two GPUs (baseline, smoke/quick)
#   hf         the Hugging Face integration's tests on the GPU; model: the model cells on cpu and this target
#   fast       selfcheck --tier fast and the fast tier's golden digests of this target recorded into $OUT/golden-fast
#   cells      the quick matrix's cells of this target, both tiers (CELLS_ARGS: more flags, e.g. --filter tier=fast),
#              and the digests they recorded
#   fastctl    the fast tier's negative controls through the gate (RL_KERNEL_CONTROL=split-k, BLOCK_K 32)
#   benchmarks (python -m bench NAME): bench (token_logprobs), row, decoder, profile (profile_decode), pstep
#              (profile_step: the training step's time per kernel family, stock vs fast; MODEL as mbench, PSTEP_ARGS its flags,
#              PSTEP_TAG a suffix for its files), mbench
#              (model_step; MODEL=qwen3-8b for the 8B shape, MBENCH_ARGS its other flags, MBENCH_TAG a suffix for its
#              files), fhead (fused_head; FHEAD_ARGS its flags, FHEAD_TAG a suffix for its files),
#              fbench (fast_tier), launch (launch_cost: the host's cost of one decoder op), rprof (profile_rollout;
#              RPROF_ARGS its flags, RPROF_TAG a suffix for its files), rmodes (rollout_modes: tokens/s of each rollout mode and their bits; RMODES_ARGS
#              its flags, RMODES_TAG a suffix for its files), rproc (rollout_process: stock and the tier side by side
#              in one process, compiled first; RPROC_ARGS its flags, RPROC_TAG a suffix for its files), gemm
#              (grouped_gemm: a mixture of experts' grouped GEMM under the mode against torch._grouped_mm; GEMM_ARGS
#              its flags, GEMM_TAG a suffix for its files), wattn (window_attention: the windowed attention alone
#              against SDPA with the window's mask, at block heights; WATTN_ARGS its flags, WATTN_TAG a suffix)
#   tune       a rebuild per TUNE_FLAGS entry (';'-separated RL_KERNEL_EXTRA_FLAGS sets: scheduling only), each
#              timed by `python -m bench row --quick`; the build of the round is restored afterwards
# junitparser, liger-kernel and a newer transformers travel as wheels in .whl/ (no network there; `make device-wheels`
# here downloads bench/device-wheels.txt into it; the device call carries ".whl"). STEP_TIMEOUT caps each
# step (default 300 s); RESULTS_TAR (e.g. $OUT/r.tar.gz) is refreshed after every step. A fresh build's _C.so is
# copied to $OUT (carry it back as kernels/rl_kernel/ to skip the next build).
set -u
out=${1:-out}
shift || true
steps=${*:-"scan parity golden pytest quick selftest mutations bench"}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/kernels:$PWD/harness:$PWD
# The carried wheels (.whl/) go first on the path: a carried transformers (continuous batching as served needs
# >= 5.25) replaces the machine's own. Installed once per machine (/tmp/site persists while it is held).
if ls .whl/*.whl >/dev/null 2>&1; then
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi

# ---- the machine: NVIDIA (CUDA) or AMD (ROCm), and the architecture the build compiles for ----------------
platform=$(python3 -c 'import torch; print("rocm" if torch.version.hip else "cuda")')
arch=$(python3 -c 'import torch; p = torch.cuda.get_device_properties(0)
print(p.gcnArchName.split(":")[0] if torch.version.hip else f"{p.major}.{p.minor}")') \
  || { echo "gpu_round.sh: no GPU visible to torch (torch.cuda serves NVIDIA and AMD alike)"; exit 1; }
if [ "$platform" = rocm ]; then
  export PYTORCH_ROCM_ARCH=${PYTORCH_ROCM_ARCH:-$arch}
  toolchain=hip
else
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch}
  toolchain=cuda
fi
{
  date -u +%FT%TZ
  git rev-parse HEAD 2>/dev/null || echo "commit: unknown"
  if [ "$platform" = rocm ]; then rocm-smi --showproductname --showdriverversion; hipcc --version | head -2
  else nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; fi
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", torch.version.hip)'
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

build() {  # the extension in place for this machine's architecture, its log under $out
  local t0
  t0=$(date +%s)
  python3 setup.py build_ext --inplace > "$out/build$1.log" 2>&1 || { tail -40 "$out/build$1.log"; return 1; }
  echo "build$1: $(( $(date +%s) - t0 )) s" | tee -a "$out/progress.txt"
}
if ! ls kernels/rl_kernel/_C*.so >/dev/null 2>&1; then
  build "" || exit 1
  cp kernels/rl_kernel/_C*.so "$out/" 2>/dev/null || true
fi
so=$(ls kernels/rl_kernel/_C*.so)
device_target=$(python3 -c 'from rl_kernel.tiers import target_of; print(target_of("cuda"))')  # sm_90, gfx942
target=${TARGET:-${device_target/sm_/sm}}  # the harness's name (axes.toml): sm90, gfx942, ...
echo "target: $device_target (harness: $target, platform: $platform)" | tee -a "$out/env.txt"

step() {  # name, command...: the log under $out, one line of progress; EXPECT: the exit status wanted (default 0)
  local name=$1 t0 rc
  t0=$(date +%s)
  shift
  # A step that hangs must not take the others' results with it: STEP_TIMEOUT (default 300 s) each (a function of
  # this script, e.g. tune, runs without it: timeout runs programs).
  if declare -F "$1" >/dev/null; then "$@" > "$out/$name.log" 2>&1; else
    timeout "${STEP_TIMEOUT:-300}" "$@" > "$out/$name.log" 2>&1; fi
  rc=$?
  echo "== $name: exit $rc (expected ${EXPECT:-0}) in $(( $(date +%s) - t0 )) s" | tee -a "$out/progress.txt"
  tail -4 "$out/$name.log" | sed 's/^/   /'
  # RESULTS_TAR: a tarball of $out refreshed after every step, so a call cut short still returns the rest.
  if [ -n "${RESULTS_TAR:-}" ]; then tar -C "$(dirname "$out")" -czf "$RESULTS_TAR" "$(basename "$out")"; fi
}
flatten() {  # a results dir -> one tarball (deep trees do not come back)
  tar -C "$out" -czf "$out/$1.tar.gz" "$1" && rm -rf "${out:?}/$1"
}
rlrun() {  # step name, expected exit, rlparity run arguments...: a matrix run whose results come back as a tarball
  local name=$1
  EXPECT=$2 step "$name" python3 -m rlparity.cli run --out "$out/$name" "${@:3}"
  flatten "$name"
}
controls_matrix() {  # the fast tier's negative controls as a matrix of this target's model cells
  sed 's/^block_k = 64$/block_k = 32/' kernels/rl_kernel/fast/configs.toml > /tmp/bk32.toml
  printf '%s\n' '[matrix]' 'description = "fast tier negative controls"' 'repeats = 2' \
    '[profiles.fast-split-k]' "platforms = [\"$platform\"]" 'env = { RL_KERNEL_CONTROL = "split-k" }' \
    '[profiles.fast-bk32]' "platforms = [\"$platform\"]" 'env = { RL_KERNEL_FAST_CONFIGS = "/tmp/bk32.toml" }' \
    '[axes]' 'image = ["cpu"]' "target = [\"$target\"]" 'profile = ["fast-split-k", "fast-bk32"]' \
    'placement = ["single"]' 'dtype = ["bf16"]' 'shapes = ["model"]' 'tier = ["fast"]' > /tmp/ctl.toml
}
tune() {  # a build per TUNE_FLAGS entry, its row kernels' registers (NVIDIA) and `bench row --quick`'s times
  local flags name
  mkdir -p /tmp/round-build && cp "$so" /tmp/round-build/
  IFS=';' read -r -a sets <<< "${TUNE_FLAGS:?TUNE_FLAGS: ';'-separated RL_KERNEL_EXTRA_FLAGS sets}"
  for flags in "${sets[@]}"; do
    name=$(echo "$flags" | tr -c 'A-Za-z0-9=_' '_')
    rm -f kernels/rl_kernel/_C*.so
    RL_KERNEL_EXTRA_FLAGS="$flags" build "-$name" || continue
    echo "== flags [$flags]"
    if command -v cuobjdump >/dev/null; then
      cuobjdump --dump-resource-usage kernels/rl_kernel/_C*.so 2>/dev/null \
        | grep -A1 -E "token_logprobs_kernelINS_4BF16|entropy_kernelINS_4BF16|node_stats_kernelINS_4BF16" \
        | grep -oE "Function [^:]+|REG:[0-9]+|SHARED:[0-9]+|LOCAL:[0-9]+" | paste -sd' ' | head -c 800
      echo
    fi
    python3 -m bench row --quick --json "$out/tune_$name.json" 2>&1 | grep -E "rl |copy"
  done
  cp /tmp/round-build/"$(basename "$so")" kernels/rl_kernel/
}

for s in $steps; do
  case $s in
    env) step env sh -c "python3 -m rlparity.cli env > '$out/fingerprint.json'" ;;
    compile) step compile python3 kernels/check/kernels_check.py --only "$toolchain" --json "$out/kernels_check.json" ;;
    scan) step scan python3 kernels/check/kernels_check.py --built "$so" ;;
    parity) step selfcheck python3 -m bench gpu_parity --json "$out/selfcheck.json" ;;
    golden) step golden python3 -m rl_kernel.contract.golden --device cuda ;;
    pytest) step pytest-kernels python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels ;;
    dtests) step decoder-tests python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels -k "decoder or golden" ;;
    gputests) step gpu-tests python3 -m pytest -q -p no:cacheprovider -m gpu tests ;;
    sel) # shellcheck disable=SC2086 # PYTEST_SEL: paths and flags, split on purpose
         step gpu-selected python3 -m pytest -q -p no:cacheprovider -n 8 ${PYTEST_SEL:?PYTEST_SEL: the tests to run} ;;
    quick) rlrun quick 0 --matrix quick --targets auto --strict --jobs 4 ;;
    selftest) step selftest python3 -m rlparity.cli selftest --target "$target" --out "$out/selftest"
              flatten selftest ;;
    mutations) step mutations python3 -m rlparity.cli selftest --mutations --target "$target" --out "$out/mutations"
               flatten mutations ;;
    planted) rlrun planted-ulp-flip 1 --matrix quick --filter "target=$target profile=baseline" --control ulp-flip ;;
    nightly) rlrun nightly 0 --matrix nightly --filter "target=$target tier=exact shapes=smoke|quick" --jobs 2 ;;
    llm) rlrun nightly-llm 0 --matrix nightly --jobs 2 --timeout 400 \
           --filter "target=$target tier=exact shapes=llm profile=baseline placement=single" ;;
    split) rlrun split 0 --matrix nightly --timeout 300 \
             --filter "target=$target placement=split profile=baseline shapes=smoke|quick" ;;
    hf) step hf-tests python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_sampling.py \
          "tests/kernels/test_decoder.py::test_rms_norm_wide_rows_do_not_depend_on_the_batch" \
          tests/kernels/test_optim_embedding.py tests/integrations ;;
    model) rlrun model 0 --matrix quick --filter "shapes=model" --targets "cpu,$target" --strict --jobs 4 ;;
    fast) step selfcheck-fast python3 -m rl_kernel.contract.selfcheck --tier fast --require-gpu --json "$out/selfcheck_fast.json"
          step golden-fast python3 -m rl_kernel.contract.golden --tier fast --device cuda --update
          mkdir -p "$out/golden-fast" && cp kernels/rl_kernel/fast/*/golden/"$device_target".json "$out/golden-fast/" ;;
    cells) # shellcheck disable=SC2086 # CELLS_ARGS: flags, split on purpose
           step cells python3 -m rlparity.cli run --matrix quick --targets "$target" --strict --jobs 4 --out "$out/cells" \
             ${CELLS_ARGS:-}
           python3 -m rlparity.cli golden --record "$out/cells" > "$out/record.log" 2>&1
           cp harness/rlparity/data/golden/fast.json "$out/harness-fast.json" 2>/dev/null
           flatten cells ;;
    fastctl) # a split-K of the fast linear must move the bits and the gate must exit 1; BLOCK_K 32 instead of 64
             # (seventh session: moved no bit on sm_90, one wgmma k16 chain either way) is kept beside it.
             controls_matrix
             rlrun ctl 1 --matrix /tmp/ctl.toml --targets "$target" ;;
    bench) step bench python3 -m bench token_logprobs --json "$out/bench.json" ;;
    row) step row python3 -m bench row --json "$out/row.json" ;;
    decoder) step decoder-bench python3 -m bench decoder --json "$out/decoder.json" ;;
    profile) step profile-decode python3 -m bench profile_decode --json "$out/profile_decode.json" ;;
    pstep) # shellcheck disable=SC2086 # PSTEP_ARGS: flags, split on purpose
           step "profile-step${PSTEP_TAG:-}" python3 -m bench profile_step --model "${MODEL:-qwen3-1.7b}" ${PSTEP_ARGS:-} \
             --json "$out/profile_step${PSTEP_TAG:-}.json" --markdown "$out/profile_step${PSTEP_TAG:-}.md" ;;
    mbench) # shellcheck disable=SC2086 # MBENCH_ARGS: flags, split on purpose
            step "model-bench${MBENCH_TAG:-}" python3 -m bench model_step --model "${MODEL:-qwen3-1.7b}" ${MBENCH_ARGS:-} \
              --json "$out/model_step${MBENCH_TAG:-}.json" ;;
    launch) step launch-cost python3 -m bench launch_cost --json "$out/launch_cost.json" ;;
    rprof) # shellcheck disable=SC2086 # RPROF_ARGS: flags, split on purpose
           step "profile-rollout${RPROF_TAG:-}" python3 -m bench profile_rollout ${RPROF_ARGS:-} \
             --json "$out/profile_rollout${RPROF_TAG:-}.json" --markdown "$out/profile_rollout${RPROF_TAG:-}.md" ;;
    rmodes) # shellcheck disable=SC2086 # RMODES_ARGS: flags, split on purpose
            step "rollout-modes${RMODES_TAG:-}" python3 -m bench rollout_modes --model "${MODEL:-qwen3-1.7b}" \
              ${RMODES_ARGS:-} --json "$out/rollout_modes${RMODES_TAG:-}.json" ;;
    gemm) # shellcheck disable=SC2086 # GEMM_ARGS: flags, split on purpose
          step "grouped-gemm${GEMM_TAG:-}" python3 -m bench grouped_gemm ${GEMM_ARGS:-} \
            --json "$out/grouped_gemm${GEMM_TAG:-}.json" ;;
    wattn) # shellcheck disable=SC2086 # WATTN_ARGS: flags, split on purpose
           step "window-attention${WATTN_TAG:-}" python3 -m bench window_attention ${WATTN_ARGS:-} \
             --json "$out/window_attention${WATTN_TAG:-}.json" ;;
    rproc) # shellcheck disable=SC2086 # RPROC_ARGS: flags, split on purpose
           step "rollout-process${RPROC_TAG:-}" python3 -m bench rollout_process --model "${MODEL:-qwen3-1.7b}" \
             ${RPROC_ARGS:-} --json "$out/rollout_process${RPROC_TAG:-}.json" ;;
    fhead) # shellcheck disable=SC2086 # FHEAD_ARGS: flags, split on purpose
           step "fused-head${FHEAD_TAG:-}" python3 -m bench fused_head ${FHEAD_ARGS:-} \
             --json "$out/fused_head${FHEAD_TAG:-}.json" ;;
    fbench) step fast-bench python3 -m bench fast_tier --json "$out/fast.json" ;;
    tune) step tune tune ;;
    *) echo "unknown step $s" | tee -a "$out/progress.txt" ;;
  esac
done
cat "$out/progress.txt"
