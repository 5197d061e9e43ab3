#!/usr/bin/env bash
# Runs one server test script with the project's Python environment (.venv, made by
# scripts/setup.sh) when there is one, else the system python3. The scripts exit 77 (ctest's
# SKIP_RETURN_CODE) when the model, a Python package or chromium is missing.
#   tests/server/run.sh SCRIPT.py path/to/ember models-dir
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=python3
[ -x "$here/../../.venv/bin/python" ] && py="$here/../../.venv/bin/python"
script=$1
shift
exec "$py" "$here/$script" "$@"
