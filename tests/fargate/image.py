"""The sandbox image, built without a Docker daemon: its Dockerfile interpreted step by step
over a debootstrapped Debian rootfs, each COPY and RUN a cached overlay layer (the key chains
every earlier instruction and the content of every file copied, as Docker's build cache
does). So the base (FROM + `build.sh deps`) is rebuilt only when build.sh, the locks or the
FROM line change, and the app layer whenever trialbox/ changes.

The cache lives outside the checkout (TRIALBOX_FARGATE_CACHE, default
/var/cache/trialbox/rootfs); a build runs under a file lock in a temporary directory renamed
into place, so concurrent test sessions never see half a layer."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.fargate.dockerfile import (
    DEFAULT_PATH,
    Context,
    Copy,
    instructions,
    parse_env,
    substitute,
)

CACHE = Path(os.environ.get("TRIALBOX_FARGATE_CACHE", "/var/cache/trialbox/rootfs"))
MIRROR = os.environ.get("TRIALBOX_DEBIAN_MIRROR", "http://deb.debian.org/debian")
NSINIT = Path(__file__).with_name("nsinit.py")
FROM_DEBIAN = re.compile(r"^debian:(?P<suite>[a-z]+)(-slim)?(@sha256:[0-9a-f]{64})?$")
# The host's CA bundle, handed to RUN steps as a build secret (never part of a layer or of a
# layer's key): on a network whose egress proxy intercepts TLS, pip trusts nothing else.
HOST_CA = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
# How long a layer not used by any session stays cached.
KEEP_UNUSED_S = 7 * 24 * 3600


class ImageBuildError(Exception):
    pass


@dataclass
class Image:
    layers: list[Path]  # bottom first; each an overlay layer directory
    env: dict[str, str]  # the image config's environment (Docker's PATH + every ENV)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    user: str | None = None
    workdir: str = "/"
    volumes: list[str] = field(default_factory=list)

    @property
    def lower(self) -> list[str]:
        """overlayfs lowerdir order: top first."""
        return [str(p) for p in reversed(self.layers)]


def required_tools() -> list[str]:
    """What building and running the image needs on this machine; the missing ones."""
    missing = [t for t in ("debootstrap", "unshare", "tini", "chroot") if not shutil.which(t)]
    if os.geteuid() != 0:
        missing.append("root (mounts, chroot and uid switches need it)")
    if "overlay" not in Path("/proc/filesystems").read_text():
        missing.append("the overlay filesystem")
    return missing


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:20]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(argv: list[str], what: str, log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise ImageBuildError(f"{what} failed (exit {done.returncode}); log {log}:\n{tail}")


def _cached(key: str, build: callable) -> Path:  # type: ignore[valid-type]
    """The layer directory for `key`, built by `build(tmp_dir)` unless cached."""
    final = CACHE / key
    if final.is_dir():
        os.utime(final)
        return final
    with _locked():
        if final.is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=CACHE))
        try:
            build(tmp)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _debootstrap(from_line: str) -> Path:
    image = from_line.split()[0]
    match = FROM_DEBIAN.match(image)
    if not match:
        raise ImageBuildError(
            f"FROM {image}: only debian:<suite>[-slim] can be rebuilt here (with debootstrap)"
        )
    suite = match["suite"]

    def build(tmp: Path) -> None:
        rootfs = tmp / "layer"
        # A private mount namespace: whatever debootstrap mounts goes with it.
        _run(
            ["unshare", "--mount", "--propagation", "private", "debootstrap",
             "--variant=minbase", suite, str(rootfs), MIRROR],
            f"debootstrap {suite}", tmp / "build.log",
        )  # fmt: skip
        (rootfs / "etc/resolv.conf").write_text("")  # a mount point, as in Docker's images

    return _cached(f"base-{suite}-{_digest('minbase', from_line, MIRROR)}", build) / "layer"


def _copy_layer(key: str, copy: Copy, context: Context, below: list[Path]) -> Path:
    def build(tmp: Path) -> None:
        layer = tmp / "layer"
        layer.mkdir()
        for source in copy.sources:
            for relative in context.files(source):
                src = context.root / relative
                if (context.root / source).is_dir():
                    inside = Path(relative).relative_to(source)
                    target = Path(copy.dest) / inside
                elif copy.dest.endswith("/"):
                    target = Path(copy.dest) / Path(relative).name
                else:
                    target = Path(copy.dest)
                dest = layer / target.relative_to("/")
                _make_parents(dest.parent, layer, below)
                shutil.copy2(src, dest, follow_symlinks=False)
                os.lchown(dest, 0, 0)

    return _cached(key, build) / "layer"


def _make_parents(directory: Path, layer: Path, below: list[Path]) -> None:
    """Missing parents as Docker makes them (root, 0755); existing ones keep their mode."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        relative = path.relative_to(layer)
        existing = next((b / relative for b in reversed(below) if (b / relative).is_dir()), None)
        path.mkdir()
        mode = existing.stat().st_mode & 0o7777 if existing else 0o755
        path.chmod(mode)


def _run_layer(
    key: str, argv: list[str], env: dict[str, str], workdir: str, below: list[Path]
) -> Path:
    def build(tmp: Path) -> None:
        for name in ("layer", "work", "merged"):
            (tmp / name).mkdir()
        spec = {
            "mode": "build",
            "lower": [str(p) for p in reversed(below)],
            "upper": str(tmp / "layer"),
            "work": str(tmp / "work"),
            "merged": str(tmp / "merged"),
            "argv": argv,
            "env": env | _secret_env(),
            "workdir": workdir,
            "secrets": {"host-ca.crt": str(HOST_CA)} if HOST_CA.is_file() else {},
        }
        (tmp / "spec.json").write_text(json.dumps(spec))
        _run(
            ["unshare", "--mount", "--pid", "--ipc", "--uts", "--fork", "--propagation",
             "private", sys.executable, str(NSINIT), str(tmp / "spec.json")],
            f"RUN {' '.join(argv)}", tmp / "build.log",
            env={"PATH": DEFAULT_PATH},
        )  # fmt: skip
        shutil.rmtree(tmp / "work")  # overlayfs' own scratch (root-only, not part of the layer)
        shutil.rmtree(tmp / "merged")

    return _cached(key, build) / "layer"


def _secret_env() -> dict[str, str]:
    if not HOST_CA.is_file():
        return {}
    return {"PIP_CERT": "/run/secrets/host-ca.crt"}


def build(root: Path, dockerfile: str = "sandbox_image/Dockerfile") -> Image:
    """Every instruction of the Dockerfile, in order, with the build context at `root`."""
    context = Context(root)
    steps = instructions((root / dockerfile).read_text())
    if not steps or steps[0].keyword != "FROM":
        raise ImageBuildError(f"{dockerfile} does not start with FROM")
    key = _digest("FROM", steps[0].args)
    image = Image(layers=[_debootstrap(steps[0].args)], env={"PATH": DEFAULT_PATH})
    for step in steps[1:]:
        where = f"{dockerfile}:{step.line} {step.keyword}"
        if step.keyword == "ENV":
            image.env.update(parse_env(step.args, image.env))
            key = _digest(key, "ENV", json.dumps(image.env, sort_keys=True))
        elif step.keyword == "COPY":
            copy = Copy.parse(step.args, image.env)
            contents = []
            for source in copy.sources:
                for relative in context.files(source):
                    path = root / relative
                    data = os.readlink(path) if path.is_symlink() else path.read_bytes()
                    mode = path.lstat().st_mode
                    contents.append(_digest(relative, data, str(mode)))
            key = _digest(key, "COPY", step.args, *contents)
            image.layers.append(_copy_layer(f"layer-{key}", copy, context, image.layers))
        elif step.keyword == "RUN":
            argv = step.json_or_shell()
            env = {"HOME": "/root", **image.env}
            key = _digest(key, "RUN", json.dumps(argv), json.dumps(env, sort_keys=True))
            started = time.monotonic()
            image.layers.append(_run_layer(f"layer-{key}", argv, env, image.workdir, image.layers))
            if time.monotonic() - started > 5:
                print(f"built {where} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        elif step.keyword == "ENTRYPOINT":
            image.entrypoint = step.json_or_shell()
        elif step.keyword == "CMD":
            image.cmd = step.json_or_shell()
        elif step.keyword == "USER":
            image.user = substitute(step.args, image.env)
        elif step.keyword == "WORKDIR":
            image.workdir = substitute(step.args, image.env)
        elif step.keyword == "VOLUME":
            text = step.args.strip()
            image.volumes += json.loads(text) if text.startswith("[") else text.split()
        elif step.keyword in ("LABEL", "ARG", "STOPSIGNAL", "HEALTHCHECK", "EXPOSE"):
            key = _digest(key, step.keyword, step.args)
        else:
            raise ImageBuildError(f"{where}: not supported by this builder")
    _prune({p.parent for p in image.layers})  # each layer is <key>/layer
    return image


def _prune(used: set[Path]) -> None:
    """Drop layers no session used for a week (the app layer changes with every edit)."""
    now = time.time()
    for entry in CACHE.iterdir():
        if entry.name.startswith("layer-") and entry not in used:
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime > KEEP_UNUSED_S:
                    with _locked():  # again under the lock: another session may reuse it now
                        if now - entry.stat().st_mtime > KEEP_UNUSED_S:
                            shutil.rmtree(entry)


def main() -> None:
    """`python3 -m tests.fargate.image`: build (or find cached) this checkout's sandbox image.
    `make test` starts it first, beside the venv's install: on a new machine it is the
    longest download, and the fixture that needs it then finds it built, or waits on its lock.
    Standard library only, so it runs before the venv exists."""
    started = time.monotonic()
    image = build(Path(__file__).resolve().parents[2])
    print(
        f"sandbox image: {len(image.layers)} layers in {CACHE} ({time.monotonic() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
