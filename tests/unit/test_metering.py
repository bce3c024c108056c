"""Transitions are counted as Step Functions bills them: a state entered, and each retry."""

from __future__ import annotations

from trialbox.metering import billed_transitions


def events(*kinds: str) -> list[dict[str, str]]:
    return [{"type": kind} for kind in kinds]


def test_each_state_entered_is_one_transition() -> None:
    history = events(
        "ExecutionStarted",
        "TaskStateEntered", "TaskScheduled", "TaskStarted", "TaskSucceeded", "TaskStateExited",
        "ChoiceStateEntered", "ChoiceStateExited",
        "PassStateEntered", "PassStateExited",
        "ExecutionSucceeded",
    )  # fmt: skip
    assert billed_transitions(history) == 3


def test_each_retry_of_a_task_is_one_more() -> None:
    history = events(
        "ExecutionStarted",
        "TaskStateEntered", "TaskScheduled", "TaskFailed", "TaskScheduled", "TaskFailed",
        "TaskScheduled", "TaskSucceeded", "TaskStateExited",
        "TaskStateEntered", "LambdaFunctionScheduled", "LambdaFunctionSucceeded",
        "TaskStateExited",
        "ExecutionSucceeded",
    )  # fmt: skip
    assert billed_transitions(history) == 2 + 2


def test_a_maps_iterations_enter_states_of_their_own() -> None:
    iteration = [
        "MapIterationStarted",
        "PassStateEntered",
        "PassStateExited",
        "MapIterationSucceeded",
    ]
    history = events("MapStateEntered", "MapStateStarted", *iteration * 3, "MapStateExited")
    assert billed_transitions(history) == 1 + 3
