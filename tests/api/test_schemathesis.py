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
from typing import Any

import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS, load_all_checks
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
from etcdsched.api.routing import CONTEXT
from etcdsched.config import Config
from etcdsched.logs.store import DirLogStore
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Ops, prefix_end

MAX_EXAMPLES = 50
STATEFUL_EXAMPLES = 80
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
    keys: Keys
    loop: asyncio.AbstractEventLoop | None = None

    def forget_all_but_tokens(self) -> None:
        """Every key of the API's prefix but its tokens: each stateful
        scenario starts from no jobs, runs nor tenant limits, so that
        hypothesis, replaying one, sees the answers it saw the first time."""

        async def forget() -> None:
            page = await self.store.range(self.keys.prefix, prefix_end(self.keys.prefix))
            keep = (self.keys.tokens_prefix(), self.keys.prefix + "meta/")
            tops = {kv.key.split("/", 2)[2].split("/", 1)[0] for kv in page.kvs}
            ops = [Ops.delete_prefix(f"{self.keys.prefix}{top}/") for top in sorted(tops)]
            ops = [op for op in ops if not op.key.startswith(keep)]
            if ops:
                await self.store.txn([], ops)

        assert self.loop is not None
        asyncio.run_coroutine_threadsafe(forget(), self.loop).result(30)


async def _serve(endpoints: list[str], log_dir: Path) -> _Served:
    store = await EtcdStore.connect(EtcdOptions(endpoints=tuple(endpoints)))
    keys, clock = Keys(f"/fuzz-{uuid.uuid4().hex[:8]}/"), SystemClock()
    services = ApiServices(
        store, keys, clock, 4, JobService(store, keys, clock, 4), DirLogStore(log_dir)
    )
    app = make_app(services, Config(max_body_bytes=64 * 1024))
    # The auth checks probe every operation with a wrong token: from one
    # address, that many are refused with 429 after a burst of 20 (as they
    # should be), where the checks want to see each one's 401.
    app[CONTEXT].auth.failed_auth_limit = (1e6, 1e6)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    token = await create_admin_token(store, keys)
    return _Served(f"http://{host}:{port}", token, runner, store, keys)


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
    served.loop = loop
    _TOKEN[:] = [served.token]
    try:
        yield served
    finally:
        asyncio.run_coroutine_threadsafe(_stop(served), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


_TOKEN: list[str] = []
"""The fuzzed API's admin token, once it is served."""


@schema.auth()
class _AdminToken:
    """The admin token, as schemathesis's own auth: its auth checks then
    know it for valid and probe the API without it and with a wrong one."""

    def get(self, case: schemathesis.Case, context: Any) -> str:
        return _TOKEN[0]

    def set(self, case: schemathesis.Case, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


load_all_checks()
ALL_CHECKS = list(CHECKS.get_all())
OPAQUE_CURSOR = "a cursor is the server's to make: one it did not issue can match the pattern"
" (base64url) and still not be one (422), which no schema can tell"
SPEC_SEMANTICS = "its body is valid only if it means something: a cron expression, a duration,"
" a time zone, an argv the kernel takes, a range of slots, which JSON Schema cannot say"
WEBHOOK_TARGET = "a webhook's URL is valid only if its scheme and the address it names are"
" allowed for it (admin allowances), and a new one needs a secret: not JSON Schema's to say"
EXCLUDED: dict[str, dict[str, str]] = {
    # operationId -> {check name: why it is not a real mismatch}
    "list_jobs": {"positive_data_acceptance": OPAQUE_CURSOR},
    "create_job": {"positive_data_acceptance": SPEC_SEMANTICS},
    "replace_job": {"positive_data_acceptance": SPEC_SEMANTICS},
    "backfill_job": {"positive_data_acceptance": SPEC_SEMANTICS},
    "create_api_token": {"positive_data_acceptance": SPEC_SEMANTICS},
    "put_webhook": {"positive_data_acceptance": WEBHOOK_TARGET},
}


def checks_for(operation_id: str) -> list[Any]:
    excluded = EXCLUDED.get(operation_id, {})
    return [check for check in ALL_CHECKS if check.__name__ not in excluded]


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_conforms(case: schemathesis.Case, threaded_api: _Served) -> None:
    case.call_and_validate(
        base_url=threaded_api.url,
        checks=checks_for(case.operation.definition.raw["operationId"]),
        timeout=10,
    )


def test_stateful(threaded_api: _Served) -> None:
    """Sequences of calls chained by the document's links (create a job,
    then read, replace, trigger, pause it...): every check on every step."""

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            threaded_api.forget_all_but_tokens()

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"base_url": threaded_api.url, "timeout": 10}

        def validate_response(self, response: Any, case: schemathesis.Case, **kwargs: Any) -> None:
            operation_id = case.operation.definition.raw["operationId"]
            case.validate_response(
                response, checks=checks_for(operation_id), transport_kwargs=kwargs
            )

    Machine.run(
        settings=settings(
            max_examples=STATEFUL_EXAMPLES,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )
