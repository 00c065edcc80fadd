#!/usr/bin/env bash
# Regenerate requirements/worker.lock.txt: every Python package of the worker image (the project's
# dependencies and its `worker` extra) pinned with its sha256 hashes, for the image's Python 3.12
# on x86_64 Linux. torch and the CUDA packages it pulls (nvidia-*, cuda-*, triton) are left out:
# Dockerfile.worker installs them first from the index of the chosen CUDA build (TORCH_INDEX_URL).
#
# Usage: scripts/lock-worker.sh         (needs uv: pip install uv; PyPI access)
set -euo pipefail
cd "$(dirname "$0")/.."
uv="${UV:-$(command -v uv || echo .tools/uv/bin/uv)}"
exclude=(torch triton cuda-bindings cuda-pathfinder cuda-toolkit)
exclude+=(nvidia-cublas nvidia-cuda-cccl nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13)
exclude+=(nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13)
exclude+=(nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx)
args=()
for p in "${exclude[@]}"; do args+=(--no-emit-package "$p"); done
"${uv}" pip compile pyproject.toml --extra worker --generate-hashes --python-version 3.12 \
  --python-platform x86_64-manylinux_2_28 "${args[@]}" --custom-compile-command scripts/lock-worker.sh \
  -o requirements/worker.lock.txt
