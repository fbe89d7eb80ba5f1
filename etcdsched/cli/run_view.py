"""What ``etcdsched run get`` (and ``run wait``) print for a run: its own
fields, then one row per attempt with who ran it, when, how it ended and
why, in words.

Times are to the millisecond: the events of one run (a worker lost, the
retry placed and started) often fall within one second, and their order is
the story. ``-o json`` prints the API's record as it is instead.
"""

from __future__ import annotations

from etcdsched.cli.support import fields, table, when_ms
from etcdsched.model.records import Attempt, RunRecord
from etcdsched.model.states import RunState

ATTEMPT_HEADERS = ("ATTEMPT", "WORKER", "STARTED", "ENDED", "OUTCOME", "REASON")


def run_fields(run: RunRecord, pending_reason: str | None = None) -> str:
    """The run, then its attempts (none before it is first placed)."""
    state = run.state + (" (cancel requested)" if run.cancel_requested else "")
    retry = [("retry at", when_ms(run.retry_at_ms))] if run.retry_at_ms is not None else []
    head = fields(
        [
            ("run", run.id),
            ("job", f"{run.job_id} (version {run.job_version})"),
            ("state", state),
            ("kind", run.kind),
            ("slot", when_ms(run.slot_ms)),
            ("attempt", run.attempt),
            ("fired", run.fired_note or "-"),
            ("reason", run.reason or "-"),
            ("waiting", pending_reason or "-"),
            *retry,
            ("created", when_ms(run.created_ms)),
            ("updated", when_ms(run.updated_ms)),
        ]
    )
    if not run.attempts:
        return head
    return f"{head}\n\n{attempt_rows(run.attempts)}"


def attempt_rows(attempts: list[Attempt]) -> str:
    rows = (
        (
            a.number,
            a.worker,
            when_ms(a.started_ms),
            when_ms(a.ended_ms),
            a.state,
            attempt_reason(a),
        )
        for a in attempts
    )
    return table(ATTEMPT_HEADERS, rows)


def attempt_reason(attempt: Attempt) -> str:
    """Why an attempt ended as it did, or what it is doing. The recorded
    reason when there is one (``fenced: the worker could not prove its
    lease (...)``, ``cancelled before start: ...``); a success records none, and an open
    attempt none yet, so those are said here."""
    if attempt.reason:
        return attempt.reason
    if attempt.state is RunState.ASSIGNED:
        return f"assigned at {when_ms(attempt.assigned_ms)}, not started yet"
    if attempt.state is RunState.RUNNING:
        return "running" + (f" (pid {attempt.pid})" if attempt.pid is not None else "")
    if attempt.exit_code is not None:
        return f"exit code {attempt.exit_code}"
    return "-"
