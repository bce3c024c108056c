"""What Step Functions bills, counted from execution histories, never estimated.

A Standard workflow pays one state transition for each state entered, and one more for each
retry of a Task ("AWS Step Functions Pricing": a transition is counted each time a step of the
workflow is executed, retries included). A Map's iterations enter their states in the same
history, so they are counted too; a child execution has a history of its own, to be counted
with it. Express workflows are billed by request and duration, not by transition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# One per attempt of a Task: the first is the state's own transition, each later one a retry.
SCHEDULED = frozenset({"TaskScheduled", "LambdaFunctionScheduled", "ActivityScheduled"})


def billed_transitions(events: Iterable[Mapping[str, Any]]) -> int:
    """The billed transitions of one execution's history (GetExecutionHistory's events)."""
    count = attempts = 0
    for event in events:
        kind = event["type"]
        if kind.endswith("StateEntered"):
            count, attempts = count + 1, 0
        elif kind in SCHEDULED:
            attempts += 1
            count += attempts > 1
    return count


def execution_transitions(sfn: Any, execution_arn: str) -> int:
    """The billed transitions of one execution, read through every page of its history."""
    pages = sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn)
    return billed_transitions(event for page in pages for event in page["events"])


def machine_transitions(sfn: Any, state_machine_arn: str) -> tuple[int, int]:
    """(executions, billed transitions) of every execution of one state machine."""
    pages = sfn.get_paginator("list_executions").paginate(stateMachineArn=state_machine_arn)
    found = [e for page in pages for e in page["executions"]]
    return len(found), sum(execution_transitions(sfn, e["executionArn"]) for e in found)
