"""Job lifecycle: create, read, update, pause, resume, delete (creating is
in ``etcdsched.store.job_create``, trigger and backfill are in
``etcdsched.store.job_runs``).

Each operation is one transaction. The compares that recur:

* ``mod(jobs/<job>) == seen``: nobody changed the job since we read it;
* ``mod(nextdue/<job>) == seen``: no scheduler fired the job meanwhile, so the
  due entry we replace is the current one;
* ``absent(...)``: we create, never overwrite.

A write whose outcome is unknown is resolved by re-reading the job. A write
that failed only because a scheduler fired the job meanwhile (its due entry
moved, the job itself is unchanged) is recomputed and tried again: the client
raced no one, so that is no conflict for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from etcdsched.model.codec import encode
from etcdsched.model.errors import Conflict, InvalidInput, NotFound, OutcomeUnknown
from etcdsched.model.records import DueEntry, JobRecord, SkipRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.triggers import (
    count_slots_between,
    next_slot,
    slots_between,
    why_no_slot,
)
from etcdsched.runtime.clock import Clock
from etcdsched.runtime.metrics import SKIPPED_SLOTS
from etcdsched.store.dependencies import checked_dependencies
from etcdsched.store.job_create import JobCreator, SharedLease
from etcdsched.store.job_runs import ManualRuns, origin_of
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Cmp, Compare, Op, Ops, Store, Versioned
from etcdsched.store.outbox import Outbox
from etcdsched.store.runs import RunOps, cancel_run, new_run
from etcdsched.store.webhooks import WebhookStore

CatchUp = Literal["skip", "run_once"]
T = TypeVar("T")
DUE_RACE_ATTEMPTS = 5


class _DueMoved(Exception):
    """A lifecycle txn failed only because a scheduler fired the job (its due
    entry moved) between our read and our write; the job is unchanged."""


@dataclass(frozen=True)
class JobState:
    """A job with its current due pointer (if scheduled)."""

    job: Versioned[JobRecord]
    due: Versioned[DueEntry] | None


def due_entry(
    job: JobRecord, job_key_version: int, slot_ms: int, prev: DueEntry | None
) -> DueEntry:
    return DueEntry(
        job_id=job.id,
        slot_ms=slot_ms,
        job_key_version=job_key_version,
        job_version=job.version,
        anchor_ms=job.anchor_ms,
        spec=job.spec,
        fired=prev.fired if prev else 0,
        last_slot_ms=prev.last_slot_ms if prev else None,
    )


class JobService(ManualRuns, JobCreator):
    """Every job operation; creating is :class:`JobCreator`'s half, running
    now and backfill :class:`ManualRuns`'s (first: its ``partition`` and
    ``active_run_ids`` are what :class:`JobCreator` declares it needs)."""

    def __init__(self, store: Store, keys: Keys, clock: Clock, partitions: int) -> None:
        self.store = store
        self.keys = keys
        self.clock = clock
        self.partitions = partitions
        self.runs = RunOps(keys)
        self.idem_lease = SharedLease()

    # -- reading -----------------------------------------------------------
    async def load(self, job_id: str) -> JobState:
        result = await self.store.txn(
            [], [Ops.get(self.keys.job(job_id)), Ops.get(self.keys.due_pointer(job_id))]
        )
        jobs, dues = result.responses
        if not jobs:
            raise NotFound(f"job {job_id} not found", field="job_id")
        due = dues[0].decode(DueEntry) if dues else None
        return JobState(jobs[0].decode(JobRecord), due)

    async def get(self, job_id: str) -> JobRecord:
        return (await self.load(job_id)).job.value

    async def list_jobs(
        self, *, after: str | None = None, limit: int = 100
    ) -> tuple[list[JobRecord], str | None]:
        """One page of jobs in id order; the cursor is the last id returned."""
        start = self.keys.job(after) + "\0" if after else self.keys.jobs_prefix()
        end = self.keys.jobs_prefix()[:-1] + "0"
        page = await self.store.range(start, end, limit=limit)
        jobs = [kv.decode(JobRecord).value for kv in page.kvs]
        return jobs, (jobs[-1].id if page.more and jobs else None)

    async def next_slot_of(self, job_id: str) -> int | None:
        """The job's next due slot; None when it has none (an ``after`` job
        waiting for its upstream runs has none either)."""
        state = await self.load(job_id)
        return state.due.value.due_ms if state.due else None

    def _schedule_ops(
        self, job: JobRecord, key_version: int, prev: DueEntry | None, after_ms: int
    ) -> list[Op]:
        """Due entry + pointer for the job's first slot after ``after_ms``."""
        if job.state == "paused":
            return []
        trigger = job.spec.trigger
        if trigger.max_runs is not None and prev is not None and prev.fired >= trigger.max_runs:
            return []
        slot = next_slot(trigger, after_ms, job.anchor_ms)
        if slot is None:
            return []
        entry = encode(due_entry(job, key_version, slot, prev))  # once for both keys
        pp = self.partition(job.id)
        return [
            Ops.put(self.keys.due(pp, slot, job.id), entry),
            Ops.put(self.keys.due_pointer(job.id), entry),
        ]

    def _unschedule_ops(self, state: JobState) -> tuple[list[Compare], list[Op]]:
        """Compares and ops that remove the job's current due entry."""
        if state.due is None:
            return [Cmp.absent(self.keys.due_pointer(state.job.value.id))], []
        entry = state.due.value
        pp = self.partition(entry.job_id)
        return [Cmp.mod(state.due.key, state.due.mod_revision)], [
            Ops.delete(self.keys.due(pp, entry.slot_ms, entry.job_id)),
            Ops.delete(state.due.key),
        ]

    async def _commit(
        self, state: JobState, job: JobRecord, ops: list[Op], extra: list[Compare]
    ) -> JobRecord:
        """Write ``job`` if nobody changed it or its due entry since ``state``."""
        compares = [Cmp.mod(state.job.key, state.job.mod_revision), *extra]
        ops = [Ops.put(state.job.key, job), *ops]
        try:
            result = await self.store.txn(compares, ops, [Ops.get(state.job.key)])
        except OutcomeUnknown:
            current = await self.get(job.id)
            if current.updated_ms == job.updated_ms and current.version == job.version:
                return current
            raise
        if not result.succeeded:
            raise self._failure(state, result.responses)
        return job

    @staticmethod
    def _failure(state: JobState, responses: list[list[KV]]) -> Exception:
        """Why a txn guarded by ``state`` failed, from the job key read in its
        failure branch: the job is unchanged, so the due entry moved."""
        job_now = responses[0] if responses else []
        if job_now and job_now[0].mod_revision == state.job.mod_revision:
            return _DueMoved()
        return Conflict(f"job {state.job.value.id} changed concurrently; retry", field="job_id")

    async def _retry_due_moved(self, job_id: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run ``attempt`` (read, decide, write) again while it fails only
        because a scheduler fired the job between its read and its write."""
        for _ in range(DUE_RACE_ATTEMPTS):
            try:
                return await attempt()
            except _DueMoved:
                continue
        raise Conflict(f"job {job_id} keeps being fired under us; retry", field="job_id")

    # -- changing ----------------------------------------------------------
    async def replace(self, job_id: str, spec: JobSpec, if_version: int | None = None) -> JobRecord:
        """New spec for future slots; active runs keep their snapshot. When
        what runs or when changes (trigger or execution), runs already fired
        under the old spec (a lead ahead) for slots after the change are
        withdrawn before they start; a run already going ends normally."""
        old = (await self.load(job_id)).job.value
        job = await self._retry_due_moved(
            job_id, lambda: self._replace_once(job_id, spec, if_version)
        )
        changed = (old.spec.trigger, old.spec.execution) != (job.spec.trigger, job.spec.execution)
        if changed or job.version > old.version + 1:  # or another replace came in between
            await self._withdraw(
                job_id, "withdrawn: job changed before its slot", job.updated_ms, job.version
            )
        return job

    async def _replace_once(self, job_id: str, spec: JobSpec, if_version: int | None) -> JobRecord:
        state = await self.load(job_id)
        old = state.job.value
        if if_version is not None and if_version != old.version:
            raise Conflict(f"job {job_id} is at version {old.version}", field="version")
        if spec.tenant != old.spec.tenant:
            raise InvalidInput("a job cannot move to another tenant", field="tenant")
        spec = await checked_dependencies(self.store, self.keys, job_id, spec)
        now = self.clock.now_ms()
        job = old.model_copy(update={"spec": spec, "version": old.version + 1, "updated_ms": now})
        compares, ops = self._reschedule_ops(state, job, now)
        pointer = self.keys.due_pointer(job_id)
        scheduled = any(op.kind == "put" and op.key == pointer for op in ops)
        if job.state == "active" and not scheduled and spec.trigger != old.spec.trigger:
            message, name = why_no_slot(spec.trigger, now)  # a new trigger that never fires
            raise InvalidInput(message, field=f"spec.trigger.{name}")
        return await self._commit(state, job, ops, compares)

    def _reschedule_ops(
        self, state: JobState, job: JobRecord, now: int
    ) -> tuple[list[Compare], list[Op]]:
        """Move the due entry to the new spec's next slot.

        * A paused job keeps its pointer untouched: it marks the paused slot,
          from which resume accounts for every missed slot.
        * The next slot is searched from the current due slot when that is
          overdue (no scheduler fired it yet), so the overdue slots meet the
          misfire policy instead of vanishing; never at or before the slot
          fired last.
        * etcd refuses a txn that deletes and puts the same key ("duplicate
          key given in txn request"), and the pointer (often the due key too)
          is rewritten: a delete of a key that is put again is dropped.
        """
        if job.state == "paused":
            pointer = self.keys.due_pointer(job.id)
            guard = Cmp.mod(pointer, state.due.mod_revision) if state.due else Cmp.absent(pointer)
            return [guard], []
        compares, removes = self._unschedule_ops(state)
        prev = state.due.value if state.due else None
        after = now - 1 if prev is None else min(now, prev.slot_ms) - 1
        if prev is not None and prev.last_slot_ms is not None:
            after = max(after, prev.last_slot_ms)
        puts = self._schedule_ops(job, state.job.version + 1, prev, after)
        put_keys = {op.key for op in puts}
        return compares, [op for op in removes if op.key not in put_keys] + puts

    async def pause(
        self, job_id: str, also: Sequence[Op] = (), provided: Sequence[Compare] = ()
    ) -> JobRecord:
        """No new slots. The due entry leaves the index but its pointer stays,
        marking the paused slot, so resume can account for every missed slot.
        Runs already fired (a lead ahead) for slots after the pause are
        withdrawn: cancelled before they start. ``also``: ops written only
        by the transaction that pauses it (a system pause's webhook events);
        ``provided``: extra compares it needs (a system pause's: its pause
        check is still there, its partition still owned)."""
        paused = await self._retry_due_moved(
            job_id, lambda: self._pause_once(job_id, also, provided)
        )
        if paused.paused_ms is not None:
            reason = "withdrawn: job paused before its slot"
            await self._withdraw(job_id, reason, paused.paused_ms)
        return paused

    async def _withdraw(
        self,
        job_id: str,
        reason: str,
        after_ms: int | None = None,
        below_version: int | None = None,
    ) -> None:
        """Cancel the job's scheduled runs that have not started (pending,
        assigned, or marked running before their gate, whose start is still
        ahead), for slots after ``after_ms`` (None: every slot) and fired from
        a job version below ``below_version`` (None: any; a replace must not
        withdraw what its own new spec fired meanwhile). A run already going
        is left be. Each cancel is ``cancel_run``'s transaction: the run is
        unchanged since read (and, executing, its assignment still exists)."""
        for rid in await self.active_run_ids(job_id):
            try:
                run = (await self.runs.load(self.store, rid)).value
            except NotFound:
                continue
            if run.kind != "scheduled" or (after_ms is not None and run.slot_ms <= after_ms):
                continue
            if below_version is not None and run.job_version >= below_version:
                continue
            started = run.current.started_ms if run.current is not None else None
            if started is not None and started <= self.clock.now_ms():
                continue
            try:
                await cancel_run(self.store, self.keys, rid, self.clock.now_ms(), reason)
            except (NotFound, Conflict):
                continue  # retention took it, or it keeps changing: it is no longer ours to stop

    async def _pause_once(
        self, job_id: str, also: Sequence[Op] = (), provided: Sequence[Compare] = ()
    ) -> JobRecord:
        state = await self.load(job_id)
        if state.job.value.state == "paused":
            return state.job.value
        now = self.clock.now_ms()
        job = state.job.value.model_copy(
            update={"state": "paused", "paused_ms": now, "updated_ms": now}
        )
        compares: list[Compare] = [*provided]
        ops: list[Op] = []
        if state.due is not None:
            entry = state.due.value
            compares.append(Cmp.mod(state.due.key, state.due.mod_revision))
            ops.append(Ops.delete(self.keys.due(self.partition(job_id), entry.slot_ms, job_id)))
        return await self._commit(state, job, [*ops, *also], compares)

    async def resume(self, job_id: str, catch_up: CatchUp = "skip") -> JobRecord:
        """Schedule again from now. Slots missed while paused get one skip
        record (reason ``paused``); with ``run_once`` the latest of them runs."""
        return await self._retry_due_moved(job_id, lambda: self._resume_once(job_id, catch_up))

    async def _resume_once(self, job_id: str, catch_up: CatchUp) -> JobRecord:
        state = await self.load(job_id)
        old = state.job.value
        if old.state != "paused":
            return old
        now = self.clock.now_ms()
        job = old.model_copy(update={"state": "active", "paused_ms": None, "updated_ms": now})
        compares = [Cmp.mod(state.due.key, state.due.mod_revision)] if state.due else []
        prev = state.due.value if state.due else None
        ops, skip = self._missed_while_paused(job, prev, now, catch_up)
        if skip is not None:
            ops += await self._skip_events(job, skip)
        ops += self._schedule_ops(job, state.job.version + 1, prev, now)
        resumed = await self._commit(state, job, ops, compares)
        if skip is not None:
            SKIPPED_SLOTS.labels(reason="paused").inc(skip.count)
        return resumed

    async def _skip_events(self, job: JobRecord, skip: SkipRecord) -> list[Op]:
        """The ``slot.skipped`` events of the slots a resume skips, written
        by the resume's own transaction. The API keeps no watched copy of
        the tenant's webhooks (the roles that end runs do), so it reads
        them: one read per resume that skips slots, and only then."""
        hooks = await WebhookStore(self.store, self.keys).list(job.spec.tenant)
        outbox = Outbox(self.keys, lambda _tenant: hooks)
        return outbox.skip_ops(job.spec, self.partition(job.id), [skip])

    def _missed_while_paused(
        self, job: JobRecord, prev: DueEntry | None, now: int, catch_up: CatchUp
    ) -> tuple[list[Op], SkipRecord | None]:
        """The ops recording the slots missed while paused, and their skip
        record if any is skipped (with ``run_once`` the latest runs instead)."""
        if prev is None or prev.slot_ms > now:
            return [], None
        trigger, anchor = job.spec.trigger, job.anchor_ms
        count = count_slots_between(trigger, prev.slot_ms - 1, now, anchor, 10**9)
        if count == 0:
            return [], None
        last = (
            slots_between(trigger, prev.slot_ms - 1, now, anchor, count)[-1]
            if count < 10_000
            else now
        )
        ops: list[Op] = []
        skipped_last, skipped_count = last, count
        if catch_up == "run_once":
            run = new_run(origin_of(job), last, now, self.partitions, coalesced=count - 1)
            ops += self.runs.create(run)[2]  # (stored run, compares, ops)
            skipped_count -= 1
            skipped_last = last - 1
        if skipped_count <= 0:
            return ops, None
        record = SkipRecord(
            job_id=job.id,
            first_slot_ms=prev.slot_ms,
            last_slot_ms=skipped_last,
            count=skipped_count,
            reason="paused",
            created_ms=now,
        )
        ops.append(Ops.put(self.keys.skip(job.id, prev.slot_ms), record))
        return ops, record

    async def delete(self, job_id: str) -> list[str]:
        """Remove the job, its due entry and its idempotency record, and mark
        it gone (``gone/<pp>/<job>``, with the instant): an hour later its
        partition's retention removes its finished runs, their logs and its
        archive. Runs fired ahead that have not started are
        withdrawn; runs already going are left be. Returns the ids of its
        active runs (the caller may cancel them)."""
        await self._retry_due_moved(job_id, lambda: self._delete_once(job_id))
        await self._withdraw(job_id, "withdrawn: job deleted")
        return await self.active_run_ids(job_id)

    async def _delete_once(self, job_id: str) -> None:
        """Compares: the job and its due entry are as read, and its
        idempotency record, if it still names this job, still does (one that
        expired and was reused names another job, and is left alone)."""
        state = await self.load(job_id)
        compares, ops = self._unschedule_ops(state)
        compares.append(Cmp.mod(state.job.key, state.job.mod_revision))
        ops += [Ops.delete(state.job.key), Ops.delete(self.keys.due_pointer(job_id))]
        gone = self.keys.gone(self.partition(job_id), job_id)
        ops.append(Ops.put(gone, str(self.clock.now_ms()).encode()))  # for retention
        record = state.job.value.idempotency_record
        if record is not None and await self._names(record, job_id):
            compares.append(Cmp.value(record, job_id.encode()))
            ops.append(Ops.delete(record))
        result = await self.store.txn(compares, ops, [Ops.get(state.job.key)])
        if not result.succeeded:
            raise self._failure(state, result.responses)

    async def _names(self, record: str, job_id: str) -> bool:
        """Whether the idempotency record ``record`` still names ``job_id``."""
        kv = await self.store.get(record)
        return kv is not None and kv.value == job_id.encode()

    async def record_kv(self, kv: KV) -> JobRecord:
        return kv.decode(JobRecord).value
