"""A scheduling pass reads the due entries, never the stored jobs."""

from __future__ import annotations

import asyncio

from etcdsched.model.errors import OutcomeUnknown
from etcdsched.model.records import JobRecord
from etcdsched.model.spec import JobSpec
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.firing import PartitionFirer
from etcdsched.scheduler.overlap import active_runs_cache
from etcdsched.scheduler.ownership import Ownership
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.jobs import JobService, due_entry
from etcdsched.store.keys import Keys, partition_of
from etcdsched.store.kv import Ops
from etcdsched.store.session import Session

STORED = 100_000
DUE = 10
P = 4
SPEC = JobSpec.model_validate(
    {"trigger": {"kind": "cron", "expr": "0 0 * * *"}, "execution": {"argv": ["true"]}}
)


async def _store_far_future_jobs(store: EtcdStore, keys: Keys, far_ms: int) -> None:
    template = JobRecord(id="JOBID", spec=SPEC, created_ms=0, updated_ms=0, anchor_ms=0)
    job_json = template.model_dump_json()
    due_json = due_entry(template, 1, far_ms, None).model_dump_json()
    gate = asyncio.Semaphore(16)

    async def chunk(start: int) -> None:
        ops = []
        for i in range(start, min(start + 60, STORED)):
            job_id = f"stored-{i:06d}"
            pp = partition_of(job_id, P)
            ops.append(Ops.put(keys.job(job_id), job_json.replace("JOBID", job_id).encode()))
            ops.append(
                Ops.put(keys.due(pp, far_ms, job_id), due_json.replace("JOBID", job_id).encode())
            )
        async with gate:
            for attempt in range(3):  # plain puts: retrying one whose outcome is unknown is safe
                try:
                    await store.txn([], ops)
                    return
                except OutcomeUnknown:
                    if attempt == 2:
                        raise

    await asyncio.gather(*(chunk(i) for i in range(0, STORED, 60)))


async def test_pass_reads_only_due_entries(
    store: EtcdStore, keys: Keys, etcd_endpoints: list[str]
) -> None:
    clock = SystemClock()
    await ensure_cluster(store, keys, P, clock.now_ms())
    now = clock.now_ms()
    try:
        await _store_far_future_jobs(store, keys, now + 86_400_000)
        jobs = JobService(store, keys, clock, P)
        now_spec = JobSpec.model_validate(
            {"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}}
        )
        for i in range(DUE):
            await jobs.create(now_spec, f"due-{i}")
        counting = await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd_endpoints)))
        session = await Session.open(counting, clock, ttl=5)
        try:
            fired, read = await _one_pass(counting, keys, clock, session)
        finally:
            await session.close()
            await counting.close()
        assert fired == DUE
        # the due entries, plus a small constant per partition (listing pages, owner reads)
        print(f"keys read in one pass over {STORED} stored jobs with {DUE} due: {read}")
        assert read <= DUE + 4 * P, read
    finally:
        await store.txn([], [Ops.delete_prefix(keys.prefix)])


async def _one_pass(
    store: EtcdStore, keys: Keys, clock: SystemClock, session: Session
) -> tuple[int, int]:
    ownership = Ownership(store, keys, "counter")
    fired = 0
    before = store.stats.keys_read
    for pp in range(P):
        assert await ownership.acquire(pp, session, clock.now_ms())
        active = active_runs_cache(store, clock, keys, pp)
        firer = PartitionFirer(pp, store, keys, clock, ownership, active, P, 0, 60_000, 16)
        await firer.due.relist()
        await firer.fire_due(clock.now_ms())
        fired += firer.stats.fired
    return fired, store.stats.keys_read - before
