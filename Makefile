# context-ceiling developer entry points. Everything installs itself; nothing by hand.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: venv lint typecheck litellm test test-fast demo image bench bench-validity bench-soak bench-trim local-model dashboards tools clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

local-model:  ## build/fetch (once, cached under ~/.cache/context-ceiling) llama-server + the GGUF model
	bash scripts/local_model.sh

tools:  ## Debian packages the tests use: Prometheus + promtool (rules, scrape), wrk, hey (load), buildah + mmdebstrap (the image); needs root
	command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v hey >/dev/null && command -v wrk >/dev/null \
	  && command -v buildah >/dev/null && command -v mmdebstrap >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus hey wrk buildah mmdebstrap)

image: venv  ## the container image, built with buildah on a Debian base from mmdebstrap (EXTRAS=sweep for the sweep Job's image)
	PYTHON=$(PY) bash scripts/image.sh

dashboards: venv  ## regenerate dashboards/generated from dashboards/mixin.py
	$(PY) -m dashboards.mixin

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

litellm:  ## LiteLLM's proxy in its own cached venv (the chaining tests and the benchmark peer)
	bash scripts/litellm.sh >/dev/null

test: venv lint typecheck local-model tools litellm  ## the README's test command; CI runs exactly this
	$(BIN)/pytest -q

test-fast: venv lint typecheck  ## the inner loop: everything but the slow, real-model and helm tests
	$(BIN)/pytest -q -m "not slow and not real_model and not helm and not image"

demo: venv local-model  ## the whole loop on a real local model
	$(PY) scripts/demo.py

bench: venv tools  ## side by side: direct, bare pass-through, LiteLLM's proxy, sidecar observe/enforce; then the soak
	bash scripts/litellm.sh >/dev/null
	$(PY) benchmarks/run.py $(BENCH_ARGS)
	$(PY) benchmarks/soak.py $(SOAK_ARGS)

bench-validity: venv  ## the sweep's statistics against known truth (simulation study, ~10 min)
	$(PY) benchmarks/validity.py $(VALIDITY_ARGS)

bench-soak: venv  ## RSS and open fds of the sidecar over 10 minutes of mixed, failing load
	$(PY) benchmarks/soak.py $(SOAK_ARGS)

bench-trim: venv  ## trimming generated agent traffic: validity and removal, LiteLLM side by side
	bash scripts/litellm.sh >/dev/null
	$(PY) benchmarks/trim_validity.py $(TRIM_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache out
