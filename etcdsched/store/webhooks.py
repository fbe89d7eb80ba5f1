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
from etcdsched.store.kv import KV, Cmp, Ops, Store, Versioned, prefix_end


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
        """The tenant's webhooks (a record that does not decode is left out).
        Asked by every transaction that ends a run of the tenant, so each
        record is decoded once per version, not once per ask."""
        hooks = []
        for kv in self.group(tenant).values():
            hook = self._decoded_hook(kv)
            if hook is not None:
                hooks.append(hook)
        return hooks

    def find(self, tenant: str, name: str) -> Webhook | None:
        """One webhook as this copy holds it (None if it holds none)."""
        kv = self.group(tenant).get(self._keys.webhook(tenant, name))
        return None if kv is None else self._decoded_hook(kv)

    def _decoded_hook(self, kv: KV) -> Webhook | None:
        try:
            return self.decode_once(kv, Webhook)
        except CorruptRecord:
            return None


HooksOf = Callable[[str], list[Webhook]]
"""A tenant -> its webhooks lookup (a :class:`TenantWebhooks`' ``of``)."""


def no_hooks(tenant: str) -> list[Webhook]:
    """Where no cache is kept: only the jobs' own ``notify`` rules count."""
    return []
