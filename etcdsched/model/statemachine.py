"""The run state machine's transitions: pure functions from a run record to
the next one.

Every state change of a run goes through :func:`transition` (or a helper built
on it: :func:`assign_attempt`, :func:`start_attempt`, :func:`finish_attempt`)
and is then written as a compare-and-swap on the run key's ``mod_revision``; a
writer that lost the race re-reads and decides again. The states and the table
of allowed moves are in :mod:`etcdsched.model.states`.

An attempt that fails, times out or is lost moves the run to ``retry_wait``
when the retry policy allows another attempt, and otherwise to the matching
terminal state (``failed``, ``timed_out``, ``lost``). An attempt its worker
stopped at shutdown (``interrupted``) is retried like a lost one, but at
once: nothing went wrong with the job or the worker's host, so no backoff.
"""

from __future__ import annotations

import hashlib

from etcdsched.model.errors import InvalidTransition
from etcdsched.model.records import Attempt, RunRecord
from etcdsched.model.spec import RetryPolicy
from etcdsched.model.states import OUTCOME_STATES, RunState, can_transition


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


INTERRUPTED_RETRIED_AS = "lost"
"""The ``retry_on`` entry an ``interrupted`` attempt is retried under: like
a lost one, its job was stopped from outside, through no fault of its own."""


def retry_decision(
    run: RunRecord, outcome: str, now_ms: int, next_slot_ms: int | None = None
) -> int | None:
    """When the next attempt may start, or ``None`` if the run must end now.
    An ``interrupted`` attempt (its worker stopped) may start again at once."""
    policy = run.spec.retry
    interrupted = outcome == "interrupted"
    retried_as = INTERRUPTED_RETRIED_AS if interrupted else outcome
    if retried_as not in policy.retry_on or run.attempt >= policy.max_attempts:
        return None
    retry_at = now_ms if interrupted else now_ms + backoff_ms(policy, run.attempt, run.id)
    if policy.stop_at_next_slot and next_slot_ms is not None and retry_at >= next_slot_ms:
        return None
    return retry_at


def assign_attempt(run: RunRecord, worker: str, now_ms: int) -> RunRecord:
    """pending -> assigned, opening attempt ``attempt + 1`` on ``worker``."""
    number = run.attempt + 1
    attempt = Attempt(number=number, worker=worker, assigned_ms=now_ms)
    return transition(
        run,
        RunState.ASSIGNED,
        now_ms,
        attempt=number,
        attempts=[*run.attempts, attempt],
        worker=worker,
        reason="",
        retry_at_ms=None,
    )


def start_attempt(run: RunRecord, now_ms: int, pid: int | None) -> RunRecord:
    """assigned -> running; of a run already running (marked before its
    gate opened), the attempt's start is set to when it actually did."""
    current = _current(run).model_copy(
        update={"state": RunState.RUNNING, "started_ms": now_ms, "pid": pid}
    )
    attempts = [*run.attempts[:-1], current]
    if run.state is RunState.RUNNING:
        return run.model_copy(update={"attempts": attempts})
    return transition(run, RunState.RUNNING, now_ms, attempts=attempts)


def hand_back(run: RunRecord, now_ms: int, reason: str) -> RunRecord:
    """assigned (or running whose job provably never started) -> pending:
    the attempt is undone, as if it had never been assigned, so handing a
    run back uses none of its attempts."""
    back = transition(run, RunState.PENDING, now_ms, reason=reason)
    undo = {"attempt": run.attempt - 1, "attempts": run.attempts[:-1], "worker": None}
    return back.model_copy(update=undo)


def finish_attempt(
    run: RunRecord,
    outcome: str,
    now_ms: int,
    *,
    exit_code: int | None = None,
    reason: str = "",
    next_slot_ms: int | None = None,
) -> RunRecord:
    """Close the current attempt with ``outcome`` and decide the run's next
    state: ``retry_wait`` if the retry policy allows, else the terminal state."""
    attempt_state = OUTCOME_STATES[outcome]
    current = _current(run).model_copy(
        update={
            "state": attempt_state,
            "ended_ms": now_ms,
            "exit_code": exit_code,
            "reason": reason,
        }
    )
    retry_at = None
    if outcome != "cancelled" and not run.cancel_requested:
        retry_at = retry_decision(run, outcome, now_ms, next_slot_ms)
    target = RunState.RETRY_WAIT if retry_at is not None else attempt_state
    if run.cancel_requested and outcome != "succeeded":
        target = RunState.CANCELLED  # a requested cancel wins over how the attempt ended
    return transition(
        run,
        target,
        now_ms,
        attempts=[*run.attempts[:-1], current],
        retry_at_ms=retry_at,
        worker=None,
        reason=reason,
    )


def _current(run: RunRecord) -> Attempt:
    if run.current is None or run.current.number != run.attempt:
        raise ValueError(f"run {run.id} has no open attempt")
    return run.current
