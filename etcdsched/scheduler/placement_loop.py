"""One placement loop per scheduler, over every partition it owns.

A pass merges the partitions' queues in queue order (priority, then
not-before; the same order across partitions, so a high-priority run in one
partition never waits behind a low-priority one in another), reads the runs
at the head — only as many as the workers have free slots, in one read per
chunk — chooses a worker for each against views that count this pass's
choices, and hands them to the workers' batchers. One pass per change of the
queues or of the workers' assignments: with a loop per partition, every
finished run woke all of them and each re-read the head of its own queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Callable, Iterator

from etcdsched.model.codec import CorruptRecord
from etcdsched.model.errors import EtcdschedError, OwnershipLost
from etcdsched.model.placement import WorkerView
from etcdsched.model.records import RunRecord, WorkerMember
from etcdsched.runtime.clock import Clock
from etcdsched.scheduler.assigner import ASSIGNED, Assigner
from etcdsched.scheduler.backpressure import FiringBrake
from etcdsched.scheduler.capacity import CapacityIndex
from etcdsched.scheduler.placer import PartitionPlacer
from etcdsched.store.cache import ChangeSignal, PrefixCache, Seen, versions, wait_any_change
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Ops, Store, Versioned

log = logging.getLogger(__name__)
READ_BATCH = 100
"""Queued runs read per request (one read-only transaction)."""
IDLE_WAIT = 1.0
GATHER_S = 0.05
"""After a wake, wait this long before the pass so that runs fired or
freed close together are placed in one transaction per worker: below
saturation each pass otherwise placed a run or two, and a run cost about
four etcd transactions (docs/adr/0020-benchmark-history.md). Runs are fired 1.5-2 s ahead
of their instant, so the wait does not reach start lag."""
URGENT_MS = 1000
"""No gathering wait when a run queued since the last pass is due sooner
than this (run-now triggers, short retry backoffs, a lookahead of 0)."""
QUEUED_WAIT = 0.25
"""Runs are queued but none could be placed: look again this soon even
without a change (a retry's not-before comes within the lookahead)."""


class PlacementLoop:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        clock: Clock,
        placers: Callable[[], list[PartitionPlacer]],
        workers: PrefixCache,
        assignments: PrefixCache,
        capacity: CapacityIndex,
        assigner: Assigner,
        lookahead_ms: int,
        backlog_limit: int,
    ) -> None:
        """``backlog_limit``: see :class:`~etcdsched.scheduler.backpressure.FiringBrake`."""
        self.store = store
        self.keys = keys
        self.clock = clock
        self.placers = placers
        self.workers = workers
        self.assignments = assignments
        self.capacity = capacity
        self.assigner = assigner
        self.lead_ms: Callable[[], int] = lambda: lookahead_ms
        """How far ahead runs are placed: the scheduler's staging lead."""
        self.queues_changed = ChangeSignal()
        """Bumped by every partition's queue cache (the scheduler wires it)."""
        self._members: dict[str, tuple[int, WorkerMember]] = {}
        self._live: set[str] = set()
        self._inflight: set[str] = set()
        """Queue keys handed to a batcher and not yet decided: a pass does
        not wait for its writes, and the next one must not read them again."""
        self.passes = 0
        self.backlogged = False
        """The last pass left ready runs waiting for room."""
        self.brake = FiringBrake(self.unexamined, clock, backlog_limit)
        """Holds the scheduler's firing while fired runs pile up unread."""

    async def run(self) -> None:
        await self.workers.ready.wait()
        await self.assignments.ready.wait()
        while True:
            seen = versions(self.queues_changed, self.workers, self.assignments)
            wait_s = IDLE_WAIT
            try:
                wait_s = await self.place_once(self.clock.now_ms())
            except EtcdschedError as exc:
                log.warning("placement: %s", exc)
            except Exception:  # one bad pass must not end placement for good
                log.exception("placement pass failed")
            await wait_any_change(seen, wait_s)
            await self.clock.sleep(self._gather_wait_s(seen))

    def _gather_wait_s(self, seen: Seen) -> float:
        """Gather only after a change: a wake by the timer comes when a
        queued run enters the lookahead, and with a short lookahead a
        wait would be start lag. Every placer is asked on every wake, so
        that what it reports is always what was queued since the last pass."""
        soonest = [t for p in self.placers() if (t := p.take_soonest_new()) is not None]
        if all(signal.version == version for signal, version in seen):
            return 0.0
        return gather_wait_s(min(soonest, default=None), self.clock.now_ms())

    def worker_views(self) -> dict[str, WorkerView]:
        """Every live worker with what is placed on it, as of the
        assignments cache's revision and this scheduler's own newer writes;
        member records are decoded again only when they changed."""
        views, memo = {}, {}
        revision = self.assignments.revision
        for kv in self.workers.items.values():
            known = self._members.get(kv.key)
            member = known[1] if known and known[0] == kv.mod_revision else None
            if member is None:
                member = kv.decode(WorkerMember).value
            memo[kv.key] = (kv.mod_revision, member)
            runs, used = self.capacity.runs(member.id), self.capacity.used(member.id)
            view = WorkerView(member, runs, revision, used)
            views[member.id] = self.assigner.fresher(view)
        self._members = memo
        return views

    def may_place_at_fire(self) -> bool:
        """Runs may be fired straight onto workers (ADR 0016): the worker
        caches are loaded, and no run waits for placement: none fired that
        a pass has not looked at, none left waiting for room by the last
        pass. A run waiting for room keeps its turn (see ``etcdsched.scheduler.direct_fire``)."""
        loaded = self.workers.ready.is_set() and self.assignments.ready.is_set()
        return loaded and not self.backlogged and not self.unexamined()

    def unexamined(self) -> int:
        """Runs this scheduler fired that no pass has looked at yet."""
        return sum(p.unexamined for p in self.placers())

    async def place_once(self, now_ms: int) -> float:
        """One pass; returns how long to wait for a change before the next
        (a run waiting for room, or a not-before coming into the lookahead)."""
        self.passes += 1
        placers = {p.partition: p for p in self.placers() if p.ready}
        views = self.worker_views()
        if self._live - views.keys():
            await self.assigner.forget(set(views))  # batchers of workers that left
        self._live = set(views)
        limit = now_ms + self.lead_ms()
        heads = heapq.merge(*(p.ready_keys(limit) for p in placers.values()))
        waiting = await self._place_heads(placers, heads, views, now_ms)
        self.backlogged = waiting
        if waiting:  # no room for the rest: read only what a deadline may end
            expiring = _deadline_chunk(placers, now_ms, limit, self._inflight)
            for placer, current in await self._read(placers, expiring):
                await self._consider(placer, current, views, now_ms)
        return QUEUED_WAIT if waiting else self._until_next(placers, now_ms)

    async def _place_heads(
        self,
        placers: dict[int, PartitionPlacer],
        heads: Iterator[tuple[str, int, str]],
        views: dict[str, WorkerView],
        now_ms: int,
    ) -> bool:
        """Place from the head of the merged queues while workers have room;
        True when ready runs are left waiting for room."""
        fresh = ((part, key) for _, part, key in heads if key not in self._inflight)
        while free := _free_slots(views):
            chunk = list(itertools.islice(fresh, min(free, READ_BATCH)))
            if not chunk:
                return False
            for placer, current in await self._read(placers, chunk):
                await self._consider(placer, current, views, now_ms)
            self.brake.poke()
            # runs this scheduler fired need no read: without this a pass
            # could hold the loop for its whole length and starve firing
            await asyncio.sleep(0)
        return next(fresh, None) is not None

    def _until_next(self, placers: dict[int, PartitionPlacer], now_ms: int) -> float:
        """Until the earliest queued not-before enters the lookahead; runs
        already inside it that could not be placed (upstream, ``queue_one``,
        no fitting worker) wait for a change of the queues or assignments."""
        limit = now_ms + self.lead_ms()
        later = (p.earliest_after(limit) for p in placers.values())
        earliest = min((t for t in later if t is not None), default=None)
        if earliest is None:
            return IDLE_WAIT
        return min(IDLE_WAIT, max(0.01, (earliest - limit) / 1000))

    async def _consider(
        self,
        placer: PartitionPlacer,
        current: Versioned[RunRecord],
        views: dict[str, WorkerView],
        now_ms: int,
    ) -> None:
        try:
            worker = await placer.placeable(current, views, now_ms)
        except OwnershipLost:
            return  # the partition moved on: its new owner places the run
        if worker is None:
            return
        run = current.value
        views[worker.member.id] = worker.with_run(run.id, run.spec.resources)
        key = run.queue_key or ""
        self._inflight.add(key)
        task = asyncio.ensure_future(placer.submit(current, worker, now_ms))
        task.add_done_callback(lambda done: self._decided(key, done))

    def _decided(self, queue_key: str, task: asyncio.Task[str]) -> None:
        self._inflight.discard(queue_key)
        failed = task.cancelled() or task.exception() is not None
        if failed or task.result() != ASSIGNED:
            self.queues_changed.notify()  # look at it again soon

    async def _read(
        self, placers: dict[int, PartitionPlacer], chunk: list[tuple[int, str]]
    ) -> list[tuple[PartitionPlacer, Versioned[RunRecord]]]:
        """The runs behind the chunk's queue keys, in its order: those this
        scheduler fired as it stored them, the others in one read-only
        transaction; stale queue entries are removed by their partition."""
        known = [placers[partition].take_fired(key) for partition, key in chunk]
        unknown = [item for item, run in zip(chunk, known, strict=True) if run is None]
        read = iter(await self._read_stored(placers, unknown))
        found = []
        for (partition, _), run in zip(chunk, known, strict=True):
            current = run if run is not None else next(read)
            if current is not None:
                found.append((placers[partition], current))
        return found

    async def _read_stored(
        self, placers: dict[int, PartitionPlacer], chunk: list[tuple[int, str]]
    ) -> list[Versioned[RunRecord] | None]:
        """One answer per chunk item, in one read-only transaction: the run,
        or None (its queue entry was stale, and is dropped; or it is corrupt)."""
        if not chunk:
            return []
        run_keys = [self.keys.run(self.keys.parse_queue(key).run_id) for _, key in chunk]
        result = await self.store.txn([], [Ops.get(k) for k in run_keys])
        found: list[Versioned[RunRecord] | None] = []
        for (partition, key), kvs in zip(chunk, result.responses, strict=True):
            placer = placers[partition]
            try:
                current = placer.check_read(key, kvs)
            except CorruptRecord as exc:
                log.error("queued run left alone: %s", exc)  # never blocks the others
                found.append(None)
                continue
            if current is None:
                with contextlib.suppress(OwnershipLost):
                    await placer.drop_queue_key(key)
            found.append(current)
        return found


def _free_slots(views: dict[str, WorkerView]) -> int:
    return sum(v.free().slots for v in views.values() if not v.member.draining)


def _deadline_chunk(
    placers: dict[int, PartitionPlacer], now_ms: int, limit_ms: int, inflight: set[str]
) -> list[tuple[int, str]]:
    keys = (
        (p.partition, k)
        for p in placers.values()
        for k in p.deadline_keys(now_ms, limit_ms)
        if k not in inflight
    )
    return list(itertools.islice(keys, READ_BATCH))


def gather_wait_s(soonest_new_ms: int | None, now_ms: int) -> float:
    """How long the placement loop waits after a wake before its pass:
    :data:`GATHER_S`, or nothing when a newly queued run is due within
    :data:`URGENT_MS`. A run queued during the wait itself may still wait
    out the rest of it (at most ``GATHER_S``)."""
    if soonest_new_ms is not None and soonest_new_ms - now_ms < URGENT_MS:
        return 0.0
    return GATHER_S
