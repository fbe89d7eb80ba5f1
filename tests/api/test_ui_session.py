"""The dashboard over plain HTTP (no browser): sessions and their cookie,
CSRF and origin checks (the login form's too), roles and tenants as the
API has them, the spec edit's version check, the live log resumed after a
drop and the log download (docs/ui.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from etcdsched.api.auth import create_token
from etcdsched.api.ui.log_events import CHUNK_BYTES
from etcdsched.model.records import RunRecord
from etcdsched.model.statemachine import assign_attempt, finish_attempt, start_attempt, transition
from etcdsched.model.states import RunState
from etcdsched.store.kv import Cmp, Ops
from tests.api.conftest import Api, spec
from tests.support.eventually import assert_eventually

CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


LOGIN_COOKIE = "etcdsched_ui_login"


def cookie_set(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """The ``Set-Cookie`` header of the cookie ``name``, if the response set it."""
    found = [c for c in headers.getall("Set-Cookie", []) if c.startswith(f"{name}=")]
    return found[0] if found else None


async def login_form(api: Api) -> tuple[str, str]:
    """The login form's CSRF value, and the pre-login cookie's value."""
    async with api.http.get(f"{api.url}/ui/login", allow_redirects=False) as resp:
        html = await resp.text()
        cookie = resp.cookies[LOGIN_COOKIE].value
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match is not None, "the login form carries its CSRF value"
    return match.group(1), cookie


async def login(
    api: Api, token: str, next_path: str = "", **headers: str
) -> tuple[int, CIMultiDictProxy[str]]:
    """Sign in through the form as a browser does: GET it, POST it back."""
    csrf, cookie = await login_form(api)
    data = {"token": token, "csrf": csrf, "next": next_path}
    headers = {"Cookie": f"{LOGIN_COOKIE}={cookie}", **headers}
    async with api.http.post(
        f"{api.url}/ui/login", data=data, headers=headers, allow_redirects=False
    ) as resp:
        return resp.status, resp.headers


async def page(
    api: Api, path: str, token: str | None, method: str = "GET", **kwargs: Any
) -> tuple[int, str, CIMultiDictProxy[str]]:
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
    cookie = cookie_set(headers, "etcdsched_ui")
    assert cookie is not None and cookie.startswith(f"etcdsched_ui={api.acme};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui/" in cookie
    assert "Secure" not in cookie, "plain HTTP on loopback: a Secure cookie would never come back"
    gone = cookie_set(headers, LOGIN_COOKIE)
    assert gone is not None and "Max-Age=0" in gone, "the pre-login cookie is spent"

    _, behind_tls = await login(api, api.acme, **{"X-Forwarded-Proto": "https"})
    assert "Secure" in (cookie_set(behind_tls, "etcdsched_ui") or "")


async def test_a_bad_token_is_refused_without_a_session(api: Api) -> None:
    status, headers = await login(api, "esk_not-a-token")
    assert status == 401 and cookie_set(headers, "etcdsched_ui") is None
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
    status, headers = await login(api, api.acme, target)
    assert status == 303 and headers["Location"] == "/ui/jobs"


async def test_the_login_form_needs_the_value_of_its_own_pre_login_cookie(api: Api) -> None:
    """Login CSRF: another site must not sign a victim into its own tenant."""
    async with api.http.get(f"{api.url}/ui/login", allow_redirects=False) as resp:
        assert resp.status == 200
        cookie = cookie_set(resp.headers, LOGIN_COOKIE)
    assert cookie is not None and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Path=/ui/" in cookie and "Max-Age=" in cookie, "short-lived"
    csrf, value = await login_form(api)
    other_csrf, _ = await login_form(api)
    assert csrf == value and other_csrf != value, "a fresh random value per form"

    async def post(data: dict[str, str], **headers: str) -> tuple[int, str, Any]:
        async with api.http.post(
            f"{api.url}/ui/login", data=data, headers=headers, allow_redirects=False
        ) as resp:
            return resp.status, await resp.text(), resp.headers

    jar = {"Cookie": f"{LOGIN_COOKIE}={value}"}
    refused = [
        await post({"token": api.globex}),  # what a cross-site form can send
        await post({"token": api.globex, "csrf": csrf}),  # no cookie
        await post({"token": api.globex}, **jar),  # no form value
        await post({"token": api.globex, "csrf": other_csrf}, **jar),  # another form's
        await post({"token": api.globex, "csrf": ""}, Cookie=f"{LOGIN_COOKIE}="),
        await post({"token": api.globex, "csrf": csrf}, Origin="https://evil.example", **jar),
    ]
    for status, _, headers in refused:
        assert status == 403 and cookie_set(headers, "etcdsched_ui") is None
    assert 'name="token"' in refused[0][1] and "expired" in refused[0][1], "the form again"

    status, _, headers = await post({"token": api.globex, "csrf": csrf}, **jar)
    assert status == 303 and (cookie_set(headers, "etcdsched_ui") or "").startswith(
        f"etcdsched_ui={api.globex};"
    )


async def test_logout_clears_the_cookie_of_a_revoked_token(api: Api) -> None:
    async with api.client(api.admin) as admin:
        created = await admin.create_token("leo", "acme", "editor")
        csrf = await csrf_of(api, created.token)
        await admin.revoke_token(created.id)

    async def signed_out() -> None:
        assert (await page(api, "/ui/jobs", created.token))[0] == 303

    await assert_eventually(signed_out, timeout=5)
    wrong = {"csrf": "0" * 64}
    assert (await page(api, "/ui/logout", created.token, "POST", data=wrong))[0] == 403
    status, _, headers = await page(api, "/ui/logout", created.token, "POST", data={"csrf": csrf})
    assert status == 303 and headers["Location"] == "/ui/login"
    assert "Max-Age=0" in (cookie_set(headers, "etcdsched_ui") or "")


@dataclass(frozen=True)
class Event:
    name: str
    id: str | None
    data: Any


async def sse(
    api: Api, path: str, token: str, last_id: str = "", until: str = "end"
) -> list[Event]:
    """The events of a live log up to the first ``until`` event; then the
    connection is dropped, as a network would."""
    headers = {"Cookie": f"etcdsched_ui={token}"}
    if last_id:
        headers["Last-Event-ID"] = last_id
    events: list[Event] = []
    buffer = b""
    timeout = aiohttp.ClientTimeout(total=20)
    async with api.http.get(api.url + path, headers=headers, timeout=timeout) as resp:
        assert resp.status == 200
        async for data in resp.content.iter_any():
            buffer += data
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                fields = dict(
                    line.split(": ", 1) for line in block.decode().split("\n") if line[:1] != ":"
                )
                if fields:
                    events.append(
                        Event(fields["event"], fields.get("id"), json.loads(fields["data"]))
                    )
                    if fields["event"] == until:
                        return events
    return events


async def advance(api: Api, run_id: str, *steps: Callable[[RunRecord], RunRecord]) -> RunRecord:
    """Move the run through ``steps`` as the scheduler and worker would (one CAS each)."""
    services = api.services
    for step in steps:
        current = await services.jobs.runs.load(services.store, run_id)
        compare = [Cmp.mod(current.key, current.mod_revision)]
        ops = [Ops.put(current.key, step(current.value))]
        assert (await services.store.txn(compare, ops)).succeeded
    return (await services.jobs.runs.load(services.store, run_id)).value


def started(now_ms: int) -> list[Callable[[RunRecord], RunRecord]]:
    return [lambda r: assign_attempt(r, "w1", now_ms), lambda r: start_attempt(r, now_ms, pid=1)]


async def test_a_resumed_live_log_keeps_its_attempt_and_every_character(api: Api) -> None:
    """A drop while following attempt 1, a reconnect after attempt 2 began:
    the stream goes on in attempt 1 where it stopped, and a character split
    across the drop arrives whole."""
    retried = spec(retry={"max_attempts": 2, "initial_delay": "0s"})
    await api.call("POST", "/v1/jobs", api.acme, json={"id": "live", "spec": retried})
    _, triggered, _ = await api.call("POST", "/v1/jobs/live/trigger", api.acme, json={})
    now = api.services.clock.now_ms()
    run = await advance(api, triggered["id"], *started(now))
    first_log = b"a" * (CHUNK_BYTES - 1) + "é".encode() + "z\n€".encode()  # é split by a read
    writer = api.logs.open_writer(run.id, 1)
    writer.write(first_log)
    # no ?attempt=: the current attempt, as the page of a run not started yet asks
    events_path = f"/ui/runs/{run.id}/log/events"

    before = await sse(api, events_path, api.acme, until="chunk")
    assert [e.name for e in before] == ["attempt", "chunk"] and before[0].data == {"attempt": 1}
    assert before[1].id == f"1:{CHUNK_BYTES - 1}", "the offset of the bytes sent, not read"

    writer.close()
    to_pending = lambda r: transition(r, RunState.PENDING, now)  # noqa: E731
    failed = lambda r: finish_attempt(r, "failed", now, exit_code=1)  # noqa: E731
    run = await advance(api, run.id, failed, to_pending, *started(now))
    assert run.attempt == 2
    api.logs.open_writer(run.id, 2).write(b"second attempt\n")

    after = await sse(api, events_path, api.acme, last_id=before[1].id or "")
    assert after[0].data == {"attempt": 1}, "the attempt it was following"
    assert [e.name for e in after] == ["attempt", "chunk", "end"]
    assert before[1].data["text"] + after[1].data["text"] == first_log.decode()
    assert after[1].id == f"1:{len(first_log)}"


async def test_a_download_is_the_log_as_it_was_when_it_began(api: Api) -> None:
    """A log still being written: the download ends at the end it saw at
    its start, with the pages' security headers."""
    await api.call("POST", "/v1/jobs", api.acme, json={"id": "dl", "spec": spec()})
    _, triggered, _ = await api.call("POST", "/v1/jobs/dl/trigger", api.acme, json={})
    run = await advance(api, triggered["id"], *started(api.services.clock.now_ms()))
    writer = api.logs.open_writer(run.id, 1)
    snapshot = (b"0123456789abcde\n" * (2 << 20)) + b"tail"  # 32 MiB and 4 bytes
    writer.write(snapshot)

    headers = {"Cookie": f"etcdsched_ui={api.acme}"}
    async with api.http.get(f"{api.url}/ui/runs/{run.id}/log.txt", headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        assert "attachment" in resp.headers["Content-Disposition"]
        body = await resp.content.readexactly(1)
        writer.write(b"written after the download began\n")  # far behind the server's buffers
        body += await resp.read()
    writer.close()
    assert len(body) == len(snapshot), "nothing written after it began"
    assert body == snapshot
