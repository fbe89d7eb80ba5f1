"""The run state machine as a table, and the retry math, on a fake clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from etcdsched.model.errors import InvalidTransition
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import JobSpec, RetryPolicy
from etcdsched.model.statemachine import (
    assign_attempt,
    backoff_ms,
    finish_attempt,
    start_attempt,
    transition,
)
from etcdsched.model.states import ACTIVE, TERMINAL, TRANSITIONS, RunState

NOW = 1_767_225_600_000


def make_run(**retry: object) -> RunRecord:
    spec = JobSpec.model_validate(
        {
            "trigger": {"kind": "now"},
            "execution": {"argv": ["true"]},
            "retry": {"max_attempts": 3, "initial_delay": "1s", "jitter": 0, **retry},
        }
    )
    return RunRecord(
        id="j@00000000000001",
        job_id="j",
        tenant="default",
        partition=0,
        slot_ms=NOW,
        not_before_ms=NOW,
        spec=spec,
        job_version=1,
        created_ms=NOW,
        updated_ms=NOW,
    )


def test_terminal_states_have_no_way_out() -> None:
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
    assert {RunState.PENDING, RunState.ASSIGNED, RunState.RUNNING, RunState.RETRY_WAIT} == ACTIVE


def test_every_state_is_in_the_table() -> None:
    assert set(TRANSITIONS) == set(RunState)


def test_illegal_transition_is_refused() -> None:
    with pytest.raises(InvalidTransition):
        transition(make_run(), RunState.SUCCEEDED, NOW)


def test_happy_path_records_the_attempt() -> None:
    run = assign_attempt(make_run(), "w1", NOW)
    run = start_attempt(run, NOW + 10, pid=123)
    run = finish_attempt(run, "succeeded", NOW + 20, exit_code=0)
    assert run.state is RunState.SUCCEEDED
    attempt = run.attempts[0]
    assert (attempt.worker, attempt.started_ms, attempt.ended_ms, attempt.exit_code) == (
        "w1",
        NOW + 10,
        NOW + 20,
        0,
    )


def test_failure_retries_until_attempts_run_out() -> None:
    run = make_run()
    for number in (1, 2):
        run = start_attempt(assign_attempt(run, f"w{number}", NOW), NOW, None)
        run = finish_attempt(run, "failed", NOW, exit_code=1)
        assert run.state is RunState.RETRY_WAIT
        assert run.retry_at_ms == NOW + 1000 * 2 ** (number - 1)
        run = transition(run, RunState.PENDING, NOW)
    run = start_attempt(assign_attempt(run, "w3", NOW), NOW, None)
    run = finish_attempt(run, "failed", NOW, exit_code=1)
    assert run.state is RunState.FAILED and len(run.attempts) == 3


def test_outcomes_not_listed_do_not_retry() -> None:
    run = start_attempt(assign_attempt(make_run(retry_on=["lost"]), "w", NOW), NOW, None)
    assert finish_attempt(run, "timed_out", NOW).state is RunState.TIMED_OUT


def test_lost_from_assigned_retries() -> None:
    run = assign_attempt(make_run(), "w", NOW)
    run = finish_attempt(run, "lost", NOW, reason="worker vanished")
    assert run.state is RunState.RETRY_WAIT and run.attempts[0].state is RunState.LOST


def test_stop_at_next_slot() -> None:
    run = start_attempt(assign_attempt(make_run(stop_at_next_slot=True), "w", NOW), NOW, None)
    assert finish_attempt(run, "failed", NOW, next_slot_ms=NOW + 500).state is RunState.FAILED


def test_backoff_is_capped_and_jitter_is_stable_and_bounded() -> None:
    policy = RetryPolicy(
        max_attempts=10,
        initial_delay=timedelta(seconds=1),
        multiplier=3,
        max_delay=timedelta(seconds=20),
        jitter=0.5,
    )
    for attempt in range(1, 8):
        delay = backoff_ms(policy, attempt, "r")
        base = min(1000 * 3 ** (attempt - 1), 20_000)
        assert base * 0.5 <= delay <= base * 1.5
        assert delay == backoff_ms(policy, attempt, "r")
