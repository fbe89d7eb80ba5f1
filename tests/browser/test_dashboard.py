"""The dashboard as a person uses it, in a real headless Chromium over a
running scheduler and worker (docs/ui.md): sign in, see a job created
through the API, read its slot ledger (a run, a skip record and its
reason), follow a running job's log live and cancel it, a viewer refused
the cancel, a tenant that never sees another's jobs, the cluster page,
and a phone-width screen."""

from __future__ import annotations

import re
from typing import Any

import pytest

from etcdsched.model.states import RunState
from tests.browser.conftest import PHONE, System, screenshot, signed_in
from tests.support.e2e_jobs import skips_of, start_worker, wait_runs, wait_state
from tests.support.eventually import assert_eventually

EVERY = {"kind": "interval", "every": "1s"}
expect = pytest.importorskip(
    "playwright.async_api", reason="browser tests skipped: the playwright package is missing"
).expect
SLOW_LINES = "i=0; while [ $i -lt 900 ]; do i=$((i+1)); echo line $i; sleep 0.2; done"


def job(trigger: dict[str, Any], argv: list[str], **extra: Any) -> dict[str, Any]:
    return {"trigger": trigger, "execution": {"argv": argv}, **extra}


async def create_jobs_with_history(system: System) -> None:
    """Jobs of tenant acme with runs and skip records behind them."""
    specs = {
        # runs every other second; the slots between meet a run still going
        "ledger": job(EVERY, ["sleep", "1.5"], overlap="skip", labels={"team": "data"}),
        "nightly": job({"kind": "cron", "expr": "0 3 * * *", "tz": "Europe/Berlin"}, ["true"]),
        "flaky": job(EVERY, ["sh", "-c", "exit $(( $(date +%s) % 3 == 0 ))"]),
        "report": job({"kind": "after", "jobs": ["flaky"]}, ["true"]),
        "backup": job(
            {"kind": "cron", "expr": "30 2 * * mon-fri", "tz": "America/New_York"},
            ["true"],
            labels={"team": "ops"},
        ),
    }
    for name, spec in specs.items():
        await system.api("POST", "/v1/jobs", system.acme, {"id": name, "spec": spec})
    await system.api("POST", "/v1/jobs/backup/pause", system.acme)
    services = system.services
    await wait_runs(services, "acme:ledger", lambda runs: any(r.state.terminal for r in runs))
    await assert_eventually(
        lambda: skips_of(services, "acme:ledger"), timeout=15, message="an overlap skip"
    )
    await wait_runs(services, "acme:flaky", lambda runs: sum(r.state.terminal for r in runs) >= 5)


async def test_jobs_page_and_slot_ledger_show_runs_and_skips_with_reasons(
    browser: Any, system: System
) -> None:
    await create_jobs_with_history(system)
    page = await signed_in(browser, system, system.acme)

    row = page.locator("tr[data-job='acme:ledger']")
    await expect(row).to_contain_text("every second")
    await expect(row.locator(".spark .bar").first).to_be_visible()
    nightly = page.locator("tr[data-job='acme:nightly']")
    await expect(nightly).to_contain_text("every day at 03:00 Europe/Berlin")
    time_title = await nightly.locator("time").get_attribute("title")
    assert time_title is not None and time_title.endswith("02:00:00 UTC"), "UTC on hover"
    await expect(nightly.locator("time")).to_contain_text("03:00:00")  # Berlin, as the viewer
    await screenshot(page, "jobs")

    await row.get_by_role("link", name="acme:ledger").click()
    await page.wait_for_url(re.compile(r"/ui/jobs/acme:ledger$"))
    ledger = page.locator("#ledger")
    await expect(ledger.locator("a.cell").first).to_be_visible()
    skip = ledger.locator(".cell.skip").first
    await expect(skip).to_contain_text("skipped")
    title = await skip.get_attribute("title")
    assert title is not None and "overlap: the previous run was still going" in title
    await expect(page.locator("table.upcoming tbody tr")).to_have_count(10)
    await screenshot(page, "job-ledger")

    run_link = ledger.locator("a.cell.run-succeeded").first
    await run_link.click()
    await page.wait_for_url(re.compile(r"/ui/runs/acme:ledger@"))
    await expect(page.locator("#run-state")).to_have_text("succeeded")
    await expect(page.locator("table.attempts tbody tr")).to_have_count(1)
    await expect(page.locator("#log-status")).to_contain_text("complete")


async def test_a_running_jobs_log_is_followed_live_and_cancelled_from_the_page(
    browser: Any, system: System
) -> None:
    spec = job({"kind": "now"}, ["sh", "-c", SLOW_LINES])
    await system.api("POST", "/v1/jobs", system.acme, {"id": "chatty", "spec": spec})
    [run] = await wait_runs(system.services, "acme:chatty", lambda runs: len(runs) == 1)
    await wait_state(system.services, run.id, RunState.RUNNING)
    page = await signed_in(browser, system, system.acme)
    await page.goto(f"{system.url}/ui/runs/{run.id}")
    log = page.locator("#log")
    await expect(log).to_contain_text("line 2")
    await page.evaluate("window.__same_page = true")
    shown = await log.inner_text()
    await expect(log).to_contain_text("line 9", timeout=10_000)
    assert len(await log.inner_text()) > len(shown), "new lines came in"
    assert await page.evaluate("window.__same_page === true"), "no reload"
    await screenshot(page, "run")

    await viewer_is_refused_the_cancel(browser, system, run.id)

    await page.locator("#cancel-run").click()
    await page.wait_for_url(re.compile(rf"/ui/runs/{re.escape(run.id)}$"))
    await expect(page.locator("#run-state")).to_have_text("cancelled", timeout=15_000)
    await expect(page.locator("#log-status")).to_contain_text("complete", timeout=15_000)
    ended = await system.services.run_of(run.id)
    assert ended.state is RunState.CANCELLED


async def viewer_is_refused_the_cancel(browser: Any, system: System, run_id: str) -> None:
    """A viewer of the same tenant sees the run without a cancel button, and
    a cancel posted from its page anyway (with its own session's CSRF
    token) is refused: the run goes on."""
    page = await signed_in(browser, system, system.acme_viewer)
    await page.goto(f"{system.url}/ui/runs/{run_id}")
    await expect(page.locator("#run-state")).to_have_text("running")
    await expect(page.locator("#log")).to_contain_text("line")
    await expect(page.locator("#cancel-run")).to_have_count(0)
    status = await page.evaluate(
        """async (runId) => {
            const csrf = document.querySelector("input[name=csrf]").value;
            const body = new URLSearchParams({csrf: csrf, reason: "viewer"});
            const resp = await fetch(`/ui/runs/${runId}/cancel`, {method: "POST", body: body});
            return resp.status;
        }""",
        run_id,
    )
    assert status == 403
    assert (await system.services.run_of(run_id)).state is RunState.RUNNING
    await page.context.close()


async def test_a_tenant_never_sees_another_tenants_jobs(browser: Any, system: System) -> None:
    theirs = job(EVERY, ["true"])
    await system.api("POST", "/v1/jobs", system.acme, {"id": "acme-only", "spec": theirs})
    own = job({"kind": "interval", "every": "1h"}, ["true"])
    await system.api("POST", "/v1/jobs", system.globex, {"id": "globex-own", "spec": own})
    page = await signed_in(browser, system, system.globex)
    table = page.locator("table.jobs")
    await expect(table).to_contain_text("globex:globex-own")
    await expect(table).not_to_contain_text("acme")
    await page.goto(f"{system.url}/ui/jobs?tenant=acme")
    await expect(page.locator("table.jobs")).not_to_contain_text("acme-only")
    response = await page.goto(f"{system.url}/ui/jobs/acme:acme-only")
    assert response is not None and response.status == 404
    await expect(page.locator("h1")).to_contain_text("404")
    await expect(page.get_by_role("link", name="Cluster")).to_have_count(0)


async def test_the_cluster_page_shows_members_capacity_and_the_queue(
    browser: Any, system: System
) -> None:
    big = {"worker_cpu": 16.0, "worker_memory_mb": 65_536, "worker_gpu": 2}
    start_worker(system.services, "gpu-1", worker_labels={"pool": "gpu"}, **big)
    needs = {"slots": 1, "cpu": 4.0, "memory_mb": 8192, "gpu": 1}
    spec = job({"kind": "now"}, ["sleep", "30"], resources=needs, selector={"pool": "gpu"})
    await system.api("POST", "/v1/jobs", system.acme, {"id": "busy", "spec": spec})
    [run] = await wait_runs(system.services, "acme:busy", lambda runs: len(runs) == 1)
    await wait_state(system.services, run.id, RunState.RUNNING)
    page = await signed_in(browser, system, system.admin)
    await page.get_by_role("link", name="Cluster").click()
    await page.wait_for_url(re.compile(r"/ui/cluster$"))
    workers = page.locator("table.workers tbody tr")
    await expect(workers).to_have_count(2)
    await expect(workers.nth(1)).to_contain_text("w1")
    gpu = workers.nth(0)
    await expect(gpu).to_contain_text("pool=gpu")
    await expect(gpu.locator("meter")).to_have_count(4)
    await expect(gpu.locator("meter").nth(1)).to_have_attribute("value", "4.0")
    await expect(gpu).to_contain_text("8192 / 57344")
    await expect(page.locator("main")).to_contain_text("s1")
    await expect(page.locator("#queue-depth")).to_contain_text("waiting for placement")
    await expect(page.locator("#start-lag")).to_contain_text("p50")
    await expect(page.locator("#brake")).to_contain_text("not engaged")
    await screenshot(page, "cluster")
    await system.api("POST", f"/v1/runs/{run.id}/cancel", system.admin, {})


async def test_phone_width_and_keyboard(browser: Any, system: System) -> None:
    small = job(EVERY, ["true"])
    await system.api("POST", "/v1/jobs", system.acme, {"id": "small", "spec": small})
    page = await signed_in(browser, system, system.acme, viewport=PHONE)
    await expect(page.locator("tr[data-job='acme:small']")).to_be_visible()
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 1, "the page does not scroll sideways; the table scrolls in its box"
    scroller = page.locator(".table-scroll").first
    assert await scroller.evaluate("el => el.scrollWidth > el.clientWidth")

    await page.keyboard.press("Tab")
    await expect(page.locator(":focus")).to_have_text("Skip to content")
    for _ in range(30):
        await page.keyboard.press("Tab")
        if await page.evaluate("document.activeElement.textContent.trim() === 'acme:small'"):
            break
    else:
        raise AssertionError("the job's link is reachable with the keyboard")
    await page.keyboard.press("Enter")
    await page.wait_for_url(re.compile(r"/ui/jobs/acme:small$"))
