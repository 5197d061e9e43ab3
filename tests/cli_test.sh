#!/usr/bin/env bash
# End-to-end checks of the `ember` program: each subcommand on real and synthetic models, and
# bad input (files, flags) giving a clear error and a non-zero exit, never a crash.
#   tests/cli_test.sh path/to/ember [models-dir]
set -uo pipefail
ember=$1
models=${2:-$(dirname "$0")/../models}
smol=$models/SmolLM2-135M-Instruct.Q4_1.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0

pass() { passes=$((passes + 1)); }
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect_ok NAME CMD...: exit 0
expect_ok() {
  local name=$1; shift
  if "$@" >"$tmp/out" 2>"$tmp/err"; then pass; else fail "$name (exit $?): $(tail -3 "$tmp/err")"; fi
}
# expect_error NAME PATTERN CMD...: a non-zero exit that is not a signal and stderr matching PATTERN
expect_error() {
  local name=$1 pattern=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then fail "$name: exit $rc, expected an error exit (not 0, not a signal)"; return; fi
  if grep -qiE "$pattern" "$tmp/err" "$tmp/out"; then pass; else fail "$name: message does not match '$pattern': $(head -3 "$tmp/err")"; fi
}
contains() {  # NAME FILE PATTERN
  if grep -qE "$3" "$2"; then pass; else fail "$1: '$3' not found in $(head -c 300 "$2")"; fi
}

expect_ok "help" "$ember" --help
contains "help lists generate" "$tmp/out" "generate"

# Synthetic model: synth -> inspect -> generate -> bench.
expect_ok "synth tiny" "$ember" synth --preset tiny --type q4_0 -o "$tmp/tiny.gguf"
expect_ok "inspect tiny" "$ember" inspect "$tmp/tiny.gguf"
contains "inspect shows tensors" "$tmp/out" "blk\.0\.ffn_gate\.weight"
contains "inspect shows the type" "$tmp/out" "Q4_0"
expect_ok "inspect json" "$ember" inspect --json "$tmp/tiny.gguf"
python3 -c "import json,sys; d=json.load(open('$tmp/out')); assert len(d['tensors']) > 10" && pass || fail "inspect --json is not valid JSON with tensors"
expect_ok "generate on synth" "$ember" generate -m "$tmp/tiny.gguf" -p "hello world" -n 8 --temp 0
contains "timing line" "$tmp/err" "generation: [0-9]+ tokens"
expect_ok "bench on synth" "$ember" bench -m "$tmp/tiny.gguf" -p 16 -n 8 -r 2 --bandwidth --json "$tmp/bench.json"
python3 -c "import json; d=json.load(open('$tmp/bench.json')); assert d['tg8']['median'] > 0 and d['pp16']['median'] > 0" \
  && pass || fail "bench JSON lacks pp16/tg8 medians"
contains "bench names its kernels' level" "$tmp/out" "^kernels: (scalar|avx2|avx_vnni|avx512)"
python3 -c "import json; d=json.load(open('$tmp/bench.json')); assert len(d['read_bandwidth_samples']) == 2 and d['tg_bandwidth_fraction'] > 0" \
  && pass || fail "bench --bandwidth JSON lacks a bandwidth measure per repetition and the decode's fraction"
contains "bench prints the decode's share of the bandwidth" "$tmp/out" "of the measured read bandwidth \(median of 2 repetitions"
expect_ok "bench with an unknown EMBER_SIMD" env EMBER_SIMD=avx9 "$ember" bench -m "$tmp/tiny.gguf" -p 4 -n 2 -r 1
contains "an unknown EMBER_SIMD is named, not ignored" "$tmp/err" "EMBER_SIMD=avx9 is not a SIMD level"
expect_ok "bench with the weight streams' prefetch forced off" env EMBER_PREFETCH=0 "$ember" bench -m "$tmp/tiny.gguf" -p 4 -n 2 -r 1
contains "bench says the prefetch was forced" "$tmp/out" "weight streams not prefetched \(set by EMBER_PREFETCH\)"
expect_ok "bench with an EMBER_PREFETCH that is neither 0 nor 1" env EMBER_PREFETCH=yes "$ember" bench -m "$tmp/tiny.gguf" -p 4 -n 2 -r 1
contains "a bad EMBER_PREFETCH is named, not ignored" "$tmp/err" "EMBER_PREFETCH=yes is neither 0 nor 1"
expect_ok "bench at a depth, F32 cache" "$ember" bench -m "$tmp/tiny.gguf" -p 8 -n 4 -d 20 --kv-type f32 -r 1 --json "$tmp/bench_d.json"
python3 -c "import json; d=json.load(open('$tmp/bench_d.json')); assert d['tg4@d20']['median'] > 0 and d['depth'] == 20 and d['kv_type'] == 'f32'" \
  && pass || fail "bench -d 20 JSON lacks tg4@d20 / depth / kv_type"
"$ember" generate -m "$tmp/tiny.gguf" -p "abc" -n 12 --temp 0.9 --seed 3 >"$tmp/a" 2>/dev/null
"$ember" generate -m "$tmp/tiny.gguf" -p "abc" -n 12 --temp 0.9 --seed 3 >"$tmp/b" 2>/dev/null
cmp -s "$tmp/a" "$tmp/b" && pass || fail "same seed gave different output"

# inspect --verify reads every value: a clean file passes; a NaN written into a middle row of a
# Q4_0 matrix (its block's scale, which loading does not read) is named with its row, exit 1,
# and generation stops with an error that points to it.
expect_ok "inspect --verify" "$ember" inspect --verify "$tmp/tiny.gguf"
contains "verify: all finite" "$tmp/out" "every value of [0-9]+ tensors .* is finite"
"$ember" inspect --json "$tmp/tiny.gguf" >"$tmp/tiny.json"
python3 - "$tmp/tiny.gguf" "$tmp/tiny.json" "$tmp/nan.gguf" <<'EOF' && pass || fail "could not write the NaN file"
import json, shutil, struct, sys
src, meta, out = sys.argv[1:]
d = json.load(open(meta))
t = next(t for t in d["tensors"] if t["name"] == "blk.0.ffn_up.weight")
rows, cols = t["shape"][1], t["shape"][0]
row_bytes = cols // 32 * 18  # Q4_0: a block of 32 values is an f16 scale and 16 bytes
shutil.copy(src, out)
with open(out, "r+b") as f:
    f.seek(t["file_offset"] + (rows // 2) * row_bytes)
    f.write(struct.pack("<H", 0x7E00))  # an f16 NaN as the first block's scale
EOF
expect_error "inspect --verify finds the NaN" "1 of [0-9]+ tensors hold values that are not finite" "$ember" inspect --verify "$tmp/nan.gguf"
contains "verify names the tensor and row" "$tmp/out" "blk\.0\.ffn_up\.weight: 1 of [0-9]+ rows .* the first is row [0-9]+"
expect_error "NaN logits stop generation" "not finite .*ember inspect --verify" "$ember" generate -m "$tmp/nan.gguf" -p "hello" -n 4 --temp 0

# Bad input: clear errors, no crashes.
expect_error "missing file" "cannot open" "$ember" inspect "$tmp/nope.gguf"
head -c 1000 "$tmp/tiny.gguf" >"$tmp/trunc.gguf"
expect_error "truncated file" "truncated|outside|bytes left" "$ember" generate -m "$tmp/trunc.gguf" -p hi
printf 'NOTAGGUFFILE' >"$tmp/bad.gguf"
expect_error "bad magic" "not a GGUF" "$ember" inspect "$tmp/bad.gguf"
expect_error "directory as model" "regular file|cannot" "$ember" generate -m "$tmp" -p hi
expect_error "negative temperature" "temp" "$ember" generate -m "$tmp/tiny.gguf" -p hi --temp -1
expect_error "unknown flag" "not expected|unknown|extra" "$ember" generate -m "$tmp/tiny.gguf" -p hi --frobnicate
expect_error "no prompt" "prompt" "$ember" generate -m "$tmp/tiny.gguf"
expect_error "prompt over context" "context" "$ember" generate -m "$tmp/tiny.gguf" -p "a b c d e f g h i j k l m n o p" -c 4
expect_error "zero threads ok but 5000 not" "thread|range" "$ember" generate -m "$tmp/tiny.gguf" -p hi -t 5000
expect_ok "serve help" "$ember" serve --help
contains "serve help lists --parallel" "$tmp/out" "parallel"
expect_error "serve zero parallel" "parallel|range" "$ember" serve -m "$tmp/tiny.gguf" --parallel 0
expect_error "serve bad host" "cannot listen" "$ember" serve -m "$tmp/tiny.gguf" --host 203.0.113.7 --port 1
expect_error "bad synth type" "type" "$ember" synth --preset tiny --type q9_9 -o "$tmp/x.gguf"
expect_error "bad synth heads" "head" "$ember" synth --preset tiny --n-head 5 -o "$tmp/x.gguf"

# Accuracy tools on synthetic models: profile -> threshold mode -> perplexity / KL divergence.
# The text: this script, repeated (byte-level tokens on synth models).
for _ in 1 2 3; do cat "$0"; done >"$tmp/text.txt"
num() { sed -nE "s/$2/\1/p" "$1" | head -1; }  # FILE REGEX-with-one-group: the first match
close() {  # NAME A B TOLERANCE: |A - B| <= TOLERANCE (A, B numbers)
  if python3 -c "import sys, math; a, b, t = map(float, sys.argv[1:4]); sys.exit(0 if math.isfinite(a) and math.isfinite(b) and abs(a - b) <= t else 1)" "$2" "$3" "$4"; then
    pass
  else
    fail "$1: '$2' and '$3' differ by more than $4"
  fi
}
expect_ok "synth relu" "$ember" synth --preset tiny --act relu --sparsity 0.6 -o "$tmp/relu.gguf"
expect_ok "profile relu" "$ember" profile -m "$tmp/relu.gguf" -f "$tmp/text.txt" -c 64 --max-tokens 1024 -o "$tmp/relu.profile.gguf" -t 2
relu_profile_sparsity=$(num "$tmp/out" '^mean +[0-9.]+ +([0-9.]+) .*')
if [ -s "$tmp/relu.profile.svg" ] && grep -q "<polyline" "$tmp/relu.profile.svg"; then pass; else fail "profile wrote no SVG plot"; fi
expect_ok "inspect profile" "$ember" inspect "$tmp/relu.profile.gguf"
contains "profile tensors" "$tmp/out" "blk\.0\.ffn_act_count"
contains "profile quantiles" "$tmp/out" "blk\.0\.ffn_gate_quantiles"
# The same 1024 tokens (16 chunks of 64) in oracle mode, batches of 8 (the sparse path, which
# counts): for ReLU the oracle is exact, so its measured sparsity is the profile's.
expect_ok "oracle ppl relu" "$ember" perplexity -m "$tmp/relu.gguf" -f "$tmp/text.txt" -c 64 --chunks 16 -b 8 -t 2 --sparse-mode oracle
oracle_sparsity=$(num "$tmp/err" '.*FFN sparsity \(oracle\): ([0-9.]+)% .*')
ppl_b8=$(num "$tmp/out" '^Final estimate: PPL = ([0-9.]+) .*')
# Whole chunks in one batch (the dense kernels) compute the same function: the same perplexity.
expect_ok "oracle ppl big batches" "$ember" perplexity -m "$tmp/relu.gguf" -f "$tmp/text.txt" -c 64 --chunks 16 -t 2 --sparse-mode oracle
close "oracle perplexity at -b 8 and -b 64" "$ppl_b8" "$(num "$tmp/out" '^Final estimate: PPL = ([0-9.]+) .*')" 0.01
close "profile sparsity = oracle sparsity" "$relu_profile_sparsity" "$(python3 -c "print(${oracle_sparsity:-nan} / 100)")" 0.002
# Input sparsity (TEAL) on a SiLU model: the profile's input tables, `sparsify`, and the result
# run with --sparse-mode input reaching its target on decode tokens.
expect_ok "profile silu" "$ember" profile -m "$tmp/tiny.gguf" -f "$tmp/text.txt" -c 64 --max-tokens 512 -o "$tmp/silu-input.profile.gguf" -t 2
expect_ok "sparsify" "$ember" sparsify -m "$tmp/tiny.gguf" --profile "$tmp/silu-input.profile.gguf" --allocation greedy --sparsity 0.4 -o "$tmp/tiny.sparse.gguf" --eval-chunks 0
contains "sparsify summary" "$tmp/err" "40\.[0-9]% of the layers' weights skipped"
# The tiny model's rows are all short: sparsify says plainly that decode reads every weight.
contains "sparsify says small rows do not pay" "$tmp/err" "will not decode faster than the dense one"
# TEAL's block allocation (the default): each layer run on calibration tokens, its output error per layer.
expect_ok "sparsify block allocation" "$ember" sparsify -m "$tmp/tiny.gguf" --profile "$tmp/silu-input.profile.gguf" --corpus "$tmp/text.txt" --block-tokens 64 --sparsity 0.4 -o "$tmp/tiny.block.gguf" --eval-chunks 0 -t 2
contains "block allocation per layer" "$tmp/err" "sparsify \[2/3\]: layer 2/2: sparsity attn_in"
contains "block allocation summary" "$tmp/err" "40\.[0-9]% of the layers' weights skipped \(block allocation\)"
contains "block allocation table" "$tmp/out" "^ +1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$"
expect_ok "a block-allocated file runs" "$ember" generate -m "$tmp/tiny.block.gguf" -p "hello world" -n 8 --temp 0
contains "block-allocated file in input mode" "$tmp/err" "running --sparse-mode input"
expect_error "a session cannot make the block allocation" "input-allocation" "$ember" generate -m "$tmp/tiny.gguf" -p hi --sparse-mode input --sparse-profile "$tmp/silu-input.profile.gguf" --input-allocation block
expect_ok "input mode from the file" "$ember" generate -m "$tmp/tiny.sparse.gguf" -p "hello world" -n 24 --temp 0 --sparse-mode input
input_sparsity=$(num "$tmp/err" '.*input sparsity \(decode tokens\): ([0-9.]+)% .*')
close "input mode sparsity near the target" "${input_sparsity:-nan}" 40 15
# One command: profile on the text, thresholds, the measurement against the dense model.
expect_ok "sparsify in one command" "$ember" sparsify -m "$tmp/tiny.gguf" -o "$tmp/tiny.sparse1.gguf" --corpus "$tmp/text.txt" --profile-tokens 512 --eval "$tmp/text.txt" --eval-chunks 1 --sparsity 0.3 -t 2
contains "sparsify steps" "$tmp/err" "sparsify \[3/3\]"
contains "sparsify times its steps" "$tmp/err" "done in [0-9]+ s \(load [0-9]+ s, profile [0-9]+ s, allocation [0-9]+ s, writing [0-9]+ s, measurement [0-9]+ s\)"
contains "sparsify perplexity" "$tmp/out" "perplexity +[0-9.]+ -> [0-9.]+"
contains "sparsify KL divergence" "$tmp/out" "KL divergence +[0-9.]+"
# A wider FFN: gate|up's rows (2304 bytes) keep their input-channel-major copy, the other sites
# decode dense; sparsify's measurement repacks the model as the loader does and builds the copy
# from the file's layout (built from the repacked matrices it would be garbage: KL of several).
expect_ok "synth wide ffn" "$ember" synth --preset tiny --n-ff 2048 --type q4_0 -o "$tmp/wide.gguf"
expect_ok "sparsify wide ffn" "$ember" sparsify -m "$tmp/wide.gguf" -o "$tmp/wide.sparse.gguf" --corpus "$tmp/text.txt" --profile-tokens 512 --eval "$tmp/text.txt" --eval-chunks 1 --sparsity 0.4 -t 2
contains "wide ffn: gate|up keeps its copy" "$tmp/err" "attn_in \(2 of 2 layers\), attn_out \(2 of 2 layers\), ffn_hidden \(2 of 2 layers\) decode with the dense kernels"
close "wide ffn: KL divergence small" "$(num "$tmp/out" '.*KL divergence +([0-9.]+) .*')" 0.1 0.1
contains "sparsify bytes" "$tmp/out" "MB dense, [0-9.]+ MB sparse"
# bench --versus-dense: input mode and its own dense path, repetition by repetition, in one run.
expect_ok "bench versus dense" "$ember" bench -m "$tmp/wide.sparse.gguf" -p 8 -n 4 -r 3 --versus-dense --json "$tmp/bench_vd.json"
contains "bench versus dense: the pairs" "$tmp/out" "^tg4 / dense, pair by pair: median [0-9.]+x \(min [0-9.]+, max [0-9.]+, 3 pairs\)"
python3 -c "import json; d=json.load(open('$tmp/bench_vd.json'))['versus_dense']; assert len(d['tg4']['ratios']) == 3 and len(d['pp8']['dense']['samples']) == 3 and d['tg4']['ratio_median'] > 0" \
  && pass || fail "bench --versus-dense JSON lacks three pairs of pp8 / tg4"
expect_error "versus dense needs input mode" "sparse-mode input" "$ember" bench -m "$tmp/wide.gguf" -p 0 -n 2 -r 1 --versus-dense
# --paying-sites: only gate|up (the one site whose copy can pay here) takes a share.
expect_ok "sparsify paying sites" "$ember" sparsify -m "$tmp/wide.gguf" -o "$tmp/wide.pay.gguf" --corpus "$tmp/text.txt" --profile-tokens 512 --block-tokens 64 --paying-sites --eval-chunks 0 --sparsity 0.3 -t 2
contains "paying sites: the attention and down inputs stay whole" "$tmp/out" "^ +1 +0\.000 +0\.000 +0\.[0-9]+ +0\.000 "
contains "paying sites said" "$tmp/err" "shares only where a copy pays"
# A mixture of experts takes input sparsity inside its experts: sparsify by the input path (the
# predictor path refused by name), each expert's gate|up through its own copy on decode.
expect_ok "synth moe wide experts" "$ember" synth --preset tiny --n-expert 4 --n-expert-used 2 --n-ff 2048 --type q4_0 -o "$tmp/moe.gguf"
expect_ok "sparsify moe" "$ember" sparsify -m "$tmp/moe.gguf" -o "$tmp/moe.sparse.gguf" --corpus "$tmp/text.txt" --profile-tokens 512 --eval "$tmp/text.txt" --eval-chunks 1 --sparsity 0.4 -t 2
contains "sparsify moe: KL divergence" "$tmp/out" "KL divergence +[0-9.]+"
expect_ok "sparsify moe paying sites" "$ember" sparsify -m "$tmp/moe.gguf" -o "$tmp/moe.pay.gguf" --corpus "$tmp/text.txt" --profile-tokens 512 --block-tokens 64 --paying-sites --eval-chunks 0 --sparsity 0.4 -t 2
expect_ok "moe decode through the experts' copies" "$ember" generate -m "$tmp/moe.pay.gguf" -p "hello world" -n 8 --temp 0
contains "moe: experts' copies read" "$tmp/err" "ffn_in: [0-9.]+% \(copy 100% of tokens\)"
expect_error "moe: no predictors" "mixtures of experts" "$ember" sparsify -m "$tmp/moe.gguf" -o "$tmp/x.gguf" --corpus "$tmp/text.txt" --method predictor
# Input mode's copies hold their scale tables in 8 bits by default (Q4_0_NM8), or with
# --sparse-down exact keep the file's scales (Q4_0_NM); the other sparse modes' down copies keep them.
expect_ok "paying sites decode" "$ember" generate -m "$tmp/wide.pay.gguf" -p "hello world" -n 8 --temp 0
contains "input copies compact by default" "$tmp/err" "copies of 2 layers' matrices \(Q4_0_NM8\)"
expect_ok "paying sites decode, exact tables" "$ember" generate -m "$tmp/wide.pay.gguf" -p "hello world" -n 8 --temp 0 --sparse-down exact
contains "input copies exact when asked" "$tmp/err" "copies of 2 layers' matrices \(Q4_0_NM\)"
expect_ok "oracle mode decode" "$ember" generate -m "$tmp/wide.gguf" -p "hello world" -n 2 --temp 0 --sparse-mode oracle
contains "oracle mode's down copy keeps the file's scales" "$tmp/err" "neuron-major down copies \(Q4_0_NM from Q4_0\)"
# --input-copies all: every site through its copy, every decode token, short rows or not.
expect_ok "input copies all" "$ember" generate -m "$tmp/wide.sparse.gguf" -p "hello world" -n 8 --temp 0 --input-copies all
contains "input copies all: attention too" "$tmp/err" "attn_in: [0-9.]+% \(copy 100% of tokens\), attn_out: [0-9.]+% \(copy 100% of tokens\)"
expect_error "paying sites need the block allocation" "allocation block" "$ember" sparsify -m "$tmp/wide.gguf" -o "$tmp/x.gguf" --corpus "$tmp/text.txt" --paying-sites --allocation greedy --eval-chunks 0
expect_error "sparsify without a corpus" "get_corpus" "$ember" sparsify -m "$tmp/tiny.gguf" -o "$tmp/x.gguf" --corpus "$tmp/none.txt"
expect_ok "a sparsified file runs sparse with no flag" "$ember" generate -m "$tmp/tiny.sparse.gguf" -p "hello world" -n 24 --temp 0
contains "auto picks input mode" "$tmp/err" "running --sparse-mode input"
contains "auto input mode skips" "$tmp/err" "input sparsity \(decode tokens\)"
expect_ok "--sparse-mode dense overrides" "$ember" generate -m "$tmp/tiny.sparse.gguf" -p "hello world" -n 4 --temp 0 --sparse-mode dense
if grep -q "input sparsity" "$tmp/err"; then fail "dense override still ran input mode"; else pass; fi
expect_error "input mode needs thresholds" "sparsify|sparse-profile" "$ember" generate -m "$tmp/tiny.gguf" -p hi --sparse-mode input
expect_error "sparsify with an old profile" "input tables|profile" "$ember" sparsify -m "$tmp/tiny.gguf" --profile "$tmp/tiny.gguf" --corpus "$tmp/text.txt" -o "$tmp/x.gguf" --eval-chunks 0
# Predictor training samples saved by the profiler, trained on, used.
expect_ok "profile samples" "$ember" profile -m "$tmp/relu.gguf" -f "$tmp/text.txt" -c 64 --max-tokens 512 --samples "$tmp/relu.samples.gguf" --samples-max 200 -o "$tmp/relu.profile2.gguf" -t 2
contains "samples written" "$tmp/err" "samples: 200 tokens x [0-9]+ layers"
expect_ok "train from samples" "$ember" train-predictor -m "$tmp/relu.gguf" --from-samples "$tmp/relu.samples.gguf" --min-rank 8 --max-rank 8 --epochs 1 -o "$tmp/relu.pred.gguf" -t 2
contains "predictor trained" "$tmp/out" "wrote .*relu\.pred\.gguf"
expect_ok "predictor mode" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --sparse-mode predictor --predictor "$tmp/relu.pred.gguf"
# ReLU models: sparsify's predictor path in one command (profile, predictors, PowerInfer's
# layout, the measurement), and the result running predictor mode with no flag.
expect_ok "sparsify relu" "$ember" sparsify -m "$tmp/relu.gguf" -o "$tmp/relu.sparse.gguf" --corpus "$tmp/text.txt" --profile-tokens 512 --samples 300 --eval "$tmp/text.txt" --eval-chunks 1 -t 2
contains "sparsify relu steps" "$tmp/err" "sparsify \[4/4\]"
contains "sparsify relu times its steps" "$tmp/err" "done in [0-9]+ s \(load [0-9]+ s, profile [0-9]+ s, predictors [0-9]+ s, layout [0-9]+ s, measurement [0-9]+ s\)"
contains "sparsify relu predictors" "$tmp/out" "^\| 0 \| [0-9]+ \| 0\.[0-9]+"
contains "sparsify relu KL divergence" "$tmp/out" "KL divergence +[0-9.]+"
contains "sparsify relu bytes" "$tmp/out" "MB dense, [0-9.]+ MB sparse"
expect_ok "a sparsified relu file runs sparse with no flag" "$ember" generate -m "$tmp/relu.sparse.gguf" -p "hello world" -n 8 --temp 0
contains "auto picks predictor mode" "$tmp/err" "running --sparse-mode predictor"
# Perplexity in predictor mode describes decode at any batch size: token by token (-b 1) and in
# whole chunks (the dense kernels with each token's own prediction) agree.
expect_ok "predictor ppl -b 1" "$ember" perplexity -m "$tmp/relu.sparse.gguf" -f "$tmp/text.txt" -c 64 --chunks 4 -b 1 -t 2
ppl_pred_b1=$(num "$tmp/out" '^Final estimate: PPL = ([0-9.]+) .*')
expect_ok "predictor ppl whole chunks" "$ember" perplexity -m "$tmp/relu.sparse.gguf" -f "$tmp/text.txt" -c 64 --chunks 4 -t 2
close "predictor perplexity at -b 1 and -b 64" "$ppl_pred_b1" "$(num "$tmp/out" '^Final estimate: PPL = ([0-9.]+) .*')" 0.02
expect_ok "profile of a prepared file runs dense" "$ember" profile -m "$tmp/relu.sparse.gguf" -f "$tmp/text.txt" -c 64 --max-tokens 128 -o "$tmp/relu.sparse.profile.gguf" -t 2
expect_error "predictor method on a silu model" "not ReLU" "$ember" sparsify -m "$tmp/tiny.gguf" -o "$tmp/x.gguf" --method predictor --corpus "$tmp/text.txt" --eval-chunks 0
expect_error "samples and a corpus" "exactly one of" "$ember" train-predictor -m "$tmp/relu.gguf" --from-samples "$tmp/relu.samples.gguf" -f "$tmp/text.txt" -o "$tmp/x.pred.gguf"

expect_ok "synth silu" "$ember" synth --preset tiny -o "$tmp/silu.gguf"
expect_ok "profile silu" "$ember" profile -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --max-tokens 1024 --sparsity 0.4 -o "$tmp/silu.profile.gguf"
close "silu profile at its target sparsity" "$(num "$tmp/out" '^mean +[0-9.]+ +([0-9.]+) .*')" 0.4 0.002
expect_ok "ppl silu t1" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --chunks 16 -t 1 --save-logits "$tmp/base.lp"
ppl1=$(num "$tmp/out" '^Final estimate: PPL = ([0-9.]+) .*')
expect_ok "ppl silu t3" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --chunks 16 -t 3 --kl-base "$tmp/base.lp"
ppl3=$(num "$tmp/out" '^Final estimate: PPL = ([0-9.]+) .*')
close "ppl equal across threads" "$ppl1" "$ppl3" "$(python3 -c "print(1e-4 * ${ppl1:-0})")"
close "KLD against itself" "$(num "$tmp/out" '^Mean +KLD +: +([0-9.]+) .*')" 0 1e-5
contains "same top-1 against itself" "$tmp/out" "Same top p +: +100\.000"
expect_ok "ppl threshold" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --chunks 16 -t 2 --sparse-mode threshold --sparse-profile "$tmp/silu.profile.gguf" --sparsity 0.4 --kl-base "$tmp/base.lp"
close "threshold mode reaches the calibrated sparsity" "$(num "$tmp/err" '.*FFN sparsity \(threshold\): ([0-9.]+)% .*')" 40 3
kld=$(num "$tmp/out" '^Mean +KLD +: +([0-9.]+) .*')
if python3 -c "import sys; sys.exit(0 if 0 < float('${kld:-nan}') < 5 else 1)"; then pass; else fail "threshold KLD '$kld' not in (0, 5)"; fi
expect_error "kl-base other -c" "same -c" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 32 --chunks 4 --kl-base "$tmp/base.lp"
expect_error "kl-base not a log-prob file" "not an Ember log-prob file" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --kl-base "$tmp/silu.gguf"
echo "hello world" >"$tmp/short.txt"
expect_error "ppl text too short" "fewer than one chunk" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/short.txt" -c 64
expect_error "ppl missing text" "cannot read the text" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/nope.txt"
expect_error "profile missing corpus" "cannot read the text" "$ember" profile -m "$tmp/silu.gguf" -f "$tmp/nope.txt" -o "$tmp/x.gguf"
expect_error "threshold mode without thresholds" "needs per-layer thresholds" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --sparse-mode threshold
expect_error "sparse profile not a profile" "not a profile" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --sparse-mode threshold --sparse-profile "$tmp/silu.gguf"
expect_ok "synth one layer" "$ember" synth --preset tiny --n-layer 1 -o "$tmp/one.gguf"
expect_ok "profile one layer" "$ember" profile -m "$tmp/one.gguf" -f "$tmp/text.txt" -c 64 --max-tokens 64 --threshold 0.1 -o "$tmp/one.profile.gguf"
expect_error "samples of another model" "this one has" "$ember" train-predictor -m "$tmp/one.gguf" --from-samples "$tmp/relu.samples.gguf" -o "$tmp/x.pred.gguf"
expect_error "profile of another model" "thresholds for a model of [0-9]+ layers" "$ember" perplexity -m "$tmp/silu.gguf" -f "$tmp/text.txt" -c 64 --sparse-mode threshold --sparse-profile "$tmp/one.profile.gguf"
# Placement (ember plan): a 7B plan from shapes, a plan file for a synth ReLU model, errors.
expect_ok "plan 7b shapes" "$ember" plan --synth-preset 7b --vram-budget 2GiB --time-limit 1
contains "plan compares methods" "$tmp/out" "layer-split"
expect_ok "synth relu" "$ember" synth --preset tiny --type q4_0 --act relu --sparsity 0.8 -o "$tmp/relu.gguf"
expect_ok "plan synth file" "$ember" plan -m "$tmp/relu.gguf" --vram-budget 64K --min-neurons 16 -o "$tmp/relu.plan.gguf"
expect_ok "inspect plan" "$ember" inspect "$tmp/relu.plan.gguf"
contains "plan file" "$tmp/out" "ember-plan"
expect_ok "generate hybrid with plan" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --temp 0 --plan "$tmp/relu.plan.gguf"
contains "hybrid log" "$tmp/err" "hybrid FFN"
# A plan is for one kind of device (the scratch its kernels keep): one for CUDA is refused on the stand-in.
expect_ok "plan for cuda" "$ember" plan -m "$tmp/relu.gguf" --vram-budget 64K --min-neurons 16 --hybrid-device cuda -o "$tmp/relu.cuda.plan.gguf"
expect_error "cuda plan on the stand-in" "made for the cuda device" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --plan "$tmp/relu.cuda.plan.gguf" --hybrid-device cpu
expect_ok "generate hybrid budget" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --temp 0 --vram-budget 64K
expect_error "generate hybrid no profile" "profile" "$ember" generate -m "$tmp/tiny.gguf" -p "hello" -n 4 --vram-budget 64K
# The hybrid serves several requests at once (a KV cache per sequence on the device): the session
# is made, then binding the unreachable address fails.
expect_error "serve hybrid parallel" "cannot listen" "$ember" serve -m "$tmp/relu.gguf" --vram-budget 64K --hybrid-device cpu --parallel 3 --host 203.0.113.7 --port 1
contains "serve hybrid planned for 3 sequences" "$tmp/err" "hybrid: device cpu-standin holds"
expect_ok "plan for 3 sequences" "$ember" plan -m "$tmp/relu.gguf" --vram-budget 64K --min-neurons 16 --parallel 3 -o "$tmp/relu3.plan.gguf"
contains "plan names its sequences" "$tmp/err" "x 3 sequences"
expect_error "plan of 3 sequences for one" "made for 3 sequence" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --plan "$tmp/relu3.plan.gguf"
expect_error "serve with a plan of 3 sequences" "cannot listen" "$ember" serve -m "$tmp/relu.gguf" --plan "$tmp/relu3.plan.gguf" --hybrid-device cpu --parallel 3 --host 203.0.113.7 --port 1
expect_ok "bench hybrid" "$ember" bench -m "$tmp/relu.gguf" -p 0 -n 4 -r 1 --vram-budget 64K --hybrid-device cpu
contains "bench hybrid breakdown" "$tmp/out" "hybrid decode per token \(last run, device cpu-standin\): CPU FFN shares [0-9.]+ ms"
contains "bench hybrid json" "$tmp/out" '"cpu_ffn_ms_per_token"'
# Budgets of the real process: auto (the device's free memory less a margin), a budget larger
# than the device has free, the runtime's reserve taken out of it, the layer split as baseline.
expect_ok "generate hybrid auto budget" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --temp 0 --vram-budget auto --hybrid-device cpu
contains "auto budget logged" "$tmp/err" "budget auto leaves the plan"
expect_error "hybrid budget over free memory" "MiB free" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --vram-budget 1000T --hybrid-device cpu
expect_error "hybrid budget under the reserve" "takes about" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --vram-budget 64K --vram-reserve 1M --hybrid-device cpu
expect_ok "generate hybrid layer split" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --temp 0 --vram-budget 128K --plan-method layer-split --hybrid-device cpu
contains "layer split planned" "$tmp/err" "planning layer-split"
# Every gating through the hybrid (the CPU stand-in runs them all): OPT in PowerInfer's layout
# (no gate, biases, only ffn_down_t) and Bamboo; a sparse mode it does not run is refused.
expect_ok "synth opt powerinfer" "$ember" synth --preset tiny --arch opt --act relu --sparsity 0.8 --powerinfer -o "$tmp/opt.pi.gguf"
expect_ok "generate hybrid opt powerinfer" "$ember" generate -m "$tmp/opt.pi.gguf" -p "hello" -n 4 --temp 0 --vram-budget 64K --hybrid-device cpu
expect_ok "synth bamboo" "$ember" synth --preset tiny --arch bamboo --act relu --sparsity 0.8 -o "$tmp/bamboo.gguf"
expect_ok "generate hybrid bamboo" "$ember" generate -m "$tmp/bamboo.gguf" -p "hello" -n 4 --temp 0 --vram-budget 64K --hybrid-device cpu
expect_ok "synth qwen2" "$ember" synth --preset tiny --arch qwen2 -o "$tmp/qwen2.gguf"
expect_ok "generate qwen2" "$ember" generate -m "$tmp/qwen2.gguf" -p "hello" -n 4 --temp 0
contains "qwen2 loaded" "$tmp/err" "\\(qwen2\\)"
# The other families (each checked against llama.cpp in test_llamacpp_synth.cpp), and PowerInfer's
# ReluFalcon layout (ffn_down_t, predictor) in its sparse modes.
for arch in qwen3 phi3 falcon; do
  expect_ok "synth $arch" "$ember" synth --preset tiny --arch $arch -o "$tmp/$arch.gguf"
  expect_ok "generate $arch" "$ember" generate -m "$tmp/$arch.gguf" -p "hello" -n 4 --temp 0
  contains "$arch loaded" "$tmp/err" "\\($arch\\)"
done
# Llama-3's vocabulary size (128256) and RoPE frequency factors.
expect_ok "synth llama3 vocab" "$ember" synth --preset tiny --n-vocab 128256 --tied --rope-freqs --rope-base 500000 -o "$tmp/llama3.gguf"
expect_ok "generate llama3 vocab" "$ember" generate -m "$tmp/llama3.gguf" -p "hello world" -n 4 --temp 0
expect_ok "synth mixtral" "$ember" synth --preset tiny --n-expert 4 --n-expert-used 2 -o "$tmp/mixtral.gguf"
expect_ok "generate mixtral" "$ember" generate -m "$tmp/mixtral.gguf" -p "hello" -n 4 --temp 0
expect_ok "synth qwen3moe" "$ember" synth --preset tiny --arch qwen3moe --n-expert 8 --n-expert-used 2 --n-ff 64 -o "$tmp/qwen3moe.gguf"
expect_ok "generate qwen3moe" "$ember" generate -m "$tmp/qwen3moe.gguf" -p "hello" -n 4 --temp 0
expect_error "sparse mode on experts" "mixtures of experts" "$ember" generate -m "$tmp/qwen3moe.gguf" -p "hello" -n 4 --sparse-mode oracle
expect_ok "profile qwen3moe" "$ember" profile -m "$tmp/qwen3moe.gguf" -f "$tmp/text.txt" -c 64 --max-tokens 256 -o "$tmp/qwen3moe.profile.gguf" -t 2
contains "profile qwen3moe: experts' routings" "$tmp/out" "experts80%"
contains "profile qwen3moe: sparsity at the target" "$tmp/out" "^mean +[0-9.]+ +0\.(49|50|51)"
expect_ok "sparsify qwen3moe from its profile" "$ember" sparsify -m "$tmp/qwen3moe.gguf" --profile "$tmp/qwen3moe.profile.gguf" --allocation greedy --sparsity 0.4 -o "$tmp/qwen3moe.sparse.gguf" --eval-chunks 0
contains "sparsify qwen3moe summary" "$tmp/err" "40\.[0-9]% of the layers' weights skipped"
expect_ok "generate sparse qwen3moe" "$ember" generate -m "$tmp/qwen3moe.sparse.gguf" -p "hello" -n 4 --temp 0
# Experts as units of placement: the profile's most routed experts on the CPU stand-in, the rest
# on the CPU, the same tokens as the CPU alone.
expect_ok "plan qwen3moe experts" "$ember" plan -m "$tmp/qwen3moe.gguf" --vram-budget 600K --sync-us 0 -c 64 -o "$tmp/qwen3moe.plan.gguf"
contains "plan qwen3moe: experts of each layer on the device" "$tmp/out" "^ +0 +(GPU|CPU) +[1-7]/8 "
contains "plan qwen3moe: bytes a token each side reads" "$tmp/out" "CPU MB/tok +GPU MB/tok"
expect_ok "generate qwen3moe alone" "$ember" generate -m "$tmp/qwen3moe.gguf" -p "hello" -n 8 --temp 0 -c 64
cp "$tmp/out" "$tmp/qwen3moe.cpu.txt"
expect_ok "generate qwen3moe hybrid" "$ember" generate -m "$tmp/qwen3moe.gguf" -p "hello" -n 8 --temp 0 -c 64 --plan "$tmp/qwen3moe.plan.gguf" --hybrid-device cpu
if cmp -s "$tmp/out" "$tmp/qwen3moe.cpu.txt"; then pass; else fail "qwen3moe hybrid: other tokens than the CPU's"; fi
contains "hybrid qwen3moe: experts by layer" "$tmp/err" "experts on the device by layer: [1-7] [1-7]"
contains "hybrid qwen3moe: runs on both sides" "$tmp/err" "hybrid experts: [0-9]+ \\(token, expert\\) runs, [1-9][0-9.]*% on the device"
expect_ok "synth relu falcon powerinfer" "$ember" synth --preset tiny --arch falcon --act relu --powerinfer -o "$tmp/falcon.pi.gguf"
expect_ok "generate relu falcon predictor" "$ember" generate -m "$tmp/falcon.pi.gguf" -p "hello" -n 4 --temp 0 --sparse-mode predictor
expect_ok "generate relu falcon oracle" "$ember" generate -m "$tmp/falcon.pi.gguf" -p "hello" -n 4 --temp 0 --sparse-mode oracle
expect_error "hybrid with threshold mode" "does not combine" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --vram-budget 64K --sparse-mode threshold
expect_error "hybrid predictors the model lacks" "needs a predictor" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --vram-budget 64K --sparse-mode predictor
expect_ok "synth relu powerinfer" "$ember" synth --preset tiny --act relu --sparsity 0.6 --powerinfer -o "$tmp/relu.pi.gguf"
expect_ok "generate hybrid with predictors" "$ember" generate -m "$tmp/relu.pi.gguf" -p "hello" -n 4 --temp 0 --vram-budget 64K --hybrid-device cpu
expect_ok "plan with predictors" "$ember" plan -m "$tmp/relu.pi.gguf" --vram-budget 1M --min-neurons 16 --sync-us 0 -o "$tmp/relu.pi.plan.gguf"
expect_ok "generate hybrid plan with predictors" "$ember" generate -m "$tmp/relu.pi.gguf" -p "hello" -n 4 --temp 0 --plan "$tmp/relu.pi.plan.gguf" --hybrid-device cpu
expect_error "predictor plan, oracle session" "made for an executor with predictors" "$ember" generate -m "$tmp/relu.pi.gguf" -p "hello" -n 4 --temp 0 --plan "$tmp/relu.pi.plan.gguf" --hybrid-device cpu --sparse-mode oracle
expect_error "plan bad budget" "size" "$ember" plan --synth-preset 7b --vram-budget 4XB
expect_error "plan without profile" "profile" "$ember" plan -m "$tmp/tiny.gguf" --vram-budget 1M

# The real default model, when installed.
if [ -f "$smol" ]; then
  expect_ok "generate SmolLM2" "$ember" generate -m "$smol" -p "The capital of France is" -n 12 --temp 0
  contains "greedy continuation" "$tmp/out" "Paris"
  expect_ok "chat SmolLM2" "$ember" generate -m "$smol" --chat -p "What is the capital of France? Answer in one word." -n 16 --temp 0
  contains "chat answer" "$tmp/out" "Paris"
  expect_ok "stop string" "$ember" generate -m "$smol" -p "The capital of France is" -n 12 --temp 0 --stop " Paris"
  if grep -q "Paris" "$tmp/out"; then fail "--stop printed the stop string"; else pass; fi
else
  echo "note: $smol not installed; skipping the real-model checks" >&2
fi

# ReLU architectures and PowerInfer's layout: synth -> generate (dense, asked for since auto runs
# a file's predictors, and oracle give the same greedy text), prepare's errors.
for arch in bamboo opt; do
  expect_ok "synth $arch pwri" "$ember" synth --arch $arch --powerinfer --type f16 --sparsity 0.8 -o "$tmp/$arch.pi.gguf"
  "$ember" generate -m "$tmp/$arch.pi.gguf" -p "the cat" -n 10 --temp 0 --sparse-mode dense >"$tmp/d" 2>/dev/null
  "$ember" generate -m "$tmp/$arch.pi.gguf" -p "the cat" -n 10 --temp 0 --sparse-mode oracle >"$tmp/o" 2>/dev/null
  [ -s "$tmp/d" ] && cmp -s "$tmp/d" "$tmp/o" && pass || fail "$arch PWRI: dense and oracle greedy text differ"
done
expect_error "synth opt silu" "ReLU architecture" "$ember" synth --arch opt --act silu -o "$tmp/x.gguf"
expect_error "prepare without a profile" "not a profile" "$ember" prepare -m "$tmp/tiny.gguf" --profile "$tmp/tiny.gguf" -o "$tmp/x.gguf"
expect_error "prepare missing profile" "cannot open" "$ember" prepare -m "$tmp/tiny.gguf" --profile "$tmp/nope.gguf" -o "$tmp/x.gguf"

# The memory tier: a mixture's experts in a cache under --mem-budget, the same greedy tokens as
# without a budget; a budget too small is refused naming the bytes; under a cgroup v1 memory limit
# of about two thirds of the file (where cgroups are writable: root), `auto` finds the limit and
# the run is never killed.
expect_ok "synth moe for the memory tier" "$ember" synth --arch llama --n-expert 8 --n-expert-used 2 --n-embd 2048 --n-ff 5632 --n-head 16 --n-head-kv 4 --n-layer 4 --n-vocab 2048 --type q4_0 -o "$tmp/tier.gguf"
"$ember" generate -m "$tmp/tier.gguf" -p "the cat sat" -n 16 --temp 0 -t 2 >"$tmp/tier0" 2>/dev/null
expect_ok "memory tier generate" "$ember" generate -m "$tmp/tier.gguf" -p "the cat sat" -n 16 --temp 0 -t 2 --mem-budget 420M
contains "memory tier said" "$tmp/err" "memory tier: a budget of 420.0 MiB \(given\)"
[ -s "$tmp/tier0" ] && cmp -s "$tmp/tier0" "$tmp/out" && pass || fail "memory tier: greedy tokens differ from the unlimited run"
expect_error "memory tier: too small a budget" "need [0-9.]+ MiB: give --mem-budget" "$ember" generate -m "$tmp/tier.gguf" -p hi -n 2 --mem-budget 100M
expect_ok "memory tier bench" "$ember" bench -m "$tmp/tier.gguf" -p 0 -n 4 -r 1 -t 2 --mem-budget 420M
contains "memory tier: bench counts" "$tmp/out" "^memory tier: [0-9]+ experts held .* MB read a token"
# Read-ahead always on: the same greedy tokens; bench scores the guesses; a mode it does not know is refused.
expect_ok "memory tier read-ahead" "$ember" generate -m "$tmp/tier.gguf" -p "the cat sat" -n 16 --temp 0 -t 2 --mem-budget 420M --read-ahead always
[ -s "$tmp/tier0" ] && cmp -s "$tmp/tier0" "$tmp/out" && pass || fail "memory tier read-ahead: greedy tokens differ from the unlimited run"
expect_ok "memory tier read-ahead bench" "$ember" bench -m "$tmp/tier.gguf" -p 0 -n 8 -r 1 -t 2 --mem-budget 420M --read-ahead always
contains "memory tier: read-ahead counted" "$tmp/out" "^memory tier: .* experts a token read ahead, [0-9]+% of them then chosen; the next layer's router guessed [0-9]+%"
expect_error "memory tier: unknown read-ahead mode" "unknown read-ahead mode 'sometimes' \(expected off, auto or always\)" "$ember" generate -m "$tmp/tier.gguf" -p hi -n 2 --read-ahead sometimes
# The server reports the memory tier's counts in /metrics.
# served_metrics MODEL ARGS...: /metrics after one completion of `ember serve -m MODEL ARGS`, in $tmp/metrics.
port=$((20000 + $$ % 20000))
served_metrics() {
  "$ember" serve -m "$@" -t 2 --port "$port" >"$tmp/serve.out" 2>"$tmp/serve.err" &
  local pid=$!
  for _ in $(seq 1 100); do curl -sf "localhost:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -sf "localhost:$port/v1/completions" -H 'Content-Type: application/json' -d '{"prompt":"the cat","max_tokens":4}' >/dev/null 2>&1
  curl -sf "localhost:$port/metrics" >"$tmp/metrics" 2>&1
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
}
served_metrics "$tmp/tier.gguf" --mem-budget 420M
contains "memory tier in /metrics" "$tmp/metrics" "^ember_expert_cache_misses_total\{model=\"[^\"]+\"\} [1-9][0-9]*"
contains "memory tier bytes in /metrics" "$tmp/metrics" "^ember_expert_cache_read_bytes_total\{model=\"[^\"]+\"\} [1-9]"
contains "memory tier read-ahead in /metrics" "$tmp/metrics" "^ember_expert_cache_read_ahead_total\{model=\"[^\"]+\"\} [0-9]"
# under_limit NAME MIB REF CMD...: CMD in a cgroup v1 memory limit of MIB after the page cache is
# dropped (where cgroups are writable: root): it finds the limit, and its output equals REF's.
under_limit() {
  local name=$1 mib=$2 ref=$3 cg=/sys/fs/cgroup/memory/ember-cli-$$-$RANDOM; shift 3
  if ! { [ -w /sys/fs/cgroup/memory ] && mkdir "$cg" 2>/dev/null; }; then
    echo "cli: cgroup v1 memory controller not writable here: $name skipped"; return
  fi
  echo $((mib << 20)) >"$cg/memory.limit_in_bytes"
  sync; echo 1 >/proc/sys/vm/drop_caches 2>/dev/null || true
  expect_ok "$name" bash -c 'echo $$ >"$1/cgroup.procs" && exec "${@:2}"' _ "$cg" "$@"
  contains "$name: the cgroup's limit found" "$tmp/err" "memory tier: a budget of $mib.0 MiB \(detected"
  cmp -s "$ref" "$tmp/out" && pass || fail "$name: greedy tokens differ from the unlimited run"
  rmdir "$cg" 2>/dev/null || true
}
under_limit "memory tier under a cgroup limit" 420 "$tmp/tier0" "$ember" generate -m "$tmp/tier.gguf" -p "the cat sat" -n 16 --temp 0 -t 2

# A dense model with predictors larger than its budget: what does not fit stays in the file's map,
# the rows each token needs are read before its kernels run; the same greedy tokens, never killed.
expect_ok "synth relu predictors for the memory tier" "$ember" synth --preset 1.1b --n-layer 4 --n-vocab 2048 --act relu --sparsity 0.9 --powerinfer --type q4_0 -o "$tmp/dtier.gguf"
"$ember" generate -m "$tmp/dtier.gguf" -p "the cat sat" -n 16 --temp 0 -t 2 >"$tmp/dtier0" 2>/dev/null
expect_ok "dense memory tier generate" "$ember" generate -m "$tmp/dtier.gguf" -p "the cat sat" -n 16 --temp 0 -t 2 --mem-budget 150M
contains "dense memory tier said" "$tmp/err" "memory tier: a budget of 150.0 MiB \(given\) holds the KV cache"
[ -s "$tmp/dtier0" ] && cmp -s "$tmp/dtier0" "$tmp/out" && pass || fail "dense memory tier: greedy tokens differ from the unlimited run"
expect_error "dense memory tier: too small a budget" "need [0-9.]+ MiB before any weight" "$ember" generate -m "$tmp/dtier.gguf" -p hi -n 2 --mem-budget 100M
expect_ok "dense memory tier bench" "$ember" bench -m "$tmp/dtier.gguf" -p 0 -n 4 -r 1 -t 2 --mem-budget 150M
contains "dense memory tier: bench counts" "$tmp/out" "^memory tier: [0-9.]+ MiB of weights resident; .* pages of FFN rows"
served_metrics "$tmp/dtier.gguf" --mem-budget 150M
contains "dense memory tier in /metrics" "$tmp/metrics" "^ember_map_read_pages_total\{model=\"[^\"]+\"\} [1-9][0-9]*"
under_limit "dense memory tier under a cgroup limit" 150 "$tmp/dtier0" "$ember" generate -m "$tmp/dtier.gguf" -p "the cat sat" -n 16 --temp 0 -t 2
# Neuron bundles (`ember prepare --bundle`): each neuron's gate, up and down rows in one row of
# blk.N.ffn_bundle; every mode computes the logits of the unbundled prepared file, bit for bit,
# read from memory, from the map, or under a budget.
expect_ok "profile for bundles" "$ember" profile -m "$tmp/dtier.gguf" -f "$tmp/text.txt" -c 64 --max-tokens 256 --sparsity 0.5 -o "$tmp/dtier.prof.gguf" -t 2
contains "profile orders neurons that fire together" "$tmp/err" "ordered in bands of 256 by firing together \(256 tokens' firing"
expect_ok "prepare unbundled" "$ember" prepare -m "$tmp/dtier.gguf" --profile "$tmp/dtier.prof.gguf" --sparsity 0.5 -o "$tmp/dtier.p.gguf"
expect_ok "prepare --bundle" "$ember" prepare -m "$tmp/dtier.gguf" --profile "$tmp/dtier.prof.gguf" --sparsity 0.5 --bundle -o "$tmp/dtier.b.gguf"
contains "prepare says it bundled" "$tmp/err" "bundled by neuron with gate and up"
contains "prepare lays out the profile's clusters" "$tmp/err" "in bands of 256 neurons that fire together"
expect_ok "prepare --no-cluster" "$ember" prepare -m "$tmp/dtier.gguf" --profile "$tmp/dtier.prof.gguf" --bundle --no-cluster -o "$tmp/dtier.nc.gguf"
if grep -q "fire together" "$tmp/err"; then fail "prepare --no-cluster still clustered"; else pass; fi
rm -f "$tmp/dtier.nc.gguf"
for mode in dense predictor threshold; do
  for where in "" "--mmap" "--mem-budget 150M"; do
    for f in p b; do
      "$ember" perplexity -m "$tmp/dtier.$f.gguf" -f "$tmp/text.txt" -c 64 --chunks 2 -t 2 --sparse-mode $mode $where --save-logits "$tmp/bundle.$f.lp" >/dev/null 2>&1
    done
    [ -s "$tmp/bundle.p.lp" ] && cmp -s "$tmp/bundle.p.lp" "$tmp/bundle.b.lp" && pass || fail "bundled file ($mode $where): logits differ from the unbundled file's"
    rm -f "$tmp/bundle.p.lp" "$tmp/bundle.b.lp"
  done
done
# A budget that leaves room past the repacked matrices keeps what every token reads and the
# hottest neurons resident; the bundled file under it still gives the unbundled file's logits.
expect_ok "bundled file keeps hot neurons" "$ember" perplexity -m "$tmp/dtier.b.gguf" -f "$tmp/text.txt" -c 64 --chunks 2 -t 2 --mem-budget 180M --save-logits "$tmp/bundle.b.lp"
contains "hot neurons kept" "$tmp/err" "memory tier: kept resident [0-9.]+ MiB that every token reads and the rows of the [1-9][0-9]* hottest of [0-9]+ neurons \([0-9.]+ MiB, [0-9.]+% of the profile's firings\)"
"$ember" perplexity -m "$tmp/dtier.p.gguf" -f "$tmp/text.txt" -c 64 --chunks 2 -t 2 --save-logits "$tmp/bundle.p.lp" >/dev/null 2>&1
[ -s "$tmp/bundle.p.lp" ] && cmp -s "$tmp/bundle.p.lp" "$tmp/bundle.b.lp" && pass || fail "bundled file with hot neurons kept: logits differ from the unbundled file's"
expect_ok "bundled file bench under a budget" "$ember" bench -m "$tmp/dtier.b.gguf" -p 0 -n 4 -r 1 -t 2 --mem-budget 180M
contains "bench says the share kept" "$tmp/out" "^memory tier: [0-9.]+ MiB of weights resident; last decode run: [0-9.]+% of the neuron rows asked for kept resident"
"$ember" generate -m "$tmp/dtier.b.gguf" -p "the cat sat" -n 16 --temp 0 -t 2 >"$tmp/bundle.gen0" 2>/dev/null
under_limit "bundled file under a cgroup limit" 180 "$tmp/bundle.gen0" "$ember" generate -m "$tmp/dtier.b.gguf" -p "the cat sat" -n 16 --temp 0 -t 2
expect_error "prepare --bundle of mixed types" "a bundle is one tensor of one type; pass --down-type [a-z0-9_]+ if down may take the gate" "$ember" prepare -m "$tmp/relu.gguf" --profile "$tmp/relu.profile.gguf" --bundle --down-type f16 -o "$tmp/x.gguf"

echo "cli: $passes passed, $failures failed"
[ "$failures" -eq 0 ]
