#!/usr/bin/env bash
# `make test` (what .ci/run calls): lint, the layering contracts, the main suite and, beside it, the vLLM engine's
# tests. In the background from the start: the vLLM engine's environment (.venv-vllm, scripts/setup-vllm.sh: mostly
# download and unpack) builds, its log in .venv-vllm.log, then the vLLM tests (tests/vllm/test_vllm_env.py) run in it
# with DECODEBENCH_REQUIRE_VLLM=1, so that they fail rather than skip, their output in .venv-vllm-tests.log; while
# lint and the main suite run. The main suite leaves a quarter of the 2 cores idle (its tests wait on servers and
# subprocesses), which the vLLM tests take: a clean clone's run took 12 min 57 s and 13 min 49 s side by side against
# 14 min 7 s one after the other (docs/engines.md, "Tests and benchmark"). Then the vLLM tests' output; a failed build
# fails the run with one line, after its log. Expects `make install`.
# The main suite runs in TEST_WORKERS processes (pytest-xdist, default 2: the CI machine's cores), a test file
# whole on one of them (--dist loadfile: module fixtures are made once), each worker's torch on one thread
# (tests/conftest.py); TEST_WORKERS=0 runs it in this process. It ends with its 25 slowest tests
# (--durations=25), so that CI's log shows where its minutes go.
# Arguments go to the main suite's pytest (bash scripts/run-tests.sh tests/repo/test_layout.py: that file only).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${BIN:-.venv/bin}"
LOG="${VLLM_ENV_LOG:-.venv-vllm.log}"
TESTS_LOG="${VLLM_TESTS_LOG:-.venv-vllm-tests.log}"
export PATH="$PWD/.tools/bin:$PATH"
BUILD_FAILED=97 # the background job's status when the build failed (pytest's own are 0 to 5)
DEPS_READY="$(mktemp -u "${TMPDIR:-/tmp}/decodebench-deps-ready.XXXXXX")" # made once setup-test-deps.sh has run

set -m # the background job in a process group of its own, so that a run stopped early ends all of it
{
  bash scripts/setup-vllm.sh >"$LOG" 2>&1 || exit "$BUILD_FAILED"
  until [ -e "$DEPS_READY" ]; do sleep 1; done # redis-server, which the foreground installs
  DECODEBENCH_REQUIRE_VLLM=1 "$BIN/python" -m pytest -q -p no:cacheprovider tests/vllm/test_vllm_env.py >"$TESTS_LOG" 2>&1
} &
vllm=$!
set +m
trap 'kill -- "-$vllm" 2>/dev/null || true; rm -f "$DEPS_READY"' EXIT
trap 'exit 130' INT TERM

"${MAKE:-make}" --no-print-directory lint
bash scripts/setup-test-deps.sh
touch "$DEPS_READY"
"$BIN/python" -m pytest -q --durations=25 -n "${TEST_WORKERS:-2}" --dist loadfile --ignore=tests/vllm/test_vllm_env.py "$@"

echo "run-tests: waiting for the vLLM tests (.venv-vllm: scripts/setup-vllm.sh, log in $LOG; the tests' in $TESTS_LOG)"
status=0
wait "$vllm" || status=$?
trap - EXIT
rm -f "$DEPS_READY"
if [ "$status" = "$BUILD_FAILED" ]; then
  tail -n 80 "$LOG" >&2
  echo "make test: building .venv-vllm failed: the last lines of its log ($LOG, scripts/setup-vllm.sh) are above" >&2
  exit 1
fi
tail -n 1 "$LOG"
cat "$TESTS_LOG"
if [ "$status" != 0 ]; then
  echo "make test: the vLLM engine's tests (tests/vllm/test_vllm_env.py) failed: their output is above" >&2
  exit 1
fi
