#!/usr/bin/env bash
# The checks that need a GPU, as one script for a lent device machine (see /work/.library/device
# in the development environment) or any CUDA host:
#   bash scripts/device-wheels.sh      # here: .whl/ with what the device machine lacks (it has no network)
#   bash scripts/device-checks.sh      # there, with .whl carried; logs and results under ${OUT:-/tmp/decodebench-device}
# On a host whose python3 has a CUDA torch it uses that torch, the carried wheels (--target
# /tmp/site) and the checkout on PYTHONPATH; elsewhere it builds a venv with the pinned torch.
# It runs tests/gpu/ (test_gpu.py on a MIG slice too: NVML by the MIG UUID, the launcher reading the real
# `nvidia-smi -L`; test_graphs_cuda.py, the CUDA graphs), `decodebench doctor --local --require-gpu`, the decode
# step eager against CUDA graphs (benchmarks/bench_graphs.py) and the throughput
# benchmark on cuda:0 with its GPU section (a GPT-2-sized random-weight model in bfloat16),
# then the report's map on 8 of the host's CPU cores, in about 9 minutes on an H200 (the device lease
# is 15 minutes, start-up included).
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
timeout --signal=INT --kill-after=15 "${TEST_GPU_S:-300}" $PY -m pytest tests/gpu/ -q -rs -s -p no:cacheprovider --durations=8 2>&1 \
  | tee "$out/test_gpu.txt"
# The decode step captured as CUDA graphs against the eager one and transformers' compiled static-cache path
# (issue 44, docs/performance.md#cuda-graphs): GPT-2 124M and a ~1.1B Llama, batch 1, 8, 32 and auto; sections
# start within GRAPHS_S seconds (default 240; the results file is rewritten after each section). CHECKS=graphs
# runs only the GPU tests and this (about 8 minutes on an H100), for a short lease.
timeout --signal=INT --kill-after=30 "$(( ${GRAPHS_S:-240} + 120 ))" $PY benchmarks/bench_graphs.py --device cuda:0 --rounds 3 \
  --budget-s "${GRAPHS_S:-240}" --out "$out/results_graphs_cuda.json" 2>&1 | tee "$out/bench_graphs_cuda.txt"
if [ "${CHECKS:-all}" = "graphs" ]; then exit 0; fi
# vs_pipeline at batch 1 on 32 prompts only (the per-prompt loop is slow by design); GPU section 3 minutes.
# At most BENCH_S seconds, 420 by default (SIGINT, then SIGKILL 30 s later): the results file is rewritten after each section,
# so a run cut short keeps what it measured ("complete": false); transformers' continuous batching, the
# last section, is the one most likely to overrun.
timeout --signal=INT --kill-after=30 "${BENCH_S:-420}" $PY benchmarks/bench_throughput.py --device cuda:0 --rounds 3 --batch 32 \
  --pipeline-prompts 32 --pipeline-also --gpu-minutes "${GPU_MINUTES:-3}" --out "$out/results_cuda.json" 2>&1 \
  | tee "$out/bench_throughput_cuda.txt"
# Own engine vs vLLM (benchmarks/bench_engines.py, docs/engines.md) where the host's python has vLLM
# (the GPU package, vllm 0.33, with its own torch: a vLLM worker image or a venv of its own; the
# device machine's carried wheels cannot hold it): a GPT-2-sized random-weight model in bfloat16
# over the bundled tokenizer, greedy and top_p at batch 1 and auto, with each side's fraction of the
# memory-bandwidth bound (H200: 4.8 TB/s; set BANDWIDTH_GBS for another GPU). At most 4 minutes.
if $PY -c "import vllm" 2>/dev/null; then
  $PY - "$out/gpt2-size" <<'PY'
import sys
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
src = "examples/models/austen-tiny"
cfg = AutoConfig.for_model("gpt2", n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=4096,
                           bos_token_id=0, eos_token_id=0)
AutoModelForCausalLM.from_config(cfg).to(dtype=__import__("torch").bfloat16).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(src).save_pretrained(sys.argv[1])
PY
  timeout --signal=INT --kill-after=30 240 $PY benchmarks/bench_engines.py --device cuda:0 --model "$out/gpt2-size" \
    --dtype bfloat16 --rounds 3 --prompts 64 --bandwidth-gbs "${BANDWIDTH_GBS:-4800}" \
    --out "$out/results_engines_cuda.json" 2>&1 | tee "$out/bench_engines_cuda.txt"
else
  echo "device-checks: no vllm in this python: own engine vs vLLM skipped (docs/engines.md)" | tee "$out/bench_engines_cuda.txt"
fi
# The report's map on the host's CPU cores (issue 25 asks >= 4x on 8 workers; the development machine has 2):
# one process against a pool of 8 over 80 cells of 200 generations (benchmarks/bench_report.py, `pooled`:
# the same independent task per cell and per pair the report workers run; docs/reports.md). CPU only,
# about a minute; at most REPORT_S seconds, and last, so that it never cuts the GPU checks short.
timeout --signal=INT --kill-after=15 "${REPORT_S:-150}" $PY benchmarks/bench_report.py --cells 80 --gens 200 --workers 8 \
  --modes single,pooled,cached 2>&1 | tee "$out/bench_report_cpu.txt"
