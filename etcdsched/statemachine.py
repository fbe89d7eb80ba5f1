"""The run state machine: states, the transition table, and pure transitions.

Every state change of a run goes through :func:`transition` (or a helper built
on it) and is then written as a compare-and-swap on the run key's
``mod_revision``; a writer that lost the race re-reads and decides again.

An attempt that fails, times out or is lost moves the run to ``retry_wait``
when the retry policy allows another attempt, and otherwise to the matching
terminal state (``failed``, ``timed_out``, ``lost``).
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import TYPE_CHECKING

from etcdsched.errors import InvalidTransition

if TYPE_CHECKING:
    from etcdsched.models import RunRecord
    from etcdsched.spec import RetryPolicy


class RunState(StrEnum):
    PENDING = "pending"
    """Created for a slot; waiting for placement (or for its not-before time)."""
    ASSIGNED = "assigned"
    """Placed on a worker, which has not yet started the process."""
    RUNNING = "running"
    """The worker holds a claim and the process was started."""
    RETRY_WAIT = "retry_wait"
    """The last attempt failed, timed out or was lost; another is due at ``retry_at_ms``."""
    SUCCEEDED = "succeeded"
    """Terminal: the process exited 0."""
    FAILED = "failed"
    """Terminal: the process exited non-zero and no retry is left."""
    TIMED_OUT = "timed_out"
    """Terminal: the attempt ran past its timeout and no retry is left."""
    LOST = "lost"
    """Terminal: the worker vanished (claim lease expired) and no retry is left."""
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
            RunState.PENDING,  # handed back by a worker shutting down
            RunState.RETRY_WAIT,
            RunState.LOST,
            RunState.CANCELLED,
            RunState.TIMED_OUT,  # hung: claimed, due, never said it started
        }
    ),
    RunState.RUNNING: frozenset(
        {
            RunState.SUCCEEDED,
            RunState.FAILED,
            RunState.TIMED_OUT,
            RunState.LOST,
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
    "cancelled": RunState.CANCELLED,
    "succeeded": RunState.SUCCEEDED,
}


def can_transition(current: RunState, target: RunState) -> bool:
    return target in TRANSITIONS[current]


def transition(run: RunRecord, target: RunState, now_ms: int, **changes: object) -> RunRecord:
    """Return ``run`` moved to ``target`` (with ``changes`` applied), or raise
    :class:`InvalidTransition` if the table does not allow it."""
    if not can_transition(run.state, target):
        raise InvalidTransition(f"run {run.id}: {run.state} -> {target} is not allowed")
    return run.model_copy(update={"state": target, "updated_ms": now_ms, **changes})


def backoff_ms(policy: RetryPolicy, attempt: int, run_id: str) -> int:
    """Delay before attempt ``attempt + 1``: initial * multiplier^(attempt-1),
    capped, then spread by +/- jitter using a stable hash of (run, attempt) so
    every scheduler computes the same instant."""
    base = policy.initial_delay.total_seconds() * policy.multiplier ** (attempt - 1)
    capped = min(base, policy.max_delay.total_seconds())
    digest = hashlib.blake2b(f"{run_id}#{attempt}".encode(), digest_size=8).digest()
    unit = int.from_bytes(digest, "big") / 2**64  # [0, 1)
    spread = capped * policy.jitter * (2 * unit - 1)
    return max(0, round((capped + spread) * 1000))


def retry_decision(
    run: RunRecord, outcome: str, now_ms: int, next_slot_ms: int | None = None
) -> int | None:
    """When the next attempt may start, or ``None`` if the run must end now."""
    policy = run.spec.retry
    if outcome not in policy.retry_on or run.attempt >= policy.max_attempts:
        return None
    retry_at = now_ms + backoff_ms(policy, run.attempt, run.id)
    if policy.stop_at_next_slot and next_slot_ms is not None and retry_at >= next_slot_ms:
        return None
    return retry_at
