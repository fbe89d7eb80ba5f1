"""Building runs and the etcd operations that create, queue and end them.

Shared by the scheduler (firing, retries), the job service (trigger now,
backfill) and the worker (reports), so a run is written the same way
whoever writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from etcdsched.model.errors import Conflict, NotFound
from etcdsched.model.records import (
    ActivePointer,
    Assignment,
    ClaimHint,
    DueEntry,
    QueueEntry,
    RunRecord,
    hang_budget_ms,
)
from etcdsched.model.spec import JobSpec
from etcdsched.model.statemachine import transition
from etcdsched.model.states import RunState
from etcdsched.model.triggers import jitter_offset_ms
from etcdsched.runtime.metrics import RETRIES, RUNS_BY_STATE
from etcdsched.store.keys import Keys, partition_of, run_id, run_seq
from etcdsched.store.kv import Cmp, Compare, Op, Ops, Store, Versioned
from etcdsched.store.outbox import Outbox

RunKind = Literal["scheduled", "manual", "backfill"]


_ENTERED = {state: RUNS_BY_STATE.labels(state=state.value) for state in RunState}
"""Each state's counter child, looked up once (``labels`` cost a worker
microseconds per report)."""


@dataclass(frozen=True)
class RunOrigin:
    """What a new run is made from: a job's spec at one version."""

    job_id: str
    spec: JobSpec
    job_version: int


def new_run(
    origin: RunOrigin,
    slot_ms: int,
    now_ms: int,
    partitions: int,
    *,
    kind: RunKind = "scheduled",
    tag: str | None = None,
    coalesced: int = 0,
    reason: str = "",
    created_by: str = "",
) -> RunRecord:
    """A pending run for ``slot_ms``; its not-before instant adds the job's
    stable jitter so every scheduler computes the same one."""
    jitter = jitter_offset_ms(
        origin.job_id, slot_ms, int(origin.spec.jitter.total_seconds() * 1000)
    )
    return RunRecord(
        id=run_id(origin.job_id, run_seq(slot_ms, tag)),
        job_id=origin.job_id,
        tenant=origin.spec.tenant,
        partition=partition_of(origin.job_id, partitions),
        slot_ms=slot_ms,
        not_before_ms=slot_ms + jitter,
        kind=kind,
        spec=origin.spec,
        job_version=origin.job_version,
        created_ms=now_ms,
        updated_ms=now_ms,
        coalesced=coalesced,
        reason=reason,
        fired_note=reason,
        created_by=created_by,
    )


def starting_deadline_ms(run: RunRecord) -> int | None:
    """The instant after which the run is skipped instead of placed;
    None for retries and runs without a starting deadline."""
    deadline = run.spec.starting_deadline
    if deadline is None or run.attempt > 0:
        return None
    return run.not_before_ms + int(deadline.total_seconds() * 1000)


def queue_entry(run: RunRecord) -> QueueEntry:
    return QueueEntry(run_id=run.id, deadline_ms=starting_deadline_ms(run))


CREATE_OPS = 3
"""Puts that create a run in the queue (:meth:`RunOps.create_ops`)."""


class RunOps:
    """Key-level operations on runs under one prefix."""

    def __init__(self, keys: Keys, outbox: Outbox | None = None) -> None:
        self.keys = keys
        self.outbox = outbox or Outbox(keys)
        """Adds a run's webhook deliveries to the transaction that ends it
        (none unless a subscription wants the event: no extra op or read)."""

    def queue_key(self, run: RunRecord) -> str:
        not_before = run.retry_at_ms if run.retry_at_ms is not None else run.not_before_ms
        return self.keys.queue(run.partition, run.spec.priority, not_before, run.id)

    def create(self, run: RunRecord) -> tuple[RunRecord, list[Compare], list[Op]]:
        """The run as stored (with its queue key). Compare: the run key was
        never created (a slot becomes at most one run). Ops: see
        :meth:`create_ops`."""
        queued, ops = self.create_ops(run)
        return queued, [Cmp.absent(self.keys.run(run.id))], ops

    def create_ops(self, run: RunRecord) -> tuple[RunRecord, list[Op]]:
        """The run as stored, and the ``CREATE_OPS`` puts that create it in
        the queue: the run, its active pointer, its queue entry."""
        queued = run.model_copy(update={"queue_key": self.queue_key(run)})
        return queued, [
            Ops.put(self.keys.run(run.id), queued),
            Ops.put(self.keys.active(run.partition, run.id), ActivePointer(run_id=run.id)),
            Ops.put(queued.queue_key or "", queue_entry(run)),
        ]

    def requeue(self, run: RunRecord) -> tuple[RunRecord, list[Op]]:
        """Put a retry_wait/pending run back in the placement queue."""
        queued = run.model_copy(update={"queue_key": self.queue_key(run)})
        return queued, [
            Ops.put(self.keys.run(run.id), queued),
            Ops.put(queued.queue_key or "", queue_entry(run)),
            Ops.put(self.keys.active(run.partition, run.id), ActivePointer(run_id=run.id)),
        ]

    def settle(self, run: RunRecord) -> list[Op]:
        """Ops that store ``run`` after a state change: terminal runs leave
        the active index and the queue, and write the outbox records of
        their webhook events; others keep a fresh pointer."""
        ops = [Ops.put(self.keys.run(run.id), run)]
        if run.state.terminal:
            ops.append(Ops.delete(self.keys.active(run.partition, run.id)))
            if run.queue_key:
                ops.append(Ops.delete(run.queue_key))
            ops += self.outbox.run_ops(run)
        return ops

    def finish_ops(self, run: RunRecord, worker: str, partition: int) -> list[Op]:
        """Ops after an attempt ended: store the run, drop the assignment;
        a retry goes back to the queue at its retry instant."""
        _ENTERED[run.state].inc()
        if run.state is RunState.RETRY_WAIT and run.current is not None:
            RETRIES.labels(outcome=run.current.state.value).inc()
        ops = [Ops.delete(self.keys.assign(worker, run.id))]
        if run.state is RunState.RETRY_WAIT:
            _, requeue = self.requeue(run)
            return ops + requeue
        return ops + self.settle(run)

    async def load(self, store: Store, rid: str) -> Versioned[RunRecord]:
        kv = await store.get(self.keys.run(rid))
        if kv is None:
            raise NotFound(f"run {rid} not found", field="run_id")
        return kv.decode(RunRecord)

    async def next_slot(self, store: Store, run: RunRecord) -> int | None:
        """The job's next pending slot, read only when the retry policy says
        ``stop_at_next_slot`` (one extra read, on failures only)."""
        if not run.spec.retry.stop_at_next_slot:
            return None
        kv = await store.get(self.keys.due_pointer(run.job_id))
        return kv.decode(DueEntry).value.due_ms if kv is not None else None

    def cancel_pending(self, run: RunRecord, now_ms: int, reason: str) -> RunRecord:
        return transition(run, RunState.CANCELLED, now_ms, reason=reason, retry_at_ms=None)

    def cancel_assignment_op(self, run: RunRecord) -> Op:
        """Tell the worker running ``run`` to stop it (it watches its assignments)."""
        assert run.worker is not None and run.current is not None
        assignment = new_assignment(run, run.not_before_ms, cancel=True)
        return Ops.put(self.keys.assign(run.worker, run.id), assignment)


def new_assignment(run: RunRecord, not_before_ms: int, *, cancel: bool = False) -> Assignment:
    """The assignment of ``run``'s current attempt, with the hint that lets
    its worker claim it unread (ADR 0017)."""
    return Assignment(
        run_id=run.id,
        attempt=run.attempt,
        not_before_ms=not_before_ms,
        resources=run.spec.resources,
        cancel=cancel,
        priority=run.spec.priority,
        claim_hint=ClaimHint(partition=run.partition, hang_budget_ms=hang_budget_ms(run.spec)),
    )


async def cancel_run(store: Store, keys: Keys, rid: str, now_ms: int, reason: str) -> RunRecord:
    """Cancel a run. Pending or retry_wait: cancelled at once (compare: the run
    is unchanged). Assigned or running: ``cancel_requested`` is set and the
    worker's assignment is flagged (compares: run unchanged, assignment still
    there); the worker stops the process and reports ``cancelled``."""
    ops = RunOps(keys)
    for _ in range(5):
        current = await ops.load(store, rid)
        run = current.value
        guard = Cmp.mod(current.key, current.mod_revision)
        if run.state.terminal or run.cancel_requested:
            return run
        if run.state in (RunState.PENDING, RunState.RETRY_WAIT):
            cancelled = ops.cancel_pending(run, now_ms, reason)
            if (await store.txn([guard], ops.settle(cancelled))).succeeded:
                return cancelled
            continue
        flagged = run.model_copy(
            update={"cancel_requested": True, "updated_ms": now_ms, "reason": reason}
        )
        assign_key = keys.assign(run.worker or "", run.id)
        result = await store.txn(
            [guard, Cmp.exists(assign_key)],
            [Ops.put(current.key, flagged), ops.cancel_assignment_op(flagged)],
        )
        if result.succeeded:
            return flagged
        if (await store.txn([guard], [Ops.put(current.key, flagged)])).succeeded:
            return flagged  # no assignment left: recovery will end it as cancelled
    raise Conflict(f"run {rid} keeps changing; retry the cancel", field="run_id")
