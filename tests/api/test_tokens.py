"""Token lifecycle: roles, tenant-admins, listing, revocation on every API
instance within a second, expiry, the first admin token, and what an
unknown token costs."""

from __future__ import annotations

import asyncio
import time

import pytest

from etcdsched.api.auth import bootstrap_admin_token
from etcdsched.model.errors import Conflict, Forbidden, NotFound, Unauthorized
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.keys import Keys
from tests.api.conftest import Api, serve, spec
from tests.support.eventually import assert_eventually


async def test_roles_from_viewer_to_tenant_admin(api: Api) -> None:
    async with api.client(api.admin) as admin:
        boss = await admin.create_token("boss", "acme", "tenant-admin")
    async with api.client(boss.token) as client:
        viewer = await client.create_token("dash", role="viewer")
        assert (viewer.tenant, viewer.role) == ("acme", "viewer")
        with pytest.raises(Forbidden):
            await client.create_token("root", role="admin")  # more than its own role
        with pytest.raises(Forbidden):
            await client.create_token("spy", "globex")  # another tenant
        job = await client.create_job(spec())
    async with api.client(viewer.token) as client:
        assert (await client.get_job(job.id)).id == job.id
        with pytest.raises(Forbidden):
            await client.create_job(spec())
        with pytest.raises(Forbidden):
            await client.pause_job(job.id)
        with pytest.raises(Forbidden):
            await client.list_tokens()
    status, body, _ = await api.call("GET", "/v1/cluster", api.acme)
    assert status == 403, body  # the cluster view is the admin's


async def test_listing_shows_ids_never_secrets_and_only_own_tenant(api: Api) -> None:
    async with api.client(api.admin) as admin:
        boss = await admin.create_token("boss", "acme", "tenant-admin")
        everyone = {t.tenant for t in (await admin.list_tokens()).items}
    assert {"acme", "globex", "default"} <= everyone
    status, body, _ = await api.call("GET", "/v1/tokens", boss.token)
    assert status == 200
    assert {item["tenant"] for item in body["items"]} == {"acme"}
    assert all("token" not in item and len(item["id"]) == 64 for item in body["items"])
    async with api.client(boss.token) as client:
        foreign = next(t for t in (await admin_list(api)) if t.tenant == "globex")
        with pytest.raises(NotFound):
            await client.revoke_token(foreign.id)


async def admin_list(api: Api) -> list:  # type: ignore[type-arg]
    async with api.client(api.admin) as admin:
        return list((await admin.list_tokens()).items)


async def test_a_revoked_token_stops_working_within_a_second_on_every_instance(
    api: Api,
) -> None:
    second_url, second = await serve(api.services)
    try:
        async with api.client(api.admin) as admin:
            created = await admin.create_token("temp", "acme")
        urls = [api.url, second_url]
        for url in urls:
            status, _, _ = await api.http_get(url, "/v1/jobs", created.token)
            assert status == 200
        async with api.client(api.admin) as admin:
            await admin.revoke_token(created.id)
        revoked_at = time.monotonic()

        async def refused_everywhere() -> None:
            for url in urls:
                status, _, headers = await api.http_get(url, "/v1/jobs", created.token)
                assert status == 401
                assert headers["WWW-Authenticate"].startswith("Bearer")

        await assert_eventually(refused_everywhere, timeout=1.0, interval=0.01)
        assert time.monotonic() - revoked_at < 1.0
    finally:
        await second.cleanup()


async def test_an_expired_token_is_refused(api: Api) -> None:
    async with api.client(api.admin) as admin:
        created = await admin.create_token("brief", "acme", expires_in="1s")
    assert created.expires_ms is not None and created.expires_ms > created.created_ms

    async def expired() -> None:
        status, _, _ = await api.call("GET", "/v1/jobs", created.token)
        assert status == 401

    await assert_eventually(expired, timeout=5)


async def test_unknown_tokens_are_limited_per_client_address(api: Api) -> None:
    statuses = [(await api.call("GET", "/v1/jobs", f"esk_guess{i}"))[0] for i in range(40)]
    assert statuses[0] == 401 and 429 in statuses

    async def known_token_works() -> None:  # once the watch has delivered it, no limit
        status, _, _ = await api.call("GET", "/v1/jobs", api.acme)
        assert status == 200

    await assert_eventually(known_token_works, timeout=3)


async def test_the_first_admin_token_is_made_once(store: EtcdStore, key_prefix: str) -> None:
    keys = Keys(key_prefix + "boot/")
    first = await bootstrap_admin_token(store, keys, 1)
    assert first.startswith("esk_")
    with pytest.raises(Conflict):
        await bootstrap_admin_token(store, keys, 2)
    with pytest.raises(Conflict):  # even concurrently, one wins
        await asyncio.gather(
            bootstrap_admin_token(store, Keys(key_prefix + "b2/"), 3),
            bootstrap_admin_token(store, Keys(key_prefix + "b2/"), 3),
        )


async def test_unauthorized_says_bearer(api: Api) -> None:
    status, _, headers = await api.call("GET", "/v1/jobs")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    async with api.client(None) as client:
        with pytest.raises(Unauthorized):
            await client.list_jobs()
