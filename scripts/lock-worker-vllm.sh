#!/usr/bin/env bash
# Regenerate requirements/worker-vllm.lock.txt, the lock of the vLLM worker image
# (`docker build -f Dockerfile.worker $(sed 's/^/--build-arg /' docker/vllm.args) ...`, docs/deploy.md):
# vLLM's GPU package (vllm==0.33.0) with everything it pins, among them its own transformers (< 5.20),
# plus the project's dependencies and its `worker` extra but torch and transformers, which vLLM's pins
# decide; every package pinned with its sha256 hashes, for the image's Python 3.12 on x86_64 Linux.
# vLLM's torch (docker/vllm.args TORCH_VERSION, checked here) and the CUDA packages it pulls (nvidia-*,
# cuda-*, triton) are left out, as in scripts/lock-worker.sh: Dockerfile.worker installs torch first.
#
# Usage: scripts/lock-worker-vllm.sh    (needs uv: pip install uv; PyPI access)
set -euo pipefail
cd "$(dirname "$0")/.."
uv="${UV:-$(command -v uv || echo .tools/uv/bin/uv)}"
vllm="${VLLM_PKG:-vllm==0.33.0}"
torch="$(sed -n 's/^TORCH_VERSION=//p' docker/vllm.args)"
platform=(--python-version 3.12 --python-platform x86_64-manylinux_2_28)
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# The inputs: vLLM, and decodebench's dependencies by name but torch and transformers.
python3 - "${vllm}" > requirements/worker-vllm.in <<'PY'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("# The vLLM worker image's inputs (scripts/lock-worker-vllm.sh writes this file and the lock)")
print(sys.argv[1])
for dep in project["dependencies"] + project["optional-dependencies"]["worker"]:
    if re.split(r"[<>=\[ ;]", dep)[0] not in ("torch", "transformers"):
        print(dep)
PY
# vLLM's torch must be the image's: the lock would otherwise replace the torch installed first.
"${uv}" pip compile requirements/worker-vllm.in "${platform[@]}" --no-annotate --no-header -q -o "${work}/all.txt"
pinned="$(sed -n 's/^torch==//p' "${work}/all.txt")"
if [[ "${pinned}" != "${torch}" ]]; then
  echo "lock-worker-vllm: ${vllm} pins torch ${pinned}; set TORCH_VERSION=${pinned} in docker/vllm.args" >&2
  exit 1
fi
# What torch pulls for its CUDA build comes with it, not from the lock.
echo "torch==${torch}" > "${work}/torch.in"
"${uv}" pip compile "${work}/torch.in" "${platform[@]}" --no-annotate --no-header -q -o "${work}/torch.txt"
args=()
for p in $(sed -n 's/==.*//p' "${work}/torch.txt" | grep -E '^(torch|triton|cuda-|nvidia-)'); do
  args+=(--no-emit-package "$p")
done
"${uv}" pip compile requirements/worker-vllm.in --generate-hashes "${platform[@]}" "${args[@]}" \
  --custom-compile-command scripts/lock-worker-vllm.sh -o requirements/worker-vllm.lock.txt
