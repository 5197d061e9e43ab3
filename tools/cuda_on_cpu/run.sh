#!/usr/bin/env bash
# Builds ember-tests with the CUDA backend translated for the HIP CPU runtime and runs the CUDA
# tests (or the gtest filter given) on this machine's CPU: the kernels' logic, indexing and
# block-level synchronization checked without a GPU. See README.md beside this script.
#   tools/cuda_on_cpu/run.sh HIP_CPU_DIR [GTEST_FILTER]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: tools/cuda_on_cpu/run.sh HIP_CPU_DIR [GTEST_FILTER]" >&2; exit 2; }
hip=$(cd "$1" && pwd)
filter=${2:-CudaOps.*}
[ -f "$hip/include/hip/hip_runtime.h" ] || { echo "run.sh: $hip is not a HIP-CPU checkout (include/hip/hip_runtime.h)" >&2; exit 2; }
dpkg-query -W -f='${Status}' libtbb-dev 2>/dev/null | grep -q "install ok installed" ||
  { echo "run.sh: the HIP CPU runtime needs Debian's libtbb-dev (apt-get install libtbb-dev)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${EMBER_CUDA_ON_CPU_DIR:-/tmp/ember-cuda-on-cpu}
mkdir -p "$work"
# The runtime's headers, with 32-lane warps (its default, 64, is AMD's wavefront).
rm -rf "$work/hip" "$work/tree"
cp -r "$hip" "$work/hip"
sed -i 's/inline constexpr int warpSize{64};.*/inline constexpr int warpSize{32};/' "$work/hip/include/hip/hip_constants.h"
grep -q 'warpSize{32}' "$work/hip/include/hip/hip_constants.h" || { echo "run.sh: could not set warpSize to 32" >&2; exit 1; }
# The working tree, its CUDA sources translated to C++.
mkdir -p "$work/tree"
(cd "$root" && tar cf - --exclude='./build*' --exclude=./.git --exclude=./models --exclude=./gpu-pack --exclude=./.venv .) |
  (cd "$work/tree" && tar xf -)
[ -d "$root/models" ] && ln -sfn "$root/models" "$work/tree/models"
for f in "$work"/tree/src/ops/cuda/*.cu; do python3 "$here/translate.py" "$f" "${f%.cu}_hip.cpp"; rm "$f"; done
for f in "$work"/tree/src/ops/cuda/*.cuh; do python3 "$here/translate.py" "$f" "$f"; done
python3 - "$work/tree/CMakeLists.txt" "$work/hip/include" "$here" <<'PY'
import sys
path, hip_include, shim = sys.argv[1:4]
s = open(path).read()
s = s.replace('set(EMBER_CUDA "AUTO"', 'set(EMBER_CUDA "OFF"')
cut = 'if(NOT EMBER_HAS_CUDA)\n  list(FILTER EMBER_SOURCES EXCLUDE REGEX "/src/device/cuda/cuda_device\\\\.cpp$")\nendif()'
assert cut in s, 'CMakeLists.txt changed: update tools/cuda_on_cpu/run.sh'
s = s.replace(cut, '')
link = 'target_link_libraries(emberlib PUBLIC Threads::Threads fmt::fmt nlohmann_json::nlohmann_json PRIVATE PkgConfig::CBC)'
assert link in s, 'CMakeLists.txt changed: update tools/cuda_on_cpu/run.sh'
s = s.replace(link, link + '\ntarget_link_libraries(emberlib PUBLIC tbb)\ntarget_compile_definitions(emberlib PUBLIC EMBER_HAS_CUDA=1)\n'
              'target_include_directories(emberlib PUBLIC ' + hip_include + ' ' + shim + ')')
open(path, 'w').write(s)
PY
cmake -S "$work/tree" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_BENCH=OFF >/dev/null
cmake --build "$work/build" --target ember-tests -j"$(nproc)"
"$work/build/ember-tests" --gtest_filter="$filter"
