"""Names shared by the CDK stack, the Lambda functions, the worker, the SDK and the tests."""

# Environment variables the functions and the worker read (each into one model in
# trialbox.settings)...
ENV_TASKSETS_BUCKET = "TRIALBOX_TASKSETS_BUCKET"
ENV_TRACES_BUCKET = "TRIALBOX_TRACES_BUCKET"
ENV_EXECUTIONS_TABLE = "TRIALBOX_EXECUTIONS_TABLE"
ENV_ROLLOUT_ARN = "TRIALBOX_ROLLOUT_ARN"
ENV_BATCH_ARN = "TRIALBOX_BATCH_ARN"  # the Batch state machine: many samples, one execution
ENV_FINISH_QUEUE_URL = "TRIALBOX_FINISH_QUEUE_URL"  # a batched sample's end, to the finisher
ENV_WORK_QUEUE_URL = "TRIALBOX_WORK_QUEUE_URL"
ENV_HEARTBEAT_S = "TRIALBOX_HEARTBEAT_S"
ENV_EXECUTE_MARGIN_S = "TRIALBOX_EXECUTE_MARGIN_S"
ENV_REQUESTS_DLQ_URL = "TRIALBOX_REQUESTS_DLQ_URL"
ENV_ADMISSION_TABLE = "TRIALBOX_ADMISSION_TABLE"  # the pool's slots and the requests admitted
ENV_RESULT_TTL_DAYS = "TRIALBOX_RESULT_TTL_DAYS"
ENV_STACK = "TRIALBOX_STACK"  # the deployed stack a client reaches, when no resources are given
ENV_STOP_GRACE_S = "TRIALBOX_STOP_GRACE_S"
ENV_RECYCLE_AFTER_JOBS = "TRIALBOX_RECYCLE_AFTER_JOBS"
ENV_WORKER_NAME = "TRIALBOX_WORKER_NAME"  # optional: the host name otherwise
# ...and the SDK (with the buckets, the table and the rollout ARN above).
ENV_ENDPOINT_URL = "TRIALBOX_ENDPOINT_URL"
ENV_REQUESTS_QUEUE_URL = "TRIALBOX_REQUESTS_QUEUE_URL"
ENV_SESSION_QUEUE_PREFIX = "TRIALBOX_SESSION_QUEUE_PREFIX"
ENV_OPEN_QUEUE_URL = "TRIALBOX_OPEN_QUEUE_URL"  # sessions' opens, taken by workers with room
ENV_POOL_CAPACITY = "TRIALBOX_POOL_CAPACITY"  # optional: jobs the pool runs at once
ENV_CLUSTER = (
    "TRIALBOX_CLUSTER"  # optional: the pool's ECS cluster (why a session's worker stopped)
)
# The pool's scaler (functions/scaler: trialbox.pipeline.scaler), with the cluster above.
ENV_POOL_SERVICE = "TRIALBOX_POOL_SERVICE"  # the pool's ECS service (its ARN or name)
ENV_POOL_MIN_TASKS = "TRIALBOX_POOL_MIN_TASKS"  # the warm minimum
ENV_POOL_MAX_TASKS = "TRIALBOX_POOL_MAX_TASKS"  # max_workers
ENV_POOL_SLOTS_PER_TASK = "TRIALBOX_POOL_SLOTS_PER_TASK"  # jobs one task runs at once
ENV_SCALE_IN_IDLE_S = "TRIALBOX_SCALE_IN_IDLE_S"  # idle this long: in to the warm minimum
ENV_SCALER_TICK_S = "TRIALBOX_SCALER_TICK_S"  # how often one invocation decides
ENV_SCALER_RUN_S = "TRIALBOX_SCALER_RUN_S"  # how long one invocation keeps deciding

# Stack outputs, by the names the SDK reads.
OUTPUT_REQUESTS_QUEUE_URL = "RequestsQueueUrl"
OUTPUT_WORK_QUEUE_URL = "WorkQueueUrl"
OUTPUT_SESSION_QUEUE_PREFIX = "SessionQueuePrefix"  # every session's queues are named so
OUTPUT_OPEN_QUEUE_URL = "OpenQueueUrl"  # where sessions open
OUTPUT_TASKSETS_BUCKET = "TasksetsBucketName"
OUTPUT_TRACES_BUCKET = "TracesBucketName"
OUTPUT_EXECUTIONS_TABLE = "ExecutionsTableName"
OUTPUT_ADMISSION_TABLE = "AdmissionTableName"  # the workers' leases (trialbox.worker.lease)
OUTPUT_ROLLOUT_ARN = "RolloutStateMachineArn"
OUTPUT_BATCH_ARN = "BatchStateMachineArn"
OUTPUT_FINISH_QUEUE_URL = "FinishQueueUrl"  # the workers' (a batched sample's end)
OUTPUT_POOL_CAPACITY = "PoolMaxWorkers"  # jobs the pool runs at once, at most
OUTPUT_RESULT_TTL_DAYS = "ResultTtlDays"  # how long results are kept (a cancel's too)
OUTPUT_CLUSTER = "PoolClusterName"  # the pool's ECS cluster: a lost worker's stop reason
# The customer managed policy with what the SDK and `trialbox run --stack` call (a trainer's).
OUTPUT_CLIENT_POLICY_ARN = "TrialboxClientPolicyArn"
OUTPUT_RUN_CODE_URL = "SandboxFusionUrl"  # POST /run_code (a function URL, IAM auth)
# The RunCode function's timeout: a /run_code call's runs and fetches fit in it, or it answers
# 504 a second before it ends (trialbox.integrations.sandbox_fusion).
RUN_CODE_TIMEOUT_S = 300
OUTPUT_STACK_VERSION = "TrialboxVersion"  # the trialbox version that synthesized the stack

# Error names the Rollout state machine routes on.
ERROR_REJECTED = "RequestRejected"  # the request is invalid: a `rejected` result (Prepare)
ERROR_SANDBOX = "Sandbox.Error"  # the runner itself failed: a `sandbox_error` result
# The worker is being stopped (Spot interruption, scale-in) and hands its job back: the Execute
# step retries it on another sandbox at once, as it does a lost one.
ERROR_INTERRUPTED = "Sandbox.Interrupted"
# A lost sandbox: the Execute step retries it LOST_SANDBOX_RETRIES times (so a request that
# still failed with one of these took LOST_SANDBOX_RETRIES + 1 attempts). Nothing else is retried.
# A batched sample's claim lapsed past its retries (trialbox.pipeline.claims): its lost sandbox.
ERROR_LOST = "Sandbox.Lost"
EXECUTE_LOST_ERRORS = ("States.HeartbeatTimeout", "States.Timeout", ERROR_INTERRUPTED)  # a token's
LOST_SANDBOX_ERRORS = (*EXECUTE_LOST_ERRORS, ERROR_LOST)
LOST_SANDBOX_RETRIES = 2
# A job whose work message no worker took (its admission marker says so) when the Execute
# step's clock lapsed is sent again without counting as a lost sandbox: waiting for a worker
# never counts (capacity lost after admission: a worker killed before it took the job). Only
# once it waited NOT_TAKEN_AFTER_S (or its own timeout, if longer) is it this error, never run.
ERROR_NOT_TAKEN = "Execute.NotTaken"
NOT_TAKEN_AFTER_S = 900
# A Batch execution's Run step waits this long at most for its samples' results: a backstop
# only (each sample's liveness is its claim's lease), past the longest job's retries.
BATCH_TIMEOUT_S = 12 * 3600

# Custom metrics (Powertools EMF; each function's `service` dimension is trialbox-<name>).
METRICS_NAMESPACE = "Trialbox"
METRIC_SANDBOX_ERROR = "SandboxError"  # per result the recorder writes: 1 if sandbox_error, else 0
METRIC_HELD_SESSIONS = "HeldSessions"  # per pool worker, each minute: the sessions it hosts
DIMENSION_POOL = "Pool"  # its value: the stack's name (the worker's TRIALBOX_POOL_NAME)
ENV_POOL_NAME = "TRIALBOX_POOL_NAME"

# A request larger than this travels by pointer (s3://<traces>/payloads/<sha256>.json): the
# SDK's messages, and the Rollout's input (Step Functions takes 256 KiB of state, which the
# execution's own data must still fit in beside it).
MAX_INLINE_REQUEST_BYTES = 128 * 1024

# The executions table.
TABLE_KEY = "request_id"
TABLE_TTL_ATTRIBUTE = "expires_at"
# The hash of the request a result was recorded for: the SDK and the dispatcher tell a
# resubmission (the same hash) from an id reused for other content.
CONTENT_ATTRIBUTE = "content_sha256"
