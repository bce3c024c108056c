"""Task QC (`trialbox tasks validate`): is a task fit to train on? For each task, in the
sandbox, without AWS:

- failing checks: the reference scores 1.0 on every one of `repeats` runs; the untouched
  starter scores below 1.0; the runs agree (not flaky); the reference fits the limits; the
  expected test ids are the ones collected (unset ids are reported, and `--write` fills them);
- reported: test strength (the fraction of the reference's mutants the hidden tests kill) and
  prompt leakage (assertion literals of the hidden tests, or an io_match task's expected
  outputs, that appear verbatim in the prompt or the starter files)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trialbox.models.common import FileContent, file_bytes
from trialbox.models.report import Status, TestOutcome
from trialbox.models.result import ExecutionResult
from trialbox.models.sample import Sample
from trialbox.models.task import Task
from trialbox.qc.leakage import MIN_CHARS, leaked
from trialbox.qc.mutants import all_mutants
from trialbox.scoring import score

if TYPE_CHECKING:
    from trialbox.sandbox.runner import Runner

STRENGTH_THRESHOLD = 0.8  # tests that kill fewer of the reference's mutants are flagged
TIGHT = 0.5  # the reference using more than this share of a limit is reported as tight


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    failing: bool = True  # False: reported, never a failure


@dataclass
class TaskQC:
    task_id: str
    checks: list[Check] = field(default_factory=list)
    collected: list[str] = field(default_factory=list)  # the reference run's test ids
    mutation_score: float | None = None
    mutants: int = 0
    leaks: list[str] = field(default_factory=list)
    reference_wall_s: float | None = None
    reference_peak_mb: float | None = None
    sandbox_errors: list[str] = field(default_factory=list)  # the platform failed a run
    survivors: list[str] = field(default_factory=list)  # mutants the tests let pass

    @property
    def failed(self) -> bool:
        return any(c.failing and not c.ok for c in self.checks)

    def problems(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


def _text(files: dict[str, FileContent]) -> str:
    return "\n".join(file_bytes(c).decode(errors="replace") for c in files.values())


def _grade(runner: Runner, task: Task, files: dict[str, FileContent], name: str) -> ExecutionResult:
    sample = Sample(task_id=task.task_id, sample_id=name, files=files)
    return score(task.grading, runner.run(task, sample))


def _why(result: ExecutionResult) -> str:
    failing = [t for t in result.tests if t.outcome != TestOutcome.PASSED]
    first = f"; {failing[0].test_id}: {(failing[0].message or '')[:200]}" if failing else ""
    return f"{result.status} reward {result.reward}{first}"


def _signature(result: ExecutionResult) -> tuple[object, ...]:
    return (
        result.status,
        result.reward,
        tuple(sorted((t.test_id, t.outcome) for t in result.tests)),
    )


def validate(runner: Runner, task: Task, repeats: int = 3, max_mutants: int = 20) -> TaskQC:
    qc = TaskQC(task.task_id)
    _leakage(qc, task)
    starter = _grade(runner, task, {}, "qc-starter")
    runs = []
    if task.reference is not None:
        reference = dict(task.reference)
        runs = [_grade(runner, task, reference, f"qc-reference-{n}") for n in range(repeats)]
    platform = [r for r in [starter, *runs] if r.status == Status.SANDBOX_ERROR]
    if platform:  # nothing can be concluded about the task: the sandbox failed, not it
        qc.sandbox_errors = [r.error or "sandbox_error" for r in platform]
        qc.checks.append(Check("sandbox", False, f"the sandbox failed: {qc.sandbox_errors[0]}"))
        return qc
    qc.checks.append(
        Check(
            "starter",
            starter.reward is not None and starter.reward < 1.0,
            f"the untouched starter: {_why(starter)}"
            + (" (the tests cannot tell it from a solution)" if starter.reward == 1.0 else ""),
        )
    )
    if task.reference is None:
        qc.checks.append(Check("reference", False, "the task has no reference solution"))
        return qc
    qc.checks.append(
        Check(
            "reference",
            all(r.reward == 1.0 for r in runs),
            "; ".join(f"run {n + 1}: {_why(r)}" for n, r in enumerate(runs) if r.reward != 1.0)
            or f"1.0 on {repeats} run(s)",
        )
    )
    outcomes = len({_signature(r) for r in runs})
    qc.checks.append(
        Check("flaky", outcomes == 1, f"{outcomes} different outcome(s) over {repeats} runs")
    )
    _limits(qc, task, runs)
    _expected_ids(qc, task, runs[0])
    if max_mutants > 0 and all(r.reward == 1.0 for r in runs):
        _strength(runner, task, dict(task.reference), qc, max_mutants)
    return qc


def _leakage(qc: TaskQC, task: Task) -> None:
    visible = task.prompt + "\n" + _text(dict(task.workspace))
    qc.leaks = leaked(
        {p: file_bytes(c).decode(errors="replace") for p, c in task.hidden_tests.items()},
        visible,
    )
    if task.grading.io is not None:  # an io_match task's expected outputs
        outputs = {c.output.strip() for c in task.grading.io.cases}
        found = {o for o in outputs if len(o) >= MIN_CHARS and o in visible}
        qc.leaks = sorted(set(qc.leaks) | found)
    detail = f"{len(qc.leaks)} hidden test value(s) shown in the prompt or starter files"
    qc.checks.append(
        Check(
            "leakage",
            not qc.leaks,
            detail + (f": {', '.join(qc.leaks[:5])}" if qc.leaks else ""),
            failing=False,
        )
    )


def _expected_ids(qc: TaskQC, task: Task, run: ExecutionResult) -> None:
    """The ids the reference's run collected in the hidden test files, against the task's."""
    if run.status != Status.SUCCEEDED:  # tests that never ran say nothing of the ids
        detail = f"not checked: the reference's run ended {run.status}"
        qc.checks.append(Check("expected_tests", False, detail, failing=False))
        return
    qc.collected = [
        t.test_id
        for t in run.tests
        if "::" in t.test_id
        and t.test_id.split("::", 1)[0] in task.hidden_tests
        and t.outcome != TestOutcome.MISSING
    ]
    expected = task.grading.expected_tests
    if expected is None:
        detail = f"not set; {len(qc.collected)} collected (--write fills them in)"
        qc.checks.append(Check("expected_tests", False, detail, failing=False))
        return
    missing = sorted(set(expected) - set(qc.collected))
    extra = sorted(set(qc.collected) - set(expected))
    detail = (f"expected, not collected: {missing}; " if missing else "") + (
        f"collected, not expected: {extra}" if extra else ""
    )
    qc.checks.append(Check("expected_tests", not (missing or extra), detail or "as collected"))


def _limits(qc: TaskQC, task: Task, runs: list[ExecutionResult]) -> None:
    grading = [c for r in runs for c in r.commands if c.phase == "grading"]
    unfit = [r.status for r in runs if r.status in (Status.TIMEOUT, Status.OOM)]
    if grading:
        qc.reference_wall_s = max(c.wall_s for c in grading)
        qc.reference_peak_mb = max(c.peak_memory_mb for c in grading)
    timeout, memory = task.grading_timeout_s, task.limits.memory_mb
    detail = (
        f"the reference's grading took {qc.reference_wall_s} s of {timeout} s and "
        f"{qc.reference_peak_mb} MiB of {memory} MiB"
    )
    if unfit:
        detail = f"the reference ran out of its limits ({', '.join(sorted(set(unfit)))}); {detail}"
        qc.checks.append(Check("limits", False, detail))
    elif (qc.reference_wall_s or 0) > TIGHT * timeout or (
        qc.reference_peak_mb or 0
    ) > TIGHT * memory:
        qc.checks.append(
            Check("limits", False, detail + " (tight: under 2x headroom)", failing=False)
        )
    else:
        qc.checks.append(Check("limits", True, detail))


def _strength(
    runner: Runner, task: Task, reference: dict[str, FileContent], qc: TaskQC, limit: int
) -> None:
    found = all_mutants(
        {p: file_bytes(c).decode(errors="replace") for p, c in reference.items()}, limit
    )
    killed = graded = 0
    survivors: list[str] = []
    for n, mutant in enumerate(found):
        result = _grade(runner, task, reference | {mutant.path: mutant.source}, f"qc-mutant-{n}")
        if result.status in (Status.SANDBOX_ERROR, Status.REJECTED, Status.CANCELLED):
            continue  # says nothing about the tests
        graded += 1
        if result.reward == 1.0:
            survivors.append(f"{mutant.path}:{mutant.line} {mutant.change}")
        else:
            killed += 1
    qc.mutants = graded
    qc.mutation_score = killed / graded if graded else None
    qc.survivors = survivors
    strong = qc.mutation_score is None or qc.mutation_score >= STRENGTH_THRESHOLD
    if graded:
        detail = f"the hidden tests kill {killed} of {graded} mutants of the reference"
        detail += f"; surviving: {', '.join(survivors[:5])}" if survivors else ""
    elif found:
        detail = "no mutant could be graded"
    else:
        detail = "no mutable Python in the reference"
    qc.checks.append(Check("strength", strong, detail, failing=False))
