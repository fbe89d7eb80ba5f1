"""Creating a job: the half of :class:`etcdsched.store.jobs.JobService` that
builds a job's creating transaction and sends it.

A create is one transaction, built in one place (:meth:`JobCreator.creation_of`)
so that the job service sending it alone and the batch
(``etcdsched.store.job_batch``) packing many into one transaction write
exactly the same keys under exactly the same compares.

An idempotency key is remembered for 24 to 25 hours: its record is bound to
a lease shared by every create of the hour (:class:`SharedLease`), so
remembering a key costs no round trip of its own, and etcd forgets it
without anyone sweeping. Deleting the job deletes its record too
(``JobService.delete``): a replay after that makes a new job.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.errors import Conflict, InvalidInput, OutcomeUnknown, StoreRejected
from etcdsched.model.records import DueEntry, JobRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.triggers import AtTrigger, why_no_slot
from etcdsched.runtime.clock import Clock
from etcdsched.store.dependencies import checked_dependencies
from etcdsched.store.keys import KeyError_, Keys, full_job_id
from etcdsched.store.kv import Cmp, Compare, Op, Ops, Store

log = logging.getLogger(__name__)
MAX_IDEMPOTENCY_KEY = 256
IDEMPOTENCY_KEEP_S = 24 * 3600
"""How long an idempotency key is remembered at least (docs/api.md)."""
IDEMPOTENCY_LEASE_REUSE_S = 3600
"""How long one lease serves new idempotency records: a record lives
between ``IDEMPOTENCY_KEEP_S`` and that plus this."""


class SharedLease:
    """One lease for every idempotency record written within the hour.

    Granted with a TTL of 25 h and reused for an hour, so each record lives
    24-25 h and a process grants one lease an hour, not one per create (a
    grant is a round trip and a raft entry). Nothing renews it. A lease that
    is gone before its time (revoked, or etcd lost it) is found out by the
    create that used it, which asks :meth:`forget` and then :meth:`current`
    again; the lock makes the many creates of a batch that all failed on it
    share one new grant.
    """

    def __init__(
        self, keep_s: int = IDEMPOTENCY_KEEP_S, reuse_s: int = IDEMPOTENCY_LEASE_REUSE_S
    ) -> None:
        self.keep_s = keep_s
        self.reuse_s = reuse_s
        self._lease = 0
        self._granted_at = 0.0
        self._lock = asyncio.Lock()

    async def current(self, store: Store, clock: Clock) -> int:
        """The lease new records go under; granted when there is none, or
        the one we have is an hour old."""
        async with self._lock:
            if not self._lease or clock.monotonic() - self._granted_at >= self.reuse_s:
                granted_at = clock.monotonic()
                self._lease, _ = await store.grant(self.keep_s + self.reuse_s)
                self._granted_at = granted_at
            return self._lease

    def forget(self, lease: int) -> None:
        """``lease`` turned out gone: the next :meth:`current` grants anew
        (unless another create already replaced it)."""
        if self._lease == lease:
            self._lease = 0


def lease_gone(exc: StoreRejected) -> bool:
    """Whether etcd refused a transaction because a put named a lease it no
    longer has ("etcdserver: requested lease not found")."""
    return "lease not found" in str(exc)


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
    lease: int = 0
    """The lease of the idempotency record (0: no record)."""

    def with_lease(self, lease: int) -> JobCreation:
        """The same create with its idempotency record under ``lease`` (the
        one it had is gone)."""
        ops = [
            Ops.put(op.key, op.value, lease) if op.key == self.idem_key else op for op in self.ops
        ]
        return JobCreation(self.job, self.idem_key, self.compares, ops, lease)

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
    idem_lease: SharedLease

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
        lease = await self.idempotency_lease() if idempotency_key else 0
        return self.creation_of(full_id, spec, idempotency_key, lease)

    async def idempotency_lease(self) -> int:
        """The lease new idempotency records go under (see :class:`SharedLease`)."""
        return await self.idem_lease.current(self.store, self.clock)

    def creation_of(
        self, job_id: str, spec: JobSpec, idempotency_key: str | None, lease: int
    ) -> JobCreation:
        """The transaction that creates a job (``job_id`` full and checked,
        ``spec``'s dependencies checked). Compares: the job key is absent, no
        run of an earlier job of that id is still active (a deleted job's
        runs end before its id is used again: the new job must not inherit
        them), and the idempotency key is absent if one was given. Ops: the
        job (naming its idempotency record), its first due entry and due
        pointer, the idempotency record under ``lease`` (from
        :meth:`idempotency_lease`), which expires it."""
        now = self.clock.now_ms()
        spec = _at_now_if_past(spec, now)
        idem_key = self.idempotency_key(spec.tenant, idempotency_key)
        if idem_key and not lease:
            raise ValueError("an idempotency record needs its lease: it must expire")
        job = JobRecord(
            id=job_id,
            spec=spec,
            created_ms=now,
            updated_ms=now,
            anchor_ms=now,
            idempotency_record=idem_key,
        )
        earlier_runs = self.keys.active_prefix(self.partition(job_id), job_id)
        compares = [Cmp.absent(self.keys.job(job_id)), Cmp.prefix_empty(earlier_runs)]
        schedule = self._schedule_ops(job, 1, None, _first_slot_after(spec, now))
        if not schedule and job.state != "paused":
            message, name = why_no_slot(spec.trigger, now)
            raise InvalidInput(message, field=f"spec.trigger.{name}")
        ops = [Ops.put(self.keys.job(job_id), job), *schedule]
        if idem_key:
            compares.append(Cmp.absent(idem_key))
            ops.append(Ops.put(idem_key, job_id.encode(), lease))
        return JobCreation(job, idem_key, compares, ops, lease if idem_key else 0)

    async def commit_creation(self, creation: JobCreation, *, regranted: bool = False) -> JobRecord:
        """Send ``creation`` alone; a failed or unknown outcome is resolved
        by :meth:`resolve_creation`. Refused because its idempotency lease is
        gone, it is sent once more under a new one."""
        try:
            result = await self.store.txn(creation.compares, creation.ops)
        except OutcomeUnknown:
            return await self.resolve_creation(creation, maybe_ours=True)
        except StoreRejected as exc:
            if regranted or not creation.lease or not lease_gone(exc):
                raise
            log.info("idempotency lease %x is gone; granting a new one", creation.lease)
            self.idem_lease.forget(creation.lease)
            renewed = creation.with_lease(await self.idempotency_lease())
            return await self.commit_creation(renewed, regranted=True)
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
