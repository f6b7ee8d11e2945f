# context-ceiling developer entry points. Everything installs itself; nothing by hand.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: help venv lock lint typecheck check docs generate litellm test test-fast demo image bench bench-validity bench-soak bench-trim local-model dashboards tools clean
.DEFAULT_GOAL := help

help:  ## list the targets with what each does
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'

venv: $(VENV)/.installed  ## the development virtualenv in .venv (editable install with every extra)

$(VENV)/.installed: pyproject.toml requirements/dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -c requirements/dev.txt
	touch $@

# The development set pinned: inspect-ai, s3fs/aiobotocore/boto3 and huggingface-hub pin each
# other so tightly that pip's resolver gives up ("resolution-too-deep") on a fresh machine; the
# lock is pip's constraints file, so `pip install -e '.[dev]'` itself is unchanged.
lock: venv  ## re-pin requirements/dev.txt (the development set) after changing pyproject.toml's dependencies
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 --quiet \
	  --custom-compile-command 'make lock' -o requirements/dev.txt

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

lint: venv  ## ruff: lint and formatting
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv  ## mypy --strict over the package, the dev tools, the test kit, the benchmarks and the tests
	$(BIN)/mypy

check: lint typecheck  ## lint and types only: seconds, no root, no model

docs: venv  ## build the documentation site into out/site (mkdocs --strict: broken links fail)
	$(BIN)/mkdocs build --strict -d out/site

generate: venv  ## regenerate every generated file (dashboards, chart schema, CLI and config references)
	$(PY) -m dashboards.mixin
	$(PY) -m devtools.chart_schema
	$(PY) -m devtools.cli_docs
	$(PY) -m devtools.config_docs
	$(PY) -m devtools.http_api_docs

litellm:  ## LiteLLM's proxy in its own cached venv (the chaining tests and the benchmark peer)
	bash scripts/litellm.sh >/dev/null

test: venv lint typecheck local-model tools litellm  ## the README's test command; CI runs exactly this
	$(BIN)/pytest -q -n auto --dist loadgroup --no-loadscope-reorder

test-fast: venv lint typecheck  ## the inner loop: the in-process tier (no socket, server or child process)
	$(BIN)/pytest -q --in-process

demo: venv local-model  ## the whole loop on a real local model
	$(PY) -m devtools.demo

bench: venv tools  ## side by side: direct, bare pass-through, LiteLLM's proxy, sidecar observe/enforce; then the soak
	bash scripts/litellm.sh >/dev/null
	$(PY) -m benchmarks.run $(BENCH_ARGS)
	$(PY) -m benchmarks.soak $(SOAK_ARGS)

bench-validity: venv  ## the sweep's statistics and cost against known truth (simulation study, ~20 min on 2 cores)
	$(PY) -m benchmarks.validity $(VALIDITY_ARGS)

bench-soak: venv  ## RSS and open fds of the sidecar over 10 minutes of mixed, failing load
	$(PY) -m benchmarks.soak $(SOAK_ARGS)

bench-trim: venv  ## trimming generated agent traffic: validity and removal, LiteLLM side by side
	bash scripts/litellm.sh >/dev/null
	$(PY) -m benchmarks.trim_validity $(TRIM_ARGS)

clean:  ## remove the venv, caches and out/
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache out
