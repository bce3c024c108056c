# Every target bootstraps what it needs: a fresh clone runs `make test` with nothing else installed.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup venv system runtime lint format test demo bench clean template synth lock
.PHONY: synth-full lock-lambda

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
	@command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
	@command -v tini >/dev/null || { apt-get update -qq && apt-get install -y -qq tini; }

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
	$(BIN)/python benchmarks/wipe.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

synth: $(STAMP)
	CDK_OUTDIR=cdk.out JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 $(BIN)/python app.py

# Synth as `cdk deploy` would, into a fresh cdk.out: the Lambda bundle pip-installed for aarch64
# from the hash-checked lock, the image asset staged, the validator and cdk-nag on; then the
# bundle is checked against the lock (pip's cache, ~/.cache/pip, makes re-runs fast).
synth-full: $(STAMP)
	rm -rf cdk.out
	env -u CDK_VALIDATION JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 $(BIN)/python -m infra.synth_full cdk.out

# Refresh the synthesized template the local twin ships as package data.
template: $(STAMP)
	$(BIN)/python -m trialbox.local.template

# Re-lock the image's environments (every transitive pin, with hashes for every platform) with
# a pinned pip-tools kept outside the checkout. Run after changing a *.in file.
LOCK_TOOL := $(HOME)/.cache/trialbox/pip-tools
PIP_COMPILE := PIP_FIND_LINKS= $(LOCK_TOOL)/bin/pip-compile -q --generate-hashes --allow-unsafe \
	--no-strip-extras --no-emit-index-url --no-emit-find-links --index-url https://pypi.org/simple
lock: lock-lambda
	test -x $(LOCK_TOOL)/bin/pip-compile || { python3 -m venv $(LOCK_TOOL) && $(LOCK_TOOL)/bin/pip install -q pip-tools==7.7.0; }
	$(PIP_COMPILE) -o sandbox_image/requirements.txt sandbox_image/requirements.in
	$(PIP_COMPILE) -o sandbox_image/worker.lock sandbox_image/worker.in

# The Lambda bundle's lock (functions/requirements.in -> requirements.lock), resolved for the
# Lambda runtime (python3.13 on aarch64), which pip-compile cannot target from this machine;
# a pinned uv in a venv outside the checkout can. Every transitive pin, hashes of all its files.
UV_VERSION := 0.13.9
UV_TOOL := $(HOME)/.cache/trialbox/uv-$(UV_VERSION)
lock-lambda:
	test -x $(UV_TOOL)/bin/uv || { python3 -m venv $(UV_TOOL) && $(UV_TOOL)/bin/pip install -q uv==$(UV_VERSION); }
	$(UV_TOOL)/bin/uv pip compile -q functions/requirements.in --generate-hashes \
		--python-platform aarch64-manylinux2014 --python-version 3.13 --only-binary :all: \
		--index-url https://pypi.org/simple --custom-compile-command "make lock" \
		-o functions/requirements.lock
