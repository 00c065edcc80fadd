#!/usr/bin/env bash
# The checks that need a GPU, as one script for a lent device machine (see /work/.library/device
# in the development environment) or any CUDA host:
#   bash scripts/device-wheels.sh      # here: .whl/ with what the device machine lacks (it has no network)
#   bash scripts/device-checks.sh      # there, with .whl carried; logs and results under ${OUT:-/tmp/decodebench-device}
# On a host whose python3 has a CUDA torch it uses that torch, the carried wheels (--target
# /tmp/site) and the checkout on PYTHONPATH; elsewhere it builds a venv with the pinned torch.
# It runs tests/test_gpu.py (on a MIG slice too: NVML by the MIG UUID, the launcher reading the real
# `nvidia-smi -L`), `decodebench doctor --local --require-gpu` and the throughput
# benchmark on cuda:0 with its GPU section (a GPT-2-sized random-weight model in bfloat16),
# in about 8 minutes on an H200 (the device lease is 15 minutes, start-up included).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/decodebench-device}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  PY=python3
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "device-checks: the carried wheels did not install"; exit 1; }
    export PYTHONPATH="/tmp/site"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  python3 -m venv /tmp/dbenv && . /tmp/dbenv/bin/activate
  pip install -q torch==2.13.0 && pip install -q -e '.[worker,dev]' || { echo "device-checks: install failed"; exit 1; }
  PY=python
fi
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv | tee "$out/nvidia-smi.csv"
$PY -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)" \
  | tee "$out/versions.txt"
$PY -c "from controller.cli import main; main()" doctor --local --require-gpu 2>&1 | tee "$out/doctor.txt"
$PY -m pytest tests/test_gpu.py -q -rs -p no:cacheprovider 2>&1 | tee "$out/test_gpu.txt"
# vs_pipeline at batch 1 on 32 prompts only (the per-prompt loop is slow by design); GPU section 3 minutes.
# At most 7 minutes (SIGINT, then SIGKILL 30 s later): the results file is rewritten after each section,
# so a run cut short keeps what it measured ("complete": false); transformers' continuous batching, the
# last section, is the one most likely to overrun.
timeout --signal=INT --kill-after=30 420 $PY benchmarks/bench_throughput.py --device cuda:0 --rounds 3 --batch 32 \
  --pipeline-prompts 32 --pipeline-also --gpu-minutes 3 --out "$out/results_cuda.json" 2>&1 \
  | tee "$out/bench_throughput_cuda.txt"
