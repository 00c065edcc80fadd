#!/usr/bin/env bash
# Wheels a lent GPU machine lacks, fetched here (where PyPI is reachable) into .whl/ (ignored by
# git), for scripts/device-checks.sh to install there: that machine reaches no network. Its
# image has Python 3.12 with a CUDA torch, tokenizers, safetensors, numpy, click, rich, pytest,
# nvidia-ml-py and huggingface_hub; it lacks pydantic, structlog, redis and rq, and its
# transformers is older than the one decodebench is locked to (requirements/worker.lock.txt),
# so that one travels too. Pure-Python wheels except pydantic-core (cp312, manylinux).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
lock() { grep -m1 -i "^$1==" requirements/worker.lock.txt | cut -d' ' -f1; }
py="${PYTHON:-python3}"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "$(lock transformers)" "$(lock pydantic)" "$(lock pydantic-core)" "$(lock annotated-types)" \
  "$(lock typing-inspection)" "$(lock typing-extensions)" "$(lock structlog)" "$(lock redis)" "$(lock rq)" \
  "$(lock croniter)" pytz
ls .whl
du -sh .whl
