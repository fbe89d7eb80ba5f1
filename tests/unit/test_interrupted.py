"""An attempt stopped because its worker was stopped: ``interrupted``,
retried like a lost one but at once, and never ``lost``."""

from __future__ import annotations

from etcdsched.model.records import RunRecord
from etcdsched.model.statemachine import assign_attempt, finish_attempt, start_attempt, transition
from etcdsched.model.states import TERMINAL, RunState
from tests.unit.test_statemachine import NOW, make_run

LATER = NOW + 60_000


def interrupted(run: RunRecord, **changes: object) -> RunRecord:
    running = start_attempt(assign_attempt(run, "w1", NOW), NOW, pid=7)
    if changes:
        running = running.model_copy(update=changes)
    return finish_attempt(running, "interrupted", LATER, reason="interrupted by shutdown")


def test_an_interrupted_attempt_is_retried_at_once_and_counts() -> None:
    run = interrupted(make_run(initial_delay="1h"))
    assert run.state is RunState.RETRY_WAIT
    assert run.retry_at_ms == LATER, "no backoff: nothing went wrong with the job"
    assert run.attempt == 1 and run.worker is None
    [attempt] = run.attempts
    assert attempt.state is RunState.INTERRUPTED and attempt.reason == "interrupted by shutdown"


def test_it_is_retried_under_lost_in_retry_on() -> None:
    assert interrupted(make_run(retry_on=["failed"])).state is RunState.INTERRUPTED
    assert interrupted(make_run(retry_on=["lost"])).state is RunState.RETRY_WAIT


def test_with_no_attempt_left_the_run_ends_interrupted_not_lost() -> None:
    run = interrupted(make_run(max_attempts=1))
    assert run.state is RunState.INTERRUPTED and run.state in TERMINAL
    assert run.retry_at_ms is None


def test_a_cancel_requested_meanwhile_wins() -> None:
    assert interrupted(make_run(), cancel_requested=True).state is RunState.CANCELLED


def test_the_retry_is_placed_like_any_other() -> None:
    run = interrupted(make_run())
    again = assign_attempt(transition(run, RunState.PENDING, LATER), "w2", LATER)
    assert again.attempt == 2 and again.state is RunState.ASSIGNED
