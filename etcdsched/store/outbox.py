"""The outbox: deliveries written by the very transaction that ends a run
(docs/webhooks.md, docs/design.md "Notifications").

The ending transaction gets one ``Put`` of ``outbox/<pp>/<run>/<event id>``
per webhook that wants the event, and nothing at all when none does: the
decision uses only the run's spec snapshot (its ``notify`` rules) and the
role's in-memory copy of its tenant's webhooks, never a read. The
partition's owner sends them (``etcdsched.scheduler.delivery``) and moves
each, once delivered or given up, to ``deliveries/<job>/<seq>/<event id>``,
kept with the run and deleted by retention with it.
"""

from __future__ import annotations

from collections.abc import Iterable

from etcdsched.model.notify_events import paused_deliveries, run_deliveries, skip_deliveries
from etcdsched.model.notify_records import Delivery
from etcdsched.model.records import RunRecord, SkipRecord
from etcdsched.model.spec import JobSpec
from etcdsched.store.cache import list_all
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Op, Ops, Store, prefix_end
from etcdsched.store.webhooks import HooksOf, no_hooks


class Outbox:
    """Builds the outbox puts of ending transactions, for one key prefix."""

    def __init__(self, keys: Keys, hooks_of: HooksOf = no_hooks) -> None:
        self.keys = keys
        self.hooks_of = hooks_of
        """The tenant's webhooks, from the role's watched copy."""

    def run_ops(self, run: RunRecord) -> list[Op]:
        """Puts for the events ``run`` (just ended) owes; usually none."""
        if not run.state.terminal:
            return []
        hooks = self.hooks_of(run.tenant)
        if not run.spec.notify and not hooks and run.spec.pause_after_failures is None:
            return []
        return [self._put(run.partition, d) for d in run_deliveries(run, hooks)]

    def paused_ops(self, check: Delivery, spec: JobSpec, partition: int, now_ms: int) -> list[Op]:
        """Puts of the ``job.paused`` events of a pause the sender makes."""
        hooks = self.hooks_of(spec.tenant)
        return [
            self._put(partition, d) for d in paused_deliveries(check, spec.notify, hooks, now_ms)
        ]

    def skip_ops(self, spec: JobSpec, partition: int, skips: Iterable[SkipRecord]) -> list[Op]:
        """Puts for the ``slot.skipped`` events of skip records just written."""
        hooks = self.hooks_of(spec.tenant)
        if not spec.notify and not hooks:
            return []
        return [
            self._put(partition, d)
            for skip in skips
            for d in skip_deliveries(skip, spec.tenant, spec.notify, hooks)
        ]

    def _put(self, partition: int, delivery: Delivery) -> Op:
        return Ops.put(self.keys.outbox(partition, delivery.run_id, delivery.event_id), delivery)


async def run_deliveries_stored(
    store: Store, keys: Keys, partition: int, rid: str
) -> list[Delivery]:
    """A run's deliveries: those still pending in the outbox and those ended."""
    found: list[Delivery] = []
    for prefix in (keys.outbox_prefix(partition, rid), keys.deliveries_prefix(rid)):
        items, _ = await list_all(store, prefix, prefix_end(prefix))
        found += [kv.decode(Delivery).value for kv in items.values()]
    return sorted(found, key=lambda d: (d.created_ms, d.kind, d.webhook))
