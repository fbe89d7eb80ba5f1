"""Placement and recovery for one owned partition.

Placement takes queued runs in queue order (priority, then not-before) and
assigns each to a worker that fits. The assignment transaction compares:
*we own the partition* (owner token), *the run is unchanged* (its
``mod_revision``), *the worker's capacity revision is the one we computed
free capacity from* (``load/<worker>`` ``mod_revision``) and *the worker is
alive* (its member key exists) — so two schedulers can never overfill one
worker and a run is never placed twice.

Recovery walks the partition's active pointers (never the run history): an
attempt on a worker whose lease expired is ``lost`` (compare: its claim is
absent, so a live worker's claim always wins), and a running attempt past
timeout + grace whose worker still holds the claim is hung: the claim is
deleted (the worker kills the process) and the attempt is ``timed_out``.
"""

from __future__ import annotations

import asyncio
import logging

from etcdsched.cache import PrefixCache
from etcdsched.clock import Clock
from etcdsched.errors import NotFound
from etcdsched.keys import Keys, run_seq
from etcdsched.metrics import LOST_RUNS, QUEUE_DEPTH
from etcdsched.models import (
    ActivePointer,
    Assignment,
    LoadRecord,
    RunRecord,
    WorkerMember,
    assign_attempt,
    finish_attempt,
)
from etcdsched.ownership import Ownership
from etcdsched.placement import WorkerView, choose_worker, never_fits
from etcdsched.runs import RunOps
from etcdsched.statemachine import EXECUTING, RunState, transition
from etcdsched.store import KV, Cmp, Ops, Store, Versioned

log = logging.getLogger(__name__)
WAITING = (RunState.PENDING, RunState.RETRY_WAIT)
ASSIGN_TRIES = 5


class WorkerGate:
    """Serialises one scheduler's assignments per worker and remembers the
    newest load record it has seen for each. Every partition placer of a scheduler wakes
    on every load change; without the gate they all raced for the same
    worker's capacity revision, one won and the rest retried, which cut
    placement to a few runs per second with 64 partitions and one worker.
    The assignment transaction keeps its compare on the capacity revision,
    so other schedulers are still fenced off exactly as before."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._latest: dict[str, tuple[LoadRecord, int]] = {}

    def lock(self, worker_id: str) -> asyncio.Lock:
        return self._locks.setdefault(worker_id, asyncio.Lock())

    def fresher(self, view: WorkerView) -> WorkerView:
        """``view`` with the newest load this scheduler knows of."""
        known = self._latest.get(view.member.id)
        if known is None or known[1] <= view.load_revision:
            return view
        return WorkerView(view.member, known[0], known[1])

    def remember(self, view: WorkerView) -> None:
        """A load this scheduler wrote or read back after a failed compare."""
        known = self._latest.get(view.member.id)
        if known is None or known[1] < view.load_revision:
            self._latest[view.member.id] = (view.load, view.load_revision)


class PartitionPlacer:
    def __init__(
        self,
        partition: int,
        store: Store,
        keys: Keys,
        clock: Clock,
        ownership: Ownership,
        active: PrefixCache,
        workers: PrefixCache,
        loads: PrefixCache,
        lookahead_ms: int,
        gate: WorkerGate | None = None,
    ) -> None:
        self.partition = partition
        self.store = store
        self.keys = keys
        self.clock = clock
        self.ownership = ownership
        self.active = active
        self.workers = workers
        self.loads = loads
        self.lookahead_ms = lookahead_ms
        self.runs = RunOps(keys)
        self.queue = PrefixCache(store, clock, keys.queue_prefix(partition), relist_every=10.0)
        self.placed = 0
        self.lost = 0
        self._view_memo: dict[str, tuple[int, int, WorkerView]] = {}
        self.gate = gate or WorkerGate()
        self._deadlines: dict[str, int | None] = {}
        """Starting-deadline instant of each queued run read so far."""

    # -- views -------------------------------------------------------------------
    def worker_views(self) -> dict[str, WorkerView]:
        """Every live worker with its load; a view is decoded again only when
        its member or load record changed (a pass runs on every load change)."""
        views, memo = {}, {}
        for kv in self.workers.items.values():
            worker_id = self.keys.parse_member("workers", kv.key)
            load_kv = self.loads.items.get(self.keys.load(worker_id))
            load_revision = load_kv.mod_revision if load_kv else 0
            known = self._view_memo.get(kv.key)
            if known is not None and known[:2] == (kv.mod_revision, load_revision):
                view = known[2]
            else:
                member = kv.decode(WorkerMember).value
                load = load_kv.decode(LoadRecord).value if load_kv else LoadRecord()
                view = WorkerView(member, load, load_revision)
            memo[kv.key] = (kv.mod_revision, load_revision, view)
            views[view.member.id] = view
        self._view_memo = memo
        return views

    @staticmethod
    def _any_free_slot(views: dict[str, WorkerView]) -> bool:
        return any(v.free().slots > 0 and not v.member.draining for v in views.values())

    def earliest_queued_ms(self) -> int | None:
        if not self.queue.items:
            return None
        return min(self.keys.parse_queue(k).not_before_ms for k in self.queue.items)

    # -- placement -------------------------------------------------------------
    async def place_once(self, now_ms: int) -> int:
        """Try to place every queued run whose not-before is within the lookahead."""
        views = self.worker_views()
        QUEUE_DEPTH.labels(partition=str(self.partition)).set(len(self.queue.items))
        placed = 0
        full = not self._any_free_slot(views)
        for key in sorted(self.queue.items):
            if self.keys.parse_queue(key).not_before_ms > now_ms + self.lookahead_ms:
                continue
            if full and not self._deadline_passed(key, now_ms):
                continue  # no worker has a free slot: only a deadline can change this run
            current = await self._queued_run(key)
            if current is None:
                continue
            self._deadlines[key] = self._deadline_ms(current.value)
            if await self._place(current, views, now_ms):
                placed += 1
            full = not self._any_free_slot(views)
        self._deadlines = {k: v for k, v in self._deadlines.items() if k in self.queue.items}
        self.placed += placed
        return placed

    def _deadline_passed(self, queue_key: str, now_ms: int) -> bool:
        """True when the run may be past its starting deadline: unknown
        (never read yet) counts as passed, so each queued run is read once
        while the workers are full instead of on every pass."""
        if queue_key not in self._deadlines:
            return True
        deadline = self._deadlines[queue_key]
        return deadline is not None and now_ms > deadline

    async def _queued_run(self, queue_key: str) -> Versioned[RunRecord] | None:
        """The run behind a queue entry; stale entries are removed."""
        rid = self.keys.parse_queue(queue_key).run_id
        try:
            current = await self.runs.load(self.store, rid)
        except NotFound:
            current = None
        if current is None or current.value.state not in WAITING:
            await self._drop_queue_key(queue_key)
            return None
        if current.value.queue_key != queue_key:
            await self._drop_queue_key(queue_key)
            return None
        return current

    async def _drop_queue_key(self, queue_key: str) -> None:
        await self.store.txn([self.ownership.guard(self.partition)], [Ops.delete(queue_key)])
        self.queue.items.pop(queue_key, None)

    async def _place(
        self, current: Versioned[RunRecord], views: dict[str, WorkerView], now_ms: int
    ) -> bool:
        run = current.value
        if self._past_deadline(run, now_ms):
            await self._end_waiting(current, RunState.SKIPPED, "starting deadline passed", now_ms)
            return False
        if run.spec.overlap == "queue_one" and self._job_executing(run):
            return False
        dependency = await self._dependencies(run)
        if dependency == "failed":
            await self._end_waiting(current, RunState.SKIPPED, "an upstream run failed", now_ms)
            return False
        if dependency == "waiting":
            return False
        return await self._assign_fitting(current, views, now_ms)

    async def _assign_fitting(
        self, current: Versioned[RunRecord], views: dict[str, WorkerView], now_ms: int
    ) -> bool:
        """Assign to the best fitting worker; when only that worker's load
        moved under us, retry with the fresh load instead of giving up."""
        run = current.value
        for _ in range(ASSIGN_TRIES):
            worker = choose_worker(
                run.spec.resources, run.spec.selector, list(views.values()), self._last_worker(run)
            )
            if worker is None:
                await self._note_waiting(current, views, now_ms)
                return False
            wid = worker.member.id
            async with self.gate.lock(wid):
                fresh = self.gate.fresher(views[wid])
                if fresh is views[wid]:
                    outcome = await self._assign(current, fresh, views, now_ms)
                else:
                    views[wid], outcome = fresh, "load_changed"  # choose again
            if outcome != "load_changed":
                return outcome == "assigned"
        return False

    @staticmethod
    def _deadline_ms(run: RunRecord) -> int | None:
        """The instant after which the run is skipped instead of placed;
        None for retries and runs without a starting deadline."""
        deadline = run.spec.starting_deadline
        if deadline is None or run.attempt > 0:
            return None
        return run.not_before_ms + int(deadline.total_seconds() * 1000)

    def _past_deadline(self, run: RunRecord, now_ms: int) -> bool:
        deadline = self._deadline_ms(run)
        return deadline is not None and now_ms > deadline

    def _job_executing(self, run: RunRecord) -> bool:
        for kv in self.active.group(run.job_id).values():
            pointer = kv.decode(ActivePointer).value
            if pointer.run_id != run.id and pointer.worker is not None:
                return True
        return False

    async def _dependencies(self, run: RunRecord) -> str:
        """``ok``, ``waiting`` or ``failed``: upstream runs of the same slot."""
        for upstream in run.spec.depends_on:
            kv = await self.store.get(f"{self.keys.runs_prefix(upstream)}{run_seq(run.slot_ms)}")
            if kv is None:
                return "waiting"
            state = kv.decode(RunRecord).value.state
            if state is RunState.SUCCEEDED:
                continue
            return "failed" if state.terminal else "waiting"
        return "ok"

    @staticmethod
    def _last_worker(run: RunRecord) -> str | None:
        return run.attempts[-1].worker if run.attempts else None

    async def _end_waiting(
        self, current: Versioned[RunRecord], target: RunState, reason: str, now_ms: int
    ) -> None:
        """Compares: owner token, run unchanged."""
        ended = transition(current.value, target, now_ms, reason=reason)
        await self.store.txn(
            [self.ownership.guard(self.partition), Cmp.mod(current.key, current.mod_revision)],
            self.runs.settle(ended),
        )

    async def _note_waiting(
        self, current: Versioned[RunRecord], views: dict[str, WorkerView], now_ms: int
    ) -> None:
        """Record why the run waits (shown by the API); written only when it changes."""
        run = current.value
        why = never_fits(run.spec.resources, run.spec.selector, list(views.values()))
        reason = f"waiting: {why or 'all fitting workers are full'}"
        if run.reason == reason:
            return
        noted = run.model_copy(update={"reason": reason, "updated_ms": now_ms})
        await self.store.txn(
            [self.ownership.guard(self.partition), Cmp.mod(current.key, current.mod_revision)],
            [Ops.put(current.key, noted)],
        )

    async def _assign(
        self,
        current: Versioned[RunRecord],
        worker: WorkerView,
        views: dict[str, WorkerView],
        now_ms: int,
    ) -> str:
        """``assigned``, ``load_changed`` (``views`` refreshed) or ``conflict``."""
        run = current.value
        if run.state is RunState.RETRY_WAIT:
            run = transition(run, RunState.PENDING, now_ms)
        assigned = assign_attempt(run, worker.member.id, now_ms).model_copy(
            update={"queue_key": None}
        )
        wid = worker.member.id
        load = LoadRecord(runs={**worker.load.runs, run.id: run.spec.resources})
        not_before = max(run.not_before_ms, run.retry_at_ms or 0)
        assignment = Assignment(
            run_id=run.id,
            attempt=assigned.attempt,
            not_before_ms=not_before,
            resources=run.spec.resources,
        )
        pointer = ActivePointer(run_id=run.id, worker=wid, attempt=assigned.attempt)
        result = await self.store.txn(
            [
                self.ownership.guard(self.partition),
                Cmp.mod(current.key, current.mod_revision),
                Cmp.mod(self.keys.load(wid), worker.load_revision),
                Cmp.exists(self.keys.member("workers", wid)),
            ],
            [
                Ops.put(current.key, assigned),
                *([Ops.delete(current.value.queue_key)] if current.value.queue_key else []),
                Ops.put(self.keys.assign(wid, run.id), assignment),
                Ops.put(self.keys.load(wid), load),
                Ops.put(self.keys.active(run.partition, run.id), pointer),
            ],
            [Ops.get(self.keys.load(wid))],
        )
        if not result.succeeded:
            outcome = self._refresh_load(views, worker, result.responses[0])
            if outcome == "load_changed":
                self.gate.remember(views[wid])
            return outcome
        self.queue.items.pop(current.value.queue_key or "", None)
        views[wid] = WorkerView(worker.member, load, result.revision)
        self.gate.remember(views[wid])
        return "assigned"

    @staticmethod
    def _refresh_load(views: dict[str, WorkerView], worker: WorkerView, fresh: list[KV]) -> str:
        """After a failed assignment: ``load_changed`` (view refreshed) when the
        worker's capacity revision moved, else ``conflict``."""
        revision = fresh[0].mod_revision if fresh else 0
        if revision == worker.load_revision:
            return "conflict"  # the run, the owner or the worker changed, not the load
        load = fresh[0].decode(LoadRecord).value if fresh else LoadRecord()
        views[worker.member.id] = WorkerView(worker.member, load, revision)
        return "load_changed"

    # -- recovery -------------------------------------------------------------
    async def reconcile_once(self, now_ms: int) -> int:
        """Fix active runs whose worker vanished or hung; requeue orphans."""
        live = {kv.decode(WorkerMember).value.id for kv in self.workers.items.values()}
        fixed = 0
        for kv in list(self.active.items.values()):
            pointer = kv.decode(ActivePointer).value
            if pointer.worker is not None and pointer.worker not in live:
                fixed += await self._mark_lost(pointer, now_ms)
            elif pointer.deadline_ms is not None and now_ms > pointer.deadline_ms:
                fixed += await self._mark_hung(pointer, now_ms)
        self.lost += fixed
        return fixed

    async def _executing(self, pointer: ActivePointer) -> Versioned[RunRecord] | None:
        try:
            current = await self.runs.load(self.store, pointer.run_id)
        except NotFound:
            return None
        run = current.value
        if run.state not in EXECUTING or run.worker != pointer.worker:
            return None
        return current

    async def _mark_lost(self, pointer: ActivePointer, now_ms: int) -> int:
        """Compares: owner token, run unchanged, claim absent."""
        current = await self._executing(pointer)
        worker = pointer.worker or ""
        if current is None or await self.store.get(self.keys.member("workers", worker)):
            return 0
        ended = finish_attempt(
            current.value,
            "lost",
            now_ms,
            reason=f"worker {worker} vanished (lease expired)",
            next_slot_ms=await self.runs.next_slot(self.store, current.value),
        )
        claim = self.keys.claim(self.partition, ended.id)
        result = await self.store.txn(
            [
                self.ownership.guard(self.partition),
                Cmp.mod(current.key, current.mod_revision),
                Cmp.absent(claim),
            ],
            self.runs.finish_ops(ended, worker, self.partition),
        )
        if result.succeeded:
            LOST_RUNS.inc()
            log.warning("run %s lost on worker %s -> %s", ended.id, worker, ended.state)
        return int(result.succeeded)

    async def _mark_hung(self, pointer: ActivePointer, now_ms: int) -> int:
        """Compares: owner token, run unchanged. Deleting the claim makes the
        worker kill the process; its late report then fails its claim compare."""
        current = await self._executing(pointer)
        if current is None:
            return 0
        ended = finish_attempt(
            current.value,
            "timed_out",
            now_ms,
            reason="hung: no report by timeout + grace",
            next_slot_ms=await self.runs.next_slot(self.store, current.value),
        )
        result = await self.store.txn(
            [self.ownership.guard(self.partition), Cmp.mod(current.key, current.mod_revision)],
            [
                Ops.delete(self.keys.claim(self.partition, ended.id)),
                *self.runs.finish_ops(ended, pointer.worker or "", self.partition),
            ],
        )
        return int(result.succeeded)
