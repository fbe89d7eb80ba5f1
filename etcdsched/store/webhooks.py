"""Tenants' webhooks in etcd (``webhooks/<tenant>/<name>``) and the watched
copy of them that every role ending runs keeps (docs/webhooks.md).

A webhook with events of its own applies to every job of its tenant: the
transaction that ends a run must know, without a read, whether to write an
outbox record. So each such role (worker, scheduler) watches the prefix;
a webhook written now applies to outcomes from about a second later (the
watch's delay), which the docs say.
"""

from __future__ import annotations

from collections.abc import Callable

from etcdsched.model.codec import CorruptRecord
from etcdsched.model.errors import NotFound
from etcdsched.model.notify_records import Webhook
from etcdsched.runtime.clock import Clock
from etcdsched.store.cache import PrefixCache, list_all
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Cmp, Ops, Store, Versioned, prefix_end


class WebhookStore:
    """Reads and writes of webhook records (the API's)."""

    def __init__(self, store: Store, keys: Keys) -> None:
        self.store = store
        self.keys = keys

    async def get(self, tenant: str, name: str) -> Versioned[Webhook]:
        kv = await self.store.get(self.keys.webhook(tenant, name))
        if kv is None:
            raise NotFound(f"webhook {name} of tenant {tenant} not found", field="name")
        return kv.decode(Webhook)

    async def list(self, tenant: str) -> list[Webhook]:
        prefix = self.keys.webhooks_prefix(tenant)
        items, _ = await list_all(self.store, prefix, prefix_end(prefix))
        return [kv.decode(Webhook).value for _, kv in sorted(items.items())]

    async def put(self, hook: Webhook) -> Webhook:
        """Create or replace (a webhook is a whole record; no compare needed:
        the last write wins, as with a tenant's limits)."""
        await self.store.txn([], [Ops.put(self.keys.webhook(hook.tenant, hook.name), hook)])
        return hook

    async def delete(self, tenant: str, name: str) -> None:
        """Compare: it exists (so a delete of a missing one is a 404)."""
        key = self.keys.webhook(tenant, name)
        result = await self.store.txn([Cmp.exists(key)], [Ops.delete(key)])
        if not result.succeeded:
            raise NotFound(f"webhook {name} of tenant {tenant} not found", field="name")


class TenantWebhooks(PrefixCache):
    """Every tenant's webhooks, watched; :meth:`of` answers from memory."""

    def __init__(self, store: Store, clock: Clock, keys: Keys) -> None:
        self._keys = keys
        super().__init__(
            store,
            clock,
            keys.webhooks_prefix(),
            relist_every=60.0,
            group_by=self._tenant_of,
        )

    def _tenant_of(self, key: str) -> str:
        return key[len(self.prefix) :].partition("/")[0]

    def of(self, tenant: str) -> list[Webhook]:
        """The tenant's webhooks (a record that does not decode is left out)."""
        hooks = []
        for kv in self.group(tenant).values():
            try:
                hooks.append(kv.decode(Webhook).value)
            except CorruptRecord:
                continue
        return hooks


HooksOf = Callable[[str], list[Webhook]]
"""A tenant -> its webhooks lookup (a :class:`TenantWebhooks`' ``of``)."""


def no_hooks(tenant: str) -> list[Webhook]:
    """Where no cache is kept: only the jobs' own ``notify`` rules count."""
    return []
