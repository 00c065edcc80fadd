#!/usr/bin/env bash
# `make test` (what .ci/run calls): lint, the layering contracts, the main suite, then the vLLM engine's
# tests. The vLLM engine's environment (.venv-vllm, scripts/setup-vllm.sh: mostly download and unpack)
# builds in the background from the start, its log in .venv-vllm.log, while lint and the main suite run;
# then the vLLM tests (tests/vllm/test_vllm_env.py) run with DECODEBENCH_REQUIRE_VLLM=1, so that they fail
# rather than skip. A failed build fails the run with one line, after its log. Expects `make install`.
# The main suite runs in TEST_WORKERS processes (pytest-xdist, default 2: the CI machine's cores), a test file
# whole on one of them (--dist loadfile: module fixtures are made once), each worker's torch on one thread
# (tests/conftest.py); TEST_WORKERS=0 runs it in this process. It ends with its 25 slowest tests
# (--durations=25), so that CI's log shows where its minutes go (docs/architecture.md, "The tests").
# Arguments go to the main suite's pytest (bash scripts/run-tests.sh tests/repo/test_layout.py: that file only).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${BIN:-.venv/bin}"
LOG="${VLLM_ENV_LOG:-.venv-vllm.log}"
export PATH="$PWD/.tools/bin:$PATH"

set -m # the build in a process group of its own, so that a run stopped early ends all of it
bash scripts/setup-vllm.sh >"$LOG" 2>&1 &
build=$!
set +m
trap 'kill -- "-$build" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM

"${MAKE:-make}" --no-print-directory lint
bash scripts/setup-test-deps.sh
"$BIN/python" -m pytest -q --durations=25 -n "${TEST_WORKERS:-2}" --dist loadfile --ignore=tests/vllm/test_vllm_env.py "$@"

echo "run-tests: waiting for .venv-vllm (scripts/setup-vllm.sh, log in $LOG)"
if ! wait "$build"; then
  trap - EXIT
  tail -n 80 "$LOG" >&2
  echo "make test: building .venv-vllm failed: the last lines of its log ($LOG, scripts/setup-vllm.sh) are above" >&2
  exit 1
fi
trap - EXIT
tail -n 1 "$LOG"
DECODEBENCH_REQUIRE_VLLM=1 "$BIN/python" -m pytest -q tests/vllm/test_vllm_env.py
