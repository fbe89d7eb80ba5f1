"""Tokens, tenant isolation (others' jobs and runs are 404) and quotas (429)."""

from __future__ import annotations

import pytest

from etcdsched.model.errors import Forbidden, QuotaExceeded, Unauthorized
from tests.api.conftest import Api, spec


async def test_tenant_token_defaults_its_tenant_and_cannot_write_others(api: Api) -> None:
    async with api.client(api.acme) as client:
        job = await client.create_job(spec())
        assert job.spec.tenant == "acme"
        with pytest.raises(Forbidden) as info:
            await client.create_job(spec(tenant="globex"))
        assert info.value.field == "spec.tenant"


async def test_tenant_cannot_see_or_touch_another_tenants_job(api: Api) -> None:
    async with api.client(api.acme) as acme:
        await acme.create_job(spec(), job_id="secret")
        run = await acme.trigger_job("secret")
        api.logs.open_writer(run.id, 1).write(b"private\n")
    denied = [
        ("GET", "/v1/jobs/secret", None),
        ("PUT", "/v1/jobs/secret?force=true", {"spec": spec()}),
        ("DELETE", "/v1/jobs/secret", None),
        ("POST", "/v1/jobs/secret/pause", None),
        ("POST", "/v1/jobs/secret/resume", None),
        ("POST", "/v1/jobs/secret/trigger", None),
        (
            "POST",
            "/v1/jobs/secret/backfill",
            {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z"},
        ),
        ("GET", "/v1/jobs/secret/runs", None),
        ("GET", "/v1/jobs/secret/skips", None),
        ("GET", f"/v1/runs/{run.id}", None),
        ("POST", f"/v1/runs/{run.id}/cancel", None),
        ("GET", f"/v1/runs/{run.id}/log", None),
        ("GET", f"/v1/runs/{run.id}/log?follow=1", None),
        ("GET", "/v1/tenants/acme", None),
    ]
    for method, path, body in denied:
        status, payload, _ = await api.call(method, path, api.globex, json=body)
        assert status == 404, (method, path, payload)
    status, page, _ = await api.call("GET", "/v1/jobs", api.globex)
    assert page["items"] == []
    status, page, _ = await api.call("GET", "/v1/jobs?tenant=acme", api.globex)
    assert page["items"] == []
    async with api.client(api.admin) as admin:
        assert (await admin.get_job("acme:secret")).spec.tenant == "acme"
        assert (await admin.get_run(run.id)).state == "pending"
        assert [job.id for job in (await admin.list_jobs()).items] == ["acme:secret"]


async def test_only_admins_manage_tenants_and_editors_no_tokens(api: Api) -> None:
    async with api.client(api.acme) as client:
        with pytest.raises(Forbidden):
            await client.create_token("more")
        with pytest.raises(Forbidden):
            await client.set_tenant("acme", {"max_jobs": 1000})
        assert (await client.get_tenant("acme")).limits.max_jobs is None
    async with api.client(api.admin) as admin:
        created = await admin.create_token("ian", "initech")
        assert created.role == "editor" and created.token.startswith("esk_")
    async with api.client(created.token) as client:
        job = await client.create_job(spec())
        assert job.spec.tenant == "initech"
    async with api.client("esk_wrong") as client:
        with pytest.raises(Unauthorized):
            await client.list_jobs()


async def test_token_body_is_validated(api: Api) -> None:
    status, body, _ = await api.call(
        "POST", "/v1/tokens", api.admin, json={"tenant": "acme", "name": "x", "role": "root"}
    )
    assert (status, body["error"]["field"]) == (422, "role")
    status, body, _ = await api.call("PUT", "/v1/tenants/acme", api.admin, json={"max_jobs": -1})
    assert (status, body["error"]["field"]) == (422, "max_jobs")
    status, body, _ = await api.call("PUT", "/v1/tenants/NO", api.admin, json={"max_jobs": 1})
    assert (status, body["error"]["field"]) == (422, "tenant")


async def test_submission_rate_gives_429_with_retry_after(api: Api) -> None:
    async with api.client(api.admin) as admin:
        await admin.set_tenant("acme", {"submissions_per_second": 0.01})
    status, _, _ = await api.call("POST", "/v1/jobs", api.acme, json={"spec": spec()})
    assert status == 201
    status, body, headers = await api.call("POST", "/v1/jobs", api.acme, json={"spec": spec()})
    assert status == 429
    assert body["error"]["code"] == "quota_exceeded"
    assert 1 <= int(headers["Retry-After"]) <= 100
    async with api.client(api.acme) as client:
        with pytest.raises(QuotaExceeded) as info:
            await client.create_job(spec())
        assert info.value.retry_after >= 1
    async with api.client(api.globex) as client:
        await client.create_job(spec())  # other tenants are not limited


async def test_max_jobs_and_idempotent_replay(api: Api) -> None:
    async with api.client(api.admin) as admin:
        await admin.set_tenant("acme", {"max_jobs": 1})
    async with api.client(api.acme) as client:
        first = await client.create_job(spec(), idempotency_key="once")
        with pytest.raises(QuotaExceeded):
            await client.create_job(spec())
        replay = await client.create_job(spec(), idempotency_key="once")
        assert replay.id == first.id


async def test_max_active_runs(api: Api) -> None:
    async with api.client(api.admin) as admin:
        await admin.set_tenant("acme", {"max_active_runs": 1})
    async with api.client(api.acme) as client:
        await client.create_job(spec(), job_id="busy")
        run = await client.trigger_job("busy")
        with pytest.raises(QuotaExceeded):
            await client.trigger_job("busy")
        await client.cancel_run(run.id)
        await client.trigger_job("busy")
