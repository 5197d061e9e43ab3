#!/usr/bin/env bash
# Packs Ember for a bare GPU machine (NVIDIA driver, CUDA toolkit, CMake and ninja; none of the
# project's libraries, no network): builds `ember`, `ember-tests` and `ember-cuda-kernels` with CUDA for sm_90 in
# build-cuda/, then copies them (stripped) with every shared library they load that is not part
# of the C library itself (fmt, CBC and its COIN-OR libraries, BLAS/LAPACK,
# gfortran, libstdc++, cudart, ...) into gpu-pack/ (git-ignored), with a MANIFEST (file, bytes,
# SHA-256, where it came from). The whole must stay under 60 MiB: the device tool carries at most
# 64 MiB with the working tree.
#   scripts/gpu_pack.sh [PACKDIR]      then, on the GPU machine: scripts/gpu_run.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
pack=${1:-gpu-pack}
limit=$((60 * 1024 * 1024))

command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "gpu_pack: no CUDA compiler (nvcc) here; install the CUDA toolkit" >&2; exit 1; }
echo "gpu_pack: building ember, ember-tests and ember-cuda-kernels with CUDA for sm_90 in build-cuda/" >&2
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DEMBER_BENCH=ON >/dev/null
programs=(ember ember-tests ember-cuda-kernels)
cmake --build build-cuda --target ember-cli ember-tests ember-cuda-kernels -j"$(nproc)"

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib"
for p in "${programs[@]}"; do
  cp "build-cuda/$p" "$pack/bin/"
  strip --strip-unneeded "$pack/bin/$p"
done

# Every library the two load, but the C library's own (its loader, libc, libm, libpthread,
# libdl, librt: the GPU machine's are compatible, and a foreign copy of them is not) and the
# CUDA driver (libcuda: the machine's own must match its kernel module).
system='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libcuda\.so)'
libs=$(ldd "${programs[@]/#/build-cuda/}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
missing=$(ldd "${programs[@]/#/build-cuda/}" | grep "not found" || true)
[ -z "$missing" ] || { echo "gpu_pack: unresolved libraries here:"$'\n'"$missing" >&2; exit 1; }
{
  echo "# Ember GPU pack, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git describe --always --dirty 2>/dev/null || echo '?')"
  echo "# built on: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1), $(nvcc --version 2>/dev/null | tail -1 || /usr/local/cuda/bin/nvcc --version | tail -1)"
  echo "# file bytes sha256 source"
} >"$pack/MANIFEST"
while read -r name path; do
  [[ "$name" =~ $system ]] && continue
  cp -L "$path" "$pack/lib/$name"
done <<<"$libs"
(cd "$pack" && for f in bin/* lib/*; do
  printf '%s %s %s %s\n' "$f" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-64)" \
    "$(if [[ $f == bin/* ]]; then echo "build-cuda/${f#bin/}"; else awk -v n="${f#lib/}" '$1 == n {print $2; exit}' <<<"$libs"; fi)"
done) >>"$pack/MANIFEST"

total=$(du -sb "$pack" | cut -f1)
echo "gpu_pack: $pack: $(ls "$pack/bin" | wc -l) programs, $(ls "$pack/lib" | wc -l) libraries, $((total / 1048576)) MiB" >&2
if [ "$total" -gt "$limit" ]; then
  echo "gpu_pack: $pack is $((total / 1048576)) MiB, over the 60 MiB the device tool can carry with the tree" >&2
  exit 1
fi
# Every library resolves from the pack alone (what the GPU machine will see, less libcuda).
LD_LIBRARY_PATH="$pack/lib" ldd "${programs[@]/#/$pack/bin/}" | grep -v "libcuda" | grep "not found" &&
  { echo "gpu_pack: a library does not resolve from $pack/lib" >&2; exit 1; }
echo "gpu_pack: ok; on the GPU machine: scripts/gpu_run.sh OUTDIR (carry $pack)" >&2
