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
expect_ok "bench on synth" "$ember" bench -m "$tmp/tiny.gguf" -p 16 -n 8 -r 2 --json "$tmp/bench.json"
python3 -c "import json; d=json.load(open('$tmp/bench.json')); assert d['tg8']['median'] > 0 and d['pp16']['median'] > 0" \
  && pass || fail "bench JSON lacks pp16/tg8 medians"
"$ember" generate -m "$tmp/tiny.gguf" -p "abc" -n 12 --temp 0.9 --seed 3 >"$tmp/a" 2>/dev/null
"$ember" generate -m "$tmp/tiny.gguf" -p "abc" -n 12 --temp 0.9 --seed 3 >"$tmp/b" 2>/dev/null
cmp -s "$tmp/a" "$tmp/b" && pass || fail "same seed gave different output"

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

# Placement (ember plan): a 7B plan from shapes, a plan file for a synth ReLU model, errors.
expect_ok "plan 7b shapes" "$ember" plan --synth-preset 7b --vram-budget 2GiB --time-limit 1
contains "plan compares methods" "$tmp/out" "layer-split"
expect_ok "synth relu" "$ember" synth --preset tiny --type q4_0 --act relu --sparsity 0.8 -o "$tmp/relu.gguf"
expect_ok "plan synth file" "$ember" plan -m "$tmp/relu.gguf" --vram-budget 64K --min-neurons 16 -o "$tmp/relu.plan.gguf"
expect_ok "inspect plan" "$ember" inspect "$tmp/relu.plan.gguf"
contains "plan file" "$tmp/out" "ember-plan"
expect_ok "generate hybrid with plan" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --temp 0 --plan "$tmp/relu.plan.gguf"
contains "hybrid log" "$tmp/err" "hybrid FFN"
expect_ok "generate hybrid budget" "$ember" generate -m "$tmp/relu.gguf" -p "hello" -n 4 --temp 0 --vram-budget 64K
expect_error "generate hybrid no profile" "profile" "$ember" generate -m "$tmp/tiny.gguf" -p "hello" -n 4 --vram-budget 64K
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

echo "cli: $passes passed, $failures failed"
[ "$failures" -eq 0 ]
