#!/usr/bin/env bash
# Everything GPU-related in one command, on a GPU machine with a pack from scripts/gpu_pack.sh,
# in under 9 minutes (each step under `timeout`), its report in OUTDIR (8 files at most):
#   env.txt        nvidia-smi, and whether every library of the two programs resolves
#   tests.xml/.log the CUDA and hybrid tests (JUnit); a skipped CUDA test fails the step here
#   sanitizer.txt  compute-sanitizer memcheck and racecheck on the CUDA op tests
#   e2e.txt        a synth ReLU model made here: KL divergence and top-1 agreement of the hybrid
#                  (--hybrid-device cuda) against all-CPU over a few hundred positions, and two
#                  hybrid runs bit-identical
#   bench.txt      ember bench, all-CPU against the hybrid at two budgets
#   memory.csv     nvidia-smi's memory.used sampled during the benchmarks
#   summary.txt    one row per step, printed last
#   scripts/gpu_run.sh OUTDIR            on the GPU machine (the pack in gpu-pack/ or $EMBER_PACK)
#   scripts/gpu_run.sh --dry-run OUTDIR  the same steps on the CPU stand-in device with a tiny model
#                                        and build/'s programs: what CI runs, so that the script is
#                                        known to work before a GPU is there
set -uo pipefail
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
[ $# -eq 1 ] || { echo "usage: scripts/gpu_run.sh [--dry-run] OUTDIR" >&2; exit 2; }
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
ops='CudaOps.MatvecAndGatherMatchReference:CudaOps.FireGateMulAxpyAndAddMatchReference:CudaOps.PredictorSelectionAndCountedFireMatchTheCpu'
if ((dry)); then
  echo "dry run: compute-sanitizer needs a GPU" >"$out/sanitizer.txt"
  row "sanitizer" skip "dry run"
else
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  : >"$out/sanitizer.txt"
  for tool in memcheck racecheck; do
    echo "== $tool" >>"$out/sanitizer.txt"
    timeout 150 "$san" --tool "$tool" --error-exitcode 1 "$tests" --gtest_filter="$ops" >>"$out/sanitizer.txt" 2>&1
    r=$?
    if [ "$r" -eq 0 ]; then row "sanitizer $tool" ok "$(grep -m1 "ERROR SUMMARY" "$out/sanitizer.txt" | tail -1)"
    else row "sanitizer $tool" FAIL "exit $r, see sanitizer.txt"; fi
  done
fi

# ---- 4. end to end: a synth ReLU model made here ---------------------------------------------
if ((dry)); then preset=tiny; chunks=4; ctx=64; else preset=1.1b; chunks=6; ctx=128; fi
model=$work/relu.gguf
cat README.md docs/*.md >"$work/text.txt"
{
  echo "== model: ember synth --preset $preset --act relu --sparsity 0.9 --type q4_0"
  timeout 120 "$ember" synth --preset "$preset" --act relu --sparsity 0.9 --gate-rank 32 --type q4_0 -o "$model" 2>&1 | tail -2
  bytes=$(stat -c %s "$model" 2>/dev/null || echo 0)
  half=$((bytes / 2))
  echo "== all-CPU (oracle), $chunks chunks of $ctx"
  timeout 120 "$ember" perplexity -m "$model" -f "$work/text.txt" -c "$ctx" --chunks "$chunks" --sparse-mode oracle \
    --save-logits "$work/cpu.lp" 2>&1 | tail -3
  for run in 1 2; do
    echo "== hybrid run $run: --vram-budget $half --hybrid-device $device"
    timeout 120 "$ember" perplexity -m "$model" -f "$work/text.txt" -c "$ctx" --chunks "$chunks" --vram-budget "$half" \
      --hybrid-device "$device" --kl-base "$work/cpu.lp" --save-logits "$work/hybrid$run.lp" 2>&1 |
      grep -E "hybrid|CUDA|KLD|top|error|PPL" | tail -14
  done
} >"$out/e2e.txt" 2>&1
kl=$(grep -m1 "Median  KLD" "$out/e2e.txt" | awk '{print $NF}')
top=$(grep -m1 "Same top p" "$out/e2e.txt" | awk '{print $5}')
if [ -z "$kl" ] || [ -z "$top" ]; then
  row "end to end" FAIL "no KL / top-1 (see e2e.txt)"
elif ! cmp -s "$work/hybrid1.lp" "$work/hybrid2.lp"; then
  row "end to end" FAIL "median KL $kl, same top-1 $top %, but two hybrid runs differ"
elif awk -v k="$kl" 'BEGIN { exit !(k < 1e-3) }'; then
  row "end to end" ok "median KL $kl, same top-1 $top %, two hybrid runs bit-identical"
else
  row "end to end" FAIL "median KL $kl (>= 1e-3), same top-1 $top %"
fi

# ---- 5. speed: all-CPU against the hybrid at two budgets -------------------------------------
sampler=""
if ((!dry)); then
  nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv -lms 250 >"$out/memory.csv" 2>&1 &
  sampler=$!
else
  echo "dry run: no GPU memory to sample" >"$out/memory.csv"
fi
: >"$out/bench.txt"
bench() {  # name flags...
  local name=$1
  shift
  timeout 90 "$ember" bench -m "$model" -p 64 -n 32 -r 3 --json "$work/$name.json" "$@" >>"$out/bench.txt" 2>&1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.1f %.1f' % (d['pp64']['median'], d['tg32']['median']))" \
    "$work/$name.json" 2>/dev/null || echo "- -"
}
read -r cpu_pp cpu_tg < <(bench cpu --sparse-mode oracle)
speeds="all-CPU pp $cpu_pp tg $cpu_tg"
for frac in 25 50; do
  budget=$(($(stat -c %s "$model" 2>/dev/null || echo 0) * frac / 100))
  read -r pp tg < <(bench "h$frac" --vram-budget "$budget" --hybrid-device "$device")
  speeds="$speeds; hybrid $frac% pp $pp tg $tg"
done
[ -n "$sampler" ] && kill "$sampler" 2>/dev/null
if grep -q "^- -" <<<"$(echo "$cpu_pp $cpu_tg")" || [[ "$speeds" == *" - "* ]]; then
  row "bench" FAIL "$speeds (see bench.txt)"
else
  peak=""
  ((dry)) || peak=$(awk -F', ' 'NR > 1 && $2 ~ /MiB/ {v = $2 + 0; if (v > m) m = v} END {print m + 0}' "$out/memory.csv")
  row "bench" ok "$speeds (tok/s)${peak:+; peak memory.used $peak MiB}"
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
