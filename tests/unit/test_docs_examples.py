"""Every Python block of docs/sdk.md runs: it is a file of examples/ verbatim (which
tests/e2e/test_sdk_example.py runs on the local twin), or this test executes it. The page's
tables agree with the code, and no page names what the SDK no longer has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

import trialbox
from trialbox import errors
from trialbox.models import REWARD_RULES, Status
from trialbox.settings import ClientSettings

ROOT = Path(__file__).resolve().parents[2]
SDK_DOC = ROOT / "docs" / "sdk.md"
INTEGRATIONS_DOC = ROOT / "docs" / "integrations.md"
README = ROOT / "README.md"
EXAMPLES = {path.read_text(): path for path in sorted((ROOT / "examples").glob("*.py"))}
REMOVED = ["trialbox.client", "trialbox/client.py", "trialbox.driver", "trialbox/driver.py"]
REMOVED += ["Client.wait", "Client.poll", "client.wait(", "client.poll(", "push_taskset(key"]


def python_blocks(path: Path) -> list[str]:
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    return [t.content for t in tokens if t.type == "fence" and t.info.split()[:1] == ["python"]]


def section(title: str) -> str:
    """The text of one `## title` section of docs/sdk.md."""
    text = SDK_DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the tables in `text`, as lists of cells."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    return [row for row in cells if set(row[0]) != {"-"} and row[0] not in HEADERS]


HEADERS = {"status", "variable", "exception"}
SNIPPETS = [block for block in python_blocks(SDK_DOC) if block not in EXAMPLES]


def test_every_example_file_is_in_a_page_verbatim() -> None:
    shown = python_blocks(SDK_DOC) + python_blocks(INTEGRATIONS_DOC)
    assert [p.name for text, p in EXAMPLES.items() if text not in shown] == []
    assert {"sdk_quickstart.py", "sdk_async.py", "grpo_group.py"} <= {
        p.name for p in EXAMPLES.values()
    }


def test_the_integrations_page_shows_only_example_files_and_their_yaml() -> None:
    assert all(block in EXAMPLES for block in python_blocks(INTEGRATIONS_DOC))
    tokens = MarkdownIt("commonmark").parse(INTEGRATIONS_DOC.read_text())
    shown = [t.content for t in tokens if t.type == "fence" and t.info == "yaml"]
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        assert path.read_text() in shown, path.name


def test_the_readme_shows_only_example_files() -> None:
    blocks = python_blocks(README)
    assert blocks, "README.md shows the quickstart"
    assert all(block in EXAMPLES for block in blocks)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"block{i}" for i in range(len(SNIPPETS))])
def test_every_other_python_block_runs(snippet: str, monkeypatch: pytest.MonkeyPatch) -> None:
    needs_client = re.search(r"\bClient\b", snippet)
    assert not needs_client, "a block that needs a client is an example file, run by tests/e2e"
    monkeypatch.chdir(ROOT)
    exec(compile(snippet, str(SDK_DOC), "exec"), {"__name__": "docs_sdk"})


def test_the_reward_table_is_the_reward_rules() -> None:
    rows = {row[0].strip("`"): row[1:] for row in table_rows(section("Results and rewards"))}
    assert set(rows) == {status.value for status in Status}
    for status, rule in REWARD_RULES.items():
        reward, loss_mask = rows[status.value]
        expected = "the scorer's number" if rule.scored else str(rule.fixed)
        assert reward.startswith(expected), status
        assert loss_mask == str(rule.loss_mask).lower(), status


def test_the_settings_table_is_what_client_settings_reads() -> None:
    named = {row[0].strip("`") for row in table_rows(section("Settings"))}
    assert named == {field.alias for field in ClientSettings.model_fields.values()}


def test_the_errors_table_names_real_exceptions_and_every_public_one() -> None:
    named = {row[0].strip("`") for row in table_rows(section("Errors"))}
    for name in named:
        assert issubclass(getattr(errors, name), errors.TrialboxError), name
    public = {n for n, module in trialbox._PUBLIC.items() if module == "trialbox.errors"}
    assert public <= named


@pytest.mark.parametrize(
    "page",
    [README, *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda page: str(page.relative_to(ROOT)),  # the same id in every checkout
)
def test_no_page_names_a_removed_sdk_name(page: Path) -> None:
    text = page.read_text()
    assert [name for name in REMOVED if name in text] == []
