"""The API in-process on 127.0.0.1 over the real test etcd, with an admin
token and tokens of two tenants (``acme`` and ``globex``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio
from aiohttp import web

from etcdsched.api.app import ApiServices, make_app
from etcdsched.api.auth import create_admin_token, create_token
from etcdsched.client import Client
from etcdsched.config import Config
from etcdsched.logs.store import DirLogStore
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys

PARTITIONS = 4
MAX_BODY = 64 * 1024


@dataclass
class Api:
    url: str
    admin: str
    acme: str
    globex: str
    services: ApiServices
    logs: DirLogStore
    http: aiohttp.ClientSession

    def client(self, token: str | None) -> Client:
        return Client(self.url, token)

    async def call(
        self, method: str, path: str, token: str | None = None, **kwargs: Any
    ) -> tuple[int, Any, Mapping[str, str]]:
        """A raw request: (status, parsed JSON or text, headers)."""
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        async with self.http.request(method, self.url + path, headers=headers, **kwargs) as resp:
            text = await resp.text()
            body: Any = text
            if resp.content_type == "application/json":
                body = await resp.json()
            return resp.status, body, resp.headers

    async def http_get(
        self, base: str, path: str, token: str
    ) -> tuple[int, Any, Mapping[str, str]]:
        """A GET on another instance (``base``) with ``token``."""
        headers = {"Authorization": f"Bearer {token}"}
        async with self.http.get(base + path, headers=headers) as resp:
            return resp.status, await resp.text(), resp.headers


def spec(**overrides: Any) -> dict[str, Any]:
    """A valid job spec as JSON: every hour, runs ``true``."""
    base: dict[str, Any] = {
        "trigger": {"kind": "interval", "every": "1h"},
        "execution": {"argv": ["true"]},
    }
    base.update(overrides)
    return base


async def serve(services: ApiServices, **settings: Any) -> tuple[str, web.AppRunner]:
    """One API instance over ``services`` on a free loopback port."""
    app = make_app(services, Config(**{"max_body_bytes": MAX_BODY, **settings}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}", runner


@pytest_asyncio.fixture(loop_scope="session")
async def api(store: EtcdStore, keys: Keys, tmp_path: Path) -> AsyncIterator[Api]:
    clock = SystemClock()
    logs = DirLogStore(tmp_path / "logs")
    jobs = JobService(store, keys, clock, PARTITIONS)
    services = ApiServices(store, keys, clock, PARTITIONS, jobs, logs)
    url, runner = await serve(services)
    admin = await create_admin_token(store, keys)
    now = clock.now_ms()
    acme = await create_token(store, keys, tenant="acme", role="editor", name="ann", now_ms=now)
    globex = await create_token(store, keys, tenant="globex", role="editor", name="gus", now_ms=now)
    async with aiohttp.ClientSession() as http:
        yield Api(url, admin, acme.secret, globex.secret, services, logs, http)
    await runner.cleanup()
