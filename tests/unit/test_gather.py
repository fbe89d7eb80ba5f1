"""Gathering windows (ADR 0012): who waits, and who is released together."""

from __future__ import annotations

import asyncio
from typing import cast

from etcdsched.config import Config
from etcdsched.logs.store import LogStore
from etcdsched.model.records import Assignment
from etcdsched.model.spec import Resources
from etcdsched.runtime.clock import FakeClock
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Store, StoreStats
from etcdsched.worker.executor import NoopExecutor
from etcdsched.worker.gather import GatherWindow
from etcdsched.worker.running import Running
from etcdsched.worker.service import WorkerService


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_callers_within_a_window_are_released_together() -> None:
    clock = FakeClock(start_ms=0)
    window = GatherWindow(clock, 0.05)
    released: list[tuple[str, int]] = []

    async def caller(name: str) -> None:
        await window.wait()
        released.append((name, clock.now_ms()))

    first = asyncio.create_task(caller("first"))
    await _settle()
    await clock.advance(0.03)
    second = asyncio.create_task(caller("second"))
    await _settle()
    assert released == [] and clock.sleepers == 1  # one window, not one per caller
    await clock.advance(0.02)
    await asyncio.gather(first, second)
    assert released == [("first", 50), ("second", 50)]

    late = asyncio.create_task(caller("late"))  # the window closed: a new one opens
    await _settle()
    assert clock.sleepers == 1
    await clock.advance(0.05)
    await late
    assert released[-1] == ("late", 100)


class _Unused:
    """Stands in for a store the test never reaches (only its stats are read)."""

    stats = StoreStats()


def _worker(slots: int, cpu: float = 0.0) -> WorkerService:
    config = Config(member_id="w1", worker_slots=slots, worker_cpu=cpu)
    return WorkerService(
        config,
        cast(Store, _Unused()),
        Keys("/t/"),
        FakeClock(),
        NoopExecutor(),
        cast(LogStore, None),
    )


def _hold(worker: WorkerService, run_id: str, need: Resources) -> None:
    assignment = Assignment(run_id=run_id, attempt=1, not_before_ms=0, resources=need)
    worker.running[run_id] = Running(assignment, cast(asyncio.Task[None], None), 1)


def test_a_report_waits_only_while_the_worker_has_room_for_another_run_like_it() -> None:
    one = Resources(slots=1)
    worker = _worker(slots=2)
    _hold(worker, "r1", one)
    assert worker.report_may_wait(one)  # room for one more
    _hold(worker, "r2", one)
    assert not worker.report_may_wait(one)  # full: a queued run may wait on this report

    busy = _worker(slots=100, cpu=2.0)
    half = Resources(slots=1, cpu=1.5)
    _hold(busy, "r1", half)
    assert not busy.report_may_wait(half)  # slots to spare, but not cpu


def test_the_running_total_follows_attempts_as_they_come_replace_and_go() -> None:
    one, two = Resources(slots=1), Resources(slots=2)
    worker = _worker(slots=2)
    _hold(worker, "r1", one)
    _hold(worker, "r1", two)  # a new attempt of the same run replaces the old one
    assert worker.running.used.slots == 2 and not worker.report_may_wait(one)
    del worker.running["r1"]
    assert worker.running.used.slots == 0 and worker.report_may_wait(two)
    _hold(worker, "r2", one)
    worker.running.clear()
    assert worker.running.used.slots == 0
