"""The webhook sender as an attacker would use it (docs/webhooks.md,
"Safety"): a tenant's editor picks the URL, the scheduler sends from inside
the network. Each attack is tried both ways: refused by default, and let
through only by the admin's explicit allowance. Every server here is a real
one on 127.0.0.1; a refused request must never reach it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest_asyncio
from aiohttp import web

from etcdsched.model.notify_records import Delivery, Webhook
from etcdsched.scheduler.webhook_sender import MAX_RESPONSE_BYTES, WebhookSender
from tests.support.webhook_receiver import WebhookReceiver

NOW_MS = int(time.time() * 1000)
DELIVERY = Delivery(
    event_id="e" * 32,
    kind="run.failed",
    tenant="acme",
    webhook="ops",
    job_id="acme:j",
    run_id="acme:j@00000000000001",
    attempt=1,
    body={"id": "e" * 32, "type": "run.failed", "link": "/v1/runs/acme:j@00000000000001"},
    created_ms=NOW_MS,
    next_attempt_ms=NOW_MS,
)


def hook(url: str, *, allow_http: bool = True, allow_private: bool = False) -> Webhook:
    return Webhook(
        tenant="acme",
        name="ops",
        url=url,
        secret="k" * 16,
        allow_http=allow_http,
        allow_private=allow_private,
        created_ms=NOW_MS,
        updated_ms=NOW_MS,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def sender() -> AsyncIterator[WebhookSender]:
    made = WebhookSender(timeout_s=1.0)
    try:
        yield made
    finally:
        await made.close()


async def test_loopback_is_refused_unless_the_admin_allowed_private_targets(
    receiver: WebhookReceiver, sender: WebhookSender
) -> None:
    refused = await sender.send(hook(receiver.url), DELIVERY, int(time.time()))
    assert refused.status is None and "loopback" in refused.error
    by_name = receiver.url.replace("127.0.0.1", "localhost")
    refused = await sender.send(hook(by_name), DELIVERY, int(time.time()))
    assert refused.status is None and "refused" in refused.error, refused
    assert receiver.received == []
    allowed = await sender.send(hook(receiver.url, allow_private=True), DELIVERY, 1)
    assert allowed.ok and len(receiver.received) == 1


async def refused_at_once(sender: WebhookSender, url: str) -> None:
    """The sender refuses ``url`` before any connection attempt."""
    started = time.monotonic()
    result = await sender.send(hook(url), DELIVERY, 1)
    assert result.status is None and result.error.startswith("refused"), (url, result)
    assert time.monotonic() - started < 0.5, "refused before any connection attempt"


async def test_the_metadata_address_and_private_networks_are_never_dialled(
    sender: WebhookSender,
) -> None:
    for url in (
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/",
        "http://10.0.0.1/",
        "http://[::ffff:127.0.0.1]:9/",
        "http://0.0.0.0:9/",
    ):
        await refused_at_once(sender, url)


async def test_internal_ranges_beyond_pythons_private_list_are_refused(
    sender: WebhookSender,
) -> None:
    """Shared (CGNAT) space with Alibaba's metadata address, IETF and 6to4
    relay ranges, site-local IPv6, and IPv6 addresses carrying a refused
    IPv4 one (6to4, NAT64, mapped) are no public receivers."""
    for url in (
        "http://100.100.100.200/latest/meta-data/",
        "http://100.64.0.1:9/",
        "http://192.0.0.1:9/",
        "http://192.88.99.1:9/",
        "http://[2002:a9fe:a9fe::1]/latest/",
        "http://[2002:7f00:1::1]:9/",
        "http://[fec0::1]:9/",
        "http://[64:ff9b::a9fe:a9fe]/latest/",
        "http://[::ffff:169.254.169.254]/latest/",
    ):
        await refused_at_once(sender, url)


async def test_the_admins_allowance_never_opens_link_local_or_metadata_addresses(
    sender: WebhookSender,
) -> None:
    for url in (
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.1.1:9/",
        "http://[fe80::1]:9/",
        "http://[fd00:ec2::254]/latest/",
        "http://100.100.100.200/latest/meta-data/",
        "http://[2002:a9fe:a9fe::1]/latest/",
        "http://[::ffff:169.254.169.254]/latest/",
    ):
        result = await sender.send(hook(url, allow_private=True), DELIVERY, 1)
        assert result.status is None and "never allowed" in result.error, (url, result)


async def test_numeric_hosts_in_other_forms_than_the_dotted_quad_are_refused(
    receiver: WebhookReceiver, sender: WebhookSender
) -> None:
    """``127.1``, ``2130706433``, ``0177.0.0.1``, ``127.0.0.1.`` and
    ``0x7f.1`` all mean loopback to the C resolver: an HTTP client that
    takes digits and dots for an IP literal would dial them unvetted. Ours
    refuses them itself, whatever the installed aiohttp does, even with
    every allowance (they are never the way to write a real receiver)."""
    port = receiver.port
    for host in ("127.1", "2130706433", "0177.0.0.1", "127.0.0.1.", "0x7f.1", "0x7f000001"):
        url = f"http://{host}:{port}/hook"
        for allow_private in (False, True):
            result = await sender.send(hook(url, allow_private=allow_private), DELIVERY, 1)
            assert result.status is None and result.error.startswith("refused"), (url, result)
            assert "standard form" in result.error, (url, result)
    assert receiver.received == []


async def test_a_url_yarl_cannot_parse_is_a_refused_attempt_not_a_crash(
    sender: WebhookSender,
) -> None:
    result = await sender.send(hook("https://xn--/"), DELIVERY, 1)
    assert result.status is None and result.error.startswith("refused: not a URL"), result


async def test_plain_http_needs_the_admins_allowance(
    receiver: WebhookReceiver, sender: WebhookSender
) -> None:
    result = await sender.send(
        hook(receiver.url, allow_http=False, allow_private=True), DELIVERY, 1
    )
    assert result.status is None and "https" in result.error and receiver.received == []


async def serve(handler: web.RequestHandler) -> tuple[str, web.AppRunner]:  # type: ignore[type-arg]
    app = web.Application()
    app.router.add_post("/hook", handler)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}/hook", runner


async def test_a_redirect_is_a_failed_attempt_and_never_followed(
    receiver: WebhookReceiver, sender: WebhookSender
) -> None:
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(receiver.url)

    url, runner = await serve(redirect)
    try:
        result = await sender.send(hook(url, allow_private=True), DELIVERY, 1)
    finally:
        await runner.cleanup()
    assert result.status == 307 and "redirect refused" in result.error and not result.ok
    assert receiver.received == []


async def test_a_huge_answer_is_not_read_and_a_silent_one_times_out(
    sender: WebhookSender,
) -> None:
    sent = 0

    async def huge(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            for _ in range(16 * 1024):  # 1 GiB if anyone read it all
                await response.write(chunk)
                sent += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return response

    url, runner = await serve(huge)
    try:
        started = time.monotonic()
        result = await sender.send(hook(url, allow_private=True), DELIVERY, 1)
        assert result.ok and time.monotonic() - started < 1.0
    finally:
        await runner.cleanup()
    assert sent < 1024 * 1024 * 1024 and MAX_RESPONSE_BYTES == 4096

    answer = asyncio.Event()

    async def silent(request: web.Request) -> web.Response:
        await request.read()
        await answer.wait()  # (longer than the sender's timeout)
        return web.Response()

    url, runner = await serve(silent)
    try:
        result = await sender.send(hook(url, allow_private=True), DELIVERY, 1)
    finally:
        answer.set()
        await runner.cleanup()
    assert result.status is None and result.error == "timed out"
