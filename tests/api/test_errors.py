"""Bad input gets a clear 4xx naming the field, never a 500, never a half-written job."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from etcdsched.api.errors import MalformedRequest, error_middleware
from etcdsched.client import ApiError, error_from_response
from etcdsched.model.errors import NotFound, QuotaExceeded
from tests.api.conftest import MAX_BODY, Api, spec

JSON = {"Content-Type": "application/json"}


async def _no_jobs(api: Api) -> None:
    status, body, _ = await api.call("GET", "/v1/jobs", api.admin)
    assert status == 200 and body["items"] == []


async def test_malformed_json_is_400(api: Api) -> None:
    status, body, _ = await api.call("POST", "/v1/jobs", api.admin, data=b'{"spec": ', headers=JSON)
    assert status == 400
    assert body["error"]["code"] == "malformed_request"
    await _no_jobs(api)


async def test_body_that_is_not_an_object_is_400(api: Api) -> None:
    status, body, _ = await api.call("POST", "/v1/jobs", api.admin, json=[1, 2])
    assert status == 400
    assert body["error"]["code"] == "malformed_request"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"spec": spec(colour="blue")}, "spec.colour"),
        (
            {"spec": spec(trigger={"kind": "interval", "every": "0s"})},
            "spec.trigger.interval.every",
        ),
        ({"spec": spec(trigger={"kind": "cron", "expr": "61 * * * *"})}, "spec.trigger.cron.expr"),
        (
            {"spec": spec(trigger={"kind": "cron", "expr": "* * * * *", "tz": "Mars/Base"})},
            "spec.trigger.cron.tz",
        ),
        ({"spec": spec(execution={"argv": []})}, "spec.execution.command.argv"),
        ({"spec": spec(priority=5000)}, "spec.priority"),
        ({"spec": spec(tenant="Not A Tenant")}, "spec.tenant"),
        ({}, "spec"),
        ({"spec": spec(), "extra": 1}, "extra"),
    ],
)
async def test_invalid_spec_is_422_naming_the_field(
    api: Api, payload: dict[str, object], field: str
) -> None:
    status, body, _ = await api.call("POST", "/v1/jobs", api.admin, json=payload)
    assert status == 422, body
    assert body["error"]["code"] == "invalid_input"
    assert body["error"]["field"] == field
    await _no_jobs(api)


async def test_invalid_job_id_is_422(api: Api) -> None:
    payload = {"id": "no/slashes", "spec": spec()}
    status, body, _ = await api.call("POST", "/v1/jobs", api.admin, json=payload)
    assert (status, body["error"]["field"]) == (422, "id")
    await _no_jobs(api)


async def test_empty_body_names_the_missing_field(api: Api) -> None:
    status, body, _ = await api.call("POST", "/v1/jobs", api.admin, data=b"")
    assert (status, body["error"]["field"]) == (422, "spec")


async def test_body_over_the_limit_is_413(api: Api) -> None:
    payload = {"spec": spec(description="x" * (MAX_BODY + 1))}
    status, body, _ = await api.call("POST", "/v1/jobs", api.admin, json=payload)
    assert status == 413
    assert body["error"]["code"] == "payload_too_large"
    await _no_jobs(api)


async def test_bad_query_parameters_are_422(api: Api) -> None:
    status, body, _ = await api.call("GET", "/v1/jobs?limit=0", api.admin)
    assert (status, body["error"]["field"]) == (422, "limit")
    status, body, _ = await api.call("GET", "/v1/jobs?colour=blue", api.admin)
    assert (status, body["error"]["field"]) == (422, "colour")
    status, body, _ = await api.call("GET", "/v1/jobs?label=nokey", api.admin)
    assert (status, body["error"]["field"]) == (422, "label")


async def test_unknown_route_and_method_are_json(api: Api) -> None:
    status, body, _ = await api.call("GET", "/v1/nothing", api.admin)
    assert (status, body["error"]["code"]) == (404, "not_found")
    status, body, headers = await api.call("PATCH", "/v1/jobs", api.admin)
    assert (status, body["error"]["code"]) == (405, "method_not_allowed")
    assert "GET" in headers["Allow"]


async def test_missing_or_unknown_token_is_401(api: Api) -> None:
    status, body, _ = await api.call("GET", "/v1/jobs")
    assert (status, body["error"]["code"]) == (401, "unauthorized")
    status, body, _ = await api.call("GET", "/v1/jobs", "esk_not-a-token")
    assert (status, body["error"]["code"]) == (401, "unauthorized")


async def test_missing_job_is_404(api: Api) -> None:
    for method, path in [
        ("GET", "/v1/jobs/ghost"),
        ("PUT", "/v1/jobs/ghost?force=true"),
        ("DELETE", "/v1/jobs/ghost"),
        ("POST", "/v1/jobs/ghost/pause"),
        ("POST", "/v1/jobs/ghost/trigger"),
        ("GET", "/v1/jobs/ghost/runs"),
        ("GET", "/v1/jobs/ghost/skips"),
        ("GET", "/v1/runs/ghost@00000000000001"),
        ("GET", "/v1/runs/not-a-run-id"),
        ("POST", "/v1/runs/ghost@00000000000001/cancel"),
        ("GET", "/v1/runs/ghost@00000000000001/log"),
        ("GET", "/v1/jobs/a%2Fb"),
        ("GET", "/v1/jobs/a%2Fb/runs"),
    ]:
        json = {"spec": spec()} if method == "PUT" else None
        status, body, _ = await api.call(method, path, api.admin, json=json)
        assert status == 404, (method, path, body)
        assert body["error"]["code"] == "not_found"


async def _raise(exc: BaseException) -> web.StreamResponse:
    raise exc


async def test_unexpected_exception_is_a_logged_500(caplog: pytest.LogCaptureFixture) -> None:
    request = make_mocked_request("GET", "/boom")
    with caplog.at_level(logging.ERROR, logger="etcdsched.api.errors"):
        response = await error_middleware(request, lambda _: _raise(RuntimeError("secret")))
    assert isinstance(response, web.Response)
    assert response.status == 500
    assert response.text is not None and "secret" not in response.text
    assert "unexpected error" in caplog.text


async def test_quota_error_carries_retry_after() -> None:
    request = make_mocked_request("POST", "/v1/jobs")
    exc = QuotaExceeded("slow down", retry_after=2.5)
    response = await error_middleware(request, lambda _: _raise(exc))
    assert response.status == 429
    assert response.headers["Retry-After"] == "3"


def test_client_maps_error_bodies_to_the_error_tree() -> None:
    def body(code: str) -> dict[str, object]:
        return {"error": {"code": code, "message": "m", "field": "f"}}

    assert isinstance(error_from_response(404, body("not_found"), {}), NotFound)
    assert isinstance(error_from_response(400, body("malformed_request"), {}), MalformedRequest)
    quota = error_from_response(429, body("quota_exceeded"), {"Retry-After": "7"})
    assert isinstance(quota, QuotaExceeded) and quota.retry_after == 7
    unknown = error_from_response(418, body("teapot"), {})
    assert isinstance(unknown, ApiError) and (unknown.code, unknown.http_status) == ("teapot", 418)
    proxy = error_from_response(502, "<html>bad gateway</html>", {})
    assert isinstance(proxy, ApiError) and proxy.http_status == 502


@pytest.mark.parametrize(
    ("trigger", "field"),
    [
        ({"kind": "at", "at": "9999-12-31T23:59:59-14:00"}, "spec.trigger.at.at"),
        ({"kind": "at", "at": "0001-01-01T00:00:00Z"}, "spec.trigger.at.at"),
        ({"kind": "at", "at": "6000-01-01T00:00:00Z"}, "spec.trigger.at.at"),
        ({"kind": "interval", "every": "1h", "start": "0001-01-01T00:00:00+00:00"}, None),
    ],
)
async def test_instants_out_of_range_are_422_never_500(
    api: Api, trigger: dict[str, object], field: str | None
) -> None:
    """Slots are epoch milliseconds in 14-digit keys: 1970 to 5138 UTC."""
    body = {"spec": {"trigger": trigger, "execution": {"argv": ["true"]}}}
    status, answer, _ = await api.call("POST", "/v1/jobs", api.admin, json=body)
    assert status == 422, answer
    assert "1970-01-01" in answer["error"]["message"]
    if field is not None:
        assert answer["error"]["field"] == field


async def test_a_log_offset_past_any_file_is_422(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="offsets")
        run = await client.trigger_job("offsets")
    for offset in (2**63, 2**50 + 1):
        path = f"/v1/runs/{run.id}/log?offset={offset}"
        status, body, _ = await api.call("GET", path, api.admin)
        assert (status, body["error"]["field"]) == (422, "offset"), body
