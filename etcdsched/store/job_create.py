"""Creating a job: the half of :class:`etcdsched.store.jobs.JobService` that
builds a job's creating transaction and sends it.

A create is one transaction, built in one place (:meth:`JobCreator.creation_of`)
so that the job service sending it alone and the batch
(``etcdsched.store.job_batch``) packing many into one transaction write
exactly the same keys under exactly the same compares.
"""

from __future__ import annotations

import hashlib
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.errors import Conflict, InvalidInput, OutcomeUnknown
from etcdsched.model.records import DueEntry, JobRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.triggers import AtTrigger, why_no_slot
from etcdsched.runtime.clock import Clock
from etcdsched.store.dependencies import checked_dependencies
from etcdsched.store.keys import KeyError_, Keys, full_job_id
from etcdsched.store.kv import Cmp, Compare, Op, Ops, Store

MAX_IDEMPOTENCY_KEY = 256


def _first_slot_after(spec: JobSpec, now_ms: int) -> int:
    """Where a new job's first slot is looked for: after now, but a one-off
    ``at`` within the misfire grace before now still counts (a client whose
    clock is a little ahead of ours meant "now"); the firer then fires it
    in time."""
    if isinstance(spec.trigger, AtTrigger):
        return now_ms - 1 - int(spec.misfire.grace.total_seconds() * 1000)
    return now_ms - 1


def _at_now_if_past(spec: JobSpec, now_ms: int) -> JobSpec:
    """A one-off ``at`` past its grace with ``if_past: run_now``: at = now."""
    trigger = spec.trigger
    if not isinstance(trigger, AtTrigger) or trigger.if_past != "run_now":
        return spec
    if trigger.at_ms > _first_slot_after(spec, now_ms):
        return spec
    at_now = trigger.model_copy(update={"at": ms_to_utc(now_ms)})
    return spec.model_copy(update={"trigger": at_now})


def new_job_name() -> str:
    """The name of a job created without one."""
    return f"job-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class JobCreation:
    """One job's create as the parts of its transaction: sent alone by
    :meth:`JobCreator.commit_creation`, or packed with other jobs' into one
    transaction by ``etcdsched.store.job_batch``."""

    job: JobRecord
    idem_key: str | None
    compares: list[Compare]
    ops: list[Op]

    def made(self, record: JobRecord) -> bool:
        """Whether ``record``, found stored, is the job this create wrote: its
        id, creation instant and spec (after an unknown outcome, or when an
        idempotency key led to it)."""
        return (
            record.id == self.job.id
            and record.created_ms == self.job.created_ms
            and record.spec == self.job.spec
        )


class JobCreator(ABC):
    """Create one job; the job service provides what it needs below."""

    store: Store
    keys: Keys
    clock: Clock

    @abstractmethod
    async def get(self, job_id: str) -> JobRecord:
        """The job (raises ``NotFound``)."""

    @abstractmethod
    def partition(self, job_id: str) -> int:
        """The partition the job's keys live in."""

    @abstractmethod
    async def active_run_ids(self, job_id: str) -> list[str]:
        """The job's runs that are not terminal yet."""

    @abstractmethod
    def _schedule_ops(
        self, job: JobRecord, key_version: int, prev: DueEntry | None, after_ms: int
    ) -> list[Op]:
        """Due entry + pointer for the job's first slot after ``after_ms``."""

    async def create(
        self, spec: JobSpec, job_id: str | None = None, idempotency_key: str | None = None
    ) -> JobRecord:
        """Create a job and its first due entry atomically (see :meth:`creation_of`).

        ``job_id`` is a name (or a full ``<tenant>:<name>`` id of the spec's
        tenant); the job's id is the full one."""
        creation = await self.checked_creation(spec, job_id, idempotency_key)
        return await self.commit_creation(creation)

    async def checked_creation(
        self, spec: JobSpec, job_id: str | None = None, idempotency_key: str | None = None
    ) -> JobCreation:
        """:meth:`creation_of` after checking the id and the spec's
        ``depends_on`` (which reads the upstream jobs from etcd)."""
        full_id = self.checked_id(spec.tenant, job_id or new_job_name())
        spec = await checked_dependencies(self.store, self.keys, full_id, spec)
        return self.creation_of(full_id, spec, idempotency_key)

    def creation_of(self, job_id: str, spec: JobSpec, idempotency_key: str | None) -> JobCreation:
        """The transaction that creates a job (``job_id`` full and checked,
        ``spec``'s dependencies checked). Compares: the job key is absent, no
        run of an earlier job of that id is still active (a deleted job's
        runs end before its id is used again: the new job must not inherit
        them), and the idempotency key is absent if one was given. Ops: the
        job, its first due entry and due pointer, the idempotency key."""
        now = self.clock.now_ms()
        spec = _at_now_if_past(spec, now)
        job = JobRecord(id=job_id, spec=spec, created_ms=now, updated_ms=now, anchor_ms=now)
        earlier_runs = self.keys.active_prefix(self.partition(job_id), job_id)
        compares = [Cmp.absent(self.keys.job(job_id)), Cmp.prefix_empty(earlier_runs)]
        schedule = self._schedule_ops(job, 1, None, _first_slot_after(spec, now))
        if not schedule and job.state != "paused":
            message, name = why_no_slot(spec.trigger, now)
            raise InvalidInput(message, field=f"spec.trigger.{name}")
        ops = [Ops.put(self.keys.job(job_id), job), *schedule]
        idem_key = self.idempotency_key(spec.tenant, idempotency_key)
        if idem_key:
            compares.append(Cmp.absent(idem_key))
            ops.append(Ops.put(idem_key, job_id.encode()))
        return JobCreation(job, idem_key, compares, ops)

    async def commit_creation(self, creation: JobCreation) -> JobRecord:
        """Send ``creation`` alone; a failed or unknown outcome is resolved
        by :meth:`resolve_creation`."""
        try:
            result = await self.store.txn(creation.compares, creation.ops)
        except OutcomeUnknown:
            return await self.resolve_creation(creation, maybe_ours=True)
        if result.succeeded:
            return creation.job
        return await self.resolve_creation(creation, maybe_ours=False)

    async def resolve_creation(self, creation: JobCreation, maybe_ours: bool) -> JobRecord:
        """After a failed or unknown create: ours if the idempotency key says
        so, or, when the outcome is unknown, our own creation instant and
        spec; else a conflict. A create that *failed* found the job already
        there, so it is never ours: two creates of one spec within one
        millisecond both succeeded when it was trusted then."""
        job, idem_key = creation.job, creation.idem_key
        if idem_key:
            kv = await self.store.get(idem_key)
            if kv is not None:
                return await self.get(kv.value.decode())
        existing = await self.store.get(self.keys.job(job.id))
        if existing is None and not maybe_ours and await self.active_run_ids(job.id):
            raise Conflict(
                f"runs of an earlier job {job.id} are still ending; create it again once they have",
                field="id",
            )
        if existing is None:
            raise OutcomeUnknown(f"creating job {job.id}: outcome unknown, nothing stored")
        record = existing.decode(JobRecord).value
        if maybe_ours and creation.made(record):
            return record
        raise Conflict(f"job {job.id} already exists", field="id")

    def idempotency_key(self, tenant: str, key: str | None) -> str | None:
        """The etcd key recording a create made with the client's ``key``."""
        if not key:
            return None
        if len(key) > MAX_IDEMPOTENCY_KEY:
            raise InvalidInput(
                f"Idempotency-Key is longer than {MAX_IDEMPOTENCY_KEY} characters",
                field="Idempotency-Key",
            )
        return self.keys.idempotency(tenant, hashlib.sha256(key.encode()).hexdigest())

    @staticmethod
    def checked_id(tenant: str, name: str) -> str:
        """The full id of job ``name`` of ``tenant``, or a 422 naming ``id``."""
        try:
            return full_job_id(tenant, name)
        except KeyError_ as exc:
            raise InvalidInput(str(exc), field="id") from None
