"""Three schedulers forced to race on the same slots create one run per slot.

The race is forced: three firers on three separate etcd connections all
believe they own every partition (they share one owner token, as a buggy
rebalance or a stale owner would) and fire the same due entries at the same
instant. Only the run-absent and due-entry-unchanged compares stand between
them and a double launch.
"""

from __future__ import annotations

import asyncio

from etcdsched.model.records import RunRecord
from etcdsched.model.spec import JobSpec
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.firing import PartitionFirer
from etcdsched.scheduler.overlap import active_runs_cache
from etcdsched.scheduler.ownership import Ownership
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.ledger import account
from etcdsched.store.session import Session

P = 4
JOBS = 40
ROUNDS = 3


async def test_three_racing_firers_create_exactly_one_run_per_slot(
    store: EtcdStore, keys: Keys, etcd_endpoints: list[str]
) -> None:
    clock = SystemClock()
    await ensure_cluster(store, keys, P, clock.now_ms())
    spec = JobSpec.model_validate(
        {"trigger": {"kind": "interval", "every": "1s"}, "execution": {"argv": ["true"]}}
    )
    jobs = JobService(store, keys, clock, P)
    for i in range(JOBS):
        await jobs.create(spec, f"race-{i:02d}")
    session = await Session.open(store, clock, ttl=10)
    shared = Ownership(store, keys, "shared")
    for pp in range(P):
        assert await shared.acquire(pp, session, clock.now_ms())
    racers = [
        await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd_endpoints))) for _ in range(3)
    ]
    try:
        for _ in range(ROUNDS):
            await asyncio.gather(*(_fire_all(r, keys, clock, shared) for r in racers))
            await asyncio.sleep(1.0)  # let the next slot of every job come due
        await asyncio.gather(*(_fire_all(r, keys, clock, shared) for r in racers))
    finally:
        for racer in racers:
            await racer.close()
        await session.close()
    for i in range(JOBS):
        job_id = f"default:race-{i:02d}"
        page = await store.range(keys.runs_prefix(job_id))
        slots = [kv.decode(RunRecord).value.slot_ms for kv in page.kvs]
        assert len(slots) == len(set(slots)) and len(slots) >= ROUNDS
        report = await account(store, keys, job_id)
        assert report.ok, report


async def _fire_all(store: EtcdStore, keys: Keys, clock: SystemClock, owner: Ownership) -> None:
    racer = Ownership(store, keys, "shared")
    racer.tokens = dict(owner.tokens)
    for pp in range(P):
        active = active_runs_cache(store, clock, keys, pp)
        firer = PartitionFirer(pp, store, keys, clock, racer, active, P, 0, 60_000, 16)
        await firer.due.relist()
        await firer.fire_due(clock.now_ms())
