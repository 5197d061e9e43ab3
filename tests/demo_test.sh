#!/usr/bin/env bash
# The README's quick start answers its demo question correctly: the default model, its recommended
# sampling (no flag), five seeds, every answer names Paris. Skips (77) without the model.
#   tests/demo_test.sh path/to/ember models-dir
set -uo pipefail
ember=$1 model=$2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || { echo "SKIP: $model is not installed (scripts/setup.sh downloads it)"; exit 77; }
prompt=$(grep -o 'generate -m models/SmolLM2-135M-Instruct.Q4_1.gguf --chat -p "[^"]*"' "$(dirname "$0")/../README.md" | head -1 | sed 's/.*-p "\(.*\)"/\1/')
[ -n "$prompt" ] || { echo "FAIL: no demo command in README.md"; exit 1; }
fails=0
for seed in 1 2 3 4 5; do
  out=$("$ember" generate -m "$model" --chat -p "$prompt" -n 48 -s "$seed" -t 2 2>/dev/null)
  if grep -q "Paris" <<<"$out"; then echo "ok (seed $seed): $out"; else echo "FAIL (seed $seed): $out"; fails=$((fails + 1)); fi
done
exit $((fails > 0))
