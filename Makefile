# Every target bootstraps what it needs: a fresh clone runs `make test` with nothing else installed.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# What outlives a checkout, so that a fresh clone on this machine starts warm (mypy's cache;
# pip keeps its own in ~/.cache/pip).
CACHE := $(HOME)/.cache/trialbox
# A pinned uv, in a venv outside the checkout: installs the project venv and re-locks.
UV_VERSION := 0.13.9
UV_TOOL := $(CACHE)/uv-$(UV_VERSION)
UV := $(UV_TOOL)/bin/uv

.PHONY: setup venv system runtime lint format test test-fast demo bench clean template synth lock
.PHONY: synth-full qc-humaneval integration-smoke

setup: venv system runtime

# The project venv, reinstalled whenever pyproject.toml changes, by the pinned uv (`make lock`'s):
# about a minute from an empty cache where pip takes four, seconds from a warm one (~/.cache/uv).
venv: $(STAMP)
$(STAMP): pyproject.toml | $(UV_TOOL)/bin/uv
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(UV) pip install -q --python $(BIN)/python --compile-bytecode -e '.[dev]'
	touch $(STAMP)
$(UV_TOOL)/bin/uv:  # one checkout at a time installs it
	mkdir -p $(CACHE) && flock $(CACHE)/uv.lock sh -c 'test -x $@ || \
		{ python3 -m venv $(UV_TOOL) && $(UV_TOOL)/bin/pip install -q uv==$(UV_VERSION); }'

# System packages the sandbox needs (root on Debian; skipped when present). One apt at a time:
# two checkouts' `make test` may set up at once, and apt may be busy with something else.
APT := flock /var/lock/trialbox-apt.lock apt-get -o DPkg::Lock::Timeout=600
system:
	@command -v bwrap >/dev/null || { $(APT) update -qq && $(APT) install -y -qq bubblewrap; }
	@command -v setpriv >/dev/null || { $(APT) update -qq && $(APT) install -y -qq util-linux; }
	@command -v debootstrap >/dev/null || { $(APT) update -qq && $(APT) install -y -qq debootstrap; }
	@command -v tini >/dev/null || { $(APT) update -qq && $(APT) install -y -qq tini; }

# The sandbox runtime (a venv on Debian's python3, outside the checkout) and the slot state dir.
runtime: $(STAMP)
	$(BIN)/python -m trialbox.sandbox.runtime install --requirements sandbox_image/requirements.txt

lint: $(STAMP)
	$(BIN)/ruff format --check trialbox tests benchmarks infra functions app.py
	$(BIN)/ruff check trialbox tests benchmarks infra functions app.py
	@mkdir -p $(CACHE)  # mypy's cache outlives the checkout; one mypy at a time uses it (SQLite)
	flock $(CACHE)/mypy.lock $(BIN)/mypy --cache-dir $(CACHE)/mypy

format: $(STAMP)
	$(BIN)/ruff format trialbox tests benchmarks infra functions app.py
	$(BIN)/ruff check --fix trialbox tests benchmarks infra functions app.py

# The suite on xdist workers, grouped and slowest first (tests/support/schedule.py), with lint
# beside it; most tests wait on sandboxes, twins and state machines rather than on the CPU.
# Bytecode is written (the environment may say otherwise): pytest keeps its rewritten test
# modules, and each twin process its compiled trialbox. Timestamps and the slowest tests go
# in the log.
WORKERS ?= 4
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest
# The sandbox image tests/fargate runs (a debootstrapped rootfs, cached under /var/cache/trialbox)
# is a new machine's longest download: it starts building beside the venv's install, and the
# fixture that needs it finds it built, or waits on its lock (tests/fargate/image.py).
test:
	@date +'%T make test starts'
	@$(MAKE) --no-print-directory system
	@($(PYTHON) -m tests.fargate.image >/dev/null 2>&1 &)
	@$(MAKE) --no-print-directory setup
	@date +'%T setup done; lint and pytest start'
	@lint=$$(mktemp); { $(MAKE) --no-print-directory lint >$$lint 2>&1; echo $$? >>$$lint.rc; } & \
	$(PYTEST) -q -n $(WORKERS) --dist loadscope --no-loadscope-reorder --durations=15; \
	tests=$$?; wait; date +'%T pytest done'; cat $$lint; linted=$$(cat $$lint.rc); \
	rm -f $$lint $$lint.rc; echo "pytest exit $$tests, lint exit $$linted"; \
	test $$tests = 0 -a $$linted = 0

# The unit level, for the inner loop: no sandbox, no twin, no synth.
test-fast: $(STAMP)
	$(PYTEST) -q -n 2 tests/unit

demo: setup
	$(BIN)/trialbox demo --out demo-results.jsonl

bench: setup
	$(BIN)/python benchmarks/sandbox_overhead.py
	$(BIN)/python benchmarks/pipeline_throughput.py -n 100
	$(BIN)/python benchmarks/orchestration_cpu.py -n 100
	$(BIN)/python benchmarks/twin_start.py -n 5
	$(BIN)/python benchmarks/transitions.py
	$(BIN)/python benchmarks/scale_model.py
	$(BIN)/python benchmarks/model_vs_twin.py
	$(BIN)/python benchmarks/cost.py
	$(BIN)/python benchmarks/wipe.py
	$(BIN)/python benchmarks/sdk_cpu.py
	$(BIN)/python benchmarks/session_calls.py
	$(BIN)/python benchmarks/session_open.py
	$(BIN)/python benchmarks/grading_boundary.py
	$(BIN)/python benchmarks/warm_grader.py --compare-cold
	$(BIN)/python benchmarks/warm_grader.py --backend rlimit --compare-cold
	$(BIN)/python benchmarks/warm_parity.py --backend rlimit
	$(BIN)/python benchmarks/warm_parity.py --backend bwrap
	$(BIN)/python benchmarks/performance_noise.py
	$(BIN)/python benchmarks/performance_noise.py --load memory
	$(BIN)/python benchmarks/integrations_overhead.py

# Task QC over all 164 HumanEval problems (not part of `make test`): reference, starter,
# flakiness, limits, mutation score and leakage per task; every check in qc-humaneval.json.
qc-humaneval: setup
	$(BIN)/python -m trialbox.qc.humaneval .qc-humaneval.jsonl
	$(BIN)/trialbox tasks validate .qc-humaneval.jsonl --json qc-humaneval.json

# The frameworks' own code against the local twin, each in its venv cached outside the checkout
# (torch 2.13.0's CPU wheel where pip finds it on this machine, else PyPI's, which pulls in the
# CUDA libraries: about 3 GB more). TRL: GRPOTrainer for 2 steps with TrialboxReward (1.5 GB).
# verl: its tool loader, agent loop call, reward loader and SandboxFusion client (2.1 GB; verl
# imports cachetools, fastapi and uvicorn without declaring them), against `trialbox local up`.
SMOKE_VENV ?= $(CACHE)/trl-venv
VERL_VENV ?= $(CACHE)/verl-venv
integration-smoke: system runtime
	test -x $(SMOKE_VENV)/bin/python || $(PYTHON) -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/pip install -q 'torch==2.13.0' 'trl==1.16.0' -e '.[local]'
	$(SMOKE_VENV)/bin/python tests/smoke/trl_grpo.py
	$(SMOKE_VENV)/bin/python tests/smoke/trl_environment.py
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install -q 'torch==2.13.0' 'verl==0.9.1' 'cachetools==8.0.2' \
		'fastapi==0.165.0' 'uvicorn==0.55.0' -e .
	$(BIN)/python tests/smoke/with_twin.py $(VERL_VENV)/bin/python tests/smoke/verl_real.py

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

# Re-lock every environment we ship, each for the platform it runs on, every transitive pin with
# the hashes of all its files (so the x86_64 twin installs the image's lock too): the image's
# worker and sandbox runtime (Debian bookworm's python 3.11 on aarch64) and the Lambda bundle
# (python3.13 on aarch64). A pinned uv, in a venv outside the checkout, resolves for a platform
# other than this machine's. Run after changing a *.in file.
UV_COMPILE := $(UV) pip compile -q --generate-hashes --index-url https://pypi.org/simple \
	--only-binary :all: --custom-compile-command "make lock"
IMAGE_PLATFORM := --python-platform aarch64-manylinux_2_36 --python-version 3.11  # bookworm
LAMBDA_PLATFORM := --python-platform aarch64-manylinux2014 --python-version 3.13
lock: | $(UV_TOOL)/bin/uv
	$(UV_COMPILE) $(IMAGE_PLATFORM) sandbox_image/requirements.in -o sandbox_image/requirements.txt
	$(UV_COMPILE) $(IMAGE_PLATFORM) sandbox_image/worker.in -o sandbox_image/worker.lock
	$(UV_COMPILE) $(LAMBDA_PLATFORM) functions/requirements.in -o functions/requirements.lock
