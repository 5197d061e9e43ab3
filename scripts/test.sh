#!/usr/bin/env bash
# Builds Ember and runs the whole test suite (what .ci/run calls). Installs missing build
# dependencies and both real models (SmolLM2 and Gemma 3, whose tests skip without them) first,
# so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-build --gemma --tests
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
cd build && ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
