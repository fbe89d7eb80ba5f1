"""Scenario ``ui``: how long each dashboard page takes to render
server-side with ``ui_jobs`` (10,000) jobs stored (issue 32: no page over
300 ms; docs/ui.md, "How fast the pages render").

The jobs go in through the batch create path
(``etcdsched.store.job_batch.create_many``, what ``POST /v1/jobs:batch``
calls) in two tenants (nine in ten in ``acme``) with a mix of cron
(several zones), interval and one-off triggers and a few labels. The
interval jobs of the first page get 20 backfilled runs each (a full
sparkline per row), and one cron job 60 runs and 30 skip records (a full
slot ledger). The API with the dashboard (``etcdsched.api.app.make_app``)
then serves from this process on a loopback port, and each page is fetched
``ui_requests`` times one after another with an admin's session cookie,
after three unmeasured fetches (templates compiled, caches warm). Each
request is timed from send to the last byte of the answer: on loopback,
the server's render plus well under a millisecond.
"""

from __future__ import annotations

import importlib.metadata
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from etcdsched.api.app import ApiServices, make_app
from etcdsched.api.auth import create_admin_token
from etcdsched.api.ui.session import COOKIE
from etcdsched.bench.context import BenchContext, BenchError
from etcdsched.bench.cpu import machine_busy_s, others_cores, sample
from etcdsched.bench.progress import note
from etcdsched.bench.results import ScenarioResult, Table, Target
from etcdsched.config import Config
from etcdsched.logs.store import DirLogStore
from etcdsched.model.records import SkipRecord
from etcdsched.model.spec import JobSpec
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.job_batch import CreateRequest, create_many
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Ops

BATCH = 500
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
ZONES = ("Europe/Berlin", "America/New_York", "Asia/Tokyo", "UTC")
LEDGER_JOB = "acme:job-00000"
FIRST_PAGE = 60
"""Job numbers below this hold the first page of ``acme``'s listing."""
WARM_REQUESTS = 3
TARGET_MS = 300.0
COLUMNS = ["page", "median ms", "p90 ms", "max ms", "requests"]


@dataclass(frozen=True)
class PageTimes:
    page: str
    ms: list[float]
    """Each measured request, send to last byte."""

    @property
    def median(self) -> float:
        return statistics.median(self.ms)

    @property
    def p90(self) -> float:
        ordered = sorted(self.ms)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]

    def row(self) -> list[Any]:
        return [self.page, self.median, self.p90, max(self.ms), len(self.ms)]


def spec_of(n: int) -> JobSpec:
    """Job ``n``: a tenant, a trigger kind and labels that vary with it."""
    tenant = "globex" if n % 10 == 9 else "acme"
    trigger: dict[str, Any]
    if n % 3 == 0:
        trigger = {"kind": "cron", "expr": f"{n % 60} {n % 24} * * *", "tz": ZONES[n % 4]}
    elif n % 3 == 1:
        trigger = {"kind": "interval", "every": f"{1 + n % 12}h"}
    else:
        trigger = {"kind": "at", "at": "2100-01-01T00:00:00Z"}
    return JobSpec.model_validate(
        {
            "tenant": tenant,
            "trigger": trigger,
            "execution": {"argv": ["true"]},
            "labels": {"team": f"team-{n % 7}", "tier": "batch" if n % 2 else "online"},
        }
    )


async def _store_jobs(jobs: JobService, count: int) -> None:
    for start in range(0, count, BATCH):
        numbers = range(start, min(start + BATCH, count))
        requests = [CreateRequest(spec_of(n), f"job-{n:05d}") for n in numbers]
        outcomes = await create_many(jobs, requests)
        failed = [o.error for o in outcomes if o.error is not None]
        if failed:
            raise BenchError(f"ui: {len(failed)} jobs not stored, e.g. {failed[0]!r}")


async def _store_history(jobs: JobService, keys: Keys, count: int, now_ms: int) -> str:
    """20 runs for each interval job of the first page, 60 runs and 30 skip
    records for the ledger job; the id of one of its runs."""
    first_page = [f"acme:job-{n:05d}" for n in range(min(FIRST_PAGE, count))
                  if n % 10 != 9 and n % 3 == 1]  # fmt: skip
    for job_id in first_page:
        await jobs.backfill(job_id, now_ms - 20 * HOUR_MS, now_ms, limit=20)
    runs = await jobs.backfill(LEDGER_JOB, now_ms - 60 * DAY_MS, now_ms, limit=60)
    for day in range(30):
        first = now_ms - (90 - day) * DAY_MS
        skip = SkipRecord(
            job_id=LEDGER_JOB,
            first_slot_ms=first,
            last_slot_ms=first,
            count=1,
            reason="misfire" if day % 2 else "overlap",
            created_ms=now_ms,
        )
        await jobs.store.txn([], [Ops.put(keys.skip(LEDGER_JOB, first), skip)])
    return runs[-1]


def pages(run_id: str, partitions: int) -> list[tuple[str, str]]:
    """(what the page shows, its path)."""
    return [
        ("jobs, every tenant (admin)", "/ui/jobs"),
        ("jobs of one tenant", "/ui/jobs?tenant=acme"),
        ("jobs filtered by label and state", "/ui/jobs?label=team%3Dteam-3&state=active"),
        ("job page: slot ledger (60 runs, 30 skips)", f"/ui/jobs/{LEDGER_JOB}"),
        ("run page", f"/ui/runs/{run_id}"),
        (f"cluster ({partitions} partitions)", "/ui/cluster"),
    ]


async def _timed(http: aiohttp.ClientSession, url: str, cookie: str, n: int) -> list[float]:
    """Milliseconds of each of ``n`` GETs of ``url``, one after another."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        async with http.get(url, headers={"Cookie": f"{COOKIE}={cookie}"}) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise BenchError(f"ui: GET {url}: {resp.status} {body[:300]!r}")
        times.append((time.perf_counter() - started) * 1000)
    return times


async def _fetch_pages(
    ctx: BenchContext, services: ApiServices, cookie: str, run_id: str
) -> list[PageTimes]:
    """Serve the dashboard on a loopback port and time each page."""
    runner = web.AppRunner(make_app(services, Config()), access_log=None)
    await runner.setup()
    timed = []
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        async with aiohttp.ClientSession() as http:
            for name, path in pages(run_id, services.partitions):
                url = f"http://{host}:{port}{path}"
                await _timed(http, url, cookie, WARM_REQUESTS)
                times = await _timed(http, url, cookie, ctx.options.ui_requests)
                timed.append(PageTimes(name, times))
    finally:
        await runner.cleanup()
    return timed


@dataclass(frozen=True)
class Measured:
    pages: list[PageTimes]
    stored_s: float
    """Seconds the storing of the jobs and their history took."""
    others: float
    """Cores the rest of the machine kept busy while the pages were timed."""


async def _measure(ctx: BenchContext, keys: Keys) -> Measured:
    """Store the jobs and their history, then time the pages."""
    count = ctx.options.ui_jobs
    clock = SystemClock()
    partitions = await ctx.init_cluster(keys)
    jobs = JobService(ctx.store, keys, clock, partitions)
    started = time.monotonic()
    await _store_jobs(jobs, count)
    run_id = await _store_history(jobs, keys, count, clock.now_ms())
    stored_s = time.monotonic() - started
    note(f"ui: stored {count:,} jobs and their history in {stored_s:.1f} s")
    cookie = await create_admin_token(ctx.store, keys)
    logs = DirLogStore(ctx.work_dir / "ui-logs")
    services = ApiServices(ctx.store, keys, clock, partitions, jobs, logs)
    ours = {"etcd": [ctx.etcd_pid], "benchmark": [os.getpid()]}
    before, machine_before = sample(ours), machine_busy_s()
    timed = await _fetch_pages(ctx, services, cookie, run_id)
    after, machine_after = sample(ours), machine_busy_s()
    return Measured(timed, stored_s, others_cores(before, after, machine_after - machine_before))


def _versions() -> str:
    found = []
    for package in ("aiohttp", "Jinja2"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package} unknown")
    return ", ".join(found)


def _targets(timed: list[PageTimes]) -> list[Target]:
    """Issue 32's 300 ms, on the slowest page's median and on the slowest request."""
    slowest = max(timed, key=lambda t: t.median)
    worst = max(timed, key=lambda t: max(t.ms))
    typical = f"every page's median <= {TARGET_MS:g} ms (slowest: {slowest.page})"
    each = f"every request <= {TARGET_MS:g} ms (slowest: {worst.page})"
    return [
        Target(typical, slowest.median, TARGET_MS, "lower", " ms"),
        Target(each, max(worst.ms), TARGET_MS, "lower", " ms"),
    ]


async def run(ctx: BenchContext) -> ScenarioResult:
    opts = ctx.options
    keys = ctx.new_keys("ui")
    try:
        measured = await _measure(ctx, keys)
    finally:
        await ctx.cleanup(keys)
    params = {"jobs": opts.ui_jobs, "requests per page": opts.ui_requests,
              "partitions": opts.partitions}  # fmt: skip
    timed = measured.pages
    table = Table(f"time per request, {opts.ui_jobs:,} jobs stored", COLUMNS,
                  [t.row() for t in timed])  # fmt: skip
    return ScenarioResult(
        name="ui",
        title=f"Dashboard pages: server-side render time with {opts.ui_jobs:,} jobs stored",
        params=params,
        tables=[table],
        targets=_targets(timed),
        metrics={"median_ms": {t.page: t.median for t in timed}},
        notes=[
            f"The jobs (two tenants, cron in four zones, interval and one-off triggers,"
            f" labels) were stored through the batch create path in {measured.stored_s:.1f} s; the"
            " first page's interval jobs have 20 runs each, one cron job 60 runs and 30"
            " skip records.",
            "The dashboard is served from the benchmark process on loopback and each page"
            f" is fetched {opts.ui_requests} times one after another as an admin (after"
            f" {WARM_REQUESTS} unmeasured), timed from send to the last byte: the server's"
            " render plus well under a millisecond. The maxima follow the machine's load"
            f" more than the page: meanwhile other processes than etcd and the benchmark"
            f" kept {measured.others:.2f} cores busy (/proc/stat). {_versions()}.",
        ],
    )
