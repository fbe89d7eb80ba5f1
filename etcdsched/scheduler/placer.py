"""One owned partition's placement queue and the decisions about each run in it.

The scheduler's :class:`~etcdsched.scheduler.placement_loop.PlacementLoop` walks the
queues of all its partitions in queue order (priority, then not-before),
asks each partition whether a run may be placed now and where, and hands it
to that worker's batcher (``etcdsched.scheduler.assigner``), whose transaction
compares per run *we own the partition* and *the run is unchanged*, and per
batch *no assignment of the worker was written since we computed its free
capacity* and *the worker is alive* — so two schedulers can never overfill
one worker and a run is never placed twice.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator

from etcdsched.model.codec import CorruptRecord
from etcdsched.model.placement import WorkerView, choose_worker, never_fits
from etcdsched.model.records import ActivePointer, QueueEntry, RunRecord, SkipReason
from etcdsched.model.statemachine import transition
from etcdsched.model.states import RunState
from etcdsched.runtime.clock import Clock
from etcdsched.runtime.metrics import QUEUE_DEPTH, SKIPPED_SLOTS
from etcdsched.scheduler.assigner import ASSIGNED, Assigner, AssignRequest
from etcdsched.scheduler.dependency_gate import DependencyGate
from etcdsched.scheduler.ownership import Ownership
from etcdsched.store.cache import PrefixCache
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Cmp, Event, Ops, Store, Versioned
from etcdsched.store.runs import RunOps, starting_deadline_ms

log = logging.getLogger(__name__)
WAITING = (RunState.PENDING, RunState.RETRY_WAIT)


FIRED_MEMO = 256
"""Fired runs remembered per partition for their first placement."""


class PartitionPlacer:
    def __init__(
        self,
        partition: int,
        store: Store,
        keys: Keys,
        clock: Clock,
        ownership: Ownership,
        active: PrefixCache,
        assigner: Assigner,
        on_change: Callable[[], None] | None = None,
        runs: RunOps | None = None,
    ) -> None:
        """``on_change`` is called on every change of the queue (the
        scheduler's placement loop waits on it); ``runs`` writes the runs
        (the scheduler's, with its webhook outbox)."""
        self.partition = partition
        self.store = store
        self.keys = keys
        self.ownership = ownership
        self.active = active
        self.assigner = assigner
        self.runs = runs or RunOps(keys)
        self.dependencies = DependencyGate(store, keys)
        self.queue = PrefixCache(
            store,
            clock,
            keys.queue_prefix(partition),
            relist_every=10.0,
            on_event=self._on_queue_event,
        )
        self._prefix_len = len(keys.queue_prefix(partition))
        self.placed = 0
        self._not_before: dict[str, int] = {}
        self._deadline_at: dict[str, int] = {}
        """Starting deadlines of queued runs that have one (from the queue entries)."""
        self._gone: dict[str, int] = {}
        """Queue entries this scheduler placed or dropped, by the entry's
        mod_revision, until the watch delivers their deletion: the cache is
        never edited by hand (a relist could then miss a delete for good)."""
        self._sorted: list[str] = []
        """Queue keys in order, kept by insertion, but for those being
        written (``submit``); deleted keys are skipped and swept out once
        they are half of it (no full sort per pass)."""
        self._on_change = on_change
        self._soonest_new: int | None = None
        """The earliest not-before among keys queued since the placement
        loop last asked (:meth:`take_soonest_new`)."""
        self._fired: dict[str, Versioned[RunRecord]] = {}
        """Runs this scheduler fired, as stored, by queue key, until placed
        once: the first look at them needs no read."""
        self.due_soon: Callable[[int], bool] = lambda not_before_ms: True
        """Whether a run of this not-before is placed now (within the
        scheduler's lead): only those count for the firing brake; one
        that may not start for minutes (a jittered herd) is not behind."""
        self._unexamined: dict[str, int] = {}
        """Queue keys of every run this scheduler fired that placement has
        not looked at yet, with the revision that queued them (the firing
        brake, ``etcdsched.scheduler.backpressure``)."""

    @property
    def ready(self) -> bool:
        return self.queue.ready.is_set() and self.active.ready.is_set()

    def _on_queue_event(self, event: Event) -> None:
        key = event.kv.key
        if event.kind == "delete":
            self._fired.pop(key, None)
            self._unexamined.pop(key, None)
            self._not_before.pop(key, None)
            self._deadline_at.pop(key, None)
            self._gone.pop(key, None)
        elif key not in self._not_before:
            self._walk(key)  # absent, or left over from a delete
            not_before = self.keys.parse_queue(key).not_before_ms
            self._not_before[key] = not_before
            if self._soonest_new is None or not_before < self._soonest_new:
                self._soonest_new = not_before
            deadline = _deadline_of(event.kv)
            if deadline is not None:
                self._deadline_at[key] = deadline
        if self._on_change is not None:
            self._on_change()

    # -- what to look at -------------------------------------------------------
    def ready_keys(self, limit_ms: int) -> Iterator[tuple[str, int, str]]:
        """Queued keys with not-before up to ``limit_ms``, lazily, in queue
        order, as ``(order, partition, key)``: ``order`` (the key below the
        partition) sorts the same across partitions."""
        items, not_before = self.queue.items, self._not_before
        if len(self._sorted) > 2 * len(items) + 64:
            self._sorted = [k for k in self._sorted if k in items]
        if len(self._fired) >= FIRED_MEMO:  # drop those whose put and delete both were missed
            self._fired = {k: run for k, run in self._fired.items() if k in items}
        self._forget_unseen(items)
        QUEUE_DEPTH.labels(partition=str(self.partition)).set(len(items))
        for key in tuple(self._sorted):  # events may insert while we are suspended
            if self.waiting(key) and not_before.get(key, 0) <= limit_ms:
                yield key[self._prefix_len :], self.partition, key

    def take_soonest_new(self) -> int | None:
        """The earliest not-before queued since the last call, and forget it."""
        soonest, self._soonest_new = self._soonest_new, None
        return soonest

    def waiting(self, queue_key: str) -> bool:
        """In the queue and not placed or dropped by us meanwhile."""
        kv = self.queue.items.get(queue_key)
        return kv is not None and self._gone.get(queue_key) != kv.mod_revision

    def _mark_gone(self, queue_key: str) -> None:
        kv = self.queue.items.get(queue_key)
        if kv is not None:
            self._gone[queue_key] = kv.mod_revision

    def deadline_keys(self, now_ms: int, limit_ms: int) -> list[str]:
        """While no worker has room only a starting deadline can change a
        run's fate: the keys whose deadline passed (known from the queue
        entries, so a full cluster reads no other queued run)."""
        expired = [k for k, at in self._deadline_at.items() if now_ms > at]
        return [k for k in expired if self.waiting(k) and self._not_before[k] <= limit_ms]

    def earliest_after(self, limit_ms: int) -> int | None:
        """The earliest not-before beyond ``limit_ms`` (a retry's backoff):
        ready runs that cannot be placed yet wait for a change instead."""
        return min((nb for nb in self._not_before.values() if nb > limit_ms), default=None)

    # -- reading ---------------------------------------------------------------
    def remember_fired(self, current: Versioned[RunRecord]) -> None:
        """A run this scheduler just created (the firer tells us). At most
        ``FIRED_MEMO`` are kept: a run is looked at only when a worker has
        room, so with every worker full a burst would keep them all (about
        4 KB each); the others are read from etcd when their turn comes."""
        queue_key = current.value.queue_key
        if not queue_key:
            return
        if self.due_soon(current.value.not_before_ms):
            self._unexamined[queue_key] = current.mod_revision
        if len(self._fired) < FIRED_MEMO:
            self._fired[queue_key] = current

    @property
    def unexamined(self) -> int:
        """Runs this scheduler fired that placement has not looked at yet."""
        return len(self._unexamined)

    def _forget_unseen(self, items: dict[str, KV]) -> None:
        """Stop counting fired runs whose queue entry the cache has moved
        past without holding it: its put and delete both fell in a re-list
        gap. An overcount would hold firing with every queue empty; entries
        still on their way (queued after the cache's revision) are kept."""
        seen = self.queue.revision
        stale = [k for k, rev in self._unexamined.items() if rev <= seen and k not in items]
        for key in stale:
            del self._unexamined[key]

    def take_fired(self, queue_key: str) -> Versioned[RunRecord] | None:
        """The run behind ``queue_key`` as we fired it, once: if it changed
        since, the assignment's compare fails and the next look reads it.
        Asked for every run placement looks at, so it also counts as looked at."""
        self._unexamined.pop(queue_key, None)
        return self._fired.pop(queue_key, None)

    def check_read(self, queue_key: str, kvs: list[KV]) -> Versioned[RunRecord] | None:
        """The run read for ``queue_key``, or None when the entry is stale
        (run gone, no longer waiting, or queued under another key)."""
        current = kvs[0].decode(RunRecord) if kvs else None
        if current is None:
            return None
        run = current.value
        if run.state not in WAITING or run.queue_key != queue_key:
            return None
        return current

    async def drop_queue_key(self, queue_key: str) -> None:
        """Compare: owner token (only the owner tidies its queue)."""
        await self.store.txn([self.ownership.guard(self.partition)], [Ops.delete(queue_key)])
        self._mark_gone(queue_key)

    # -- deciding --------------------------------------------------------------
    async def placeable(
        self, current: Versioned[RunRecord], views: dict[str, WorkerView], now_ms: int
    ) -> WorkerView | None:
        """The worker to place the run on now, or None (it waits, or its
        deadline or an upstream failure ended it)."""
        run = current.value
        if self._past_deadline(run, now_ms):
            why = "starting deadline passed"
            await self._skip_waiting(current, "starting_deadline", why, now_ms)
            return None
        if run.spec.overlap == "queue_one" and self._job_executing(run):
            return None
        if run.spec.depends_on:
            verdict = await self.dependencies.verdict(run, now_ms)
            if verdict.kind == "skip":
                await self._skip_waiting(current, "dependency", verdict.why, now_ms)
                return None
            if verdict.kind == "wait":
                await self._note(current, verdict.why, now_ms)
                return None
        spec = run.spec
        worker = choose_worker(
            spec.resources, spec.selector, run.tenant, list(views.values()), self._last_worker(run)
        )
        if worker is None:
            await self._note_never_fits(current, views, now_ms)
        return worker

    async def submit(self, current: Versioned[RunRecord], worker: WorkerView, now_ms: int) -> str:
        """Hand the run to the worker's batcher; on success it leaves the queue."""
        guard = self.ownership.guard(self.partition)
        request = AssignRequest(self.partition, guard, now_ms, current=current)
        queue_key = current.value.queue_key or ""
        self._hold(queue_key)
        outcome = ""
        try:
            outcome = await self.assigner.assign(worker, request)
        finally:
            self._release(queue_key, placed=outcome == ASSIGNED)
        if outcome == ASSIGNED:
            self._mark_gone(queue_key)
            self.placed += 1
        return outcome

    def _hold(self, queue_key: str) -> None:
        """Take a key being written out of what passes walk: with a worker's
        batcher behind, thousands of them sat at the head of the queue and
        every pass walked past each (a tenth of the scheduler's CPU)."""
        at = bisect.bisect_left(self._sorted, queue_key)
        if at < len(self._sorted) and self._sorted[at] == queue_key:
            del self._sorted[at]

    def _release(self, queue_key: str, placed: bool) -> None:
        """Walk the key again unless it was placed (its delete is on its way)."""
        if not placed and queue_key in self._not_before:
            self._walk(queue_key)

    def _walk(self, queue_key: str) -> None:
        """Put ``queue_key`` in ``_sorted``, in order, unless it is there."""
        at = bisect.bisect_left(self._sorted, queue_key)
        if at == len(self._sorted) or self._sorted[at] != queue_key:
            self._sorted.insert(at, queue_key)

    @staticmethod
    def _past_deadline(run: RunRecord, now_ms: int) -> bool:
        deadline = starting_deadline_ms(run)
        return deadline is not None and now_ms > deadline

    def _job_executing(self, run: RunRecord) -> bool:
        for kv in self.active.group(run.job_id).values():
            pointer = kv.decode(ActivePointer).value
            if pointer.run_id != run.id and pointer.worker is not None:
                return True
        return False

    @staticmethod
    def _last_worker(run: RunRecord) -> str | None:
        return run.attempts[-1].worker if run.attempts else None

    async def _skip_waiting(
        self, current: Versioned[RunRecord], kind: SkipReason, reason: str, now_ms: int
    ) -> None:
        """End a waiting run ``skipped``. Compares: owner token, run unchanged."""
        ended = transition(current.value, RunState.SKIPPED, now_ms, reason=reason)
        result = await self.store.txn(
            [self.ownership.guard(self.partition), Cmp.mod(current.key, current.mod_revision)],
            self.runs.settle(ended),
        )
        if result.succeeded:
            SKIPPED_SLOTS.labels(reason=kind).inc()

    async def _note_never_fits(
        self, current: Versioned[RunRecord], views: dict[str, WorkerView], now_ms: int
    ) -> None:
        """Record why no worker could ever take the run (shown by the API);
        written only when it changes. A run that waits for a full worker
        gets no write: in a burst that would be one write per queued run."""
        run = current.value
        why = never_fits(run.spec.resources, run.spec.selector, run.tenant, list(views.values()))
        if why:
            await self._note(current, f"waiting: {why}", now_ms)

    async def _note(self, current: Versioned[RunRecord], reason: str, now_ms: int) -> None:
        """Say why a run waits (``run get`` shows it); written only when it
        changes. Compares: owner token, run unchanged."""
        run = current.value
        if run.reason == reason:
            return
        noted = run.model_copy(update={"reason": reason, "updated_ms": now_ms})
        await self.store.txn(
            [self.ownership.guard(self.partition), Cmp.mod(current.key, current.mod_revision)],
            [Ops.put(current.key, noted)],
        )


def _deadline_of(kv: KV) -> int | None:
    """A queue entry's starting deadline; an entry that does not decode
    counts as expired, so the run is read and the question settled."""
    try:
        return kv.decode(QueueEntry).value.deadline_ms
    except CorruptRecord:
        return 0
