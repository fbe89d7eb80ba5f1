"""Runs a client asks for: a job's run now (trigger) and runs for past
slots (backfill), as the half of :class:`etcdsched.store.jobs.JobService` that
creates runs rather than changing the job."""

from __future__ import annotations

from abc import ABC, abstractmethod

from etcdsched.model.errors import Conflict, InvalidInput
from etcdsched.model.records import JobRecord, RunRecord
from etcdsched.model.triggers import AfterTrigger, slots_between
from etcdsched.runtime.clock import Clock
from etcdsched.store.keys import Keys, partition_of
from etcdsched.store.kv import Cmp, Store
from etcdsched.store.runs import RunOps, RunOrigin, new_run


def origin_of(job: JobRecord) -> RunOrigin:
    """What a run of ``job`` is made from: its spec at its current version."""
    return RunOrigin(job.id, job.spec, job.version)


class ManualRuns(ABC):
    """Trigger and backfill, and where a job's keys live (its partition,
    its active runs); the job service provides the rest."""

    store: Store
    keys: Keys
    clock: Clock
    partitions: int
    runs: RunOps

    @abstractmethod
    async def get(self, job_id: str) -> JobRecord:
        """The job (raises ``NotFound``)."""

    def partition(self, job_id: str) -> int:
        return partition_of(job_id, self.partitions)

    async def active_run_ids(self, job_id: str) -> list[str]:
        """The job's runs that are not terminal yet (its active pointers)."""
        prefix = self.keys.active_prefix(self.partition(job_id), job_id)
        page = await self.store.range(prefix, keys_only=True)
        return [self.keys.parse_active(kv.key)[1].run_id for kv in page.kvs]

    # -- running now -------------------------------------------------------
    async def trigger(self, job_id: str, force: bool = False) -> RunRecord:
        """A manual run now. Works while paused. Obeys the overlap policy
        (``skip`` refuses while a run is active) unless ``force``.

        Compares: the run key is absent (its id is the instant plus ``-m``),
        the job still exists, and for ``skip`` the job has no active run. The
        job key itself is not written: its etcd version is what due entries
        compare, so touching it would invalidate the job's pending slot."""
        job = await self.get(job_id)
        now = self.clock.now_ms()
        run = new_run(origin_of(job), now, now, self.partitions, kind="manual", tag="m")
        _, compares, ops = self.runs.create(run)
        compares.append(Cmp.exists(self.keys.job(job_id)))
        if job.spec.overlap == "skip" and not force:
            compares.append(Cmp.prefix_empty(self.keys.active_prefix(run.partition, job_id)))
        result = await self.store.txn(compares, ops)
        if not result.succeeded:
            if job.spec.overlap == "skip" and not force and await self.active_run_ids(job_id):
                raise Conflict(
                    f"job {job_id} has an active run and overlap is 'skip'; use force",
                    field="force",
                )
            raise Conflict(f"job {job_id} changed concurrently; retry", field="job_id")
        return (await self.runs.load(self.store, run.id)).value

    async def backfill(
        self, job_id: str, start_ms: int, end_ms: int, limit: int = 1000
    ) -> list[str]:
        """Runs for every slot in [start, end] that has no run yet: each is
        its own transaction whose compare is *the run key is absent*, so a
        slot that already has a run (fired, or backfilled before) keeps it."""
        if end_ms < start_ms:
            raise InvalidInput("end must not be before start", field="end")
        job = await self.get(job_id)
        if isinstance(job.spec.trigger, AfterTrigger):
            raise InvalidInput(
                "an after job has no slots of its own to backfill; trigger it", field="job_id"
            )
        slots = slots_between(job.spec.trigger, start_ms - 1, end_ms, job.anchor_ms, limit + 1)
        if len(slots) > limit:
            raise InvalidInput(f"more than {limit} slots in range", field="end")
        now = self.clock.now_ms()
        created: list[str] = []
        for slot in slots:
            run = new_run(origin_of(job), slot, now, self.partitions, kind="backfill")
            _, compares, ops = self.runs.create(run)
            if (await self.store.txn(compares, ops)).succeeded:
                created.append(run.id)
        return created
