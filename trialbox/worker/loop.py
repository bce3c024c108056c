"""Long-poll the work queue; run each job in the sandbox; heartbeat while it runs; upload the
raw report; answer the task token; delete the message only after the callback."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import TypeAdapter, ValidationError

from trialbox.constants import ERROR_INTERRUPTED, ERROR_SANDBOX
from trialbox.keys import job_key
from trialbox.models import Status
from trialbox.models.batches import BatchWork
from trialbox.models.jobs import ExecutionDone, JobSpec, WorkMessage
from trialbox.pipeline.admission import Admission, Held
from trialbox.pipeline.stores import ObjectStore
from trialbox.settings import TASK_SLOTS, work_visibility_s
from trialbox.worker.batched import BatchedJobs
from trialbox.worker.lease import hold_lease
from trialbox.worker.opener import Opener
from trialbox.worker.run import RunJob

if TYPE_CHECKING:
    from trialbox.worker.sessions import SessionHost

log = logging.getLogger("trialbox.worker")
# The execution moved on (timed out, retried elsewhere, or ended): this token is dead.
GONE = ("TaskTimedOut", "InvalidToken", "TaskDoesNotExist")

# What a work-queue message is: a job's or a batched sample's (each model forbids the
# other's fields, so exactly one parses). Sessions open on a queue of their own (opener.py).
WORK_ITEM: TypeAdapter[WorkMessage | BatchWork] = TypeAdapter(WorkMessage | BatchWork)
RETRY_PAUSE_S = 1.0
MAX_ANSWER_PAUSE_S = 8.0  # between sends of a refused callback (each after botocore's retries)
MAX_CAUSE_CHARS = 32_000  # SendTaskFailure takes a cause of at most 32,768 characters


def failure_cause(message: str, attempt: int) -> str:
    """A Sandbox.Error's cause: the JSON the recorder reads (the message, and the Execute
    retries before this attempt), the message cut so that the whole stays within the limit."""
    cut = message[:MAX_CAUSE_CHARS]
    while len(cause := json.dumps({"errorMessage": cut, "attempt": attempt})) > MAX_CAUSE_CHARS:
        cut = cut[: min(len(cut) - 1, len(cut) * MAX_CAUSE_CHARS // len(cause))]
    return cause


@dataclass
class Worker:
    sqs: Any
    sfn: Any
    jobs: ObjectStore
    queue_url: str
    run_job: RunJob
    heartbeat_s: int
    name: str = "worker"
    wait_s: int = 20
    stop: threading.Event = field(default_factory=threading.Event)
    # Epoch s after which a job still running is handed back (set on SIGTERM), so that the
    # container's stop timeout never cuts a job off unanswered.
    hand_back_at: float | None = None
    # Exit (for a fresh task) after this many jobs; None: never (the twin's workers).
    recycle_after_jobs: int | None = None
    # What earlier jobs left where the next could see it (Runner.residue); anything found
    # ends the loop before another job is taken.
    residue: Callable[[], list[str]] | None = None
    # Hosts the sessions it takes from the open queue (trialbox.worker.sessions and
    # .opener); None: jobs only.
    sessions: SessionHost | None = None
    open_queue_url: str | None = None
    # Where its free slots are leased to the dispatcher (trialbox.worker.lease): None only
    # for a loop driven by hand (a test's poll_once), which no admission counts on.
    admission: Admission | None = None
    # Set when free_slots() changes: the lease is rewritten at once, not at its next renewal.
    slots_changed: threading.Event = field(default_factory=threading.Event)
    # Runs the samples of batches (trialbox.worker.batched); None: token jobs only.
    batched: BatchedJobs | None = None
    jobs_done: int = 0
    _hosted_exclusively: bool = False

    def shut_down(self, grace_s: float) -> None:
        """Take no new job; finish the current one, or hand it back after `grace_s`."""
        deadline = time.time() + grace_s
        self.hand_back_at = min(deadline, self.hand_back_at or deadline)  # a 2nd never extends
        self.stop.set()
        self.slots_changed.set()

    def serve(self) -> None:
        """Until `stop`. An AWS call that fails for one job never ends the loop: that job's
        message comes back after its visibility timeout, or its heartbeat lapses and the
        state machine retries it on another sandbox."""
        lease = None
        if self.admission is not None:
            lease = hold_lease(
                self.admission, self.name, self.free_slots, self.stop, self.slots_changed
            )
        opener = None
        if self.sessions is not None and self.open_queue_url:
            opener = Opener(
                self.sqs, self.open_queue_url, self.sessions, self.stop,
                wait_s=self.wait_s, on_hosted=self.slots_changed,
            ).start()  # fmt: skip
        try:
            self._serve()
        finally:
            self.stop.set()
            self.slots_changed.set()
            if lease is not None:
                lease.join()  # withdrawn before the loop returns
            if opener is not None:
                opener.join()  # its opens in hand go back to the queue

    def _serve(self) -> None:
        while not self.stop.is_set():
            if self._held_exclusively():
                self.stop.wait(RETRY_PAUSE_S)
                continue
            try:
                self.poll_once()
            except Exception:
                log.exception("%s: polling or answering failed; polling again", self.name)
                self.stop.wait(RETRY_PAUSE_S)

    def free_slots(self) -> int:
        """Jobs this worker can take now (its admission lease): one, none once it is stopping
        or while it hosts a session exclusively."""
        if self.stop.is_set():
            return 0
        if self.sessions is not None and self.sessions.exclusive and self.sessions.held():
            return 0
        return TASK_SLOTS

    def _held_exclusively(self) -> bool:
        """Under the rlimit backend a task serves one sandbox user at a time: while it hosts
        a session it takes no job and no other session, and once the session ends the wipe
        check runs, as after a job."""
        if self.sessions is None or not self.sessions.exclusive:
            return False
        if self.sessions.held():
            self._hosted_exclusively = True
            return True
        if self._hosted_exclusively:
            self._hosted_exclusively = False
            self.slots_changed.set()  # its slot is free again: the lease says so at once
            self._after_job()
        return self.stop.is_set()

    def poll_once(self) -> bool:
        answer = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=1,
            WaitTimeSeconds=self.wait_s,
            VisibilityTimeout=work_visibility_s(self.heartbeat_s),
        )
        messages = answer.get("Messages", [])
        for message in messages:
            if self.stop.is_set():  # told to stop during the long poll: give it back at once
                self._return(message["ReceiptHandle"])
                continue
            if self.handle(message):
                self._after_job()
        return bool(messages)

    def _after_job(self) -> None:
        """Recycle after `recycle_after_jobs`, or at once when the wipe left anything."""
        self.jobs_done += 1
        holding = self.sessions is not None and self.sessions.held() > 0
        if (
            self.recycle_after_jobs is not None
            and self.jobs_done >= self.recycle_after_jobs
            and not holding  # a worker recycles only once it holds no session
        ):
            log.info("%s: %d jobs done; exiting for a fresh task", self.name, self.jobs_done)
            self.stop.set()
            return
        try:
            found = self.residue() if self.residue is not None else []
        except Exception as exc:  # a check that cannot run proves nothing: fail closed
            found = [f"the check itself failed: {type(exc).__name__}: {exc}"]
        if found:
            log.error("%s: the wipe left %s; exiting for a fresh task", self.name, found[:20])
            self.stop.set()

    def handle(self, message: dict[str, Any]) -> bool:
        """One work message; whether it was a job this worker ran."""
        receipt = message["ReceiptHandle"]
        try:
            work = WORK_ITEM.validate_json(message["Body"])
        except ValidationError:
            log.error("dropping a work message that is not a job: %.200s", message["Body"])
            self._delete(receipt)
            return False
        with self.sessions.job() if self.sessions else contextlib.nullcontext(True) as seated:
            if not seated:  # under rlimit, a session came first: the job is another task's
                self._return(receipt)
                return False
            return self._handle(work, receipt)

    def _handle(self, work: WorkMessage | BatchWork, receipt: str) -> bool:
        if isinstance(work, BatchWork):
            if self.batched is None:
                log.error("dropping a batched job: this worker runs none: %s", work.request_id)
                self._delete(receipt)
                return False
            with self.sessions.working() if self.sessions else contextlib.nullcontext():
                return self.batched.handle(work, receipt, self._run)
        if not self._beat(work.task_token):  # a stale redelivery: its execution moved on
            self._delete(receipt)
            return False
        beaten_at = time.monotonic()
        held = self._hold(work.request_id)
        try:
            # Taking the slot may outlast the heartbeat (a throttled table under the client's
            # retries): the execution may have moved on, and sent the job again, meanwhile.
            # Asked again only once a beat is due; a take that quick is one call fewer a job.
            if time.monotonic() - beaten_at >= self._beat_interval_s():
                if not self._beat(work.task_token):
                    self._delete(receipt)
                    return False
                beaten_at = time.monotonic()
            self._work(work, receipt, holds_slot=held is not None, beaten_at=beaten_at)
        finally:
            self._give_back(work.request_id, held)
        return True

    def _hold(self, request_id: str) -> Held | None:
        """Its admission slot is this worker's until the sandbox is done (a cancel or a lapsed
        heartbeat ends the execution, not the run): the reaper frees it only if this worker
        dies (its lease lapses). None: it holds none (or the take failed)."""
        if self.admission is None:
            return None
        try:
            return self.admission.take(request_id, self.name)
        except Exception:  # then Record gives it back (the answer says it holds none)
            log.exception("%s: marking its admission slot taken failed", request_id)
            return None

    def _give_back(self, request_id: str, held: Held | None) -> None:
        """The slot `_hold` took (none: a marker the take did not answer is read first)."""
        if self.admission is None:
            return
        try:
            self.admission.release(request_id, worker=self.name, held=held)
        except Exception:  # the reaper frees it once this worker's lease lapses
            log.exception("%s: giving its admission slot back failed", request_id)

    def _work(self, work: WorkMessage, receipt: str, holds_slot: bool, beaten_at: float) -> None:
        lost = threading.Event()
        done = threading.Event()
        beating = threading.Thread(
            target=self._heartbeats,
            args=(work.task_token, receipt, done, lost, beaten_at),
            daemon=True,
        )
        beating.start()
        started_at = time.time()
        try:
            with self.sessions.working() if self.sessions else contextlib.nullcontext():
                outcome = self._run(work.job_uri, work.request_id, lost)
            # Answered while the heartbeat runs, so that the task lives for as long as its
            # answer is refused (throttled, a 5xx) instead of lapsing into a lost-sandbox retry.
            if not lost.is_set():
                self._answer_until_taken(work, outcome, started_at, lost, holds_slot)
        finally:
            done.set()
            beating.join()
        if lost.is_set():
            log.warning("%s: the execution moved on; dropping the result", work.request_id)
        self._delete(receipt)

    def _run(self, job_uri: str, request_id: str, lost: threading.Event) -> tuple[str, str]:
        """('success', report_uri) or ('failure', cause); nothing is uploaded for a job whose
        execution moved on while it ran."""
        try:
            job = JobSpec.model_validate_json(self.jobs.get_bytes(job_uri))
            report = self.run_job(job, lost)
        except Exception as exc:  # the runner itself failed: a typed failure, never a reward
            log.exception("%s: the runner failed", request_id)
            return "failure", f"{type(exc).__name__}: {exc}"
        if lost.is_set():
            return "failure", "the execution moved on"
        try:
            uri = self.jobs.put_json(job_key(request_id, "report.json"), report)
        except Exception as exc:  # botocore retried already: the run cannot be scored
            log.exception("%s: the report could not be uploaded", request_id)
            return "failure", f"the run report could not be uploaded ({type(exc).__name__}: {exc})"
        if report.status == Status.SANDBOX_ERROR:
            return "failure", report.error or "the sandbox failed"
        return "success", uri

    def _answer_until_taken(
        self,
        work: WorkMessage,
        outcome: tuple[str, str],
        started_at: float,
        lost: threading.Event,
        holds_slot: bool,
    ) -> None:
        """The callback, sent again (after botocore's own retries) until Step Functions takes
        it or its task is gone: the heartbeat finds it dead, or lapses (`_heartbeats`)."""
        pause = RETRY_PAUSE_S
        while not lost.is_set():
            try:
                self._answer(work, outcome, started_at, holds_slot)
                return
            except (ClientError, BotoCoreError):
                log.exception("%s: the callback failed; sending it again", work.request_id)
            lost.wait(pause)
            pause = min(2 * pause, MAX_ANSWER_PAUSE_S)

    def _answer(
        self,
        work: WorkMessage,
        outcome: tuple[str, str],
        started_at: float,
        holds_slot: bool,
    ) -> None:
        kind, value = outcome
        if kind == "success":
            done = ExecutionDone(
                report_uri=value,
                worker=self.name,
                started_at=started_at,
                finished_at=time.time(),
                attempt=work.attempt,
                holds_slot=holds_slot,
            )
            answered = self._to_token(
                self.sfn.send_task_success, taskToken=work.task_token, output=done.model_dump_json()
            )
        else:
            answered = self._to_token(
                self.sfn.send_task_failure,
                taskToken=work.task_token,
                error=ERROR_SANDBOX,
                cause=failure_cause(value, work.attempt),
            )
        if not answered:
            log.warning("%s: the execution moved on before the callback", work.request_id)

    @staticmethod
    def _to_token(call: Callable[..., Any], **kwargs: Any) -> bool:
        """A task-token call; False when the execution moved on (the token is dead)."""
        try:
            call(**kwargs)
        except ClientError as exc:
            if exc.response["Error"]["Code"] in GONE:
                return False
            raise
        return True

    def _beat(self, token: str) -> bool:
        return self._to_token(self.sfn.send_task_heartbeat, taskToken=token)

    def _beat_interval_s(self) -> float:
        return max(1.0, self.heartbeat_s / 3)

    def _heartbeats(
        self,
        token: str,
        receipt: str,
        done: threading.Event,
        lost: threading.Event,
        beaten_at: float,  # handle()'s last beat
    ) -> None:
        interval = self._beat_interval_s()
        next_beat = beaten_at + interval
        while not done.wait(min(1.0, interval)):
            if self.hand_back_at is not None and time.time() >= self.hand_back_at:
                self._hand_back(token)
                lost.set()  # whatever the run still produces is dropped
                return
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + interval
            try:
                if not self._beat(token):
                    lost.set()
                    return
                beaten_at = time.monotonic()
                self.sqs.change_message_visibility(
                    QueueUrl=self.queue_url,
                    ReceiptHandle=receipt,
                    VisibilityTimeout=work_visibility_s(self.heartbeat_s),
                )
            except (ClientError, BotoCoreError):
                log.exception("heartbeat failed; trying again")
            if time.monotonic() - beaten_at > self.heartbeat_s:
                # No heartbeat for HeartbeatSeconds: Step Functions has given the task up.
                log.error("no heartbeat got through for %d s: the task lapsed", self.heartbeat_s)
                lost.set()
                return

    def _hand_back(self, token: str) -> None:
        log.warning("%s: stopping before the job finished; handing it back", self.name)
        try:  # a token already dead has nothing to hand back
            self._to_token(
                self.sfn.send_task_failure,
                taskToken=token,
                error=ERROR_INTERRUPTED,
                cause="the worker was stopped",
            )
        except (ClientError, BotoCoreError):
            log.exception("handing the job back failed; its heartbeat will lapse")

    def _delete(self, receipt: str) -> None:
        self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt)

    def _return(self, receipt: str) -> None:
        """Back to the queue at once, for another worker."""
        self.sqs.change_message_visibility(
            QueueUrl=self.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
        )
