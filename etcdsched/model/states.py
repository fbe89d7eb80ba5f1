"""The states a run can be in and the table of allowed moves between them.

Kept apart from the transitions themselves (:mod:`etcdsched.model.statemachine`)
because the records (:mod:`etcdsched.model.records`) need the states, and the
transitions need the records: states below both, no cycle.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    PENDING = "pending"
    """Created for a slot; waiting for placement (or for its not-before time)."""
    ASSIGNED = "assigned"
    """Placed on a worker, which has not yet started the process."""
    RUNNING = "running"
    """The worker holds a claim and the process was started."""
    RETRY_WAIT = "retry_wait"
    """The last attempt failed, timed out, was lost or interrupted; another
    is due at ``retry_at_ms``."""
    SUCCEEDED = "succeeded"
    """Terminal: the process exited 0."""
    FAILED = "failed"
    """Terminal: the process exited non-zero and no retry is left."""
    TIMED_OUT = "timed_out"
    """Terminal: the attempt ran past its timeout and no retry is left."""
    LOST = "lost"
    """Terminal: the worker vanished (claim lease expired) and no retry is left."""
    INTERRUPTED = "interrupted"
    """Terminal: its worker was stopped on purpose (reason ``interrupted by
    shutdown``) and no retry is left. Not ``lost``: the worker ended the job
    and wrote the verdict itself, holding its lease."""
    CANCELLED = "cancelled"
    """Terminal: a client cancelled it (or ``cancel_previous`` overlap did)."""
    SKIPPED = "skipped"
    """Terminal: never started (overlap, starting deadline, failed dependency)."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {
        RunState.SUCCEEDED,
        RunState.FAILED,
        RunState.TIMED_OUT,
        RunState.LOST,
        RunState.INTERRUPTED,
        RunState.CANCELLED,
        RunState.SKIPPED,
    }
)
ACTIVE = frozenset(RunState) - TERMINAL
EXECUTING = frozenset({RunState.ASSIGNED, RunState.RUNNING})

TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset({RunState.ASSIGNED, RunState.CANCELLED, RunState.SKIPPED}),
    RunState.ASSIGNED: frozenset(
        {
            RunState.RUNNING,
            RunState.PENDING,  # handed back: never started (worker shut down or lost)
            RunState.RETRY_WAIT,
            RunState.LOST,
            RunState.CANCELLED,
            RunState.TIMED_OUT,  # hung: claimed, due, never said it started
        }
    ),
    RunState.RUNNING: frozenset(
        {
            RunState.PENDING,  # handed back: marked running, its gate never opened
            RunState.SUCCEEDED,
            RunState.FAILED,
            RunState.TIMED_OUT,
            RunState.LOST,
            RunState.INTERRUPTED,  # its worker stopped it at shutdown, no retry left
            RunState.CANCELLED,
            RunState.RETRY_WAIT,
        }
    ),
    RunState.RETRY_WAIT: frozenset({RunState.PENDING, RunState.CANCELLED, RunState.SKIPPED}),
    **{state: frozenset() for state in TERMINAL},
}

OUTCOME_STATES = {
    "failed": RunState.FAILED,
    "timed_out": RunState.TIMED_OUT,
    "lost": RunState.LOST,
    "interrupted": RunState.INTERRUPTED,
    "cancelled": RunState.CANCELLED,
    "succeeded": RunState.SUCCEEDED,
}


def can_transition(current: RunState, target: RunState) -> bool:
    return target in TRANSITIONS[current]
