#!/bin/sh
# The sandbox image's build steps, run by the Dockerfile and, in a debootstrapped bookworm rootfs,
# by tests/fargate (so the suite runs the image's contents without a Docker daemon).
#   build.sh deps   Debian's python3, the worker venv (worker.lock) and the sandbox runtime venv
#                   (requirements.txt), every package pinned with its hashes.
#   build.sh app    trialbox itself into the worker venv, the runtime's trusted plugin and
#                   manifest; then /src goes.
# Both expect the files the Dockerfile copies under /src.
set -eu
SRC=/src
WORKER=/opt/trialbox/worker
RUNTIME=/opt/trialbox/runtime
STATE=/var/lib/trialbox
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore

case "${1:-}" in
deps)
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # util-linux (prlimit, setpriv) is essential in bookworm; python3 is bookworm's 3.11, the
    # twin's interpreter, so a sample grades the same on both.
    apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates
    rm -rf /var/lib/apt/lists/*
    umask 022 # every file readable by the slot uids
    python3 -m venv "$WORKER"
    "$WORKER/bin/pip" install -q --require-hashes -r "$SRC/sandbox_image/worker.lock"
    python3 -m venv "$RUNTIME"
    "$RUNTIME/bin/pip" install -q --require-hashes -r "$SRC/sandbox_image/requirements.txt"
    ;;
app)
    umask 022
    "$WORKER/bin/pip" install -q --no-deps --no-build-isolation "$SRC"
    "$WORKER/bin/python" -m trialbox.sandbox.runtime install --existing \
        --root "$RUNTIME" --requirements "$SRC/sandbox_image/requirements.txt" --state-dir "$STATE"
    rm -rf "$SRC" # umask 022 kept everything installed read-only to the slot uids
    ;;
*)
    echo "usage: build.sh deps|app" >&2
    exit 2
    ;;
esac
