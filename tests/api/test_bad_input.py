"""Bad input, one case at a time: each is a 4xx naming the field at fault,
and none writes anything to etcd (every key of the test's prefix, but the
tokens', keeps its mod revision; tokens note their last use by themselves).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from etcdsched.api.app import ApiServices
from etcdsched.api.errors import error_middleware
from etcdsched.model.spec import MAX_ARG_BYTES
from etcdsched.runtime.quoting import quoted
from etcdsched.store.kv import prefix_end
from tests.api.conftest import Api, serve, spec

JSON = {"Content-Type": "application/json"}
Snapshot = dict[str, int]


async def _snapshot(services: ApiServices) -> Snapshot:
    keys = services.keys
    page = await services.store.range(keys.prefix, prefix_end(keys.prefix))
    tokens = keys.tokens_prefix()
    return {kv.key: kv.mod_revision for kv in page.kvs if not kv.key.startswith(tokens)}


async def _refused(
    api: Api,
    method: str,
    path: str,
    status: int,
    field: str | None,
    *,
    raw: bytes | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Send one bad request; check its status, its field, and that etcd is
    as it was."""
    before = await _snapshot(api.services)
    data = raw if raw is not None else json.dumps(body).encode()
    sent = {**JSON, **(headers or {})}
    got, answer, _ = await api.call(method, path, api.admin, data=data, headers=sent)
    assert (got, answer["error"]["field"]) == (status, field), answer
    assert await _snapshot(api.services) == before
    return dict(answer["error"])


async def _job(api: Api, name: str, **overrides: Any) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(**overrides), job_id=name)


# -- media type ---------------------------------------------------------------
@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
async def test_a_body_of_another_media_type_is_415(api: Api, content_type: str | None) -> None:
    before = await _snapshot(api.services)
    headers = {"Content-Type": content_type} if content_type else {}
    data = json.dumps({"spec": spec()}).encode()
    status, body, _ = await api.call("POST", "/v1/jobs", api.admin, data=data, headers=headers)
    assert (status, body["error"]["code"]) == (415, "unsupported_media_type"), body
    assert body["error"]["field"] == "Content-Type"
    assert await _snapshot(api.services) == before


async def test_json_with_a_charset_and_empty_bodies_without_a_type_are_fine(api: Api) -> None:
    headers = {"Content-Type": "Application/JSON; charset=UTF-8"}
    data = json.dumps({"spec": spec(), "id": "typed"}).encode()
    status, body, _ = await api.call("POST", "/v1/jobs", api.admin, data=data, headers=headers)
    assert status == 201, body
    for action in ("pause", "resume", "trigger"):
        status, body, _ = await api.call("POST", f"/v1/jobs/typed/{action}", api.admin, data=b"")
        assert status in (200, 201), (action, body)


# -- JSON itself --------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"spec": {"trigger": {"kind": "cron", "kind": "interval", "every": "1h"},'
         b' "execution": {"argv": ["true"]}}}', "spec.trigger.kind"),
        (b'{"id": "a", "id": "b", "spec": {}}', "id"),
        (b'{"spec": {"trigger": {"kind": "now"}, "execution": {"argv": ["true"],'
         b' "env": {"A": "1", "A": "2"}}}}', "spec.execution.env.A"),
    ],
)  # fmt: skip
async def test_a_key_given_twice_is_422_naming_it(api: Api, raw: bytes, field: str) -> None:
    await _refused(api, "POST", "/v1/jobs", 422, field, raw=raw)


async def test_a_key_given_twice_in_a_batch_names_the_item(api: Api) -> None:
    item = json.dumps({"id": "x", "spec": spec()})
    raw = f'{{"items": [{item}, {item[:-1]}, "id": "y"}}]}}'.encode()
    await _refused(api, "POST", "/v1/jobs:batch", 422, "items[1].id", raw=raw)


@pytest.mark.parametrize(
    "raw", [b"\xff\xfe{}", b'{"spec": NaN', b"[" * 50_000, b'{"id": 1' + b"0" * 5000 + b"}"]
)
async def test_what_is_not_utf8_json_is_400(api: Api, raw: bytes) -> None:
    error = await _refused(api, "POST", "/v1/jobs", 400, None, raw=raw)
    assert error["code"] == "malformed_request"


# -- strict types -------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/jobs", {"spec": spec(retry={"max_attempts": "3"})}, "spec.retry.max_attempts"),
        ("/v1/jobs/strict/trigger", {"force": "yes"}, "force"),
        ("/v1/jobs/strict/trigger", {"force": 1}, "force"),
        ("/v1/jobs/strict/backfill", {"start": 0, "end": "2026-01-01T00:00:00Z"}, "start"),
        (
            "/v1/jobs/strict/backfill",
            {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "limit": "5"},
            "limit",
        ),
    ],
)
async def test_numbers_booleans_and_instants_are_not_strings(
    api: Api, path: str, body: dict[str, Any], field: str
) -> None:
    await _job(api, "strict")
    await _refused(api, "POST", path, 422, field, body=body)


async def test_query_strings_still_parse_numbers(api: Api) -> None:
    status, body, _ = await api.call("GET", "/v1/jobs?limit=3", api.admin)
    assert status == 200, body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_jobs": "3"}, "max_jobs"),
        ({"loader_env": "true"}, "loader_env"),
        ({"submissions_per_second": "5"}, "submissions_per_second"),
        ({}, None),
        (None, None),
    ],
)
async def test_tenant_limits_are_strict_and_never_all_cleared_by_accident(
    api: Api, body: dict[str, Any] | None, field: str | None
) -> None:
    async with api.client(api.admin) as client:
        await client.set_tenant("acme", {"max_jobs": 5})
    raw = b"" if body is None else None
    error = await _refused(api, "PUT", "/v1/tenants/acme", 422, field, raw=raw, body=body)
    if body in ({}, None):
        assert "at least one" in error["message"]
    async with api.client(api.admin) as client:
        assert (await client.get_tenant("acme")).limits.max_jobs == 5
        cleared = await client.set_tenant("acme", {"max_jobs": None})
        assert cleared.limits.max_jobs is None


# -- quotas -------------------------------------------------------------------
@pytest.mark.parametrize(("rate", "retry_after"), [(5e-324, "3600"), (1e-300, "3600"), (0.4, "3")])
async def test_retry_after_is_whole_seconds_between_1_and_3600(
    api: Api, rate: float, retry_after: str
) -> None:
    async with api.client(api.admin) as client:
        await client.set_tenant("acme", {"submissions_per_second": rate})
    async with api.client(api.acme) as client:
        await client.create_job(spec())
    before = await _snapshot(api.services)
    status, body, headers = await api.call("POST", "/v1/jobs", api.acme, json={"spec": spec()})
    assert (status, headers["Retry-After"]) == (429, retry_after), body
    assert await _snapshot(api.services) == before


# -- If-Match -----------------------------------------------------------------
async def test_a_replace_must_say_which_version_it_replaces(api: Api) -> None:
    await _job(api, "versioned")
    new = {"spec": spec(priority=7)}
    error = await _refused(api, "PUT", "/v1/jobs/versioned", 428, "If-Match", body=new)
    assert error["code"] == "precondition_required"
    for bad in ('"²"', '"3', "*", '"1" junk'):
        headers = {"If-Match": bad}
        path = "/v1/jobs/versioned"
        await _refused(api, "PUT", path, 422, "If-Match", body=new, headers=headers)
    status, body, _ = await api.call("PUT", "/v1/jobs/versioned?force=true", api.admin, json=new)
    assert (status, body["version"]) == (200, 2), body
    headers = {"If-Match": 'W/"2"'}
    status, body, _ = await api.call("PUT", path, api.admin, json=new, headers=headers)
    assert (status, body["version"]) == (200, 3), body
    async with api.client(api.admin) as client:
        assert (await client.replace_job("versioned", spec())).version == 4


# -- spec size ----------------------------------------------------------------
@pytest_asyncio.fixture(loop_scope="session")
async def roomy(api: Api) -> AsyncIterator[Api]:
    """The API again, over the same etcd, with a 2 MiB body limit: room for
    specs larger than fit one etcd request."""
    url, runner = await serve(api.services, max_body_bytes=2 << 20)
    yield Api(url, api.admin, api.acme, api.globex, api.services, api.logs, api.http)
    await runner.cleanup()


def _argv(total: int) -> list[str]:
    """``true`` and arguments as long as the kernel allows, ``total`` bytes."""
    argv = ["true"]
    while total > 0:
        argv.append("x" * min(MAX_ARG_BYTES, total))
        total -= MAX_ARG_BYTES
    return argv


@pytest.mark.parametrize("size", [400_000, 600_000, 1_000_000, 1_900_000])
async def test_a_spec_too_large_to_store_is_413_naming_the_limit(roomy: Api, size: int) -> None:
    big = spec(execution={"argv": _argv(size)})
    error = await _refused(roomy, "POST", "/v1/jobs", 413, "spec", body={"spec": big})
    assert "393216" in error["message"] and "etcd" in error["message"]
    await _job(roomy, "small")
    path = "/v1/jobs/small?force=true"
    await _refused(roomy, "PUT", path, 413, "spec", body={"spec": big})


async def test_a_spec_that_fits_is_stored(roomy: Api) -> None:
    status, body, _ = await roomy.call(
        "POST", "/v1/jobs", roomy.admin, json={"spec": spec(execution={"argv": _argv(390_000)})}
    )
    assert status == 201, str(body)[:500]


async def test_a_batch_item_too_large_fails_alone(roomy: Api) -> None:
    items = [{"spec": spec(execution={"argv": _argv(700_000)})}, {"id": "fine", "spec": spec()}]
    status, body, _ = await roomy.call("POST", "/v1/jobs:batch", roomy.admin, json={"items": items})
    assert status == 200, body
    first, second = body["results"]
    assert (first["status"], first["error"]["field"]) == (413, "items[0].spec")
    assert second["status"] == 201


# -- what a process may not be given ---------------------------------------------
@pytest.mark.parametrize(
    ("execution", "field"),
    [
        ({"argv": ["true", "a\0b"]}, "spec.execution.command.argv"),
        ({"argv": ["true"], "env": {"A": "a\0b"}}, "spec.execution.command.env"),
        ({"argv": ["true"], "cwd": "/tmp\0/x"}, "spec.execution.command.cwd"),
        ({"argv": ["true"], "env": {"A=B": "c"}}, "spec.execution.command.env"),
        ({"argv": ["true", "x" * (MAX_ARG_BYTES + 1)]}, "spec.execution.command.argv"),
    ],
)
async def test_what_execve_refuses_is_422(
    roomy: Api, execution: dict[str, Any], field: str
) -> None:
    body = {"id": "exec", "spec": spec(execution=execution)}
    await _refused(roomy, "POST", "/v1/jobs", 422, field, body=body)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"start": "0001-01-01T00:00:00Z", "end": "0001-01-02T00:00:00Z"}, "start"),
        ({"start": "2026-01-01T00:00:00Z", "end": "9999-12-31T23:59:59-14:00"}, "end"),
    ],
)
async def test_backfill_instants_out_of_range_are_422(
    api: Api, body: dict[str, Any], field: str
) -> None:
    await _job(api, "ranged")
    await _refused(api, "POST", "/v1/jobs/ranged/backfill", 422, field, body=body)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/jobs?label=bad%20key=1", "label"),
        ("/v1/jobs?cursor=%C2%B2", "cursor"),
        ("/v1/jobs/ranged/skips?cursor=%C2%B2", "cursor"),
        ("/v1/jobs/ranged/runs?cursor=0000000000000%C2%B2", "cursor"),
        ("/v1/jobs?tenant=NO", "tenant"),
    ],
)
async def test_query_parameters_outside_their_pattern_are_422(
    api: Api, path: str, field: str
) -> None:
    await _job(api, "ranged")
    before = await _snapshot(api.services)
    status, body, _ = await api.call("GET", path, api.admin)
    assert (status, body["error"]["field"]) == (422, field), body
    assert await _snapshot(api.services) == before


async def test_a_job_id_with_a_newline_is_refused(api: Api) -> None:
    body = {"id": "nightly\n", "spec": spec()}
    await _refused(api, "POST", "/v1/jobs", 422, "id", body=body)
    await _refused(api, "PUT", "/v1/tenants/acme%0A", 422, "tenant", body={"max_jobs": 1})


# -- operator logs ----------------------------------------------------------------
def test_quoted_escapes_and_cuts() -> None:
    assert quoted("a\nb\0c\u202e") == "'a\\nb\\x00c\\u202e'"
    long = quoted("x" * 400_000)
    assert len(long) < 300 and long.endswith("...(+399800 chars)")


async def _boom(exc: BaseException) -> web.StreamResponse:
    raise exc


async def test_an_unexpected_error_logs_tenant_input_quoted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    request = make_mocked_request("POST", "/v1/jobs/a%0Ab/trigger")
    failure = ValueError("argv: " + "\0\n" * 100_000)
    with caplog.at_level(logging.ERROR, logger="etcdsched.api.errors"):
        response = await error_middleware(request, lambda _: _boom(failure))
    assert response.status == 500
    (record,) = caplog.records
    text = record.getMessage()
    assert "\0" not in text and "a\nb" not in text and "a\\nb" in text
    assert len(text) < 5000 and "Traceback" in text
