# Every target bootstraps what it needs: a fresh clone runs `make test` with nothing else installed.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup venv system runtime lint format test demo bench clean template synth lock

setup: venv system runtime

# The project venv, reinstalled whenever pyproject.toml changes.
venv: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# System packages the sandbox needs (root on Debian; skipped when present).
system:
	@command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap; }
	@command -v setpriv >/dev/null || { apt-get update -qq && apt-get install -y -qq util-linux; }

# The sandbox runtime (a venv on Debian's python3, outside the checkout) and the slot state dir.
runtime: $(STAMP)
	$(BIN)/python -m trialbox.sandbox.runtime install --requirements sandbox_image/requirements.txt

lint: $(STAMP)
	$(BIN)/ruff format --check trialbox tests benchmarks infra functions app.py
	$(BIN)/ruff check trialbox tests benchmarks infra functions app.py
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format trialbox tests benchmarks infra functions app.py
	$(BIN)/ruff check --fix trialbox tests benchmarks infra functions app.py

test: setup lint
	$(BIN)/pytest -q

demo: setup
	$(BIN)/trialbox demo --out demo-results.jsonl

bench: setup
	$(BIN)/python benchmarks/sandbox_overhead.py
	$(BIN)/python benchmarks/pipeline_throughput.py -n 100

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

synth: $(STAMP)
	CDK_OUTDIR=cdk.out JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 $(BIN)/python app.py

# Refresh the synthesized template the local twin ships as package data.
template: $(STAMP)
	$(BIN)/python -m trialbox.local.template

# Re-lock the image's environments (every transitive pin, with hashes for every platform) with
# a pinned pip-tools kept outside the checkout. Run after changing a *.in file.
LOCK_TOOL := $(HOME)/.cache/trialbox/pip-tools
PIP_COMPILE := PIP_FIND_LINKS= $(LOCK_TOOL)/bin/pip-compile -q --generate-hashes --allow-unsafe \
	--no-strip-extras --no-emit-index-url --no-emit-find-links --index-url https://pypi.org/simple
lock:
	test -x $(LOCK_TOOL)/bin/pip-compile || { python3 -m venv $(LOCK_TOOL) && $(LOCK_TOOL)/bin/pip install -q pip-tools==7.7.0; }
	$(PIP_COMPILE) -o sandbox_image/requirements.txt sandbox_image/requirements.in
	$(PIP_COMPILE) -o sandbox_image/worker.lock sandbox_image/worker.in
