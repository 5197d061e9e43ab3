#!/usr/bin/env bash
# Everything GPU-related in one command, on a GPU machine with a pack from scripts/gpu_pack.sh,
# each part under 9 minutes (each step under `timeout`, a step that would start past the deadline
# skipped and said so), its report in OUTDIR:
#
#   part a (the default): correctness, kernels, the 7B shape
#   env.txt        nvidia-smi, and whether every library of the programs resolves
#   tests.xml/.log the CUDA and hybrid tests (JUnit); a skipped CUDA test fails the step here
#   sanitizer.txt  compute-sanitizer memcheck and racecheck on the CUDA op tests
#   kernels.txt/.json  ember-cuda-kernels: each kernel's microseconds and GB/s on 7B shapes
#                  against the card's device-to-device copy rate (issue 43: the 4096 x 11008 Q4_0
#                  matvec at >= 75 %)
#   e2e.txt        a 1.1B-shape synth ReLU model made here: KL divergence and top-1 agreement of the
#                  hybrid (--hybrid-device cuda, attention and hot neurons on the GPU) against
#                  all-CPU over a few hundred positions, two hybrid runs bit-identical, and the
#                  process's GPU memory (nvidia-smi, every process of the command) against its
#                  budget: CUDA's context measured
#   bench.txt      ember bench on a 7B-shape synth ReLU model (90 % sparse, Q4_0, or Q4_K / F16
#                  with --bench-type q4_k / f16; PowerInfer's layout, context 1024), with the model's
#                  predictors: all-CPU, the hybrid at 25 / 50 / 75 % of the model's bytes (plus
#                  CUDA's context: the budgets are of the process), the layer split at 50 %
#                  (whole layers, as llama.cpp's -ngl), all-GPU (--vram-budget auto) for decode and
#                  a 512-token prompt (pp512; also dense, with the tiles on tensor cores and with
#                  EMBER_CUDA_TILES=dp4a), all-GPU dense; with the oracle rule: all-CPU, hybrid
#                  and layer split at 50 %; each hybrid run's time breakdown and the device's counts
#                  per decode step (kernel launches, graph replays, host waits, bytes each way)
#   profile.txt    ncu's time of every kernel over two all-GPU decode tokens of the 7B shape, summed
#                  by kernel (scripts/ncu_table.py), launched one by one (EMBER_CUDA_GRAPHS=0)
#   memory.csv     nvidia-smi's memory.used sampled during the benchmarks
#   part b (--part b): the large shapes
#   large.txt      a 33B shape (6656 / 17920 / 60 layers) at half its bytes (hybrid, layer split)
#                  and all on the GPU; a 70B shape (8192 / 28672 / 80 layers, 8 KV heads) at a
#                  24 GiB budget (an RTX 4090's, the paper's setting: hybrid, layer split); the 7B
#                  shape in F16, all-GPU and at half its bytes; a mixture (the Qwen3-30B-A3B shape
#                  cut to 24 layers, Q4_0): all-CPU, the hybrid's experts and layer split at half
#                  its bytes, llama.cpp's --n-cpu-moe beside it
#   summary.txt    one row per step, printed last (both parts)
#
#   scripts/gpu_run.sh [--part a|b] OUTDIR   on the GPU machine (the pack in gpu-pack/ or $EMBER_PACK;
#                                            EMBER_GPU_E2E_PRESET / EMBER_GPU_BENCH_PRESET: the synth
#                                            presets of the e2e and 7B steps, 1.1b and 7b by default)
#   scripts/gpu_run.sh --dry-run [--part a|b] OUTDIR
#                                            the same steps on the CPU stand-in device with tiny
#                                            models and build/'s programs: what CI runs, so that the
#                                            script is known to work before a GPU is there
# Optionally, llama.cpp side by side: a llama-bench built outside this repository, in
# $EMBER_LLAMACPP (a folder with llama-bench and its libraries), runs on the same files.
set -uo pipefail
dry=0
bench_type=q4_0
part=a
while [ $# -gt 1 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --bench-type) bench_type=$2; shift 2 ;;
    --part) part=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: scripts/gpu_run.sh [--dry-run] [--part a|b] [--bench-type q4_0|q4_k|f16] OUTDIR" >&2; exit 2; }
[[ "$bench_type" =~ ^(q4_0|q4_k|f16)$ ]] || { echo "gpu_run: --bench-type is q4_0, q4_k or f16" >&2; exit 2; }
[[ "$part" =~ ^(a|b)$ ]] || { echo "gpu_run: --part is a or b" >&2; exit 2; }
out=$1
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
pack=${EMBER_PACK:-gpu-pack}
if ((dry)) && [ ! -d "$pack" ]; then bin=build; else bin=$pack/bin; fi
[ -d "$pack/lib" ] && export LD_LIBRARY_PATH="$(cd "$pack/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ember=$bin/ember
tests=$bin/ember-tests
kernels=$bin/ember-cuda-kernels
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
# Budgets are of the process: a share of the model's bytes for the plan, plus what CUDA's context
# takes by itself (kCudaContextReserve in src/device/device.hpp, read from there: one number).
reserve_mib=$(grep -o 'kCudaContextReserve = uint64_t{[0-9]*} << 20' src/device/device.hpp | grep -o '{[0-9]*}' | tr -d '{}')
[ -n "$reserve_mib" ] || { echo "gpu_run: kCudaContextReserve not found in src/device/device.hpp" >&2; exit 2; }
reserve=$((reserve_mib * 1048576))
((dry)) && reserve=0
cat README.md docs/*.md >"$work/text.txt"

# The peak GPU memory (MiB, nvidia-smi) of a command's processes (the command and its children:
# `timeout` runs ember as its child), sampled while it runs; "$@" runs as given.
peak_process_mib() {  # out-file command...
  local f=$1 pid sampler
  shift
  "$@" &
  pid=$!
  if ((dry)); then wait "$pid"; echo 0 >"$f"; return; fi
  (while kill -0 "$pid" 2>/dev/null; do
     pids=" $pid $(pgrep -P "$pid" | tr '\n' ' ')"
     nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
       awk -F', ' -v p="$pids" 'index(p, " " $1 " ") {s += $2} END {print s + 0}'
     sleep 0.2
   done) >"$f.samples" &
  sampler=$!
  wait "$pid"
  wait "$sampler" 2>/dev/null
  sort -n "$f.samples" | tail -1 >"$f"
}
# One `ember bench` run: the median generation (or prompt) tok/s, or -; its JSON in $work/NAME.json.
bench_model=""
bench() {  # name test(tg16|pp512) flags...
  local name=$1 test=$2
  shift 2
  if late; then echo "-"; return; fi
  echo "== $name: $*" >>"$bench_log"
  timeout 90 "$ember" bench -m "$bench_model" -c 1024 -r 3 --json "$work/$name.json" "$@" >>"$bench_log" 2>&1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.2f' % d[sys.argv[2]]['median'])" \
    "$work/$name.json" "$test" 2>/dev/null || echo "-"
}
# A hybrid run's decode per token and its device counts (ember bench's "hybrid" record), or -.
breakdown() {  # name
  python3 - "$work/$1.json" <<'PY' 2>/dev/null || echo "-"
import json, sys
h = json.load(open(sys.argv[1]))['hybrid']
share = ('%.0f%% of the experts\' runs' % (100 * h['device_expert_share']) if h.get('device_expert_share')
         else '%.0f%% fired' % (100 * h['device_fired_share']))
print('CPU FFN %.2f ms, wait %.2f, device %.2f, CPU layers %.2f, %s on the device; per step %.0f launches, '
      '%.1f graphs, %.1f host waits, %.1f KiB in, %.1f KiB out' % (
      h['cpu_ffn_ms_per_token'], h['wait_ms_per_token'], h['device_block_ms_per_token'], h['cpu_layer_ms_per_token'],
      share, h['launches_per_step'], h['graphs_per_step'], h['host_waits_per_step'],
      h['bytes_in_per_step'] / 1024, h['bytes_out_per_step'] / 1024))
PY
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-" }'; }
synth() {  # out-file flags...: a PowerInfer-layout ReLU synth, 90 % sparse
  local f=$1
  shift
  timeout 200 "$ember" synth --act relu --sparsity 0.9 --gate-rank 32 --powerinfer -o "$f" "$@" 2>&1 | tail -1
}
llamacpp() {  # model flags...: llama-bench's tg16 t/s beside Ember's, or -
  local m=$1
  shift
  [ -n "${EMBER_LLAMACPP:-}" ] && [ -x "$EMBER_LLAMACPP/llama-bench" ] && ! late || { echo "-"; return; }
  LD_LIBRARY_PATH="$EMBER_LLAMACPP:${LD_LIBRARY_PATH:-}" timeout 120 "$EMBER_LLAMACPP/llama-bench" -m "$m" -p 0 \
    -n 16 -r 3 -o json "$@" 2>>"$bench_log" |
    python3 -c "import json,sys; print('%.2f' % json.load(sys.stdin)[0]['avg_ts'])" 2>/dev/null || echo "-"
}

# ---- 1. the machine and the libraries --------------------------------------------------------
{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm), $(nproc) cores, part $part"
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

if [ "$part" = a ]; then
# ---- 2. the CUDA and hybrid tests ------------------------------------------------------------
timeout 240 "$tests" --gtest_filter='CudaOps.*:HybridExecutor.*:*FfnContract*:Blocks.*' \
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
ops='CudaOps.MatvecAndGatherMatchReference:CudaOps.FiringShareMatchesTheCpuRule:CudaOps.PredictorSelectionMatchesTheCpu:CudaOps.AttentionBlockKernelsMatchTheCpu'
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
    if [ "$r" -eq 0 ]; then row "sanitizer $tool" ok "$(grep "ERROR SUMMARY" "$out/sanitizer.txt" | tail -1)"
    else row "sanitizer $tool" FAIL "exit $r, see sanitizer.txt"; fi
  done
fi

# ---- 4. the kernels against the card's bandwidth ---------------------------------------------
if ((dry)); then
  echo "dry run: the kernel benchmark needs a GPU" >"$out/kernels.txt"
  row "kernels" skip "dry run"
elif [ ! -x "$kernels" ]; then
  row "kernels" FAIL "$kernels is missing (scripts/gpu_pack.sh builds it)"
else
  timeout 120 "$kernels" --json "$out/kernels.json" >"$out/kernels.txt" 2>&1
  mv_share=$(grep -m1 "matvec Q4_0 .*gate/up 11008 x 4096, 1 token" "$out/kernels.txt" | awk -F'|' '{gsub(/[ %]/, "", $7); print $7}')
  copy=$(grep -m1 -o "copy [0-9.]* GB/s" "$out/kernels.txt")
  if [ -z "$mv_share" ]; then row "kernels" FAIL "no result (see kernels.txt)"
  else row "kernels" ok "device-to-device $copy; Q4_0 matvec 11008 x 4096 at ${mv_share} % of it (target >= 75 %); kernels.txt has every kernel"; fi
fi

# ---- 5. end to end: a synth ReLU model made here ---------------------------------------------
if ((dry)); then preset=tiny; chunks=4; ctx=64; else preset=${EMBER_GPU_E2E_PRESET:-1.1b}; chunks=6; ctx=128; fi
model=$work/relu.gguf
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
    echo "process GPU memory (nvidia-smi, peak of its processes): $(cat "$work/peak$run") MiB of a budget of $((half / 1048576)) MiB"
  done
} >"$out/e2e.txt" 2>&1
kl=$(grep -m1 "Median  KLD" "$out/e2e.txt" | awk '{print $NF}')
top=$(grep -m1 "Same top p" "$out/e2e.txt" | awk '{print $5}')
peak=$(cat "$work/peak1" 2>/dev/null || echo 0)
arena=$(grep -m1 -o "the plan's arena [0-9.]* MiB" "$work/hybrid1.log" 2>/dev/null | awk '{print $4}')
half_mib=$((($(stat -c %s "$model" 2>/dev/null || echo 0) / 2 + reserve) / 1048576))
context=""
[ -n "$arena" ] && ((!dry)) && context="; CUDA's context and modules: $(awk -v p="$peak" -v a="$arena" 'BEGIN {printf "%.0f", p - a}') MiB (process $peak MiB - arena $arena MiB; kCudaContextReserve $reserve_mib MiB)"
if [ -z "$kl" ] || [ -z "$top" ]; then
  row "end to end" FAIL "no KL / top-1 (see e2e.txt)"
elif ! cmp -s "$work/hybrid1.lp" "$work/hybrid2.lp"; then
  row "end to end" FAIL "median KL $kl, same top-1 $top %, but two hybrid runs differ"
elif ! awk -v k="$kl" 'BEGIN { exit !(k < 1e-3) }'; then
  row "end to end" FAIL "median KL $kl (>= 1e-3), same top-1 $top %"
elif ((!dry)) && [ "${peak:-0}" -eq 0 ]; then
  row "end to end" FAIL "median KL $kl, same top-1 $top %, but nvidia-smi showed no memory of the process"
elif ((!dry)) && [ "${peak:-0}" -gt "$half_mib" ]; then
  row "end to end" FAIL "median KL $kl, same top-1 $top %, but the process took $peak MiB of a $half_mib MiB budget$context"
else
  row "end to end" ok "median KL $kl, same top-1 $top %, two hybrid runs bit-identical, process GPU memory ${peak} MiB <= budget $half_mib MiB$context"
fi

# ---- 6. speed on a 7B shape: all-CPU, the hybrid at three budgets, the layer split, all-GPU ------
if ((dry)); then preset7=tiny; else preset7=${EMBER_GPU_BENCH_PRESET:-7b}; fi
bench_model=$work/relu7b.gguf
bench_log=$out/bench.txt
sampler=""
if late; then
  row "bench" skip "out of time ($(($(date +%s) - start)) s)"
else
  kshape=()  # the tiny preset's rows are shorter than a K-quant's 256-value super-block
  ((dry)) && [ "$bench_type" = q4_k ] && kshape=(--n-embd 256 --n-ff 768)
  synth "$bench_model" --preset "$preset7" "${kshape[@]}" --type "$bench_type" >"$bench_log"
  if ((!dry)); then
    nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv -lms 250 >"$out/memory.csv" 2>&1 &
    sampler=$!
  else
    echo "dry run: no GPU memory to sample" >"$out/memory.csv"
  fi
  bytes7=$(stat -c %s "$bench_model" 2>/dev/null || echo 0)
  budget() { echo $((bytes7 * $1 / 100 + reserve)); }
  tg=(-p 0 -n 16)
  speeds="$bench_type"
  for mode in predictor oracle; do
    cpu_tg=$(bench "cpu-$mode" tg16 "${tg[@]}" --sparse-mode "$mode")
    speeds="$speeds; $mode: all-CPU $cpu_tg"
    fracs="25 50 75"
    [ "$mode" = oracle ] && fracs=50
    for frac in $fracs; do
      t=$(bench "h$frac-$mode" tg16 "${tg[@]}" --sparse-mode "$mode" --vram-budget "$(budget "$frac")" \
        --plan-method greedy --hybrid-device "$device")
      speeds="$speeds, hybrid $frac% $t"
      [ "$frac" = 50 ] && h50=$t
    done
    split_tg=$(bench "split50-$mode" tg16 "${tg[@]}" --sparse-mode "$mode" --vram-budget "$(budget 50)" \
      --plan-method layer-split --hybrid-device "$device")
    r=$(ratio "$h50" "$split_tg")
    speeds="$speeds, layer split 50% $split_tg (hybrid / layer split ${r}x)"
    [ "$mode" = predictor ] && pred_ratio=$r && pred_h50=$h50 && pred_split=$split_tg && pred_cpu=$cpu_tg
    speeds="$speeds; per decode token at 50 %: hybrid $(breakdown "h50-$mode"), layer split $(breakdown "split50-$mode")"
  done
  # All on the device (every layer and the head, as llama.cpp's -ngl 99; the stand-in's auto is
  # the host's free memory): decode with predictors and dense, and a 512-token prompt.
  all=(--vram-budget auto --plan-method layer-split --hybrid-device "$device")
  gpu_tg=$(bench gpu tg16 "${tg[@]}" --sparse-mode predictor "${all[@]}")
  gpu_dense=$(bench gpu-dense tg16 "${tg[@]}" --sparse-mode dense "${all[@]}")
  pp=(-p 512 -n 0)
  ((dry)) && pp=(-p 64 -n 0)
  gpu_pp=$(bench gpu-pp pp"${pp[1]}" "${pp[@]}" --sparse-mode predictor "${all[@]}")
  # Dense prompts through the tiles, on tensor cores (the default from compute capability 8.0) and
  # with dp4a: what mma gives.
  gpu_pp_dense=$(bench gpu-pp-dense pp"${pp[1]}" "${pp[@]}" --sparse-mode dense "${all[@]}")
  gpu_pp_dp4a=$(EMBER_CUDA_TILES=dp4a bench gpu-pp-dp4a pp"${pp[1]}" "${pp[@]}" --sparse-mode dense "${all[@]}")
  l_gpu=$(llamacpp "$bench_model" -ngl 99)
  l_split=$(llamacpp "$bench_model" -ngl 16)
  speeds="$speeds; all-GPU $gpu_tg with predictors ($(breakdown gpu)), $gpu_dense dense, pp${pp[1]} $gpu_pp"
  speeds="$speeds (dense $gpu_pp_dense, dense with dp4a tiles $gpu_pp_dp4a: mma / dp4a $(ratio "$gpu_pp_dense" "$gpu_pp_dp4a")x)"
  [ "$l_gpu" != "-" ] && speeds="$speeds; llama.cpp all-GPU $l_gpu (Ember / llama.cpp $(ratio "$gpu_tg" "$l_gpu")x), -ngl 16 $l_split (hybrid 50 % / it $(ratio "$pred_h50" "$l_split")x)"
  speeds="$speeds (generation tok/s, medians of 3)"
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  if [ "$pred_cpu" = "-" ] || [ "$pred_h50" = "-" ] || [ "$pred_split" = "-" ] || [ "$gpu_tg" = "-" ]; then
    row "bench" FAIL "$speeds (see bench.txt)"
  else
    peak=""
    ((dry)) || peak=$(awk -F', ' 'NR > 1 && $2 ~ /MiB/ {v = $2 + 0; if (v > m) m = v} END {print m + 0}' "$out/memory.csv")
    row "bench" ok "$speeds; target: hybrid / layer split at 50 % >= 3x with predictors: ${pred_ratio}x${peak:+; peak memory.used $peak MiB}"
  fi
fi

# ---- 7. where an all-GPU decode token's time goes: ncu, by kernel ----------------------------
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if ((dry)); then
  echo "dry run: ncu needs a GPU" >"$out/profile.txt"
  row "profile" skip "dry run"
elif late || [ ! -x "$ncu" ] || [ ! -f "$bench_model" ]; then
  row "profile" skip "$( [ -x "$ncu" ] || echo "no ncu; ")$( late && echo "out of time")"
else
  # The warm-up repetition's tokens are skipped (about 600 launches a token), then two tokens.
  EMBER_CUDA_GRAPHS=0 timeout 150 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
    --launch-skip 3000 --launch-count 1300 "$ember" bench -m "$bench_model" -c 1024 -p 0 -n 12 -r 1 \
    --sparse-mode predictor --vram-budget auto --plan-method layer-split --hybrid-device cuda \
    >"$work/ncu.csv" 2>"$work/ncu.err"
  n_layer=$(timeout 30 "$ember" inspect "$bench_model" --json 2>/dev/null | python3 -c "import json, sys
print(next(m['value'] for m in json.load(sys.stdin)['metadata'] if m['key'].endswith('.block_count')))" 2>/dev/null || echo 32)
  python3 scripts/ncu_table.py "$work/ncu.csv" "$n_layer" >"$out/profile.txt" 2>&1
  if grep -q "^| total" "$out/profile.txt"; then row "profile" ok "$(grep "^per token" "$out/profile.txt")"
  else row "profile" FAIL "no kernels profiled (see profile.txt)"; tail -5 "$work/ncu.err" >>"$out/profile.txt"; fi
fi
fi  # part a

if [ "$part" = b ]; then
# ---- 8. the large shapes: 33B at half its bytes, 70B at 24 GiB, 7B in F16 ---------------------
bench_log=$out/large.txt
: >"$bench_log"
large() {  # label synth-flags... -- bench budgets (fractions %, or NNGiB)...
  local label=$1
  shift
  local flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  if late; then row "$label" skip "out of time"; return; fi
  bench_model=$work/$label.gguf
  echo "== $label: synth ${flags[*]}" >>"$bench_log"
  synth "$bench_model" "${flags[@]}" >>"$bench_log"
  local bytes res="" b
  bytes=$(stat -c %s "$bench_model" 2>/dev/null || echo 0)
  for b in "$@"; do
    local v
    case "$b" in
      *GiB) v=$((${b%GiB} * 1073741824)) ;;
      auto) v=auto ;;
      *) v=$((bytes * b / 100 + reserve)) ;;
    esac
    local budget=(--vram-budget "$v")
    local h s
    if [ "$b" = auto ]; then
      h=$(bench "$label-gpu" tg16 -p 0 -n 16 --sparse-mode predictor --plan-method layer-split --hybrid-device "$device" "${budget[@]}")
      res="$res; all-GPU $h ($(breakdown "$label-gpu"))"
      continue
    fi
    h=$(bench "$label-h$b" tg16 -p 0 -n 16 --sparse-mode predictor --plan-method greedy --hybrid-device "$device" "${budget[@]}")
    s=$(bench "$label-s$b" tg16 -p 0 -n 16 --sparse-mode predictor --plan-method layer-split --hybrid-device "$device" "${budget[@]}")
    res="$res; at $b: hybrid $h, layer split $s ($(ratio "$h" "$s")x), per token $(breakdown "$label-h$b")"
  done
  rm -f "$bench_model"
  row "$label" ok "${res#; }"
}
if ((dry)); then
  large 33b --preset tiny --n-layer 4 --type q4_0 -- 50 auto
  large 70b --preset tiny --n-head-kv 1 --type q4_0 -- 50
  large 7b-f16 --preset tiny --type f16 -- 50 auto
else
  large 33b --preset 7b --n-embd 6656 --n-ff 17920 --n-layer 60 --n-head 52 --n-head-kv 52 --type q4_0 -- 50 auto
  large 70b --preset 7b --n-embd 8192 --n-ff 28672 --n-layer 80 --n-head 64 --n-head-kv 8 --type q4_0 -- 24GiB
  large 7b-f16 --preset 7b --type f16 -- 50 auto
fi
# ---- 9. a mixture: the Qwen3-30B-A3B shape (cut to 24 layers), its experts placed whole --------
# All-CPU, the hybrid (the greedy plan: attention and the most routed experts on the GPU) and the
# layer split at half the file's bytes; llama.cpp with every layer on the GPU but the experts of
# the first half of the layers on the CPU (--n-cpu-moe), the same split by another rule.
moe_step() {  # label n_layer synth-flags...
  local label=$1 n_layer=$2
  shift 2
  if late; then row "$label" skip "out of time"; return; fi
  bench_model=$work/$label.gguf
  echo "== $label: synth $*" >>"$bench_log"
  timeout 300 "$ember" synth --n-layer "$n_layer" "$@" -o "$bench_model" 2>&1 | tail -1 >>"$bench_log"
  local bytes v c h s l
  bytes=$(stat -c %s "$bench_model" 2>/dev/null || echo 0)
  v=$((bytes / 2 + reserve))
  c=$(bench "$label-cpu" tg16 -p 0 -n 16)
  h=$(bench "$label-h50" tg16 -p 0 -n 16 --plan-method greedy --hybrid-device "$device" --vram-budget "$v")
  s=$(bench "$label-s50" tg16 -p 0 -n 16 --plan-method layer-split --hybrid-device "$device" --vram-budget "$v")
  l=$(llamacpp "$bench_model" -ngl 99 -ncmoe $((n_layer / 2)))
  rm -f "$bench_model"
  row "$label" ok "tg16 all-CPU $c; at 50 %: hybrid $h ($(ratio "$h" "$c")x CPU), layer split $s ($(ratio "$h" "$s")x), llama.cpp --n-cpu-moe $((n_layer / 2)) $l ($(ratio "$h" "$l")x); hybrid per token $(breakdown "$label-h50")"
}
if ((dry)); then
  moe_step moe-qwen3 4 --preset tiny --arch qwen3moe --n-expert 8 --n-expert-used 2 --n-ff 64 --type q4_0
else
  moe_step moe-qwen3 24 --arch qwen3moe --n-embd 2048 --n-ff 768 --n-expert 128 --n-expert-used 8 --n-head 32 \
    --n-head-kv 4 --head-dim 128 --n-vocab 32000 --type q4_0
fi
fi  # part b

# ---- the summary -------------------------------------------------------------------------------
{
  echo "Ember GPU run, part $part$( ((dry)) && echo " (dry run: CPU stand-in, tiny models)"), $(date -u +%Y-%m-%dT%H:%M:%SZ), ${gpu:-no GPU}, $(($(date +%s) - start)) s"
  echo "| step | status | detail |"
  echo "| --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
} >"$out/summary.txt"
cat "$out/summary.txt"
exit "$failed"
