"""`make synth-full` runs here once: bundling on (the aarch64 pip install from the hash-checked
lock), the image asset staged, the validator and cdk-nag on. pip's cache lives in ~/.cache/pip
(or PIP_CACHE_DIR), outside the checkout, so a second run downloads nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra import lambdas
from infra.synth_full import ELF_MACHINE_AARCH64, elf_machine, installed, locked

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS_IN = ROOT / "functions" / "requirements.in"


@pytest.fixture(scope="module")
def assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One `python -m infra.synth_full`, exactly as the Makefile runs it."""
    outdir = tmp_path_factory.mktemp("cdk.out")
    env = {k: v for k, v in os.environ.items() if k != "CDK_VALIDATION"}
    env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = "20"
    done = subprocess.run(
        [sys.executable, "-m", "infra.synth_full", str(outdir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "with bundling and validation on" in done.stdout
    return outdir


def lambda_asset(assembly: Path) -> Path:
    (asset,) = [p for p in assembly.glob("asset.*") if (p / "functions").is_dir()]
    return asset


def test_the_lambda_asset_is_the_lock_built_for_aarch64(assembly: Path) -> None:
    asset = lambda_asset(assembly)
    assert (asset / "functions" / "recorder" / "handler.py").is_file()
    assert (asset / "trialbox" / "pipeline" / "recorder.py").is_file()
    (core,) = (asset / "pydantic_core").glob("_pydantic_core*.so")
    assert "aarch64-linux-gnu" in core.name
    assert elf_machine(core) == ELF_MACHINE_AARCH64
    assert installed(asset) == locked()
    assert installed(asset)["boto3"] == installed(asset)["botocore"] == "1.44.8"


def test_the_image_asset_is_staged_with_its_dockerfile(assembly: Path) -> None:
    staged = [p for p in assembly.glob("asset.*") if (p / "sandbox_image").is_dir()]
    assert len(staged) == 1 and (staged[0] / "sandbox_image" / "Dockerfile").is_file()


def test_a_lock_with_a_wrong_hash_fails_bundling(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    text = lambdas.LOCK.read_text()
    entry = re.search(r"^six==.*?(?=^\S)", text, re.MULTILINE | re.DOTALL)
    assert entry is not None
    forged = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, entry[0])
    lock = tmp_path / "requirements.lock"
    lock.write_text(text.replace(entry[0], forged))
    with pytest.raises(subprocess.CalledProcessError):
        lambdas.LocalBundler(lock=lock).try_bundle(str(tmp_path / "out"))
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in capfd.readouterr().err


def test_the_lock_pins_every_top_level_requirement_with_hashes() -> None:
    top = dict(
        line.split("==")
        for line in REQUIREMENTS_IN.read_text().splitlines()
        if line and not line.startswith("#")
    )
    pins = locked()
    assert {name: pins[name] for name in top} == top
    assert {"botocore", "pydantic-core", "typing-extensions"} <= set(pins)  # transitive ones
    entries = re.split(r"^(?=\S)", lambdas.LOCK.read_text(), flags=re.MULTILINE)
    for entry in (e for e in entries if "==" in e and not e.startswith("#")):
        assert "--hash=sha256:" in entry, entry.splitlines()[0]


def test_the_lock_is_part_of_the_asset_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = lambdas._source_hash()
    lock = tmp_path / "requirements.lock"
    lock.write_text(lambdas.LOCK.read_text() + "# one more byte\n")
    monkeypatch.setattr(lambdas, "LOCK", lock)
    assert lambdas._source_hash() != before
