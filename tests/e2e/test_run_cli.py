"""`trialbox run` and `trialbox demo` as a user runs them."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.tasks import ADD_TASK, CORRECT

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasksets"


def trialbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trialbox", *args], capture_output=True, text=True, timeout=600
    )


# Every bundled demo sample and what the pipeline must make of it (status, reward).
DEMO = {
    ("add-two", "correct"): ("succeeded", 1.0),
    ("fizzbuzz", "correct"): ("succeeded", 1.0),
    ("palindrome", "correct"): ("succeeded", 1.0),
    ("word-count", "correct"): ("succeeded", 1.0),
    ("fibonacci", "correct"): ("succeeded", 1.0),
    ("roman", "correct"): ("succeeded", 1.0),
    ("binary-search", "correct"): ("succeeded", 1.0),
    ("matrix", "correct"): ("succeeded", 1.0),
    ("add-two", "wrong"): ("succeeded", 0.0),
    ("palindrome", "syntax-error"): ("succeeded", 0.0),
    ("fibonacci", "timeout"): ("timeout", 0.0),
    ("word-count", "memory-hog"): ("oom", 0.0),
    ("roman", "test-tamperer"): ("succeeded", 0.0),
    ("binary-search", "hard-coder"): ("succeeded", 2 / 3),
    ("fizzbuzz", "off-by-one"): ("succeeded", 0.0),
    ("stdin-sum", "correct"): ("succeeded", 1.0),
    ("lru-cache", "correct"): ("succeeded", 1.0),
    ("normalize-rows", "correct"): ("succeeded", 1.0),
    ("slugify-package", "correct"): ("succeeded", 1.0),
    ("lru-cache", "no-eviction-order"): ("succeeded", 1 / 3),
    ("normalize-rows", "divides-by-zero"): ("succeeded", 0.5),
    ("stdin-sum", "hard-coded-output"): ("succeeded", 0.25),
    ("slugify-package", "agent-commands"): ("succeeded", 1.0),
}


@pytest.mark.alone  # its timeout and memory-hog samples, and 5 s limits on the others
def test_demo_runs_the_bundled_task_set(tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    done = trialbox("demo", "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    got = {(r["task_id"], r["sample_id"]): (r["status"], r["reward"]) for r in rows}
    assert list(got) == list(DEMO)  # every sample, in input order
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in DEMO.items()}
    assert [v[1] for v in got.values()] == pytest.approx([v[1] for v in DEMO.values()])
    assert len({task for task, _ in got}) == 12
    assert "mean reward" in done.stdout and "succeeded" in done.stdout
    rows_shown = [line for line in done.stdout.splitlines() if " succeeded " in line]
    assert len(rows_shown) == 21 + 1  # a row per succeeded sample, and the summary's
    assert any("0.25" in line for line in rows_shown)
    assert f"results: {out}" in done.stdout
    traces = out.with_suffix(".traces")
    assert sorted(p.stem for p in traces.iterdir()) == sorted(r["request_id"] for r in rows)
    for key in ("request_id", "loss_mask", "tests_passed", "tests_expected", "duration_s"):
        assert key in rows[0]


def test_run_rejects_bad_input_before_submitting(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(ADD_TASK) + "\n")
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": "add-two"}) + "\n{bad\n")
    done = trialbox("run", "--tasks", str(tasks), "--samples", str(samples), "--out", "x.jsonl")
    assert done.returncode == 2
    assert "samples.jsonl:1: sample_id: Field required" in done.stderr
    assert "samples.jsonl:2: bad JSON" in done.stderr


def inputs(tmp_path: Path) -> tuple[Path, Path]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(ADD_TASK) + "\n")
    samples = tmp_path / "samples.jsonl"
    sample = {"task_id": "add-two", "sample_id": "a", "files": {"solution.py": CORRECT}}
    samples.write_text(json.dumps(sample) + "\n")
    return tasks, samples


@pytest.mark.parametrize(
    ("out", "extra", "message"),
    [
        ("tasks.jsonl", [], "--out {d}/tasks.jsonl is the --tasks file: the results would "
         "overwrite it"),
        (".", [], "--out {d} is a directory: give a file path"),
        ("nowhere/r.jsonl", [], "--out {d}/nowhere/r.jsonl: directory {d}/nowhere does not "
         "exist"),
        ("binary.bin", [], "--out {d}/binary.bin exists and is not a results file of `trialbox "
         "run` (resume writes into it): choose another path, or delete it"),
        ("r.jsonl", ["--traces-dir", "binary.bin"], "--traces-dir {d}/binary.bin is a file: "
         "give a directory"),
    ],
)  # fmt: skip
def test_an_unusable_output_path_is_bad_input_and_nothing_runs(
    tmp_path: Path, out: str, extra: list[str], message: str
) -> None:
    tasks, samples = inputs(tmp_path)
    (tmp_path / "binary.bin").write_bytes(b"\x00\xff" * 100)
    before = tasks.read_bytes()
    extra = [str(tmp_path / e) if e.endswith(".bin") else e for e in extra]
    done = trialbox(
        "run", "--tasks", str(tasks), "--samples", str(samples), "--out", str(tmp_path / out),
        *extra,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == f"error: {message.format(d=tmp_path)}\n"
    assert "starting the local twin" not in done.stderr
    assert tasks.read_bytes() == before and (tmp_path / "binary.bin").stat().st_size == 200


def test_an_endpoint_without_resource_names_is_bad_input(tmp_path: Path) -> None:
    tasks, samples = inputs(tmp_path)
    out = tmp_path / "r.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBOX_")}
    done = subprocess.run(
        [sys.executable, "-m", "trialbox", "run", "--tasks", str(tasks), "--samples",
         str(samples), "--out", str(out), "--endpoint-url", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "error: --endpoint-url http://127.0.0.1:9 needs the stack's resource names: set "
        "TRIALBOX_REQUESTS_QUEUE_URL, TRIALBOX_EXECUTIONS_TABLE, TRIALBOX_TRACES_BUCKET, "
        "TRIALBOX_TASKSETS_BUCKET (`trialbox local up` prints them), or use --stack NAME\n"
    )
    assert not out.exists()


def test_rerunning_with_the_same_run_id_skips_finished_samples(tmp_path: Path) -> None:
    tasks, samples = inputs(tmp_path)
    out = tmp_path / "out.jsonl"
    args = ["run", "--tasks", str(tasks), "--samples", str(samples), "--out", str(out)]
    first = trialbox(*args, "--run-id", "r1", "--local")
    assert first.returncode == 0, first.stderr
    row = json.loads(out.read_text())
    assert row["reward"] == 1.0 and row["request_id"].startswith("r1-add-two-a-")
    row["feedback"] = "kept from the first run"
    out.write_text(json.dumps(row) + "\n")
    again = trialbox(*args, "--run-id", "r1", "--local")
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text())["feedback"] == "kept from the first run"
    assert f"resuming run r1: 1 of 1 sample(s) already have results in {out}" in again.stderr
    assert "starting the local twin" not in again.stderr  # nothing left to run
    # The same run id with a changed sample: its old row would be a wrong result.
    samples.write_text(samples.read_text().replace("a + b", "a - b"))
    changed = trialbox(*args, "--run-id", "r1", "--local")
    assert changed.returncode == 2, changed.stderr
    assert "1 sample(s) changed since run r1 recorded them" in changed.stderr
    assert "give a new --run-id" in changed.stderr


def test_ctrl_c_keeps_what_finished_and_prints_the_resume_command(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(ADD_TASK) + "\n")
    slow = "import time\ntime.sleep(2)\n" + CORRECT
    samples = tmp_path / "samples.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"task_id": "add-two", "sample_id": f"s{i}", "files": {"solution.py": slow}})
            + "\n"
            for i in range(8)
        )
    )
    out = tmp_path / "out.jsonl"
    args = ["run", "--tasks", str(tasks), "--samples", str(samples), "--out", str(out)]
    running = subprocess.Popen(
        [sys.executable, "-m", "trialbox", *args, "--run-id", "cc", "--concurrency", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
        assert running.poll() is None, running.communicate()
        time.sleep(0.2)
    os.killpg(running.pid, signal.SIGINT)  # as a terminal does: the whole process group
    stdout, stderr = running.communicate(timeout=120)
    assert running.returncode == 1, stderr
    assert "stopping: no more submissions" in stderr
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert 1 <= len(first) < 8
    assert [r["sample_id"] for r in first] == sorted(r["sample_id"] for r in first)
    assert all(r["status"] == "succeeded" and r["reward"] == 1.0 for r in first)
    assert f"{len(first)}/8 samples" in stdout
    resume = shlex.split(stderr.split("Resume with:\n", 1)[1].splitlines()[0])
    # This command as it was started (here `python -m trialbox`), so it runs as printed.
    assert resume[:4] == [sys.executable, "-m", "trialbox", "run"] and "cc" in resume

    for row in first:  # marked: a re-executed sample would lose the mark
        row["feedback"] = "from the interrupted run"
    out.write_text("".join(json.dumps(r) + "\n" for r in first))
    again = subprocess.run(resume, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["sample_id"] for r in rows] == [f"s{i}" for i in range(8)]
    kept = [r for r in rows if r["feedback"] == "from the interrupted run"]
    assert len(kept) == len(first)
    assert all(r["reward"] == 1.0 for r in rows)


def test_without_the_local_extra_run_names_it_in_one_line(tmp_path: Path) -> None:
    """`pip install trialbox` has no moto: `trialbox run` (the local twin) says which extra to
    install, in one line, before anything starts."""
    tasks, samples = inputs(tmp_path)
    out = tmp_path / "out.jsonl"
    hide = (
        "import sys\nfor name in ('moto', 'requests', 'werkzeug'):\n    sys.modules[name] = None\n"
    )
    code = hide + "from trialbox.cli import main\nmain()\n"
    done = subprocess.run(
        [sys.executable, "-c", code, "run", "--tasks", str(tasks), "--samples", str(samples),
         "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: the local twin needs `pip install 'trialbox[local]'` (no module 'requests')"
    ]
    assert not out.exists()


def test_local_up_serves_the_sdk_until_ctrl_c(tmp_path: Path) -> None:
    serving = subprocess.Popen(
        [sys.executable, "-m", "trialbox", "local", "up", "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert serving.stdout is not None
        banner = serving.stdout.readline()
        assert banner.startswith("local twin at http://127.0.0.1:"), serving.communicate()
        exports: dict[str, str] = {}
        for line in iter(serving.stdout.readline, "# serving until Ctrl-C\n"):
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").strip().partition("=")
                exports[name] = value
        assert exports["AWS_ENDPOINT_URL"] == banner.split()[3]
        env = os.environ | exports
        code = (
            "from trialbox import Client, Task\n"
            "from tests.support.twin import request\n"
            "from tests.support.tasks import ADD_TASK, CORRECT\n"
            "client = Client()\n"
            "print(client.run([request('up-1', CORRECT)], timeout=120)[0].reward)\n"
            "with client.session(Task.model_validate(ADD_TASK)) as session:\n"  # sessions too
            "    print(session.exec(['echo', 'hi']).stdout.strip())\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
        )
        assert done.stdout.split() == ["1.0", "hi"], done.stderr
        # SandboxFusion's endpoint, where the sandbox-fusion client looks for it.
        fusion = exports["SANDBOX_FUSION_ENDPOINT"] + "/run_code"
        ran = requests.post(fusion, json={"code": "print(7)", "language": "python"}, timeout=60)
        assert ran.json()["run_result"]["stdout"] == "7\n"
        # The CLI against that twin keeps the traces too: its S3 ends when it stops.
        tasks, samples = inputs(tmp_path)
        out = tmp_path / "r.jsonl"
        run = subprocess.run(
            [sys.executable, "-m", "trialbox", "run", "--tasks", str(tasks), "--samples",
             str(samples), "--out", str(out)],
            env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        (row,) = [json.loads(line) for line in out.read_text().splitlines()]
        assert (tmp_path / "r.traces" / f"{row['request_id']}.json").is_file()
        assert "starting the local twin" not in run.stderr
    finally:
        os.killpg(serving.pid, signal.SIGINT)
        try:
            stdout, _ = serving.communicate(timeout=60)
        finally:  # never left running: it would hold its twin and workers past the test
            if serving.poll() is None:
                os.killpg(serving.pid, signal.SIGKILL)
                serving.wait()
    assert serving.returncode == 0 and "stopping" in stdout
