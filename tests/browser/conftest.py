"""The dashboard in a real headless Chromium (Debian's ``chromium``),
driven by Playwright, over a whole running system: the test etcd, an
in-process scheduler and worker that really run the jobs, and the API
with the dashboard on a loopback port.

Without ``/usr/bin/chromium`` (or ``ETCDSCHED_CHROMIUM``) every test here
is skipped, saying so. Playwright's own browser download is never used:
it fails on machines without general network access, and Debian's build
is what CI installs.

With ``ETCDSCHED_UI_SCREENSHOTS=<dir>`` the tests save screenshots of the
four pages there (``docs/images`` for the docs); without it nothing is
written, so a test run leaves the tree clean.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from etcdsched.api.app import ApiServices, make_app
from etcdsched.api.auth import create_admin_token, create_token
from etcdsched.runtime.clock import SystemClock
from tests.support.e2e_jobs import start_worker
from tests.support.services import PARTITIONS, Services

CHROMIUM = Path(os.environ.get("ETCDSCHED_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = os.environ.get("ETCDSCHED_UI_SCREENSHOTS", "")
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

NO_CHROMIUM = (
    f"browser tests skipped: no Chromium at {CHROMIUM} (apt-get install chromium,"
    " or set ETCDSCHED_CHROMIUM to a Chromium binary)"
)


@dataclass
class System:
    """The running system and the tokens of its users."""

    url: str
    services: Services
    admin: str
    acme: str
    """An editor of tenant acme."""
    acme_viewer: str
    globex: str
    """An editor of tenant globex."""
    http: aiohttp.ClientSession

    async def api(self, method: str, path: str, token: str, body: Any = None) -> Any:
        """A JSON API call, as any client makes it."""
        headers = {"Authorization": f"Bearer {token}"}
        async with self.http.request(method, self.url + path, json=body, headers=headers) as resp:
            assert resp.status < 300, (resp.status, await resp.text())
            return await resp.json()


@pytest_asyncio.fixture(loop_scope="session")
async def system(services: Services) -> AsyncIterator[System]:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    clock = SystemClock()
    api = ApiServices(
        services.store, services.keys, clock, PARTITIONS, services.jobs, services.logs
    )
    runner = web.AppRunner(make_app(api, services.config), access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    store, keys, now = services.store, services.keys, clock.now_ms()
    admin = await create_admin_token(store, keys)
    tokens = [
        await create_token(store, keys, tenant=tenant, role=role, name=name, now_ms=now)
        for tenant, role, name in (
            ("acme", "editor", "ann"),
            ("acme", "viewer", "vic"),
            ("globex", "editor", "gus"),
        )
    ]
    try:
        async with aiohttp.ClientSession() as http:
            url = f"http://{host}:{port}"
            acme, viewer, globex = (issued.secret for issued in tokens)
            yield System(url, services, admin, acme, viewer, globex, http)
    finally:
        await runner.cleanup()


@pytest_asyncio.fixture(loop_scope="session")
async def browser() -> AsyncIterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(NO_CHROMIUM)
    async_api = pytest.importorskip(
        "playwright.async_api", reason="browser tests skipped: the playwright package is missing"
    )
    async with async_api.async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            await chromium.close()


async def signed_in(browser: Any, system: System, token: str, viewport: Any = None) -> Any:
    """A fresh browser context signed in with ``token`` through the login form."""
    context = await browser.new_context(viewport=viewport or LAPTOP, timezone_id="Europe/Berlin")
    page = await context.new_page()
    await page.goto(f"{system.url}/ui/jobs")
    await page.wait_for_url(re.compile(r"/ui/login\?next="))
    await page.fill("#token", token)
    await page.click("form[action='/ui/login'] button[type=submit]")
    await page.wait_for_url(re.compile(r"/ui/jobs$"))
    return page


async def screenshot(page: Any, name: str) -> None:
    """``ui-<name>.png`` in the screenshot directory, when one is asked for."""
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SCREENSHOTS) / f"ui-{name}.png"), full_page=True)
