"""The firing brake: fired runs placement has not looked at are counted per
partition, and firing waits while there are too many of them."""

from __future__ import annotations

import asyncio
import logging

import pytest

from etcdsched.runtime.clock import FakeClock
from etcdsched.scheduler.backpressure import LOG_EVERY_S, FiringBrake, NoBrake
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Event
from tests.unit.test_placer_queue import fired, placer, queued

K = Keys("/t/")


def test_fired_runs_count_until_placement_looks_or_they_leave_the_queue() -> None:
    p = placer()
    keys = [queued(p, f"j{i}@00000000000100", 100, i + 1) for i in range(3)]
    for i, key in enumerate(keys):
        fired(p, key, f"j{i}@00000000000100")
    assert p.unexamined == 3
    p.take_fired(keys[0])  # placement looked at it
    assert p.unexamined == 2
    p._on_queue_event(Event("delete", KV(keys[1], b"", 0, 9, 0)))  # cancelled, or placed
    assert p.unexamined == 1


def test_a_run_placement_reads_from_etcd_counts_as_looked_at_too() -> None:
    p = placer()
    key = queued(p, "j@00000000000100", 100, 1)
    fired(p, key, "j@00000000000100")
    p._fired.clear()  # past the memo: placement will read it instead
    assert p.take_fired(key) is None and p.unexamined == 0


def test_runs_whose_queue_entries_never_showed_stop_counting() -> None:
    p = placer()
    for i in range(100):
        key = K.queue(3, 0, 100, f"j{i}@00000000000100")
        fired(p, key, f"j{i}@00000000000100")  # put and delete both missed by the cache
    p.queue.revision = 8  # a re-list after them (they were fired at revision 7)
    list(p.ready_keys(1000))
    assert p.unexamined == 0


def test_runs_fired_after_the_caches_revision_still_count() -> None:
    p = placer()
    fired(p, K.queue(3, 0, 100, "j@00000000000100"), "j@00000000000100")  # at revision 7
    p.queue.revision = 6  # its queue entry's put is still on its way
    list(p.ready_keys(1000))
    assert p.unexamined == 1


def test_the_brake_engages_at_the_limit() -> None:
    backlog = [5]
    brake = FiringBrake(lambda: backlog[0], FakeClock(0), limit=5)
    assert brake.engaged()
    backlog[0] = 4
    assert not brake.engaged()
    assert not NoBrake().engaged()


async def test_a_held_firer_goes_on_once_placement_pokes() -> None:
    backlog = [10]
    brake = FiringBrake(lambda: backlog[0], FakeClock(0), limit=5)
    held = asyncio.create_task(brake.released())
    await asyncio.sleep(0.01)
    assert not held.done()
    brake.poke()  # placement looked, still behind
    await asyncio.sleep(0.01)
    assert not held.done()
    backlog[0] = 0
    brake.poke()
    await asyncio.wait_for(held, 1)


async def test_holds_are_logged_at_once_then_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, backlog = FakeClock(0), [0]
    brake = FiringBrake(lambda: backlog[0], clock, limit=1)

    async def hold_once() -> None:
        backlog[0] = 1
        held = asyncio.create_task(brake.released())
        await asyncio.sleep(0)
        backlog[0] = 0
        brake.poke()
        await asyncio.wait_for(held, 1)

    with caplog.at_level(logging.WARNING, logger="etcdsched.scheduler.backpressure"):
        await hold_once()
        await hold_once()
        await clock.advance(LOG_EVERY_S)
        await hold_once()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("firing held 1 time(s): 1 fired runs wait unread")
    assert lines[1].startswith("firing held 2 time(s) in the last 60 s")
