"""A bounded property-based run of ``/openapi.json`` against the API: whatever
schemathesis generates (valid and invalid input), the API never answers 5xx.

Schemathesis calls the API synchronously, so here the API runs on an event
loop of its own in a thread, with its own etcd connection and key prefix.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import (
    CoveragePhaseConfig,
    PhasesConfig,
    ProjectConfig,
    ProjectsConfig,
    SchemathesisConfig,
)

from etcdsched.api.app import ROUTES, ApiServices, make_app
from etcdsched.api.auth import create_admin_token
from etcdsched.api.openapi import build_document
from etcdsched.config import Config
from etcdsched.logs.store import DirLogStore
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys

MAX_EXAMPLES = 25
# The coverage phase sends ~700 boundary cases to each JobSpec route alone:
# too slow for the unit suite. Fuzzing mixes valid and invalid input anyway.
_CONFIG = SchemathesisConfig(
    projects=ProjectsConfig(
        default=ProjectConfig(phases=PhasesConfig(coverage=CoveragePhaseConfig(enabled=False)))
    )
)
schema = schemathesis.openapi.from_dict(build_document(ROUTES), config=_CONFIG)


@dataclass
class _Served:
    url: str
    token: str
    runner: web.AppRunner
    store: EtcdStore


async def _serve(endpoints: list[str], log_dir: Path) -> _Served:
    store = await EtcdStore.connect(EtcdOptions(endpoints=tuple(endpoints)))
    keys, clock = Keys(f"/fuzz-{uuid.uuid4().hex[:8]}/"), SystemClock()
    services = ApiServices(
        store, keys, clock, 4, JobService(store, keys, clock, 4), DirLogStore(log_dir)
    )
    runner = web.AppRunner(make_app(services, Config(max_body_bytes=64 * 1024)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return _Served(f"http://{host}:{port}", await create_admin_token(store, keys), runner, store)


async def _stop(served: _Served) -> None:
    await served.runner.cleanup()
    await served.store.close()


@pytest.fixture(scope="module")
def threaded_api(
    etcd_endpoints: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Served]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzzed-api", daemon=True)
    thread.start()
    log_dir = tmp_path_factory.mktemp("fuzz-logs")
    served = asyncio.run_coroutine_threadsafe(_serve(etcd_endpoints, log_dir), loop).result(30)
    try:
        yield served
    finally:
        asyncio.run_coroutine_threadsafe(_stop(served), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case: schemathesis.Case, threaded_api: _Served) -> None:
    case.call_and_validate(
        base_url=threaded_api.url,
        headers={"Authorization": f"Bearer {threaded_api.token}"},
        checks=[not_a_server_error],
        timeout=10,
    )
