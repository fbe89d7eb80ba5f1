"""The dashboard over plain HTTP (no browser): sessions and their cookie,
CSRF and origin checks, roles and tenants as the API has them, the spec
edit's version check (docs/ui.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from etcdsched.api.auth import create_token
from etcdsched.model.states import RunState
from tests.api.conftest import Api, spec

CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


async def login(api: Api, token: str, **headers: str) -> tuple[int, Mapping[str, str]]:
    async with api.http.post(
        f"{api.url}/ui/login", data={"token": token}, headers=headers, allow_redirects=False
    ) as resp:
        return resp.status, resp.headers


async def page(
    api: Api, path: str, token: str | None, method: str = "GET", **kwargs: Any
) -> tuple[int, str, Mapping[str, str]]:
    """A dashboard request with the session cookie of ``token``."""
    headers = dict(kwargs.pop("headers", {}))
    if token is not None:
        headers["Cookie"] = f"etcdsched_ui={token}"
    async with api.http.request(
        method, api.url + path, headers=headers, allow_redirects=False, **kwargs
    ) as resp:
        return resp.status, await resp.text(), resp.headers


async def csrf_of(api: Api, token: str) -> str:
    status, html, _ = await page(api, "/ui/jobs", token)
    assert status == 200
    match = CSRF.search(html)
    assert match is not None, "the page carries its forms' CSRF token"
    return match.group(1)


async def viewer(api: Api, tenant: str = "acme") -> str:
    services = api.services
    issued = await create_token(
        services.store,
        services.keys,
        tenant=tenant,
        role="viewer",
        name="vera",
        now_ms=services.clock.now_ms(),
    )
    return issued.secret


async def test_login_sets_a_strict_http_only_cookie_for_the_dashboard_only(api: Api) -> None:
    status, headers = await login(api, api.acme)
    assert status == 303 and headers["Location"] == "/ui/jobs"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"etcdsched_ui={api.acme};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui/" in cookie
    assert "Secure" not in cookie, "plain HTTP on loopback: a Secure cookie would never come back"

    _, behind_tls = await login(api, api.acme, **{"X-Forwarded-Proto": "https"})
    assert "Secure" in behind_tls["Set-Cookie"]


async def test_a_bad_token_is_refused_without_a_session(api: Api) -> None:
    status, headers = await login(api, "esk_not-a-token")
    assert status == 401 and "Set-Cookie" not in headers
    status, *_ = await page(api, "/ui/jobs", "esk_not-a-token")
    assert status == 303, "a cookie with an unknown token is no session"


async def test_pages_need_a_session_and_send_to_the_login(api: Api) -> None:
    status, _, headers = await page(api, "/ui/jobs?state=active", None)
    assert status == 303
    assert headers["Location"] == "/ui/login?next=%2Fui%2Fjobs%3Fstate%3Dactive"
    status, html, headers = await page(api, "/ui/login", None)
    assert status == 200 and 'name="token"' in html
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]


async def test_a_post_without_the_csrf_token_or_from_another_origin_is_refused(api: Api) -> None:
    status, *_ = await api.call("POST", "/v1/jobs", api.acme, json={"id": "j", "spec": spec()})
    assert status == 201
    csrf = await csrf_of(api, api.acme)

    status, html, _ = await page(api, "/ui/jobs/j/pause", api.acme, "POST", data={})
    assert status == 403 and "CSRF" in html
    wrong = {"csrf": "0" * 64}
    assert (await page(api, "/ui/jobs/j/pause", api.acme, "POST", data=wrong))[0] == 403
    evil = {"Origin": "https://evil.example"}
    ok = {"csrf": csrf}
    status, *_ = await page(api, "/ui/jobs/j/pause", api.acme, "POST", data=ok, headers=evil)
    assert status == 403
    assert (await api.services.jobs.get("acme:j")).state == "active", "nothing was done"

    status, _, headers = await page(api, "/ui/jobs/j/pause", api.acme, "POST", data=ok)
    assert status == 303 and headers["Location"] == "/ui/jobs/acme:j"
    assert (await api.services.jobs.get("acme:j")).state == "paused"


async def test_a_viewer_sees_no_buttons_and_its_cancel_is_refused(api: Api) -> None:
    await api.call("POST", "/v1/jobs", api.acme, json={"id": "v", "spec": spec()})
    status, run, _ = await api.call("POST", "/v1/jobs/v/trigger", api.acme, json={})
    assert status == 201
    vera = await viewer(api)

    status, html, _ = await page(api, f"/ui/runs/{run['id']}", vera)
    assert status == 200 and "Cancel run" not in html
    status, html, _ = await page(api, "/ui/jobs", vera)
    assert "acme:v" in html and "Pause" not in html and "Run now" not in html

    csrf = await csrf_of(api, vera)
    cancel = f"/ui/runs/{run['id']}/cancel"
    status, html, _ = await page(api, cancel, vera, "POST", data={"csrf": csrf})
    assert status == 403 and "editor role" in html
    status, *_ = await page(api, "/ui/jobs/v/trigger", vera, "POST", data={"csrf": csrf})
    assert status == 403
    still = await api.services.jobs.runs.load(api.services.store, run["id"])
    assert still.value.state is RunState.PENDING

    editor = await csrf_of(api, api.acme)
    status, *_ = await page(api, cancel, api.acme, "POST", data={"csrf": editor})
    assert status == 303
    done = await api.services.jobs.runs.load(api.services.store, run["id"])
    assert done.value.state is RunState.CANCELLED and "dashboard" in done.value.reason


async def test_another_tenants_job_and_run_are_not_found(api: Api) -> None:
    await api.call("POST", "/v1/jobs", api.acme, json={"id": "secret", "spec": spec()})
    _, run, _ = await api.call("POST", "/v1/jobs/secret/trigger", api.acme, json={})

    status, html, _ = await page(api, "/ui/jobs", api.globex)
    assert status == 200 and "secret" not in html
    status, *_ = await page(api, "/ui/jobs/acme:secret", api.globex)
    assert status == 404
    assert (await page(api, f"/ui/runs/{run['id']}", api.globex))[0] == 404
    assert (await page(api, f"/ui/runs/{run['id']}/log.txt", api.globex))[0] == 404
    assert (await page(api, f"/ui/runs/{run['id']}/log/events", api.globex))[0] == 404
    status, html, _ = await page(api, "/ui/jobs?tenant=acme", api.globex)
    assert "acme:secret" not in html, "a tenant filter does not widen what a tenant sees"

    csrf = await csrf_of(api, api.globex)
    pause = "/ui/jobs/acme:secret/pause"
    status, *_ = await page(api, pause, api.globex, "POST", data={"csrf": csrf})
    assert status == 404
    assert (await page(api, "/ui/cluster", api.globex))[0] == 403, "the cluster is the admin's"
    assert (await page(api, "/ui/cluster", api.admin))[0] == 200
    status, html, _ = await page(api, "/ui/jobs?tenant=acme", api.admin)
    assert "acme:secret" in html


async def test_an_edit_made_from_a_stale_version_is_refused(api: Api) -> None:
    await api.call("POST", "/v1/jobs", api.acme, json={"id": "ed", "spec": spec()})
    csrf = await csrf_of(api, api.acme)
    edit = "/ui/jobs/ed/edit"
    text = "trigger: {kind: interval, every: 2h}\nexecution: {argv: ['true']}\n"

    status, html, _ = await page(
        api, edit, api.acme, "POST", data={"csrf": csrf, "spec": text, "version": "1"}
    )
    assert status == 303
    job = await api.services.jobs.get("acme:ed")
    assert job.version == 2 and job.spec.trigger.kind == "interval"

    status, html, _ = await page(
        api, edit, api.acme, "POST", data={"csrf": csrf, "spec": text, "version": "1"}
    )
    assert status == 409 and "version 2" in html and "every: 2h" in html
    bad = {"csrf": csrf, "spec": "trigger: {kind: interval, every: 0s}", "version": "2"}
    status, html, _ = await page(api, edit, api.acme, "POST", data=bad)
    assert status == 422 and "spec.trigger.interval.every" in html, "the field at fault"
    assert (await api.services.jobs.get("acme:ed")).version == 2


async def test_logout_clears_the_cookie(api: Api) -> None:
    csrf = await csrf_of(api, api.acme)
    status, _, headers = await page(api, "/ui/logout", api.acme, "POST", data={"csrf": csrf})
    assert status == 303 and headers["Location"] == "/ui/login"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith('etcdsched_ui="";') and "Max-Age=0" in cookie


async def test_the_dashboard_is_not_in_the_openapi_document(api: Api) -> None:
    _, document, _ = await api.call("GET", "/openapi.json")
    assert not [path for path in document["paths"] if path.startswith("/ui")]
    status, body, _ = await page(api, "/ui/static/htmx.min.js", None)
    assert status == 200 and "htmx" in body


@pytest.mark.parametrize("target", ["https://evil.example/x", "//evil.example", "/v1/jobs"])
async def test_login_goes_only_to_a_dashboard_page(api: Api, target: str) -> None:
    async with api.http.post(
        f"{api.url}/ui/login",
        data={"token": api.acme, "next": target},
        allow_redirects=False,
    ) as resp:
        assert resp.status == 303 and resp.headers["Location"] == "/ui/jobs"
