"""The image's build inputs: every COPY source survives .dockerignore (Docker's matching),
and the parsers the builder relies on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fargate.dockerfile import (
    Context,
    Copy,
    ignored,
    instructions,
    parse_dockerignore,
    parse_env,
)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "sandbox_image" / "Dockerfile"


def copies() -> list[Copy]:
    env: dict[str, str] = {}
    found = []
    for step in instructions(DOCKERFILE.read_text()):
        if step.keyword == "ENV":
            env |= parse_env(step.args, env)
        if step.keyword == "COPY":
            found.append(Copy.parse(step.args, env))
    return found


def test_every_copy_source_survives_dockerignore() -> None:
    context = Context(ROOT)
    sources = [s for copy in copies() for s in copy.sources]
    assert sources, "the Dockerfile copies nothing"
    for source in sources:
        path = ROOT / source
        if path.is_dir():
            on_disk = {
                str(p.relative_to(ROOT))
                for p in path.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts
            }
            assert set(context.files(source)) == on_disk, source
        else:
            assert context.files(source) == [source]


def test_pycache_never_reaches_the_image() -> None:
    context = Context(ROOT)
    assert not context.included("trialbox/__pycache__/constants.cpython-311.pyc")
    assert not context.included("trialbox/sandbox/__pycache__/x.pyc")
    assert context.included("trialbox/sandbox/runner.py")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("pyproject.toml", False),
        ("tests/fargate/conftest.py", True),
        ("trialbox", True),  # `trialbox/**` re-includes what is below it, not the dir itself
        ("trialbox/a/b.py", False),
        ("trialbox/a/__pycache__/b.pyc", True),
        ("docs/x.md", True),
        ("docs/keep.md", False),
        ("a/b/c.log", True),
    ],
)
def test_matcher_follows_docker(path: str, expected: bool) -> None:
    patterns = parse_dockerignore(
        "# comment\n*\n!pyproject.toml\n!trialbox/**\n**/__pycache__\n!docs/keep.md\n**/*.log\n"
    )
    assert ignored(path, patterns) is expected


def test_env_parser_handles_continuations_and_quotes() -> None:
    (step,) = instructions('ENV A=1 B="two words" \\\n    C=${A}x\n')
    assert parse_env(step.args, {}) == {"A": "1", "B": "two words", "C": "1x"}


def test_a_copy_of_an_ignored_file_fails_like_docker(tmp_path: Path) -> None:
    (tmp_path / ".dockerignore").write_text("*\n")
    (tmp_path / "x").write_text("")
    with pytest.raises(FileNotFoundError, match=r"excluded by \.dockerignore"):
        Context(tmp_path).files("x")
