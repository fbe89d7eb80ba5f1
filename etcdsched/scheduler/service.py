"""The scheduler role: hold partitions, fire their due slots, place their
runs, recover their lost runs.

One session (lease) per incarnation: the member key and every owner key are
bound to it. When the session is lost, every partition task stops at once
and a new session starts from scratch, so a process that was frozen past its
TTL comes back as a new member and cannot act on stale ownership (its writes
would fail the owner-token compare anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from etcdsched.config import Config
from etcdsched.logs.store import LogStore
from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.errors import EtcdschedError, OwnershipLost, StoreUnavailable
from etcdsched.model.records import ClusterMeta, OwnerRecord, SchedulerMember
from etcdsched.runtime.clock import Clock
from etcdsched.runtime.metrics import PARTITIONS_OWNED
from etcdsched.scheduler.after_watch import AfterWatch
from etcdsched.scheduler.assigner import Assigner
from etcdsched.scheduler.capacity import CapacityIndex
from etcdsched.scheduler.delivery import Notifications
from etcdsched.scheduler.direct_fire import DirectPlacement
from etcdsched.scheduler.firing import PartitionFirer
from etcdsched.scheduler.overlap import active_runs_cache
from etcdsched.scheduler.ownership import Ownership, desired_owners
from etcdsched.scheduler.placement_loop import PlacementLoop
from etcdsched.scheduler.placer import PartitionPlacer
from etcdsched.scheduler.recovery import PartitionRecovery
from etcdsched.scheduler.retention import RetentionSweeper
from etcdsched.scheduler.staging import StagingLead
from etcdsched.store.cache import PrefixCache, versions, wait_any_change
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Cmp, Ops, Store
from etcdsched.store.runs import RunOps, cancel_run
from etcdsched.store.session import RenewerFactory, Session

log = logging.getLogger(__name__)
FIRING_IN_PARALLEL = 2
"""Partitions building and committing a firing batch at once (per scheduler)."""


KEY_LAYOUT = 2
"""See :attr:`etcdsched.model.records.ClusterMeta.layout`."""


async def ensure_cluster(store: Store, keys: Keys, partitions: int, now_ms: int) -> ClusterMeta:
    """Create the cluster settings once (compare: absent); afterwards the
    stored partition count wins over any configured one. Retried while etcd
    is unavailable: a retry after an unknown outcome reads our own write."""
    meta = ClusterMeta(partitions=partitions, created_ms=now_ms, layout=KEY_LAYOUT)
    key = keys.cluster_meta()
    for attempt in range(30):
        try:
            result = await store.txn([Cmp.absent(key)], [Ops.put(key, meta)], [Ops.get(key)])
            break
        except StoreUnavailable:
            if attempt == 29:
                raise
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
    if result.succeeded:
        return meta
    stored = result.responses[0][0].decode(ClusterMeta).value
    if stored.layout != KEY_LAYOUT:
        raise ValueError(
            f"the etcd data under {keys.prefix} was written by an earlier etcdsched (key layout"
            f" {stored.layout}, job ids without their tenant); this version needs layout"
            f" {KEY_LAYOUT}: start with a new data directory or prefix (there is no migration"
            " before 1.0)"
        )
    return stored


@dataclass
class PartitionTasks:
    firer: PartitionFirer
    placer: PartitionPlacer
    recovery: PartitionRecovery
    active: PrefixCache
    after: AfterWatch
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class SchedulerService:
    def __init__(
        self,
        config: Config,
        store: Store,
        keys: Keys,
        clock: Clock,
        logs: LogStore | None = None,
        renew_store: RenewerFactory | None = None,
    ) -> None:
        """``renew_store`` moves lease renewal to its own thread and
        connection (``etcdsched.store.session``): an overloaded scheduler keeps
        its partitions instead of losing them all and re-listing."""
        self.config = config
        self.store = store
        self.renew_store = renew_store
        self.keys = keys
        self.clock = clock
        self.member_id = config.member_id
        self.partitions = 0
        self.owned: dict[int, PartitionTasks] = {}
        self._timers: set[asyncio.Task[None]] = set()
        """Cancels waiting for the instant of the run that supersedes them."""
        self.ownership = Ownership(store, keys, self.member_id)
        self.session: Session | None = None
        self.workers = PrefixCache(store, clock, keys.members_prefix("workers"), relist_every=15)
        self.capacity = CapacityIndex(keys)
        self.assignments = PrefixCache(
            store, clock, keys.assign_prefix(), relist_every=15, on_event=self.capacity.on_event
        )
        self.schedulers = PrefixCache(
            store, clock, keys.members_prefix("schedulers"), relist_every=10
        )
        self.owners = PrefixCache(store, clock, keys.owners_prefix(), relist_every=10)
        self.notify = Notifications(config, store, keys, clock, self.ownership)
        """Runs this scheduler ends write their webhook deliveries; it sends
        those of its partitions (docs/webhooks.md)."""
        self.runs = RunOps(keys, self.notify.outbox)
        """Run writes of every owned partition: their ends carry the outbox."""
        self._caches: list[asyncio.Task[None]] = []
        self.retention = RetentionSweeper(store, keys, logs, config.retention_log_delete_grace_ms)
        self.assigner = Assigner(store, keys)
        self.fire_gate = asyncio.Semaphore(FIRING_IN_PARALLEL)
        self.placement = PlacementLoop(
            store,
            keys,
            clock,
            lambda: [t.placer for t in self.owned.values()],
            self.workers,
            self.assignments,
            self.capacity,
            self.assigner,
            config.lookahead_ms,
            config.fire_backlog,
        )
        direct = DirectPlacement(self.placement, self.assigner, keys)
        self.direct = direct if config.fire_onto_workers else None
        self.staging = StagingLead(
            clock,
            config.lookahead_ms,
            config.horizon_ms,
            lambda now_ms: (t.firer.herd_profile(now_ms) for t in self.owned.values()),
            self._capacity_slots,
            config.max_staged_runs,
        )
        """How far ahead to fire and place: the lookahead, more for a herd."""
        if config.adaptive_staging:
            self.placement.lead_ms = self.staging.lead_ms

    # -- lifecycle ---------------------------------------------------------------
    async def run(self) -> None:
        meta = await ensure_cluster(
            self.store, self.keys, self.config.partitions, self.clock.now_ms()
        )
        self.partitions = meta.partitions
        self.notify.know_partitions(self.partitions)
        self._start_caches()
        try:
            while True:
                await self._incarnation()
        finally:
            await self._stop_all()
            await self.assigner.forget(set())
            for task in [*self._caches, *self._timers]:
                task.cancel()
            await asyncio.gather(*self._caches, return_exceptions=True)
            await self.notify.close()
            if self.session is not None:
                await self.session.close()

    def _start_caches(self) -> None:
        hooks = self.notify.webhooks
        for cache in (self.workers, self.assignments, self.schedulers, self.owners, hooks):
            self._caches.append(asyncio.create_task(cache.run(), name=f"cache {cache.prefix}"))
        self._caches.append(asyncio.create_task(self.placement.run(), name="placement"))
        self._caches.append(asyncio.create_task(self._measure_staging(), name="staging-rate"))

    def _capacity_slots(self) -> int:
        return sum(view.member.capacity.slots for view in self.placement.worker_views().values())

    async def _measure_staging(self) -> None:
        """Feed the staging lead what was fired, twice a second."""
        while True:
            fired = sum(t.firer.stats.fired for t in self.owned.values())
            self.staging.observe(fired, self.placement.brake.engaged())
            await self.clock.sleep(0.5)

    async def _incarnation(self) -> None:
        """One session: register, then balance partitions until it is lost.
        Stopped (cancelled: the agent is stopping), it revokes its lease, so
        its partitions are free for another scheduler at once instead of
        after the TTL; after an error it lets the lease expire, as a crash
        would, since it cannot tell what its last writes did."""
        stopping = False
        try:
            self.session = await Session.open(
                self.store, self.clock, self.config.lease_ttl, renew_store=self.renew_store
            )
            self.ownership.bind(self.session)
            await self.notify.webhooks.ready.wait()  # no run ends before its webhooks are known
            await self._register(self.session)
            await self.schedulers.ready.wait()
            while not self.session.lost:
                seen = versions(self.schedulers, self.owners)
                await self.rebalance()
                await wait_any_change(seen, 1.0, self.session.wait_lost())
        except EtcdschedError as exc:
            log.warning("scheduler %s: %s; starting a new session", self.member_id, exc)
            await self.clock.sleep(0.5)
        except asyncio.CancelledError:
            stopping = True
            raise
        finally:
            await self._stop_all()
            self.ownership.forget_all()
            if self.session is not None and not self.session.lost:
                await (self.session.close() if stopping else self.session.orphan())

    async def _register(self, session: Session) -> None:
        member = SchedulerMember(
            id=self.member_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_ms=self.clock.now_ms(),
        )
        key = self.keys.member("schedulers", self.member_id)
        await self.store.txn([], [Ops.put(key, member, lease=session.lease_id)])

    # -- partitions ------------------------------------------------------------
    def live_schedulers(self) -> list[str]:
        return sorted(kv.decode(SchedulerMember).value.id for kv in self.schedulers.items.values())

    async def rebalance(self) -> None:
        """Release partitions meant for another live member; acquire free ones
        meant for us."""
        assert self.session is not None
        members = self.live_schedulers()
        if self.member_id not in members:
            members.append(self.member_id)
        desired = desired_owners(sorted(members), self.partitions)
        for partition, tasks in list(self.owned.items()):
            if desired.get(partition) != self.member_id or tasks_done(tasks):
                await self._stop_partition(partition)
                await self.ownership.release(partition)
        before = len(self.owned)
        await self._acquire_free(desired)
        PARTITIONS_OWNED.set(len(self.owned))
        if len(self.owned) != before:
            log.info("scheduler %s owns %d partitions", self.member_id, len(self.owned))

    async def _acquire_free(self, desired: dict[int, str]) -> None:
        """Acquire every free partition meant for us at once, then start
        those we got. One at a time, each acquire waited behind the partitions
        started before it (their first listing, firing and placement share
        this loop): taking over 50 partitions of a dead scheduler took 2 s
        after its lease expired. Each acquire is still its own transaction
        (compare: owner key absent), so at most one owner per partition."""
        assert self.session is not None
        session, now_ms = self.session, self.clock.now_ms()
        wanted = [
            partition
            for partition, member in desired.items()
            if member == self.member_id and partition not in self.owned and self._free(partition)
        ]
        results = await asyncio.gather(
            *(self.ownership.acquire(partition, session, now_ms) for partition in wanted),
            return_exceptions=True,
        )
        for partition, got in zip(wanted, results, strict=True):
            if got is True:
                self._start_partition(partition)
        for partition, got in zip(wanted, results, strict=True):
            # Session gone (or a bug): end this incarnation. Any other etcd
            # error leaves an unknown outcome that the next pass re-reads
            # (an owner key under our lease is ours), keeping the others.
            if isinstance(got, OwnershipLost) or not isinstance(got, (bool, EtcdschedError)):
                raise got
            if isinstance(got, EtcdschedError):
                log.warning("partition %d: acquire failed: %s", partition, got)

    def _free(self, partition: int) -> bool:
        kv = self.owners.items.get(self.keys.owner(partition))
        if kv is None:
            return True
        return kv.decode(OwnerRecord).value.scheduler == self.member_id

    def _start_partition(self, partition: int) -> None:
        cfg = self.config
        active = active_runs_cache(
            self.store, self.clock, self.keys, partition, self.retention.on_active_event
        )
        firer = PartitionFirer(
            partition,
            self.store,
            self.keys,
            self.clock,
            self.ownership,
            active,
            self.partitions,
            cfg.lookahead_ms,
            cfg.horizon_ms,
            cfg.fire_batch,
            self.fire_gate,
            self.placement.brake,
            self.direct,
            self.staging.lead_ms if cfg.adaptive_staging else None,
            self.runs,
        )
        placer = PartitionPlacer(
            partition,
            self.store,
            self.keys,
            self.clock,
            self.ownership,
            active,
            self.assigner,
            self.placement.queues_changed.notify,
            self.runs,
        )
        firer.on_fired = placer.remember_fired
        placer.due_soon = lambda not_before_ms: (
            not_before_ms <= self.clock.now_ms() + self.placement.lead_ms()
        )
        recovery = PartitionRecovery(
            partition, self.store, self.keys, self.ownership, active, self.workers, self.runs
        )
        after = AfterWatch(firer, self.store, self.keys, self.clock, self.ownership)
        delivery = self.notify.loop(partition)
        tasks = PartitionTasks(firer, placer, recovery, active, after)
        tasks.tasks = [
            asyncio.create_task(active.run(), name=f"active-{partition}"),
            asyncio.create_task(placer.queue.run(), name=f"queue-{partition}"),
            asyncio.create_task(self._guarded(firer.run(), partition), name=f"fire-{partition}"),
            asyncio.create_task(
                self._guarded(self._tend_loop(tasks), partition), name=f"tend-{partition}"
            ),
            asyncio.create_task(
                self._guarded(delivery.run(), partition), name=f"deliver-{partition}"
            ),
        ]
        self.owned[partition] = tasks
        log.debug("scheduler %s owns partition %d", self.member_id, partition)

    async def _guarded(self, work: Coroutine[Any, Any, None], partition: int) -> None:
        """Run a partition task; losing ownership ends it quietly."""
        try:
            await work
        except OwnershipLost:
            log.warning("partition %d: ownership lost", partition)
        except EtcdschedError as exc:
            log.warning("partition %d: %s", partition, exc)

    async def _tend_loop(self, tasks: PartitionTasks) -> None:
        """Everything a partition needs besides firing and placement: cancel
        what a ``cancel_previous`` firing superseded, arm ``after`` jobs
        whose upstream runs ended, recover the runs of vanished or hung
        workers, sweep old runs."""
        await tasks.active.ready.wait()
        await self.workers.ready.wait()
        next_reconcile = 0.0
        seen_workers: set[str] = set()
        while True:
            now = self.clock.now_ms()
            seen = versions(tasks.placer.queue, self.workers)
            await self._cancel_previous(tasks.firer, now)
            await tasks.after.check()
            # a worker that left may have held runs: recover them now, not up
            # to reconcile_every later (its claims went with its lease)
            workers = set(self.workers.items)
            left, seen_workers = bool(seen_workers - workers), workers
            if left or self.clock.monotonic() >= next_reconcile:
                await tasks.recovery.reconcile_once(now)
                await self.retention.sweep_gone(tasks.firer.partition, now)
                await self.retention.sweep(now)
                next_reconcile = self.clock.monotonic() + self.config.reconcile_every
            wait_s = max(0.0, next_reconcile - self.clock.monotonic())
            await wait_any_change(seen, min(1.0, wait_s))

    async def _cancel_previous(self, firer: PartitionFirer, now_ms: int) -> None:
        """Cancel what a ``cancel_previous`` run supersedes when the new run
        takes over (its not-before), not when it was fired a lead earlier."""
        while firer.cancel_requests:
            rid, at_ms = firer.cancel_requests.pop()
            task = asyncio.create_task(self._supersede(rid, at_ms), name=f"supersede {rid}")
            self._timers.add(task)
            task.add_done_callback(self._timers.discard)

    async def _supersede(self, rid: str, at_ms: int) -> None:
        await self.clock.sleep_until_ms(at_ms)
        reason = f"superseded by slot {ms_to_utc(at_ms).isoformat(timespec='milliseconds')}"
        with contextlib.suppress(EtcdschedError):
            await cancel_run(self.store, self.keys, rid, self.clock.now_ms(), reason)

    async def _stop_partition(self, partition: int) -> None:
        tasks = self.owned.pop(partition, None)
        if tasks is None:
            return
        for task in tasks.tasks:
            task.cancel()
        await asyncio.gather(*tasks.tasks, return_exceptions=True)

    async def _stop_all(self) -> None:
        for partition in list(self.owned):
            await self._stop_partition(partition)


def tasks_done(tasks: PartitionTasks) -> bool:
    """A partition whose tasks ended (ownership lost) must be re-acquired."""
    return any(task.done() for task in tasks.tasks)
