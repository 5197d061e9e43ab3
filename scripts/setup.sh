#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for Ember: installs the build dependencies that are
# missing, the Python packages the server tests use (the `openai` and `ollama` clients, LangChain, selenium, into
# .venv, which tests/server/run.sh picks up), downloads the default model and the English text
# corpus of the accuracy tools (scripts/get_corpus.sh; both verified by SHA-256, nothing is
# downloaded twice) and builds a Release binary in build/.
#   scripts/setup.sh            deps + model + build
#   scripts/setup.sh --no-build deps + model only
#   scripts/setup.sh --gemma    also the second real model, Gemma-3-270M Q4_K_M (240 MB)
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
gemma=0
for arg in "$@"; do
  case "$arg" in
    --no-build) build=0 ;;
    --gemma) gemma=1 ;;
    *) echo "setup.sh: unknown option '$arg' (known: --no-build, --gemma)" >&2; exit 2 ;;
  esac
done

packages=(build-essential cmake ninja-build pkg-config libcli11-dev nlohmann-json3-dev libfmt-dev libgtest-dev
          libgmock-dev libbenchmark-dev python3 python3-pip python3-venv unzip
          curl chromium chromium-driver coinor-libcbc-dev tmux)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python packages of the server tests (tests/server/), versions as tested. A venv, because
# Debian 12's pip refuses to install into the system Python (PEP 668).
py_packages=(openai==3.54.0 selenium==4.51.0 jsonschema==4.26.0 ollama==0.6.3 langchain-openai==1.7.4 langchain-ollama==1.1.0 openai-agents==0.24.0 litellm==1.110.2 jinja2==3.1.6)
if ! .venv/bin/python -c "import openai, selenium, jsonschema, ollama, langchain_openai, langchain_ollama, agents, litellm, jinja2" 2>/dev/null; then
  echo "setup: installing ${py_packages[*]} into .venv" >&2
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet "${py_packages[@]}"
fi

scripts/get_model.sh smollm2
if ((gemma)); then scripts/get_model.sh gemma3; fi
scripts/get_corpus.sh

if ((build)); then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)"
fi
