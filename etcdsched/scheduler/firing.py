"""Firing the due slots of one owned partition.

The partition's due entries up to a horizon live in memory (listed, then
watched, re-listed as the horizon moves). Entries due within the lookahead
are fired in batches, a granule's worth at a time (see ``GRANULE_MAX_MS``):
one transaction per batch whose compares are, per entry, *the due entry is
unchanged* (``mod`` of its key), *the job is the version the entry was
computed from* (``version`` of the job key), *the run does not exist*
(``create_revision == 0``) and, for overlap ``skip``, *the job has no active
run* (empty ``active/<pp>/<job>/``); plus once per batch *we still own the
partition* (owner key ``create_revision`` = our token). When a batch fails,
entries are retried one by one against fresh reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator

from etcdsched.model.codec import encode
from etcdsched.model.errors import OutcomeUnknown, StoreRejected
from etcdsched.model.planning import PlannedRun, plan_fire
from etcdsched.model.records import ActivePointer, DueEntry, RunRecord, SkipRecord
from etcdsched.model.triggers import WATCH_SLOT
from etcdsched.runtime.clock import Clock
from etcdsched.runtime.metrics import FIRES, SKIPPED_SLOTS
from etcdsched.scheduler.assign_requests import ASSIGNED, FULL, GONE
from etcdsched.scheduler.backpressure import FiringBrake, NoBrake
from etcdsched.scheduler.direct_fire import DirectFiring, DirectPlacement
from etcdsched.scheduler.fire_order import FireOrder
from etcdsched.scheduler.firing_conflicts import ConflictResolution, EntryWrite, FireStats
from etcdsched.scheduler.overlap import ActiveByJob, overlap_skip, overlap_verdict
from etcdsched.scheduler.ownership import Ownership
from etcdsched.store.cache import PrefixCache
from etcdsched.store.horizon_cache import HorizonCache
from etcdsched.store.keys import SLOT_WIDTH, Keys
from etcdsched.store.kv import KV, MAX_TXN_OPS, Cmp, Compare, Op, Ops, Store, Versioned
from etcdsched.store.runs import CREATE_OPS, RunOps, RunOrigin, new_run

log = logging.getLogger(__name__)
FIRST_FIRED_SLOT = WATCH_SLOT + 1
"""Slots up to ``WATCH_SLOT`` are ``after`` jobs' watch entries, not fired."""
END_OF_SLOTS = 10**SLOT_WIDTH
HORIZON_STEP_S = 1.0
"""The horizon moves this often, by listing the second it newly covers."""
RELIST_EVERY_S = 900.0
"""A whole listing of the horizon this often, should a watch lag unseen.
Not often: with a herd in the horizon it reads every entry again (a
million at midnight: a gigabyte, and etcd stalled long enough for a
worker's lease renewal to time out)."""
PASS_BATCHES = 32
"""A pass over a backlog orders and fires at most this many batches, so
ordering a herd of thousands per partition is not redone in full for every
pass; the next pass takes the next ones."""
GRANULE_PART = 4
GRANULE_MAX_MS = 500
"""A partition fires once its earliest entry is within ``lookahead -
granule`` of now, and then everything within the whole lookahead, where the
granule is a quarter of the lookahead but at most half a second: slots
spread evenly over time go out in batches of a granule's worth instead of
one transaction each (see ``ready_entries``), and a long lookahead (a burst
staged minutes ahead) still starts firing as soon as it is due to."""


class PartitionFirer(ConflictResolution):
    def __init__(
        self,
        partition: int,
        store: Store,
        keys: Keys,
        clock: Clock,
        ownership: Ownership,
        active: PrefixCache,
        partitions: int,
        lookahead_ms: int,
        horizon_ms: int,
        batch: int,
        gate: asyncio.Semaphore | None = None,
        brake: FiringBrake | None = None,
        direct: DirectPlacement | None = None,
        lead: Callable[[], int] | None = None,
        runs: RunOps | None = None,
    ) -> None:
        """``gate`` and ``brake`` are shared by a scheduler's partitions (see
        :meth:`fire_due`); with ``direct``, runs are fired straight onto
        workers with room where they may be (ADR 0016); ``lead`` says how
        far ahead to fire now (``etcdsched.scheduler.staging``), at least
        the lookahead. ``runs`` writes the runs (the scheduler's, with its
        webhook outbox)."""
        self._lead = lead or (lambda: lookahead_ms)
        self._profile: tuple[int, Counter[int]] = (-1, Counter())
        self.direct = direct
        self.partition = partition
        self.gate = gate or asyncio.Semaphore(1)
        self.brake = brake or NoBrake()
        self.store = store
        self.keys = keys
        self.watch_end = keys.due_until(partition, WATCH_SLOT)
        """Due keys below this are ``after`` jobs waiting for their upstream
        runs (``etcdsched.scheduler.after_watch``): never fired as they are."""
        self.clock = clock
        self.ownership = ownership
        self.active = active
        self.partitions = partitions
        self.granule_ms = min(lookahead_ms // GRANULE_PART, GRANULE_MAX_MS)
        self.horizon_ms = horizon_ms
        self.batch = batch
        self.runs = runs or RunOps(keys)
        self.stats = FireStats()
        self._horizon_until = 0
        self._horizon_key = keys.due_prefix(partition)
        self._slot_at = len(self._horizon_key)
        self.due = HorizonCache(
            store,
            clock,
            keys.due_prefix(partition),
            horizon_end=self._horizon_end,
            keep=self._within_horizon,
            extend_every=HORIZON_STEP_S,
            relist_every=RELIST_EVERY_S,
            group_by=self._slot_of,
        )
        """Grouped by slot: the herd is counted, and the earliest slot
        found, per distinct slot rather than per entry (a million entries
        at one instant are one group)."""
        self.order = FireOrder(self.due, self._slot_of, FIRST_FIRED_SLOT)
        """Earliest start, then highest priority, first (``fire_order``)."""
        self.due.on_put = self.order.on_put
        self.cancel_requests: list[tuple[str, int]] = []
        """(run, when) to cancel: superseded by a ``cancel_previous`` run."""
        self._written: dict[str, tuple[int, DueEntry]] = {}
        """Due entries this firer wrote, by key, with the revision they have."""
        self.on_fired: Callable[[Versioned[RunRecord]], None] = lambda run: None
        """Told each run this firer created, as stored (the placer then need
        not read it back)."""

    def _horizon_end(self) -> str:
        """Called at each listing and extension: move the horizon forward."""
        # never backwards (a clock stepped back): keys past a shrunk end would
        # be refused by ``keep`` and never listed again until a whole re-list
        self._horizon_until = max(self._horizon_until, self.clock.now_ms() + self.horizon_ms)
        self._horizon_key = self.keys.due_until(self.partition, self._horizon_until)
        return self._horizon_key

    def _slot_of(self, key: str) -> str:
        """The slot of a due key, as in the key (ordered as strings)."""
        return key[self._slot_at : self._slot_at + SLOT_WIDTH]

    def _within_horizon(self, key: str) -> bool:
        return key < self._horizon_key

    def _slots(self, start: int, end: int) -> Iterator[str]:
        """The held slots (as in the key) in ``[start, end)``."""
        low, high = f"{start:0{SLOT_WIDTH}d}", f"{end:0{SLOT_WIDTH}d}"
        return (slot for slot in self.due.group_names() if low <= slot < high)

    def _entries(self, slots: Iterator[str]) -> list[KV]:
        return [kv for slot in slots for kv in self.due.group(slot).values()]

    # -- one step ----------------------------------------------------------
    def ready_entries(self, now_ms: int) -> list[KV]:
        """Due entries to fire now, in fire order (``FireOrder``), at most
        ``PASS_BATCHES`` batches: none until the earliest is within
        ``lookahead - granule`` of now, then every entry within the
        lookahead. With slots spread evenly over time, firing each as it
        entered the lookahead cost a transaction per slot (and most of the
        scheduler's CPU at a thousand slots a second); a slot still goes out
        at least ``lookahead - granule`` ahead."""
        earliest = self.earliest_ms()
        lead_ms = self._lead()
        if earliest is None or earliest > now_ms + lead_ms - self.granule_ms:
            return []
        return self.order.take(now_ms + lead_ms, self.batch * PASS_BATCHES)

    def herd_profile(self, now_ms: int) -> Counter[int]:
        """The due entries held (up to the horizon) by whole seconds from
        now, for the staging lead; counted at most once a second (a walk
        over every entry, which a herd makes many)."""
        second = now_ms // 1000
        if self._profile[0] != second:
            # a second stale by the time it is read: count each slot a second nearer
            profile: Counter[int] = Counter()
            for slot in self._slots(FIRST_FIRED_SLOT, END_OF_SLOTS):
                profile[(int(slot) - now_ms) // 1000 - 1] += len(self.due.group(slot))
            self._profile = (second, profile)
        return self._profile[1]

    def earliest_ms(self) -> int | None:
        """The earliest slot to fire (``after`` jobs' watch entries aside)."""
        earliest = min(self._slots(FIRST_FIRED_SLOT, END_OF_SLOTS), default=None)
        return None if earliest is None else int(earliest)

    def watch_entries(self) -> list[KV]:
        """The ``after`` jobs of the partition waiting for upstream runs."""
        return self._entries(self._slots(0, FIRST_FIRED_SLOT))

    async def fire_due(self, now_ms: int) -> bool:
        """Fire the ready entries; False when the brake stopped it first.
        Each batch is built and committed while holding the scheduler's
        firing gate: 64 partitions building batches in one event-loop turn
        made each turn take over a second under load, and placement, which
        needs a turn per step, all but stopped. The brake is engaged while
        placement is behind (``etcdsched.scheduler.backpressure``); the entries left
        stay in the cache for the next call."""
        ready = self.ready_entries(now_ms)
        chunks = self._chunks(ready, now_ms, self._active_by_job())
        while True:
            async with self.gate:
                if self.brake.engaged():
                    return False
                chunk = next(chunks, None)
                if chunk is None:
                    return True
                await self._commit(chunk, now_ms)

    def _chunks(
        self, ready: list[KV], now_ms: int, active_by_job: ActiveByJob
    ) -> Iterator[list[tuple[KV, EntryWrite]]]:
        """The ready entries' writes in batches that fit one transaction."""
        chunk: list[tuple[KV, EntryWrite]] = []
        size = 0
        jobs_in_chunk: set[str] = set()
        for kv in ready:
            write = self._entry_write(kv, now_ms, active_by_job)
            weight = max(CREATE_OPS * len(write.unqueued) + len(write.ops), len(write.compares))
            job_id = self.keys.parse_due(kv.key).job_id
            full = size + weight > MAX_TXN_OPS or len(chunk) >= self.batch
            if chunk and (full or job_id in jobs_in_chunk):
                # a stale duplicate entry of one job must not share a txn
                # with the current one: etcd refuses duplicate keys in a txn
                yield chunk
                chunk, size = [], 0
                jobs_in_chunk.clear()
            chunk.append((kv, write))
            jobs_in_chunk.add(job_id)
            size += weight
        if chunk:
            yield chunk

    def _active_by_job(self) -> ActiveByJob:
        """The active runs of the jobs about to fire, decoded on first use:
        only jobs whose overlap policy is not ``allow`` ask (with a backlog,
        decoding every job's pointers on every pass was most of the CPU)."""

        def decode(job_id: str) -> list[ActivePointer]:
            return [p.decode(ActivePointer).value for p in self.active.group(job_id).values()]

        return ActiveByJob(decode)

    def _entry_write(
        self,
        kv: KV,
        now_ms: int,
        active_by_job: dict[str, list[ActivePointer]],
        existing: frozenset[int] = frozenset(),
    ) -> EntryWrite:
        """The write that fires ``kv``; planned runs whose slot is in
        ``existing`` already have a run (a backfill made it) and are left out."""
        entry = self._entry_of(kv)
        plan = plan_fire(entry, now_ms)
        job_key = self.keys.job(entry.job_id)
        write = EntryWrite(
            self.runs,
            compares=[
                Compare(kv.key, "mod", "==", kv.mod_revision),
                Compare(job_key, "version", "==", entry.job_key_version),
            ],
        )
        allow = entry.spec.overlap == "allow"
        active = [] if allow else list(active_by_job[entry.job_id])
        planned = [p for p in plan.runs if p.slot_ms not in existing]
        skips = [*plan.skips, *self._add_runs(write, entry, planned, now_ms, active)]
        write.ops += [Ops.put(self.keys.skip(s.job_id, s.first_slot_ms), s) for s in skips]
        write.ops += self.runs.outbox.skip_ops(entry.spec, self.partition, skips)
        write.skips = skips
        self.stats.skipped += sum(s.count for s in skips)
        write.ops += self._due_ops(kv, entry, plan.next_entry, write)
        return write

    def _add_runs(
        self,
        write: EntryWrite,
        entry: DueEntry,
        planned: list[PlannedRun],
        now_ms: int,
        active: list[ActivePointer],
    ) -> list[SkipRecord]:
        """Add the planned runs to ``write`` as the overlap policy allows;
        returns the skip records of the slots it refused."""
        origin = RunOrigin(entry.job_id, entry.spec, entry.job_version)
        skips = []
        for slot in planned:
            run = new_run(
                origin,
                slot.slot_ms,
                now_ms,
                self.partitions,
                coalesced=slot.coalesced,
                reason=slot.reason,
                created_by=self.ownership.signature,
            )
            verdict = overlap_verdict(entry, active)
            if verdict == "skip":
                skips.append(overlap_skip(entry, slot.slot_ms, now_ms))
                continue
            write.unqueued.append(run)
            compares = [Cmp.absent(self.keys.run(run.id))]  # a slot becomes at most one run
            if entry.spec.overlap == "skip":
                prefix = self.keys.active_prefix(self.partition, entry.job_id)
                compares.append(Cmp.prefix_empty(prefix))
            if verdict == "cancel":
                write.cancel_after += [(p.run_id, run.not_before_ms) for p in active]
            write.compares += compares
            active.append(ActivePointer(run_id=run.id))
        return skips

    def _entry_of(self, kv: KV) -> DueEntry:
        """The entry behind ``kv``: the one this firer wrote if the key
        still holds that revision, else decoded (a due entry carries the
        job's whole spec; decoding it was a third of building a batch)."""
        revision, entry = self._written.pop(kv.key, (0, None))
        if entry is not None and revision == kv.mod_revision:
            return entry
        if len(self._written) > 2 * len(self.due.items) + 64:  # entries deleted unfired
            self._written = {k: v for k, v in self._written.items() if k in self.due.items}
        return kv.decode(DueEntry).value

    def _due_ops(
        self, kv: KV, entry: DueEntry, nxt: DueEntry | None, write: EntryWrite
    ) -> list[Op]:
        pointer = self.keys.due_pointer(entry.job_id)
        ops = [Ops.delete(kv.key)]
        if nxt is None:
            return [*ops, Ops.delete(pointer)]
        next_key = self.keys.due(self.partition, nxt.slot_ms, nxt.job_id)
        data = encode(nxt)
        write.next_kv = (next_key, data, nxt)
        return [*ops, Ops.put(next_key, data), Ops.put(pointer, data)]

    # -- committing ----------------------------------------------------------
    async def _commit(self, chunk: list[tuple[KV, EntryWrite]], now_ms: int) -> None:
        """Fire the entries that may go straight onto a worker through that
        worker's batcher, and the others into the queue, both at once."""
        guard = self.ownership.guard(self.partition)
        sent = self.direct.fire(chunk, self.partition, guard, now_ms) if self.direct else []
        if not sent:
            await self._commit_queued(chunk, now_ms)
            return
        indexes = {index for index, _, _ in sent}
        queued = [item for index, item in enumerate(chunk) if index not in indexes]
        try:
            if queued:
                await self._commit_queued(queued, now_ms)
        except BaseException:
            for _, _, task in sent:
                task.cancel()
            raise
        await self._settle_direct(chunk, sent, now_ms)

    async def _settle_direct(
        self, chunk: list[tuple[KV, EntryWrite]], sent: DirectFiring, now_ms: int
    ) -> None:
        """Reflect the runs placed at firing; an entry whose worker was full
        or gone fires into the queue, one whose outcome is not known (a
        compare failed, the write timed out) is re-read and fired alone."""
        outcomes = await asyncio.gather(*(task for _, _, task in sent), return_exceptions=True)
        queued, unsure = [], []
        for (index, request, _), outcome in zip(sent, outcomes, strict=True):
            kv, write = chunk[index]
            if outcome == ASSIGNED and request.stored is not None:
                write.placed = [request.stored]
                self._applied([(kv, write)], request.revision)
                self.stats.direct += 1
            elif outcome in (FULL, GONE):
                queued.append((kv, write))
            else:
                if isinstance(outcome, asyncio.CancelledError):  # the worker left
                    log.info("firing %s onto a worker: its batcher was closed", kv.key)
                elif isinstance(outcome, BaseException):
                    log.warning("firing %s onto a worker: %r", kv.key, outcome)
                unsure.append((kv, write))
        if queued:
            await self._commit_queued(queued, now_ms)
        if unsure:
            await self._one_by_one(unsure, now_ms)

    async def _commit_queued(self, chunk: list[tuple[KV, EntryWrite]], now_ms: int) -> None:
        guard = self.ownership.guard(self.partition)
        compares = [guard] + [c for _, w in chunk for c in w.compares]
        ops = [o for _, w in chunk for o in w.all_ops]
        self.stats.batches += 1
        try:
            result = await self.store.txn(compares, ops, [Ops.get(guard.key)])
        except OutcomeUnknown:
            await self._one_by_one(chunk, now_ms)
            return
        except StoreRejected:
            if len(chunk) == 1:
                raise
            await self._one_by_one(chunk, now_ms)  # isolate the entry etcd refuses
            return
        if result.succeeded:
            self._applied(chunk, result.revision)
            return
        self._check_owner(result.responses[0] if result.responses else [], guard)
        if len(chunk) > 1:
            await self._one_by_one(chunk, now_ms)
        else:
            await self._resolve_single(chunk[0][0], now_ms)

    def _applied(self, chunk: list[tuple[KV, EntryWrite]], revision: int) -> None:
        """Reflect a committed batch in memory before the watch echoes it, so
        the same entries are never fired twice from a stale cache."""
        for kv, write in chunk:
            self.due.discard(kv.key)
            self.order.forget(kv.key)
            if write.next_kv is not None and self._within_horizon(write.next_kv[0]):
                key, data, entry = write.next_kv
                self.due.put_item(KV(key, data, revision, revision, 1))
                self._written[key] = (revision, entry)
            created = write.created
            for run in created:
                self.on_fired(Versioned(self.keys.run(run.id), run, revision, revision, 1))
            self.stats.fired += len(created)
            FIRES.labels(kind="scheduled").inc(len(created))
            for skip in write.skips:
                SKIPPED_SLOTS.labels(reason=skip.reason).inc(skip.count)
            self.cancel_requests += write.cancel_after

    # -- loop ------------------------------------------------------------------
    async def run(self) -> None:
        cache_task = asyncio.create_task(self.due.run(), name=f"due-{self.partition}")
        try:
            await self.due.ready.wait()
            while True:
                now, seen = self.clock.now_ms(), self.due.version
                if await self.fire_due(now):
                    await self._wait_next(now, seen)
                else:
                    await self.brake.released()
        finally:
            cache_task.cancel()
            await asyncio.gather(cache_task, return_exceptions=True)

    async def _wait_next(self, now_ms: int, seen: int) -> None:
        """Sleep until the earliest entry is ready or the due index changes.

        Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancellation
        that arrives while the awaited change completes (CPython gh-86296),
        and this task then fires on after its partition was handed over,
        while the scheduler waits forever for it to stop.
        ``asyncio.timeout`` lets the cancellation through."""
        earliest = self.earliest_ms()
        lead_ms = self._lead() - self.granule_ms
        wait_ms = 1000 if earliest is None else earliest - lead_ms - now_ms
        if wait_ms <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(wait_ms, 1000) / 1000):
                await self.due.wait_changed(seen)
