"""Recovery for one owned partition.

Recovery walks the partition's active pointers (never the run history): an
attempt on a worker whose lease expired is ``lost``, its reason saying it was
*fenced* (the worker killed it itself; compare: its claim is absent, so a
live worker's claim always wins), or, if it never started,
handed back to the queue without using an attempt; and a running attempt past
timeout + grace whose worker still holds the claim is hung: the claim is
deleted (the worker kills the process) and the attempt is ``timed_out``.
Both end the attempt with the same operations as a worker's report, so the
run's assignment goes too and the worker's capacity is free again.
"""

from __future__ import annotations

import logging

from etcdsched.model.errors import NotFound
from etcdsched.model.records import ActivePointer, RunRecord, WorkerMember
from etcdsched.model.statemachine import finish_attempt, hand_back
from etcdsched.model.states import EXECUTING, RunState
from etcdsched.runtime.metrics import LOST_RUNS, REQUEUED_RUNS
from etcdsched.scheduler.ownership import Ownership
from etcdsched.store.cache import PrefixCache
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Cmp, Ops, Store, Versioned
from etcdsched.store.runs import RunOps

log = logging.getLogger(__name__)


def fenced_reason(worker: str) -> str:
    """The verdict on a ``running`` attempt whose worker's lease expired.
    A worker that cannot prove its lease kills its own jobs before the lease
    can expire on the server (its watchdog, docs/design.md "The watchdog"),
    so the attempt did not merely lose contact: it was fenced, and the reason
    says so. It is ``lost`` all the same, and retried like any lost attempt."""
    return f"fenced: the worker could not prove its lease (worker {worker}'s lease expired)"


class PartitionRecovery:
    def __init__(
        self,
        partition: int,
        store: Store,
        keys: Keys,
        ownership: Ownership,
        active: PrefixCache,
        workers: PrefixCache,
        runs: RunOps | None = None,
    ) -> None:
        """``runs`` writes the runs (the scheduler's, with its webhook outbox)."""
        self.partition = partition
        self.store = store
        self.keys = keys
        self.ownership = ownership
        self.active = active
        self.workers = workers
        self.runs = runs or RunOps(keys)
        self.lost = 0

    async def reconcile_once(self, now_ms: int) -> int:
        """Fix active runs whose worker vanished or hung; requeue orphans."""
        live = {kv.decode(WorkerMember).value.id for kv in self.workers.items.values()}
        fixed = 0
        for pointer in self.active.decoded(ActivePointer):
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
        """Compares: owner token, run unchanged, claim absent. A run still
        ``assigned`` never started: a worker writes ``running`` before a
        job's gate may open (docs/design.md, "Claims and fencing"), so it
        goes back to the queue with its attempt undone; a ``running`` one
        may have run, and its attempt is ``lost``."""
        current = await self._executing(pointer)
        worker = pointer.worker or ""
        if current is None or await self.store.get(self.keys.member("workers", worker)):
            return 0
        run = current.value
        if run.state is RunState.ASSIGNED:
            why = f"worker {worker} vanished (lease expired) before the job started; queued again"
            back, requeue = self.runs.requeue(hand_back(run, now_ms, reason=why))
            ops = [Ops.delete(self.keys.assign(worker, run.id)), *requeue]
        else:
            back = finish_attempt(
                run,
                "lost",
                now_ms,
                reason=fenced_reason(worker),
                next_slot_ms=await self.runs.next_slot(self.store, run),
            )
            ops = self.runs.finish_ops(back, worker, self.partition)
        claim = self.keys.claim(self.partition, run.id)
        compares = [
            self.ownership.guard(self.partition),
            Cmp.mod(current.key, current.mod_revision),
            Cmp.absent(claim),
        ]
        result = await self.store.txn(compares, ops)
        if result.succeeded:
            (LOST_RUNS if back.state is not RunState.PENDING else REQUEUED_RUNS).inc()
            log.warning("run %s on vanished worker %s -> %s", run.id, worker, back.state)
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
