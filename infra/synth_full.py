"""`make synth-full`: synthesize as `cdk deploy` would, then check what was built.

Asset bundling is on (the real aarch64 pip install from the hash-checked lock), the image asset
is staged, the built-in CloudFormation validator and cdk-nag run. Then the Lambda asset is
checked: the handlers and `trialbox/` are in it, `pydantic_core` is an aarch64 build, and its
installed distributions are exactly the lock's, at the lock's versions.

    python -m infra.synth_full [OUTDIR]   (default: cdk.out)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.lambdas import LOCK, ROOT
from infra.locks import normal, pins

ELF_MACHINE_AARCH64 = 183


@dataclass(frozen=True)
class Built:
    assembly: Path
    lambda_asset: Path
    image_asset: Path


def synth_full(outdir: Path) -> Built:
    os.environ.pop("CDK_VALIDATION", None)  # the validator runs, as it does for cdk deploy
    sys.path.insert(0, str(ROOT))
    from app import build_app

    assembly = Path(build_app(outdir=str(outdir)).synth().directory)
    (manifest,) = assembly.glob("*.assets.json")
    assets = json.loads(manifest.read_text())
    zips = [f for f in assets["files"].values() if f["source"].get("packaging") == "zip"]
    lambdas = [assembly / f["source"]["path"] for f in zips]
    (lambda_asset,) = [path for path in lambdas if (path / "functions").is_dir()]
    (image,) = assets["dockerImages"].values()
    built = Built(assembly, lambda_asset, assembly / image["source"]["directory"])
    check(built)
    return built


def locked(lock: Path = LOCK) -> dict[str, str]:
    """The lock's pins, by normalized distribution name."""
    return pins(lock.read_text())


def installed(asset: Path) -> dict[str, str]:
    """The distributions pip installed into the asset, by normalized name."""
    found = {}
    for info in asset.glob("*.dist-info"):
        name, version = info.name.removesuffix(".dist-info").rsplit("-", 1)
        found[normal(name)] = version
    return found


def elf_machine(path: Path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return int.from_bytes(header[18:20], "little")


def check(built: Built) -> None:
    asset = built.lambda_asset
    for handler in ("dispatcher", "prepare", "recorder"):
        path = asset / "functions" / handler / "handler.py"
        assert path.is_file(), f"the Lambda asset lacks {path.relative_to(asset)}"
    assert (asset / "trialbox" / "models").is_dir(), "the Lambda asset lacks trialbox/"
    (core,) = (asset / "pydantic_core").glob("_pydantic_core*.so")
    assert "aarch64" in core.name, f"{core.name} is not an aarch64 build"
    assert elf_machine(core) == ELF_MACHINE_AARCH64, f"{core.name} is not an AArch64 ELF"
    want, got = locked(), installed(asset)
    assert got == want, f"the asset's distributions differ from the lock: {_delta(want, got)}"
    assert (built.image_asset / "sandbox_image" / "Dockerfile").is_file()


def _delta(want: dict[str, str], got: dict[str, str]) -> str:
    names = sorted(set(want) | set(got))
    return ", ".join(
        f"{n}: lock {want.get(n)} asset {got.get(n)}" for n in names if want.get(n) != got.get(n)
    )


if __name__ == "__main__":
    built = synth_full(Path(sys.argv[1] if len(sys.argv) > 1 else "cdk.out"))
    count = len(locked())
    print(f"synthesized {built.assembly} with bundling and validation on")
    print(f"Lambda asset {built.lambda_asset.name}: {count} locked distributions, aarch64")
    print(f"image asset {built.image_asset.name}: staged")
