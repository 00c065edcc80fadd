#!/usr/bin/env bash
# The project's virtual environment (`make demo`: `run`; `make install` and `make test`: `dev`):
#   run  the CPU torch first (TORCH, so that no dependency pulls a CUDA build of several GB), decodebench
#        with its worker extra, and the example strategy plugin (docs/sweeps.md), offline, without build
#        isolation: what a sweep needs;
#   dev  the above and the dev tools (tests, lint, the S3 stand-in).
# The installer is uv with pip's own sources (scripts/uv-env.sh): from a fresh clone on the 2-core
# development machine it builds the dev environment in about 20 s where pip took about 3 minutes, the
# same packages at the same versions (docs/performance.md). INSTALLER=pip installs with pip.
set -euo pipefail
cd "$(dirname "$0")/.."

WHAT="${1:?usage: scripts/install.sh run|dev}"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
TORCH="${TORCH:-torch==2.13.0}"
INSTALLER="${INSTALLER:-uv}"

# One line per step on stderr, with the seconds so far: the installers themselves run quietly.
step() { printf 'install (%s) [%s/4, %ds]: %s\n' "$WHAT" "$1" "$SECONDS" "$2" >&2; }

step 1 "virtual environment $VENV and the installer ($INSTALLER)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
source scripts/uv-env.sh
installer "$VENV" "$INSTALLER"

step 2 "$TORCH (the largest download)"
# shellcheck disable=SC2086  # TORCH may carry options, e.g. 'torch==2.13.0 --index-url ...'
install $TORCH
if [ "$WHAT" = dev ]; then
  step 3 "decodebench with its worker and dev extras"
  install -e '.[worker,dev]'
else
  step 3 "decodebench with its worker extra (transformers, ...)"
  install -e '.[worker]'
fi
step 4 "the example strategy plugin"
install --no-build-isolation -e examples/plugin-strategy
TORCH="$TORCH" "$VENV/bin/python" -c '
import os, sys, torch
if torch.version.cuda and os.environ["TORCH"] == "torch==2.13.0":
    sys.exit(f"install: {sys.prefix} has a CUDA build of torch ({torch.__version__}); the CPU wheel goes first (TORCH)")
'
step 4 "done: $VENV"
