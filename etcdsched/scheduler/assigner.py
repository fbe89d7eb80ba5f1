"""Group commit of assignments: one committer per worker, per scheduler.

Every partition placer of a scheduler hands the runs it chose for a worker
to that worker's :class:`WorkerBatcher`. The batcher writes as many of
them as fit ``MAX_TXN_OPS`` in one transaction whose compares are:

* per partition in the batch, *we still own it* (owner key
  ``create_revision`` is our token);
* per run, *it is unchanged since the placer read it* (``mod_revision``);
* *no assignment of the worker was written since the revision we computed
  free capacity at*: the worker's assignment epoch key has ``mod_revision``
  below it. Every placement touches the epoch in the same transaction, so
  another scheduler's assignment fails the compare; a finished run's
  deleted assignment only frees capacity and does not (ADR 0013: a range
  compare over ``assign/<worker>/`` cost etcd a walk over every tombstone
  of the worker's past assignments);
* *the worker is alive*: the epoch exists. It is bound to the worker's
  session lease and written with its member key, so it is gone exactly
  when the member key is (and a worker from before ADR 0013, which has no
  epoch, counts as gone).

So two schedulers can never overfill one worker and a run is never placed
twice; a burst of runs for one worker costs one round trip per batch, and a
worker frees capacity by deleting the assignment in the same transaction
that reports the run, with no shared counter for it and the schedulers to
fight over. When the batch fails, the failure branch reads back what the
compares looked at, and only the requests that can still succeed are tried
again (ADR 0006).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from etcdsched.model.errors import OutcomeUnknown, StoreRejected, StoreUnavailable
from etcdsched.model.placement import NOTHING, WorkerView, fits, plus, total_of
from etcdsched.scheduler.assign_requests import (
    ASSIGNED,
    CONFLICT,
    FULL,
    GONE,
    UNKNOWN,
    AssignRequest,
    BatchRequest,
)
from etcdsched.scheduler.capacity import with_assignments
from etcdsched.store.keys import Keys
from etcdsched.store.kv import MAX_TXN_OPS, Cmp, Ops, Store, TxnResult, holds

__all__ = ["ASSIGNED", "CONFLICT", "FULL", "GONE", "UNKNOWN", "AssignRequest", "Assigner"]
log = logging.getLogger(__name__)
TRIES = 5


class WorkerBatcher:
    """The committer of one worker's assignments, and the newest view of
    what is on that worker this scheduler knows."""

    def __init__(self, store: Store, keys: Keys, view: WorkerView) -> None:
        self.store = store
        self.keys = keys
        self.view = view
        self.pending: list[BatchRequest] = []
        self._committer: asyncio.Task[None] | None = None
        self._undecided = NOTHING
        """What the requests handed to this batcher and not yet decided
        take in total, kept as they come and go: a placement pass asks for
        it once per worker, and summing thousands of queued requests each
        time made placement slower the further behind it fell."""
        self._undecided_count = 0

    def observe(self, view: WorkerView) -> None:
        """A view from the caches: newer assignments, or a changed member record."""
        # at an equal revision the cache's view is exact, ours may over-count
        newest = view if view.revision >= self.view.revision else self.view
        self.view = WorkerView(view.member, newest.runs, newest.revision, newest.total)

    def planned(self) -> WorkerView:
        """The view with every run handed to this batcher and not yet
        decided counted as placed: a placement pass that starts while the
        previous pass's runs are still being written sees their slots taken."""
        if not self._undecided_count:
            return self.view
        view = self.view
        return WorkerView(view.member, view.runs, view.revision, plus(view.total, self._undecided))

    async def assign(self, request: BatchRequest) -> str:
        self._count_undecided(request)
        self.pending.append(request)
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._drain(), name=f"assign {self.worker}")
        return await request.done

    @property
    def worker(self) -> str:
        return self.view.member.id

    async def close(self) -> None:
        if self._committer is not None:
            self._committer.cancel()
            await asyncio.gather(self._committer, return_exceptions=True)
        for request in self.pending:
            request.done.cancel()

    # -- committing ----------------------------------------------------------
    async def _drain(self) -> None:
        while self.pending:
            batch = self._take()
            try:
                await self._commit(batch)
            except BaseException as exc:
                for request in batch:
                    if not request.done.done():
                        request.done.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise

    def _take(self) -> list[BatchRequest]:
        """Requests still awaited, one per run, as many as the epoch touch
        and their ops fit in ``MAX_TXN_OPS`` (39 runs, 29 when each leaves
        the queue)."""
        batch: list[BatchRequest] = []
        seen: set[str] = set()
        rest: list[BatchRequest] = []
        ops = 1  # the epoch touch
        for index, request in enumerate(self.pending):
            if request.done.done():
                continue
            cost = request.cost()
            if ops + cost > MAX_TXN_OPS:  # full: the rest wait, in order, unexamined
                rest += self.pending[index:]
                break
            if request.key in seen:
                rest.append(request)
                continue
            batch.append(request)
            seen.add(request.key)
            ops += cost
        self.pending = rest
        return batch

    def _count_undecided(self, request: BatchRequest) -> None:
        """Count ``request`` in ``_undecided`` until it is decided. Its
        callback runs a moment after the decision: a placed run is then
        briefly counted twice (in the view too), which only leaves room
        unused for that moment; it is never counted in neither."""
        need = request.run.spec.resources
        self._undecided = plus(self._undecided, need)
        self._undecided_count += 1

        def decided(_: asyncio.Future[str]) -> None:
            self._undecided_count -= 1
            # exact again whenever nothing waits, so float sums cannot drift
            self._undecided = plus(self._undecided, need, -1) if self._undecided_count else NOTHING

        request.done.add_done_callback(decided)

    async def _commit(self, batch: list[BatchRequest]) -> None:
        for _ in range(TRIES):
            if self.view.revision < 0 and not await self._read_assignments():
                self._resolve_all(batch, UNKNOWN)
                return
            batch = self._fitting(batch)
            if not batch:
                return
            try:
                result = await self._write(batch)
            except StoreRejected as exc:
                await self._one_by_one(batch, exc)
                return
            except (OutcomeUnknown, StoreUnavailable):
                self._resolve_all(batch, UNKNOWN)
                self.view = WorkerView(self.view.member, self.view.runs, -1, self.view.total)
                return
            if result.succeeded:
                self.view = replace(self._with_requests(batch), revision=result.revision)
                for request in batch:
                    request.revision = result.revision
                self._resolve_all(batch, ASSIGNED)
                return
            batch = self._after_failure(batch, result)
        self._resolve_all(batch, CONFLICT)

    async def _one_by_one(self, batch: list[BatchRequest], exc: StoreRejected) -> None:
        """etcd refused the batch (too large): each run alone; a run etcd
        refuses on its own is reported and left queued."""
        if len(batch) == 1:
            log.error("assignment of %s refused by etcd: %s", batch[0].key, exc)
            self._resolve_all(batch, CONFLICT)
            return
        for request in batch:
            await self._commit([request])

    def _fitting(self, batch: list[BatchRequest]) -> list[BatchRequest]:
        """The requests that fit the worker, in order; the rest are ``full``."""
        view, kept = self.view, []
        for request in batch:
            run = request.run
            need = run.spec.resources
            if not view.member.draining and fits(need, view.free(), view.member.capacity):
                kept.append(request)
                view = view.with_run(run.id, need)
            else:
                request.resolve(FULL)
        return kept

    async def _read_assignments(self) -> bool:
        """After an unknown outcome: what is on the worker now."""
        try:
            page = await self.store.range(self.keys.assign_prefix(self.worker))
        except StoreUnavailable:
            return False
        self.view = with_assignments(self.view, page.kvs, page.revision)
        return True

    def _with_requests(self, requests: list[BatchRequest]) -> WorkerView:
        """The view with these runs on the worker too. A run the view's
        total already holds (its assignment event overtook the reply) is
        counted twice until a view at a later revision replaces this one:
        an over-count only leaves room unused for a moment, where checking
        membership in the live ``runs`` against an older total would
        under-count and overfill the worker."""
        view = self.view
        if not requests:
            return view
        added = total_of(r.run.spec.resources for r in requests)
        return WorkerView(view.member, view.runs, view.revision, plus(view.total, added))

    async def _write(self, batch: list[BatchRequest]) -> TxnResult:
        wid = self.worker
        epoch = self.keys.assign_epoch(wid)
        guards = {r.partition: r.guard for r in batch}  # dict: partition order kept
        compares = [
            *guards.values(),
            *(c for r in batch for c in r.compares()),
            Cmp.exists(epoch),
            Cmp.unwritten_since(epoch, self.view.revision),
        ]
        ops = [Ops.touch(epoch), *(op for r in batch for op in r.ops(self.keys, wid))]
        reads = [
            Ops.get_prefix(self.keys.assign_prefix(wid)),
            Ops.get(epoch),
            *(Ops.get(g.key) for g in guards.values()),
            *(op for r in batch for op in r.reads()),
        ]
        return await self.store.txn(compares, ops, reads)

    def _after_failure(self, batch: list[BatchRequest], result: TxnResult) -> list[BatchRequest]:
        """Learn what is on the worker, resolve the requests that cannot
        succeed, keep the rest."""
        assign_kvs, epoch_kvs, *rest = result.responses
        partitions = list(dict.fromkeys(r.partition for r in batch))
        owners = dict(zip(partitions, rest, strict=False))
        answers = iter(rest[len(partitions) :])
        self.view = with_assignments(self.view, assign_kvs, result.revision)
        if not epoch_kvs:
            self._resolve_all(batch, GONE)
            return []
        kept = []
        for request in batch:
            mine = [next(answers) for _ in request.reads()]
            owned = holds(request.guard, owners[request.partition])
            if owned and request.still_possible(mine):
                kept.append(request)
            else:
                request.resolve(CONFLICT)
        return kept

    @staticmethod
    def _resolve_all(batch: list[BatchRequest], outcome: str) -> None:
        for request in batch:
            request.resolve(outcome)


class Assigner:
    """One scheduler's batchers, by worker id."""

    def __init__(self, store: Store, keys: Keys) -> None:
        self.store = store
        self.keys = keys
        self._batchers: dict[str, WorkerBatcher] = {}

    def fresher(self, view: WorkerView) -> WorkerView:
        """``view`` with the newest assignments this scheduler knows of, and
        the runs it is writing counted as placed."""
        batcher = self._batchers.get(view.member.id)
        if batcher is None:
            batcher = self._batchers[view.member.id] = WorkerBatcher(self.store, self.keys, view)
        batcher.observe(view)
        return batcher.planned()

    async def assign(self, view: WorkerView, request: BatchRequest) -> str:
        """``view`` may count runs chosen earlier in the same pass: it is
        never taken as what is on the worker (a new batcher reads that)."""
        batcher = self._batchers.get(view.member.id)
        if batcher is None:
            unknown = WorkerView(view.member, {}, -1)
            batcher = self._batchers[view.member.id] = WorkerBatcher(self.store, self.keys, unknown)
        return await batcher.assign(request)

    async def forget(self, live: set[str]) -> None:
        """Stop the batchers of workers that left."""
        for wid in [w for w in self._batchers if w not in live]:
            with contextlib.suppress(Exception):
                await self._batchers.pop(wid).close()
