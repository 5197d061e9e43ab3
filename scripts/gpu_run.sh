#!/usr/bin/env bash
# Everything GPU-related in one command, on a GPU machine with a pack from scripts/gpu_pack.sh,
# in under 9 minutes (each step under `timeout`), its report in OUTDIR (8 files at most):
#   env.txt        nvidia-smi, and whether every library of the two programs resolves
#   tests.xml/.log the CUDA and hybrid tests (JUnit); a skipped CUDA test fails the step here
#   sanitizer.txt  compute-sanitizer memcheck and racecheck on the CUDA op tests
#   e2e.txt        a 1.1B-shape synth ReLU model made here: KL divergence and top-1 agreement of the
#                  hybrid (--hybrid-device cuda, attention and hot neurons on the GPU) against
#                  all-CPU over a few hundred positions, two hybrid runs bit-identical, and the
#                  process's GPU memory (nvidia-smi) against its budget: CUDA's context measured
#   bench.txt      ember bench on a 7B-shape synth ReLU model (90 % sparse, Q4_0, or F16 with
#                  --bench-type f16; PowerInfer's layout, context 256), with the model's
#                  predictors: all-CPU, the hybrid at 25 / 50 / 75 % of the model's bytes (plus
#                  CUDA's context: the budgets are of the process), the layer split at 50 %
#                  (whole layers, as llama.cpp's -ngl), all-GPU (--vram-budget auto); with the
#                  oracle rule: all-CPU, hybrid and layer split at 50 %; each hybrid run's time
#                  breakdown
#   memory.csv     nvidia-smi's memory.used sampled during the benchmarks
#   summary.txt    one row per step, printed last
#   scripts/gpu_run.sh OUTDIR            on the GPU machine (the pack in gpu-pack/ or $EMBER_PACK;
#                                        EMBER_GPU_E2E_PRESET / EMBER_GPU_BENCH_PRESET: the synth
#                                        presets of steps 4 and 5, 1.1b and 7b by default)
#   scripts/gpu_run.sh --dry-run OUTDIR  the same steps on the CPU stand-in device with a tiny model
#                                        and build/'s programs: what CI runs, so that the script is
#                                        known to work before a GPU is there
set -uo pipefail
dry=0
bench_type=q4_0
while [ $# -gt 1 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --bench-type) bench_type=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: scripts/gpu_run.sh [--dry-run] [--bench-type q4_0|f16] OUTDIR" >&2; exit 2; }
[[ "$bench_type" =~ ^(q4_0|f16)$ ]] || { echo "gpu_run: --bench-type is q4_0 or f16" >&2; exit 2; }
out=$1
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
pack=${EMBER_PACK:-gpu-pack}
if ((dry)) && [ ! -d "$pack" ]; then bin=build; else bin=$pack/bin; fi
[ -d "$pack/lib" ] && export LD_LIBRARY_PATH="$(cd "$pack/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ember=$bin/ember
tests=$bin/ember-tests
device=cuda
((dry)) && device=cpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
rows=()
failed=0
row() {  # step status detail
  rows+=("| $1 | $2 | $3 |")
  [ "$2" = "FAIL" ] && failed=1
  return 0
}
deadline=${EMBER_GPU_DEADLINE:-500}  # seconds: a step that would start later is skipped (9 minutes in all)
late() { [ $(($(date +%s) - start)) -gt "$deadline" ]; }

# ---- 1. the machine and the libraries --------------------------------------------------------
{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm), $(nproc) cores"
  if ((dry)); then echo "dry run: no GPU asked for"; else timeout 30 nvidia-smi || echo "nvidia-smi failed"; fi
  echo "== libraries ($bin, LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
  ldd "$ember" "$tests"
} >"$out/env.txt" 2>&1
if [ ! -x "$ember" ] || [ ! -x "$tests" ]; then
  row "programs" FAIL "$ember or $tests is missing: run scripts/gpu_pack.sh first (dry run: build/)"
elif grep -v libcuda "$out/env.txt" | grep -q "not found"; then
  row "libraries" FAIL "$(grep -v libcuda "$out/env.txt" | grep "not found" | awk '{print $1}' | sort -u | tr '\n' ' ')"
else
  row "libraries" ok "every library resolves"
fi
gpu=$(grep -m1 -o "NVIDIA [A-Z0-9][A-Za-z0-9 ]*" "$out/env.txt" | head -1)
((dry)) || [ -n "$gpu" ] || row "GPU" FAIL "nvidia-smi shows no NVIDIA GPU"

# ---- 2. the CUDA and hybrid tests ------------------------------------------------------------
timeout 240 "$tests" --gtest_filter='CudaOps.*:HybridFfn.*:*FfnContract*:Blocks.*' \
  --gtest_output="xml:$out/tests.xml" >"$out/tests.log" 2>&1
rc=$?
count() { local n; n=$(grep -c "$1" "$out/tests.xml" 2>/dev/null) || true; echo "${n:-0}"; }
n_tests=$(count "<testcase ")
n_fail=$(count "<failure")
n_cuda_skipped=$( (grep "<testcase " "$out/tests.xml" 2>/dev/null | grep 'classname="CudaOps"' | grep -c 'result="skipped"') || true)
n_cuda_skipped=${n_cuda_skipped:-0}
detail="$n_tests tests, $n_fail failures, $n_cuda_skipped CUDA tests skipped (exit $rc)"
if [ "$rc" -ne 0 ] || [ "$n_fail" -ne 0 ] || [ "$n_tests" -eq 0 ]; then
  row "tests" FAIL "$detail"
elif ((!dry)) && [ "$n_cuda_skipped" -ne 0 ]; then
  row "tests" FAIL "$detail: a skipped CUDA test on a GPU machine is a failure"
else
  row "tests" ok "$detail"
fi

# ---- 3. compute-sanitizer on the CUDA op tests -----------------------------------------------
ops='CudaOps.MatvecAndGatherMatchReference:CudaOps.FireGateMulAxpyAndAddMatchReference:CudaOps.PredictorSelectionAndCountedFireMatchTheCpu:CudaOps.AttentionBlockKernelsMatchTheCpu'
if ((dry)); then
  echo "dry run: compute-sanitizer needs a GPU" >"$out/sanitizer.txt"
  row "sanitizer" skip "dry run"
else
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  : >"$out/sanitizer.txt"
  for tool in memcheck racecheck; do
    echo "== $tool" >>"$out/sanitizer.txt"
    timeout 100 "$san" --tool "$tool" --error-exitcode 1 "$tests" --gtest_filter="$ops" >>"$out/sanitizer.txt" 2>&1
    r=$?
    if [ "$r" -eq 0 ]; then row "sanitizer $tool" ok "$(grep -m1 "ERROR SUMMARY" "$out/sanitizer.txt" | tail -1)"
    else row "sanitizer $tool" FAIL "exit $r, see sanitizer.txt"; fi
  done
fi

# ---- 4. end to end: a synth ReLU model made here ---------------------------------------------
if ((dry)); then preset=tiny; chunks=4; ctx=64; else preset=${EMBER_GPU_E2E_PRESET:-1.1b}; chunks=6; ctx=128; fi
# Budgets are of the process: a share of the model's bytes for the plan, plus what CUDA's context
# takes by itself (kCudaContextReserve, engine/device.hpp; the CPU stand-in has none).
reserve=$((512 * 1048576))
((dry)) && reserve=0
model=$work/relu.gguf
cat README.md docs/*.md >"$work/text.txt"
# The process's GPU memory as nvidia-smi sees it, sampled while a command runs: the peak in MiB.
peak_process_mib() {  # out-file command...
  local f=$1 pid sampler
  shift
  "$@" &
  pid=$!
  if ((dry)); then wait "$pid"; echo 0 >"$f"; return; fi
  (while kill -0 "$pid" 2>/dev/null; do
     nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
       awk -F', ' -v p="$pid" '$1 == p {print $2}'
     sleep 0.2
   done) >"$f.samples" &
  sampler=$!
  wait "$pid"
  wait "$sampler" 2>/dev/null
  sort -n "$f.samples" | tail -1 >"$f"
}
{
  echo "== model: ember synth --preset $preset --act relu --sparsity 0.9 --type q4_0"
  timeout 120 "$ember" synth --preset "$preset" --act relu --sparsity 0.9 --gate-rank 32 --type q4_0 -o "$model" 2>&1 | tail -2
  bytes=$(stat -c %s "$model" 2>/dev/null || echo 0)
  half=$((bytes / 2 + reserve))  # the process's budget: half the model's bytes for the plan, CUDA's context on top
  echo "== all-CPU (oracle), $chunks chunks of $ctx"
  timeout 120 "$ember" perplexity -m "$model" -f "$work/text.txt" -c "$ctx" --chunks "$chunks" --sparse-mode oracle \
    --save-logits "$work/cpu.lp" 2>&1 | tail -3
  for run in 1 2; do
    echo "== hybrid run $run: --vram-budget $half --hybrid-device $device (the process, CUDA's context included)"
    peak_process_mib "$work/peak$run" timeout 120 "$ember" perplexity -m "$model" -f "$work/text.txt" -c "$ctx" \
      --chunks "$chunks" --vram-budget "$half" --hybrid-device "$device" --kl-base "$work/cpu.lp" \
      --save-logits "$work/hybrid$run.lp" >"$work/hybrid$run.log" 2>&1
    grep -E "hybrid|CUDA|KLD|top|error|PPL" "$work/hybrid$run.log" | tail -16
    echo "process GPU memory (nvidia-smi, peak): $(cat "$work/peak$run") MiB of a budget of $((half / 1048576)) MiB"
  done
} >"$out/e2e.txt" 2>&1
kl=$(grep -m1 "Median  KLD" "$out/e2e.txt" | awk '{print $NF}')
top=$(grep -m1 "Same top p" "$out/e2e.txt" | awk '{print $5}')
peak=$(cat "$work/peak1" 2>/dev/null || echo 0)
arena=$(grep -m1 -o "the plan's arena [0-9.]* MiB" "$work/hybrid1.log" 2>/dev/null | awk '{print $4}')
half_mib=$((($(stat -c %s "$model" 2>/dev/null || echo 0) / 2 + reserve) / 1048576))
context=""
[ -n "$arena" ] && ((!dry)) && context="; CUDA's context and modules: $(awk -v p="$peak" -v a="$arena" 'BEGIN {printf "%.0f", p - a}') MiB (process $peak MiB - arena $arena MiB)"
if [ -z "$kl" ] || [ -z "$top" ]; then
  row "end to end" FAIL "no KL / top-1 (see e2e.txt)"
elif ! cmp -s "$work/hybrid1.lp" "$work/hybrid2.lp"; then
  row "end to end" FAIL "median KL $kl, same top-1 $top %, but two hybrid runs differ"
elif ! awk -v k="$kl" 'BEGIN { exit !(k < 1e-3) }'; then
  row "end to end" FAIL "median KL $kl (>= 1e-3), same top-1 $top %"
elif ((!dry)) && [ "${peak:-0}" -gt "$half_mib" ]; then
  row "end to end" FAIL "median KL $kl, same top-1 $top %, but the process took $peak MiB of a $half_mib MiB budget$context"
else
  row "end to end" ok "median KL $kl, same top-1 $top %, two hybrid runs bit-identical, process GPU memory ${peak} MiB <= budget $half_mib MiB$context"
fi

# ---- 5. speed on a 7B shape: all-CPU, the hybrid at three budgets, the layer split, all-GPU ------
# PowerInfer's layout (neuron-major ffn_down_t in the file's type, predictors), a context of 256:
# the model's predictors everywhere (PowerInfer's way), and the oracle rule (the gate decides, on
# each side) for all-CPU, the hybrid and the layer split at 50 %.
if ((dry)); then preset7=tiny; else preset7=${EMBER_GPU_BENCH_PRESET:-7b}; fi
model7=$work/relu7b.gguf
sampler=""
if late; then
  row "bench" skip "out of time ($(($(date +%s) - start)) s)"
else
  timeout 150 "$ember" synth --preset "$preset7" --act relu --sparsity 0.9 --gate-rank 32 --type "$bench_type" \
    --powerinfer -o "$model7" >"$out/bench.txt" 2>&1
  if ((!dry)); then
    nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv -lms 250 >"$out/memory.csv" 2>&1 &
    sampler=$!
  else
    echo "dry run: no GPU memory to sample" >"$out/memory.csv"
  fi
  bench() {  # name flags...: the median generation tok/s, or -
    local name=$1
    shift
    if late; then echo "-"; return; fi
    echo "== $name: $*" >>"$out/bench.txt"
    timeout 60 "$ember" bench -m "$model7" -c 256 -p 32 -n 16 -r 3 --json "$work/$name.json" "$@" \
      >>"$out/bench.txt" 2>&1
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.2f' % d['tg16']['median'])" \
      "$work/$name.json" 2>/dev/null || echo "-"
  }
  breakdown() {  # name: the hybrid run's decode time per token (ember bench's "hybrid" record), or -
    python3 -c "import json,sys; h=json.load(open(sys.argv[1]))['hybrid']; print('CPU FFN %.2f ms, wait %.2f, device %.2f, CPU layers %.2f, %.0f%% fired on the device' % (h['cpu_ffn_ms_per_token'], h['wait_ms_per_token'], h['device_block_ms_per_token'], h['cpu_layer_ms_per_token'], 100 * h['device_fired_share']))" \
      "$work/$1.json" 2>/dev/null || echo "-"
  }
  bytes7=$(stat -c %s "$model7" 2>/dev/null || echo 0)
  budget() { echo $((bytes7 * $1 / 100 + reserve)); }
  speeds="$bench_type"
  for mode in predictor oracle; do
    cpu_tg=$(bench "cpu-$mode" --sparse-mode "$mode")
    speeds="$speeds; $mode: all-CPU $cpu_tg"
    fracs="25 50 75"
    [ "$mode" = oracle ] && fracs=50
    for frac in $fracs; do
      t=$(bench "h$frac-$mode" --sparse-mode "$mode" --vram-budget "$(budget "$frac")" --plan-method greedy \
        --hybrid-device "$device")
      speeds="$speeds, hybrid $frac% $t"
      [ "$frac" = 50 ] && h50=$t
    done
    split_tg=$(bench "split50-$mode" --sparse-mode "$mode" --vram-budget "$(budget 50)" --plan-method layer-split \
      --hybrid-device "$device")
    ratio=$(awk -v h="$h50" -v s="$split_tg" 'BEGIN { if (h + 0 > 0 && s + 0 > 0) printf "%.2f", h / s; else print "-" }')
    speeds="$speeds, layer split 50% $split_tg (hybrid / layer split ${ratio}x)"
    [ "$mode" = predictor ] && pred_ratio=$ratio && pred_h50=$h50 && pred_split=$split_tg && pred_cpu=$cpu_tg
    speeds="$speeds; per decode token at 50 %: hybrid $(breakdown "h50-$mode"), layer split $(breakdown "split50-$mode")"
  done
  if ((dry)); then gpu_tg="-"; else
    gpu_tg=$(bench gpu --sparse-mode predictor --vram-budget auto --plan-method greedy --hybrid-device "$device")
  fi
  speeds="$speeds; all-GPU $gpu_tg (generation tok/s, medians of 3)"
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  if [ "$pred_cpu" = "-" ] || [ "$pred_h50" = "-" ] || [ "$pred_split" = "-" ]; then
    row "bench" FAIL "$speeds (see bench.txt)"
  else
    peak=""
    ((dry)) || peak=$(awk -F', ' 'NR > 1 && $2 ~ /MiB/ {v = $2 + 0; if (v > m) m = v} END {print m + 0}' "$out/memory.csv")
    row "bench" ok "$speeds; target: hybrid / layer split at 50 % >= 3x with predictors: ${pred_ratio}x${peak:+; peak memory.used $peak MiB}"
  fi
fi

# ---- 6. the summary --------------------------------------------------------------------------
{
  echo "Ember GPU run$( ((dry)) && echo " (dry run: CPU stand-in, tiny model)"), $(date -u +%Y-%m-%dT%H:%M:%SZ), ${gpu:-no GPU}, $(($(date +%s) - start)) s"
  echo "| step | status | detail |"
  echo "| --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
} >"$out/summary.txt"
cat "$out/summary.txt"
exit "$failed"
