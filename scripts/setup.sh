#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for Ember: installs the build dependencies that are
# missing, downloads the default model and the English text corpus of the accuracy tools
# (scripts/get_corpus.sh; both verified by SHA-256, nothing is downloaded twice) and builds the
# `ember` program (Release) in build/. With --tests also what the test suite uses: chromium and
# tmux, and the Python clients the server tests drive (openai, ollama, LangChain, litellm, the
# Agents SDK, lm-eval, selenium) in .venv, which tests/server/run.sh picks up.
#   scripts/setup.sh            deps + model + the ember program
#   scripts/setup.sh --no-build deps + model only
#   scripts/setup.sh --gemma    also the second real model, Gemma-3-270M Q4_K_M (240 MB)
#   scripts/setup.sh --tests    also the test suite's packages (scripts/test.sh passes it)
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
gemma=0
tests=0
for arg in "$@"; do
  case "$arg" in
    --no-build) build=0 ;;
    --gemma) gemma=1 ;;
    --tests) tests=1 ;;
    *) echo "setup.sh: unknown option '$arg' (known: --no-build, --gemma, --tests)" >&2; exit 2 ;;
  esac
done

# CMake configures the tests too (GTest), so their headers come with the build's packages.
packages=(build-essential cmake ninja-build pkg-config libcli11-dev nlohmann-json3-dev libfmt-dev libgtest-dev
          libgmock-dev python3 python3-pip python3-venv unzip curl coinor-libcbc-dev)
if ((tests)); then packages+=(libbenchmark-dev chromium chromium-driver tmux); fi
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
# Debian 12's pip refuses to install into the system Python (PEP 668). lm-eval with its `api`
# extra only: its local-completions model needs no torch.
py_packages=(openai==3.54.0 selenium==4.51.0 jsonschema==4.26.0 ollama==0.6.3 langchain-openai==1.7.4 langchain-ollama==1.1.0 openai-agents==0.24.0 litellm==1.110.2 jinja2==3.1.6 "lm-eval[api]==0.4.13")
if ((tests)) && ! .venv/bin/python -c "import openai, selenium, jsonschema, ollama, langchain_openai, langchain_ollama, agents, litellm, jinja2, lm_eval" 2>/dev/null; then
  echo "setup: installing ${py_packages[*]} into .venv" >&2
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet "${py_packages[@]}"
fi

scripts/get_model.sh smollm2
if ((gemma)); then scripts/get_model.sh gemma3; fi
scripts/get_corpus.sh

if ((build)); then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)" --target ember
fi
