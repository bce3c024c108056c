"""The sandbox runtime: one pinned Python environment, outside the checkout, shared by every
sandbox. `make setup` (and the sandbox image's Dockerfile) run `install`; the runner reads its
manifest for provenance and refuses to run when the trusted plugin is out of date.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trialbox.errors import SandboxSetupError
from trialbox.sandbox.config import SandboxConfig
from trialbox.sandbox.host import favor_dynamic_cgroups
from trialbox.sandbox.shared_files import exclusive, publish

MANIFEST = "trialbox-runtime.json"
PLUGIN_DIR = "trialbox"  # inside the runtime: the trusted plugin and pytest config
PLUGIN_SOURCE = Path(__file__).parent / "plugin"
PLUGIN_MODULE = "trialbox_report"
POLICY_MODULE = "trialbox_policy"  # the policy's side of the isolation boundary
POLICY_FD_ENV = "TRIALBOX_POLICY_FD"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plugin_files() -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in sorted(PLUGIN_SOURCE.iterdir())
        if path.suffix in (".py", ".ini")
    }


def plugin_hash() -> str:
    return _sha256(b"".join(name.encode() + b"\0" + data for name, data in plugin_files().items()))


@dataclass(frozen=True)
class Runtime:
    root: Path
    version: str
    hash: str

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def plugin_dir(self) -> Path:
        return self.root / PLUGIN_DIR

    @property
    def pytest_ini(self) -> Path:
        return self.plugin_dir / "pytest.ini"

    @classmethod
    def load(cls, root: Path) -> Runtime:
        try:
            manifest = json.loads((root / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise SandboxSetupError(
                f"no sandbox runtime at {root} ({exc}); run `make setup`"
            ) from exc
        if manifest.get("plugin_sha256") != plugin_hash():
            raise SandboxSetupError(
                f"the trusted pytest plugin in {root} is out of date; run `make setup`"
            )
        return cls(root=root, version=manifest["version"], hash=manifest["hash"])


def install(root: Path, requirements: Path, python: str, existing: bool = False) -> Runtime:
    """Create or update the runtime. Idempotent: does nothing when it is already current.
    `existing`: the venv was built from `requirements` already (the image's build.sh does it
    in a layer of its own); only the plugin and the manifest are written. One install at a
    time (two checkouts' `make setup` may run at once), and files that sandboxes of other
    runners read are replaced whole, only when they change."""
    os.umask(0o022)  # every file must be readable by the slot uids
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    with exclusive(root.parent / f".{root.name}.lock"):
        return _install(root, requirements, python, existing)


def _install(root: Path, requirements: Path, python: str, existing: bool) -> Runtime:
    wanted_requirements = _sha256(requirements.read_bytes())
    manifest_path = root / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if existing and not (root / "bin" / "python").exists():
        raise SandboxSetupError(f"--existing: no venv at {root}")
    if not existing and manifest.get("requirements_sha256") != wanted_requirements:
        if root.exists():
            shutil.rmtree(root)
        subprocess.run([python, "-m", "venv", str(root)], check=True)
        pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--no-cache-dir"]
        pip += ["--require-virtualenv", "--require-hashes", "-r", str(requirements)]
        subprocess.run(pip, check=True)
        manifest = {}
    plugin_dir = root / PLUGIN_DIR
    plugin_dir.mkdir(exist_ok=True, mode=0o755)
    changed = [publish(plugin_dir / name, data) for name, data in plugin_files().items()]
    # Compiled once here: sandboxes never write bytecode, and every grading imports these.
    # (-f: a file rewritten within the second it was compiled keeps its old mtime.)
    force = ["-f"] if any(changed) else []
    subprocess.run(
        [str(root / "bin" / "python"), "-m", "compileall", "-q", *force, str(plugin_dir)],
        check=True,
    )
    python_version = subprocess.run(
        [str(root / "bin" / "python"), "-c", "import platform; print(platform.python_version())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    freeze = subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "freeze", "--all"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pytest_pin = next(
        (line for line in freeze.splitlines() if line.lower().startswith("pytest==")), "pytest"
    )
    new_manifest = {
        "version": f"python-{python_version}+{pytest_pin.replace('==', '-')}",
        "python": python_version,
        "requirements_sha256": wanted_requirements,
        "plugin_sha256": plugin_hash(),
        "freeze": freeze.splitlines(),
    }
    new_manifest["hash"] = _sha256(
        json.dumps({k: new_manifest[k] for k in ("python", "freeze", "plugin_sha256")}).encode()
    )
    if new_manifest != manifest:
        publish(manifest_path, (json.dumps(new_manifest, indent=2) + "\n").encode())
    return Runtime.load(root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trialbox.sandbox.runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="create or update the sandbox runtime")
    config = SandboxConfig.from_env()
    inst.add_argument("--root", type=Path, default=config.runtime_dir)
    inst.add_argument("--requirements", type=Path, required=True)
    inst.add_argument("--python", default="/usr/bin/python3")
    inst.add_argument("--state-dir", type=Path, default=config.state_dir)
    inst.add_argument(
        "--existing", action="store_true", help="the venv at --root is built already (image)"
    )
    args = parser.parse_args(argv)
    runtime = install(args.root, args.requirements, args.python, args.existing)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    args.state_dir.chmod(0o711)
    print(f"sandbox runtime {runtime.version} ({runtime.hash[:12]}) at {runtime.root}")
    if not args.existing:  # host tuning: an image build has no host to tune
        print(favor_dynamic_cgroups())
    return 0


if __name__ == "__main__":
    sys.exit(main())
