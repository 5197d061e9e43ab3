#!/usr/bin/env bash
# Builds the GGUF reader fuzz target with clang + libFuzzer (+ ASan/UBSan) and runs it.
#   scripts/fuzz_gguf.sh [SECONDS=60] [JOBS=1]
# Needs clang and libclang-rt-dev (Debian: apt-get install clang libclang-rt-14-dev).
# Crashing inputs are copied to tests/data/gguf_malformed/, which the test suite replays
# (GgufMalformed.SavedCrashInputs); fix the reader, then commit them as regression inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
jobs=${2:-1}
CXX=${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++)}
out=build-fuzz
mkdir -p "$out" "$out/corpus" "$out/artifacts" tests/data/gguf_malformed
sources=(src/gguf/reader.cpp src/gguf/value.cpp src/tensor/dtype.cpp src/core/mmap_file.cpp tests/fuzz/fuzz_gguf.cpp)
if [[ ! -x $out/fuzz_gguf ]] || [[ -n $(find "${sources[@]}" src/gguf/*.hpp -newer "$out/fuzz_gguf") ]]; then
  echo "building $out/fuzz_gguf with $CXX"
  "$CXX" -std=c++20 -g -O1 -Isrc -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    "${sources[@]}" -lfmt -o "$out/fuzz_gguf"
fi
# Seeds: the committed corpus plus the saved regression inputs.
cp -n tests/fuzz/corpus/* "$out/corpus/" 2>/dev/null || true
cp -n tests/data/gguf_malformed/* "$out/corpus/" 2>/dev/null || true
status=0
parallel=()
[[ $jobs -gt 1 ]] && parallel=(-jobs="$jobs" -workers="$jobs")  # logs go to $out/fuzz-N.log
(cd "$out" && ./fuzz_gguf corpus -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 \
  -artifact_prefix=artifacts/ -print_final_stats=1 "${parallel[@]}") || status=$?
found=$(find "$out/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
if [[ $found -gt 0 ]]; then
  cp "$out"/artifacts/* tests/data/gguf_malformed/
  echo "fuzz_gguf: $found failing input(s) copied to tests/data/gguf_malformed/"
fi
exit $status
