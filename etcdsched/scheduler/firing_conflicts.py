"""What a firing batch does when it fails: isolate the entries, re-read,
and fire each one alone or drop it (see :class:`ConflictResolution`).

Kept apart from :mod:`etcdsched.scheduler.firing` so that the happy path (build a
batch, commit it, reflect it in memory) reads on its own.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from etcdsched.model.errors import OwnershipLost
from etcdsched.model.planning import FirePlan, plan_fire
from etcdsched.model.records import ActivePointer, DueEntry, RunRecord, SkipRecord
from etcdsched.scheduler.ownership import Ownership
from etcdsched.store.cache import PrefixCache
from etcdsched.store.keys import Keys, run_seq
from etcdsched.store.kv import KV, Compare, Op, Ops, Store, holds
from etcdsched.store.runs import RunOps

log = logging.getLogger("etcdsched.scheduler.firing")


@dataclass
class EntryWrite:
    """The compares and ops that fire one due entry."""

    runs: RunOps
    """Builds the runs' queue writes, only if they are wanted (see :meth:`queued`)."""
    compares: list[Compare] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    """Its ops besides the runs' own: skip records, and the due entry's
    own delete and puts."""
    unqueued: list[RunRecord] = field(default_factory=list)
    """The runs it creates, as they are before they are queued (ADR 0016
    places a lone one straight onto a worker instead)."""
    placed: list[RunRecord] = field(default_factory=list)
    """The runs as stored when they were fired straight onto a worker."""
    _queued: list[tuple[RunRecord, list[Op]]] | None = None
    cancel_after: list[tuple[str, int]] = field(default_factory=list)
    """Runs an ``overlap: cancel_previous`` run supersedes, with the instant
    to cancel them at: the new run's not-before, when it takes over."""
    skips: list[SkipRecord] = field(default_factory=list)
    """The skip records it writes (counted once the write commits)."""
    next_kv: tuple[str, bytes, DueEntry] | None = None
    """The job's next due entry: key, value (encoded once for its two puts
    and the cache) and the entry itself (so the next firing need not decode it)."""

    def queued(self) -> list[tuple[RunRecord, list[Op]]]:
        """Each run as stored in the queue, with the ops that create it
        there; built on first use, since a run fired straight onto a worker
        never needs them (encoding them was wasted work on every such run)."""
        if self._queued is None:
            self._queued = [self.runs.create_ops(run) for run in self.unqueued]
        return self._queued

    @property
    def created(self) -> list[RunRecord]:
        """The runs it created, as stored."""
        return self.placed or [run for run, _ in self.queued()]

    @property
    def all_ops(self) -> list[Op]:
        """Every op of the entry's firing into the queue."""
        return [*(op for _, ops in self.queued() for op in ops), *self.ops]


@dataclass
class FireStats:
    fired: int = 0
    direct: int = 0
    """Of ``fired``, runs fired straight onto a worker (ADR 0016)."""
    skipped: int = 0
    batches: int = 0
    conflicts: int = 0


class ConflictResolution(ABC):
    """The failure paths of :class:`etcdsched.scheduler.firing.PartitionFirer`.

    A batch fails when one of its entries changed, its job changed, one of
    its runs already exists, or we lost the partition; etcd does not say
    which, so the entries are retried one at a time against fresh reads.
    """

    partition: int
    store: Store
    keys: Keys
    ownership: Ownership
    due: PrefixCache
    stats: FireStats

    @abstractmethod
    def _entry_write(
        self,
        kv: KV,
        now_ms: int,
        active_by_job: dict[str, list[ActivePointer]],
        existing: frozenset[int] = frozenset(),
    ) -> EntryWrite:
        """The write that fires ``kv`` (see the firer)."""

    @abstractmethod
    def _applied(self, chunk: list[tuple[KV, EntryWrite]], revision: int) -> None:
        """Reflect a committed batch in memory (see the firer)."""

    def _check_owner(self, owner_kvs: list[KV], guard: Compare) -> None:
        if not holds(guard, owner_kvs):
            self.ownership.tokens.pop(self.partition, None)
            raise OwnershipLost(f"partition {self.partition} was taken over")

    async def _one_by_one(self, chunk: list[tuple[KV, EntryWrite]], now_ms: int) -> None:
        self.stats.conflicts += 1
        for kv, _ in chunk:
            fresh = await self.store.get(kv.key)
            if fresh is None or fresh.mod_revision != kv.mod_revision:
                self.due.discard(kv.key)  # already fired (unknown outcome) or changed
                if fresh is not None:
                    self.due.put_item(fresh)
                continue
            active = await self._fresh_active(fresh)
            await self._commit_single(fresh, self._entry_write(fresh, now_ms, active), now_ms)

    async def _fresh_active(self, kv: KV) -> dict[str, list[ActivePointer]]:
        job_id = self.keys.parse_due(kv.key).job_id
        page = await self.store.range(self.keys.active_prefix(self.partition, job_id))
        return {job_id: [p.decode(ActivePointer).value for p in page.kvs]}

    async def _commit_single(self, kv: KV, write: EntryWrite, now_ms: int) -> None:
        guard = self.ownership.guard(self.partition)
        result = await self.store.txn([guard, *write.compares], write.all_ops, [Ops.get(guard.key)])
        if result.succeeded:
            self._applied([(kv, write)], result.revision)
            return
        self._check_owner(result.responses[0], guard)
        await self._resolve_single(kv, now_ms)

    async def _resolve_single(self, kv: KV, now_ms: int) -> None:
        """A lone entry that still fails: the job changed under it, or a run
        of one of its slots already exists (a backfill made it). Re-read; if
        the job is gone or changed, drop the orphaned entry; otherwise fire it
        again leaving out the runs that exist — each of those slots is
        already explained by its run, and the plan's other runs and skip
        records must still be written, or their slots would be lost."""
        entry = kv.decode(DueEntry).value
        job = await self.store.get(self.keys.job(entry.job_id))
        if job is None or job.version != entry.job_key_version:
            await self._drop_stale(kv)
            return
        existing = await self._existing_runs(entry, plan_fire(entry, now_ms))
        log.warning("due entry %s conflicts; runs exist for slots %s", kv.key, sorted(existing))
        write = self._entry_write(kv, now_ms, await self._fresh_active(kv), existing)
        guard = self.ownership.guard(self.partition)
        result = await self.store.txn([guard, *write.compares], write.all_ops)
        if result.succeeded:
            self._applied([(kv, write)], result.revision)
        # else: left in the cache; the next pass re-reads and decides again

    async def _drop_stale(self, kv: KV) -> None:
        """Delete a due entry computed from an older job. Compares: owner
        token, the entry unchanged. When it did change, a replace rewrote it
        in place (same slot, same key): keep the fresh entry in the cache."""
        guard = self.ownership.guard(self.partition)
        result = await self.store.txn(
            [guard, Compare(kv.key, "mod", "==", kv.mod_revision)],
            [Ops.delete(kv.key)],
            [Ops.get(kv.key)],
        )
        self.due.discard(kv.key)
        fresh = result.responses[0] if not result.succeeded and result.responses else []
        if fresh:
            self.due.put_item(fresh[0])
        else:
            log.info("dropped stale due entry %s", kv.key)

    async def _existing_runs(self, entry: DueEntry, plan: FirePlan) -> frozenset[int]:
        """Slots of ``plan`` that already have a (non-manual) run."""
        if not plan.runs:
            return frozenset()
        prefix = self.keys.runs_prefix(entry.job_id)
        first, last = plan.runs[0].slot_ms, plan.runs[-1].slot_ms
        page = await self.store.range(
            prefix + run_seq(first), prefix + run_seq(last + 1), keys_only=True
        )
        planned = {p.slot_ms for p in plan.runs}
        refs = (self.keys.parse_run(kv.key) for kv in page.kvs)
        return frozenset(
            r.slot_ms for r in refs if r.seq == run_seq(r.slot_ms) and r.slot_ms in planned
        )
