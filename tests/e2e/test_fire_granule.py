"""A partition fires its entries in batches a quarter lookahead apart, never
earlier than the lookahead and never later than ``lookahead - granule``."""

from __future__ import annotations

from etcdsched.config import BACKLOG_LIMIT
from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.spec import JobSpec
from etcdsched.runtime.clock import FakeClock
from etcdsched.scheduler.backpressure import FiringBrake
from etcdsched.scheduler.firing import GRANULE_MAX_MS, PartitionFirer
from etcdsched.scheduler.overlap import active_runs_cache
from etcdsched.scheduler.ownership import Ownership
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.session import Session

P = 1
LOOKAHEAD_MS = 2000


def _at(slot_ms: int) -> JobSpec:
    return JobSpec.model_validate(
        {"trigger": {"kind": "at", "at": ms_to_utc(slot_ms)}, "execution": {"argv": ["true"]}}
    )


async def test_fires_a_quarter_lookahead_at_a_time(store: EtcdStore, keys: Keys) -> None:
    clock = FakeClock()
    t0 = clock.now_ms()
    jobs = JobService(store, keys, clock, P)
    for offset in (3000, 3400, 4900, 5500):
        await jobs.create(_at(t0 + offset), f"at-{offset}")
    active = active_runs_cache(store, clock, keys, 0)
    owner = Ownership(store, keys, "x")
    firer = PartitionFirer(0, store, keys, clock, owner, active, P, LOOKAHEAD_MS, 60_000, 16)
    await firer.due.relist()

    def ready(at_ms: int) -> list[str]:
        return [keys.parse_due(kv.key).job_id for kv in firer.ready_entries(at_ms)]

    def at(offset: int) -> str:
        return f"default:at-{offset}"

    # the earliest (t0+3000) is not yet within lookahead - granule (1500 ms)
    assert ready(t0 + 1000) == []
    assert ready(t0 + 1499) == []
    # once it is, everything within the whole lookahead goes together
    assert ready(t0 + 1500) == [at(3000), at(3400)]
    # what is left waits for its own turn, and the lookahead still bounds the batch
    firer.due.discard(keys.due(0, t0 + 3000, at(3000)))
    firer.due.discard(keys.due(0, t0 + 3400, at(3400)))
    assert ready(t0 + 3399) == []
    assert ready(t0 + 3400) == [at(4900)]
    assert ready(t0 + 3600) == [at(4900), at(5500)]


async def test_a_long_lookahead_still_fires_within_half_a_second(
    store: EtcdStore, keys: Keys
) -> None:
    """A burst staged ten minutes ahead must not wait 2.5 minutes to start firing."""
    clock = FakeClock()
    t0 = clock.now_ms()
    await JobService(store, keys, clock, P).create(_at(t0 + 600_000), "staged")
    active = active_runs_cache(store, clock, keys, 0)
    owner = Ownership(store, keys, "x")
    firer = PartitionFirer(0, store, keys, clock, owner, active, P, 600_000, 900_000, 16)
    await firer.due.relist()
    assert firer.granule_ms == GRANULE_MAX_MS
    assert firer.ready_entries(t0 + 499) == []
    staged = keys.due(0, t0 + 600_000, "default:staged")
    assert [kv.key for kv in firer.ready_entries(t0 + 500)] == [staged]


async def test_a_held_brake_stops_firing_between_batches(store: EtcdStore, keys: Keys) -> None:
    """Placement behind: nothing fires, the entries stay; released: they fire."""
    clock = FakeClock()
    t0 = clock.now_ms()
    jobs = JobService(store, keys, clock, P)
    for offset in (100, 200):
        await jobs.create(_at(t0 + offset), f"at-{offset}")
    backlog = [BACKLOG_LIMIT]
    brake = FiringBrake(lambda: backlog[0], clock)
    active = active_runs_cache(store, clock, keys, 0)
    owner = Ownership(store, keys, "x")
    session = await Session.open(store, clock, ttl=10)
    try:
        assert await owner.acquire(0, session, t0)
        firer = PartitionFirer(
            0, store, keys, clock, owner, active, P, LOOKAHEAD_MS, 60_000, 16, brake=brake
        )
        await firer.due.relist()
        await active.relist()
        assert await firer.fire_due(t0) is False
        assert len(firer.due.items) == 2 and firer.stats.fired == 0
        backlog[0] = 0
        assert await firer.fire_due(t0) is True
        assert firer.stats.fired == 2 and not firer.due.items
    finally:
        await session.close()
