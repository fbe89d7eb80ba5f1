"""The delivery loop of one owned partition: send what its outbox holds.

Only the partition's owner sends, so at any time one sender per delivery
(docs/webhooks.md, "Exactly once per outcome"). Each attempt's result is
written back with two compares: *we still own the partition* (the owner
key's create revision) and *the delivery is unchanged since we read it*.
A delivery that a crashed or departed owner had not finished stays in the
outbox and the next owner sends it again: a receiver may see the same
event (same ``Idempotency-Key``) more than once, never two different
events for one outcome (event ids are stable).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from etcdsched.config import Config
from etcdsched.model.codec import CorruptRecord
from etcdsched.model.errors import EtcdschedError, OwnershipLost
from etcdsched.model.notify_events import PAUSE_CHECK, after_attempt, is_recovery
from etcdsched.model.notify_records import Delivery, Webhook
from etcdsched.model.records import RunRecord
from etcdsched.model.states import RunState
from etcdsched.runtime.clock import Clock
from etcdsched.runtime.metrics import WEBHOOK_ATTEMPTS, WEBHOOK_DELIVERIES, WEBHOOK_PENDING
from etcdsched.scheduler.delivery_pause import FailurePause
from etcdsched.scheduler.ownership import Ownership
from etcdsched.scheduler.webhook_sender import AttemptResult, WebhookSender
from etcdsched.store.cache import PrefixCache
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Cmp, Op, Ops, Store
from etcdsched.store.outbox import Outbox
from etcdsched.store.webhooks import TenantWebhooks

log = logging.getLogger(__name__)
RECOVERY_LOOKBACK = 20
"""Earlier runs read to find the one a success may have recovered from."""


@dataclass(frozen=True)
class DeliverySettings:
    retry_initial_ms: int = 1000
    retry_max_delay_ms: int = 300_000
    give_up_after_ms: int = 86_400_000
    concurrency: int = 8

    @classmethod
    def of(cls, config: Config) -> DeliverySettings:
        return cls(
            retry_initial_ms=config.webhook_retry_initial_ms,
            retry_max_delay_ms=config.webhook_retry_max_delay_ms,
            give_up_after_ms=config.webhook_max_retry_ms,
            concurrency=config.webhook_concurrency,
        )


class Notifications:
    """What a scheduler keeps for webhooks: the tenants' webhooks (watched),
    the outbox its run-ending transactions write through, the HTTP sender,
    and a delivery loop per owned partition."""

    def __init__(
        self, config: Config, store: Store, keys: Keys, clock: Clock, ownership: Ownership
    ) -> None:
        self.store, self.keys, self.clock, self.ownership = store, keys, clock, ownership
        self.webhooks = TenantWebhooks(store, clock, keys)
        self.outbox = Outbox(keys, self.webhooks.of)
        self.sender = WebhookSender(config.webhook_timeout_ms / 1000, config.webhook_link_base)
        self.settings = DeliverySettings.of(config)
        self.pauses: FailurePause | None = None

    def know_partitions(self, partitions: int) -> None:
        """Pausing a job needs the partition count (known once the cluster is)."""
        jobs = JobService(self.store, self.keys, self.clock, partitions)
        self.pauses = FailurePause(self.store, self.keys, self.clock, jobs, self.outbox)

    def loop(self, partition: int) -> PartitionDelivery:
        return PartitionDelivery(
            partition,
            *(self.store, self.keys, self.clock, self.ownership, self.sender),
            self.settings,
            self.webhooks,
            self.pauses,
        )

    async def close(self) -> None:
        await self.sender.close()


class PartitionDelivery:
    """Watches ``outbox/<pp>/`` and sends each pending delivery when due."""

    def __init__(
        self,
        partition: int,
        store: Store,
        keys: Keys,
        clock: Clock,
        ownership: Ownership,
        sender: WebhookSender,
        settings: DeliverySettings,
        webhooks: TenantWebhooks,
        pauses: FailurePause | None = None,
    ) -> None:
        """``pauses`` handles pause checks (``pause_after_failures``); without
        it they are retired unread."""
        self.partition = partition
        self.store = store
        self.keys = keys
        self.clock = clock
        self.ownership = ownership
        self.sender = sender
        self.settings = settings
        self.webhooks = webhooks
        self.pauses = pauses
        self.outbox = PrefixCache(store, clock, keys.outbox_prefix(partition), relist_every=30.0)
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._handled: dict[str, int] = {}
        """Outbox keys whose attempt was recorded, by the revision it was
        made from, until the watch shows the write: never sent twice from
        one stale copy."""
        self._counted = 0

    async def run(self) -> None:
        cache = asyncio.create_task(self.outbox.run(), name=f"outbox-{self.partition}")
        try:
            await self.outbox.ready.wait()
            while True:
                seen = self.outbox.version
                next_ms = self._start_due(self.clock.now_ms())
                self._count_pending()
                wait_s = 1.0 if next_ms is None else (next_ms - self.clock.now_ms()) / 1000
                await self._wait(seen, min(1.0, max(0.01, wait_s)))
        finally:
            tasks = [cache, *self._inflight.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            WEBHOOK_PENDING.dec(self._counted)
            self._counted = 0

    async def _wait(self, seen: int, timeout: float) -> None:
        """Until the outbox changes, an attempt ends, or ``timeout``."""
        changed = asyncio.ensure_future(self.outbox.wait_changed(seen))
        waits: set[asyncio.Future[None]] = {changed, *self._inflight.values()}
        try:
            await asyncio.wait(waits, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            changed.cancel()
        for key, task in list(self._inflight.items()):
            if task.done():
                del self._inflight[key]
                error = None if task.cancelled() else task.exception()
                if isinstance(error, OwnershipLost):
                    raise OwnershipLost(f"partition {self.partition} is not owned")
                if error is not None:
                    log.error("delivery %s failed unexpectedly", key, exc_info=error)

    def _count_pending(self) -> None:
        pending = len(self.outbox.items)
        WEBHOOK_PENDING.inc(pending - self._counted)
        self._counted = pending

    def _start_due(self, now_ms: int) -> int | None:
        """Start the due deliveries (as many as may be in flight); return
        when the next waiting one is due."""
        soonest: int | None = None
        items = self.outbox.items
        self._handled = {k: r for k, r in self._handled.items() if k in items}
        for key, kv in list(items.items()):
            if key in self._inflight or self._handled.get(key) == kv.mod_revision:
                continue
            try:
                delivery = kv.decode(Delivery).value
            except CorruptRecord:
                self._handled[key] = kv.mod_revision  # left for an operator; never sent
                log.warning("outbox record %s does not decode; not sent", key)
                continue
            if delivery.next_attempt_ms > now_ms:
                if soonest is None or delivery.next_attempt_ms < soonest:
                    soonest = delivery.next_attempt_ms
                continue
            if len(self._inflight) >= self.settings.concurrency:
                return now_ms
            self._inflight[key] = asyncio.create_task(self._attempt(kv, delivery))
        return soonest

    async def _attempt(self, kv: KV, delivery: Delivery) -> None:
        try:
            if delivery.webhook == PAUSE_CHECK:  # not a POST: a decision of the owner
                if self.pauses is not None:
                    fence = self.ownership.guard(self.partition)
                    await self.pauses.check(delivery, kv, self.partition, fence)
                await self._record(kv, delivery)
                self._handled[kv.key] = kv.mod_revision
                return
            hook = await self._webhook(delivery)
            if hook is None:
                result = AttemptResult(None, f"webhook {delivery.webhook} no longer exists")
                ended = self._give_up(delivery, result)
            elif delivery.kind == "run.recovered" and not await self._recovered(delivery):
                ended = delivery.model_copy(
                    update={"state": "not_applicable", "ended_ms": self.clock.now_ms()}
                )
            else:
                result = await self.sender.send(hook, delivery, self.clock.now_ms() // 1000)
                WEBHOOK_ATTEMPTS.labels(result="ok" if result.ok else "error").inc()
                ended = after_attempt(
                    delivery,
                    self.clock.now_ms(),
                    status=result.status,
                    error=result.error,
                    initial_ms=self.settings.retry_initial_ms,
                    max_delay_ms=self.settings.retry_max_delay_ms,
                    give_up_after_ms=self.settings.give_up_after_ms,
                )
            await self._record(kv, ended)
            self._handled[kv.key] = kv.mod_revision
        except OwnershipLost:
            raise
        except EtcdschedError as exc:
            log.warning("delivery %s: %s; trying again later", delivery.event_id, exc)
            await self.clock.sleep(1.0)

    def _give_up(self, delivery: Delivery, result: AttemptResult) -> Delivery:
        update = {"state": "failed", "ended_ms": self.clock.now_ms(), "last_error": result.error}
        return delivery.model_copy(update=update)

    async def _webhook(self, delivery: Delivery) -> Webhook | None:
        """Looked up at each attempt, in the scheduler's watched copy: a
        changed URL or rotated secret applies to the next attempt of a
        pending delivery. Read from etcd only when the copy lacks it (a
        webhook written a moment ago that the watch has yet to bring), so
        a delivery is never given up on a copy that is behind."""
        hook = self.webhooks.find(delivery.tenant, delivery.webhook)
        if hook is not None:
            return hook
        kv = await self.store.get(self.keys.webhook(delivery.tenant, delivery.webhook))
        return None if kv is None else kv.decode(Webhook).value

    async def _recovered(self, delivery: Delivery) -> bool:
        """Whether the job's last finished run before this one failed."""
        start = self.keys.runs_prefix(delivery.job_id)
        page = await self.store.range(
            start, self.keys.run(delivery.run_id), limit=RECOVERY_LOOKBACK, descending=True
        )
        for item in page.kvs:
            run = item.decode(RunRecord).value
            if run.state.terminal and run.state not in (RunState.CANCELLED, RunState.SKIPPED):
                return is_recovery(run)
        return False

    async def _record(self, kv: KV, delivery: Delivery) -> None:
        """Compares: we own the partition; the delivery is as we read it.
        Pending: rewritten in place. Ended: moved to ``deliveries/``."""
        ops: list[Op]
        if delivery.webhook == PAUSE_CHECK:
            # done: its events, if any, are deliveries of their own (a pause
            # deleted the check itself, so then this finds it changed)
            ops = [Ops.delete(kv.key)]
        elif delivery.state == "pending":
            ops = [Ops.put(kv.key, delivery)]
        else:
            ops = [
                Ops.delete(kv.key),
                Ops.put(self.keys.delivery(delivery.run_id, delivery.event_id), delivery),
            ]
        compares = [self.ownership.guard(self.partition), Cmp.mod(kv.key, kv.mod_revision)]
        result = await self.store.txn(compares, ops, [Ops.get(self.keys.owner(self.partition))])
        if not result.succeeded:
            owner = result.responses[0] if result.responses else []
            if not owner or owner[0].create_revision != self.ownership.tokens.get(self.partition):
                raise OwnershipLost(f"partition {self.partition} was taken over")
            return  # someone else moved the delivery (a previous owner's late write)
        if delivery.state in ("delivered", "failed"):
            WEBHOOK_DELIVERIES.labels(result=delivery.state).inc()
            log.info(
                "delivery %s (%s of %s to %s): %s after %d attempt(s)",
                delivery.event_id,
                delivery.kind,
                delivery.run_id,
                delivery.webhook,
                delivery.state,
                delivery.attempts,
            )
