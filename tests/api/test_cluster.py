"""Cluster view, health, metrics, and the OpenAPI document's sync with the router."""

from __future__ import annotations

import pytest

from etcdsched.api.app import ROUTES, make_app
from etcdsched.api.openapi import documented_operations
from etcdsched.config import Config
from etcdsched.model.errors import Forbidden
from etcdsched.model.records import OwnerRecord, SchedulerMember, WorkerMember
from etcdsched.model.spec import Capacity
from etcdsched.runtime import metrics
from etcdsched.store.kv import Ops
from tests.api.conftest import PARTITIONS, Api, spec


async def test_cluster_view(api: Api) -> None:
    services = api.services
    keys, now = services.keys, services.clock.now_ms()
    worker = WorkerMember(id="w1", capacity=Capacity(slots=4, cpu=2), started_ms=now)
    scheduler = SchedulerMember(id="s1", started_ms=now)
    await services.store.txn(
        [],
        [
            Ops.put(keys.member("workers", "w1"), worker),
            Ops.put(keys.member("schedulers", "s1"), scheduler),
            Ops.put(keys.owner(1), OwnerRecord(scheduler="s1", since_ms=now)),
        ],
    )
    async with api.client(api.acme) as client:
        await client.create_job(spec(), job_id="q")
        run = await client.trigger_job("q")
        with pytest.raises(Forbidden):  # hostnames, pids, labels: the operator's
            await client.cluster()
    async with api.client(api.admin) as admin:
        view = await admin.cluster()
    assert view.partitions == PARTITIONS
    assert [w.id for w in view.workers] == ["w1"] and view.workers[0].capacity.slots == 4
    assert [s.id for s in view.schedulers] == ["s1"]
    assert [(o.partition, o.scheduler) for o in view.owners] == [(1, "s1")]
    assert view.unowned == [0, 2, 3]
    assert view.queue_depth == 1
    assert view.queue_by_partition == {str(run.partition): 1}


async def test_health_ready_and_metrics_need_no_token(api: Api) -> None:
    status, body, _ = await api.call("GET", "/healthz")
    assert (status, body["status"]) == (200, "ok")
    status, body, _ = await api.call("GET", "/readyz")
    assert (status, body["status"]) == (200, "ready")
    metrics.FIRES.labels(kind="manual").inc(0)
    status, text, headers = await api.call("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for name in (
        "etcdsched_start_lag_seconds",
        "etcdsched_fires_total",
        "etcdsched_lost_runs_total",
        "etcdsched_partitions_owned",
        "etcdsched_api_requests_total",
    ):
        assert name in text


async def test_openapi_document_matches_the_router(api: Api) -> None:
    status, document, _ = await api.call("GET", "/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.1")
    app = make_app(api.services, Config())
    registered = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None
        and route.method != "HEAD"
        and not route.resource.canonical.startswith("/ui")  # the dashboard: not API operations
    }
    assert registered == documented_operations(document)
    assert len(registered) == len(ROUTES)
    operation_ids = [
        op["operationId"] for item in document["paths"].values() for op in item.values()
    ]
    assert len(operation_ids) == len(set(operation_ids))


async def test_openapi_refs_resolve(api: Api) -> None:
    _, document, _ = await api.call("GET", "/openapi.json")
    schemas = document["components"]["schemas"]

    def refs(node: object) -> list[str]:
        if isinstance(node, dict):
            found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
            return found + [r for value in node.values() for r in refs(value)]
        if isinstance(node, list):
            return [r for value in node for r in refs(value)]
        return []

    for ref in refs(document):
        assert ref.startswith("#/components/schemas/")
        assert ref.rsplit("/", 1)[-1] in schemas, ref
    create = document["paths"]["/v1/jobs"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert "security" not in create  # the document-wide bearer requirement applies
    assert document["paths"]["/healthz"]["get"]["security"] == []
