"""The compact text a model reads on its next turn."""

from __future__ import annotations

import shlex

from trialbox.models.limits import Limits
from trialbox.models.report import CommandResult, RunReport, Status, TestOutcome

MAX_FEEDBACK_CHARS = 2000
MAX_FAILURES = 8
MESSAGE_CHARS = 300
TAIL_LINES = 15


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _keep_tail(text: str, limit: int) -> str:
    """Tracebacks end with the error, so a long message keeps its tail, from a word start."""
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    if text[-limit - 1] != " " and " " in tail:  # cut inside a word: start at the next one
        tail = tail.split(" ", 1)[1]
    return "..." + tail.lstrip()


def _seconds(value: float) -> str:
    return f"{value:g}"


def _killed(command: CommandResult, report: RunReport, timeout_s: float) -> str:
    where = "grading" if command.phase == "grading" else f"command {command.argv[0]!r}"
    limits = report.provenance.limits if report.provenance else None
    if command.timed_out:
        return f"{where} timed out after {_seconds(timeout_s)} s"
    if command.status == Status.TIMEOUT:  # the boundary stopped the solution's code
        return f"{where}: the solution's code did not finish within {_seconds(timeout_s)} s"
    memory = f" {limits.memory_mb} MiB" if limits else ""
    return f"{where} killed: memory limit{memory}"


def feedback(
    report: RunReport, passed: int, expected: int, untrusted: list[str], caught: list[str]
) -> str:
    if report.status == Status.SANDBOX_ERROR:
        return f"sandbox error (not your code): {report.error}"
    if caught and report.status == Status.SUCCEEDED:
        shown = "; ".join(caught[:4])
        return f"integrity violation, reward 0: {shown}"[:MAX_FEEDBACK_CHARS]
    limits = report.provenance.limits if report.provenance else None
    killed: list[str] = []  # agent commands the runner stopped, when the run went on
    for command in report.commands:
        if command.status in (Status.TIMEOUT, Status.OOM):
            timeout = (
                report.provenance.grading_timeout_s
                if command.phase == "grading" and report.provenance
                else None
            ) or (limits.timeout_s if limits else 0)
            text = _killed(command, report, timeout)
            # A graded run's status is its grading's: an agent command is only ever a note.
            carries = report.grading is None or command.phase == "grading"
            if carries and command.status == report.status:
                return text
            killed.append(f"note: {text}")
    text = "\n".join([_graded(report, passed, expected, untrusted), *killed])
    return text if len(text) <= MAX_FEEDBACK_CHARS else text[: MAX_FEEDBACK_CHARS - 3] + "..."


def _graded(report: RunReport, passed: int, expected: int, untrusted: list[str]) -> str:
    grading = report.grading
    if grading is None:
        return "not graded"
    setup = [a for a in grading.anomalies if a.startswith("grading_setup_failed:")]
    if setup:  # nothing could be graded: say why, in the runner's words
        return "reward 0: " + setup[0].split(":", 1)[1].strip()
    if untrusted:
        return (
            f"reward 0: the test run cannot be trusted ({', '.join(untrusted)}); "
            "the pytest process must run to the end of its session undisturbed"
        )
    if expected and passed == expected:
        return f"all {expected} tests passed"
    # No expected ids and none collected: collection itself failed (an exit at import, say).
    lines = [f"{passed}/{expected} tests passed" if expected else "no tests ran"]
    # Errors and failures first, with their messages; tests that never ran, in one line.
    problems = [
        t for t in grading.tests if t.outcome not in (TestOutcome.PASSED, TestOutcome.MISSING)
    ]
    for test in problems[:MAX_FAILURES]:
        message = _keep_tail(" ".join((test.message or "").split()), MESSAGE_CHARS)
        lines.append(
            f"{test.outcome.value.upper()} {test.test_id}" + (f": {message}" if message else "")
        )
    if len(problems) > MAX_FAILURES:
        lines.append(f"... and {len(problems) - MAX_FAILURES} more")
    missing = [t.test_id for t in grading.tests if t.outcome == TestOutcome.MISSING]
    if missing:
        shown = ", ".join(missing[:MAX_FAILURES]) + (", ..." if len(missing) > MAX_FAILURES else "")
        lines.append(f"NOT RUN ({len(missing)}): {shown}")
    grader = next((c for c in report.commands if c.phase == "grading"), None)
    if grader is not None and (not expected or passed == 0):
        tail = _tail(grader.stderr) or _tail(grader.stdout)
        if tail:
            lines.append(tail)
    return "\n".join(lines)


def command_feedback(commands: list[CommandResult], limits: Limits) -> str:
    """A session call's text for the model: each command, how it ended, its output's tail."""
    parts = []
    for command in commands:
        if command.timed_out:
            ended = f"timed out after {_seconds(limits.timeout_s)} s"
        elif command.oom_killed:
            ended = f"killed: memory limit {limits.memory_mb} MiB"
        else:
            ended = f"exit {command.exit_code}"
        lines = [f"$ {shlex.join(command.argv)}  ({ended}, {command.wall_s:.2f} s)"]
        for name, text in (("stdout", command.stdout), ("stderr", command.stderr)):
            if text.strip():
                lines.append(f"[{name}]\n{_tail(text)}")
        parts.append("\n".join(lines))
    text = "\n".join(parts)
    return text if len(text) <= MAX_FEEDBACK_CHARS else "..." + text[-(MAX_FEEDBACK_CHARS - 3) :]
