#!/usr/bin/env bash
# Builds Ember and runs the whole test suite (what .ci/run calls). Installs missing build
# dependencies and the default model first, so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
cd build && ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
