"""Cluster view, tokens and tenants, and the unauthenticated operational
endpoints: health, readiness, metrics, the OpenAPI document."""

from __future__ import annotations

import asyncio
import re

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from etcdsched.api.auth import TenantRecord, put_tenant
from etcdsched.api.routing import Call, Route, json_model
from etcdsched.api.schemas import (
    ClusterView,
    Health,
    OwnerView,
    TenantLimitsBody,
    TenantView,
)
from etcdsched.model.errors import EtcdschedError, InvalidInput, NotFound
from etcdsched.model.records import OwnerRecord, SchedulerMember, WorkerMember
from etcdsched.model.spec import TENANT_PATTERN
from etcdsched.runtime.quoting import quoted
from etcdsched.store.cache import list_all
from etcdsched.store.keys import TENANT_SEP
from etcdsched.store.kv import prefix_end

READY_TIMEOUT = 2.0


async def _members(call: Call, role: str) -> list[object]:
    model = SchedulerMember if role == "schedulers" else WorkerMember
    prefix = call.services.keys.members_prefix(role)
    items, _ = await list_all(call.services.store, prefix, prefix_end(prefix))
    return [kv.decode(model).value for kv in items.values()]


async def _owners(call: Call) -> list[OwnerView]:
    keys = call.services.keys
    prefix = keys.owners_prefix()
    items, _ = await list_all(call.services.store, prefix, prefix_end(prefix))
    owners = []
    for kv in items.values():
        record = kv.decode(OwnerRecord).value
        owners.append(OwnerView(partition=keys.parse_owner(kv.key), **record.model_dump()))
    return sorted(owners, key=lambda owner: owner.partition)


async def _queue_depths(call: Call) -> dict[int, int]:
    """Count-only ranges, one per partition, sent concurrently."""
    services = call.services

    async def depth(pp: int) -> int:
        page = await services.store.range(services.keys.queue_prefix(pp), count_only=True)
        return page.count

    partitions = range(services.partitions)
    counts = await asyncio.gather(*(depth(pp) for pp in partitions))
    return dict(zip(partitions, counts, strict=True))


async def cluster(call: Call) -> web.StreamResponse:
    return json_model(await cluster_view(call))


async def cluster_view(call: Call) -> ClusterView:
    """Members, owners and the queue, read concurrently (the JSON cluster
    view and the dashboard's cluster page)."""
    schedulers, workers, owners, depths = await asyncio.gather(
        _members(call, "schedulers"), _members(call, "workers"), _owners(call), _queue_depths(call)
    )
    owned = {owner.partition for owner in owners}
    return ClusterView.model_validate(
        {
            "partitions": call.services.partitions,
            "schedulers": schedulers,
            "workers": workers,
            "owners": owners,
            "unowned": [pp for pp in range(call.services.partitions) if pp not in owned],
            "queue_depth": sum(depths.values()),
            "queue_by_partition": {str(pp): n for pp, n in depths.items() if n},
        }
    )


def _tenant_name(call: Call) -> str:
    name = call.match("tenant")
    if not re.fullmatch(TENANT_PATTERN, name):
        raise InvalidInput(f"invalid tenant name {quoted(name)}", field="tenant")
    return name


async def set_tenant(call: Call) -> web.StreamResponse:
    name = _tenant_name(call)
    services = call.services
    limits = call.body_as(TenantLimitsBody).limits()
    record = await put_tenant(services.store, services.keys, name, limits, services.clock.now_ms())
    call.ctx.auth.forget_tenant(name)
    return json_model(TenantView.model_validate(record.model_dump()))


async def get_tenant(call: Call) -> web.StreamResponse:
    name = _tenant_name(call)
    if not call.who.sees(name):
        raise NotFound(f"tenant {name} not found", field="tenant")
    kv = await call.services.store.get(call.services.keys.tenant(name))
    record = kv.decode(TenantRecord).value if kv else TenantRecord(name=name)
    depth = await _tenant_queue_depth(call, name)
    return json_model(TenantView.model_validate({**record.model_dump(), "queue_depth": depth}))


async def _tenant_queue_depth(call: Call, tenant: str) -> int:
    """The tenant's runs waiting for placement: what a tenant may know of
    the queue (the whole cluster view is the admin's). Queue keys end in
    the run id, which begins with the tenant; one keys-only read."""
    keys = call.services.keys
    prefix = keys.queue_root()
    page = await call.services.store.range(prefix, prefix_end(prefix), keys_only=True)
    mine = f"/{tenant}{TENANT_SEP}"
    return sum(1 for kv in page.kvs if mine in kv.key)


async def healthz(call: Call) -> web.StreamResponse:
    return json_model(Health(status="ok"))


async def readyz(call: Call) -> web.StreamResponse:
    """Ready when etcd answers a linearizable read within READY_TIMEOUT."""
    services = call.services
    try:
        await asyncio.wait_for(services.store.get(services.keys.cluster_meta()), READY_TIMEOUT)
    except (TimeoutError, EtcdschedError) as exc:
        detail = str(exc) or "etcd did not answer in time"
        return json_model(Health(status="unavailable", detail=detail), 503)
    return json_model(Health(status="ready"))


async def metrics(call: Call) -> web.StreamResponse:
    data = generate_latest(call.services.registry)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi_document(call: Call) -> web.StreamResponse:
    return web.json_response(call.ctx.openapi)


ROUTES = [
    Route(
        "GET",
        "/v1/cluster",
        cluster,
        "Schedulers, workers, owners, queue (admin)",
        "cluster",
        response=ClusterView,
        auth="admin",
    ),
    Route(
        "PUT",
        "/v1/tenants/{tenant}",
        set_tenant,
        "Set a tenant's limits (admin)",
        "admin",
        body=TenantLimitsBody,
        response=TenantView,
        auth="admin",
    ),
    Route(
        "GET",
        "/v1/tenants/{tenant}",
        get_tenant,
        "Read a tenant's limits",
        "admin",
        response=TenantView,
    ),
    Route("GET", "/healthz", healthz, "The process is alive", "ops", response=Health, auth="none"),
    Route("GET", "/readyz", readyz, "etcd is reachable", "ops", response=Health, auth="none"),
    Route(
        "GET",
        "/metrics",
        metrics,
        "Prometheus metrics",
        "ops",
        auth="none",
        media_type="text/plain",
    ),
    Route(
        "GET", "/openapi.json", openapi_document, "This API's OpenAPI document", "ops", auth="none"
    ),
]
