#!/usr/bin/env bash
# The checks that need a GPU, as one script for a lent device machine (see
# /work/.library/device in the development environment, or any CUDA host):
#   bash scripts/device-checks.sh            # writes its logs under ${OUT:-/tmp/decodebench-device}
# It installs the project into a venv (torch as found, else the pinned wheel), runs
# tests/test_gpu.py and the throughput benchmark (benchmarks/bench_throughput.py with its GPU
# section: a GPT-2-sized random-weight model in bfloat16) on cuda:0, and `decodebench doctor`.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/decodebench-device}"; mkdir -p "$out"
python3 -m venv /tmp/dbenv && . /tmp/dbenv/bin/activate
python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
pip install -q -e '.[worker,dev]' 2>&1 | grep -v WARNING | tail -2
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv | tee "$out/nvidia-smi.csv"
decodebench doctor --local --require-gpu 2>&1 | tee "$out/doctor.txt"
python -m pytest tests/test_gpu.py -q -rs 2>&1 | tee "$out/test_gpu.txt"
python benchmarks/bench_throughput.py --device cuda:0 --rounds 3 --batch 32 --gpu-minutes 4 \
  --out "$out/results_cuda.json" 2>&1 | tee "$out/bench_throughput_cuda.txt"
