"""How long does each dashboard page take to render server-side with
10,000 jobs stored? A side measurement for docs/ui.md, not part of
``etcdsched bench`` (issue 32: no page over 300 ms).

Starts its own single-member etcd with fsync on (as ``etcdsched up`` runs
it), stores ``--jobs`` jobs through the batch create path
(``etcdsched.store.job_batch.create_many``) in two tenants (nine in ten
in ``acme``) with a mix of cron (several zones), interval and one-off
triggers and a few labels; gives the 50 jobs of the first page 20
backfilled runs each (a full sparkline per row), and one job 60 runs and
30 skip records (a full slot ledger). Then serves the API with the
dashboard in this process on a loopback port and GETs each page
``--requests`` times, one at a time, with an admin's session cookie,
timing each request from send to the last byte of the answer (on
loopback that is the server's render plus well under a millisecond).
Prints a markdown table: median and max per page, with the command, the
versions and the machine.

Run: ``.venv/bin/python scripts/ui_render_bench.py [--jobs 10000] [--requests 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from etcdsched.api.app import ApiServices, make_app
from etcdsched.api.auth import create_admin_token
from etcdsched.bench.env import machine_info
from etcdsched.config import Config
from etcdsched.logs.store import DirLogStore
from etcdsched.model.records import SkipRecord
from etcdsched.model.spec import JobSpec
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.embedded import COMPACT_EVERY, EtcdTuning
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.etcd_cluster import EtcdCluster
from etcdsched.store.job_batch import CreateRequest, create_many
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Ops

PREFIX = "/etcdsched/"
PARTITIONS = 64
BATCH = 500
DAY_MS = 86_400_000
ZONES = ("Europe/Berlin", "America/New_York", "Asia/Tokyo", "UTC")
LEDGER_JOB = "acme:job-00000"


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=30, help="GETs of each page")
    return parser.parse_args()


def spec_of(n: int) -> JobSpec:
    tenant = "globex" if n % 10 == 9 else "acme"
    kind = n % 3
    trigger: dict[str, Any]
    if kind == 0:
        trigger = {"kind": "cron", "expr": f"{n % 60} {n % 24} * * *", "tz": ZONES[n % 4]}
    elif kind == 1:
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


async def store_jobs(jobs: JobService, count: int) -> None:
    for start in range(0, count, BATCH):
        requests = [
            CreateRequest(spec_of(n), f"job-{n:05d}")
            for n in range(start, min(start + BATCH, count))
        ]
        outcomes = await create_many(jobs, requests)
        failed = [o.error for o in outcomes if o.error is not None]
        assert not failed, failed[:3]


async def store_history(jobs: JobService, store: EtcdStore, keys: Keys, now_ms: int) -> str:
    """20 runs for each job of the first page, 60 and 30 skip records for
    one; the id of one of its runs."""
    first_page = [f"acme:job-{n:05d}" for n in range(0, 60) if n % 10 != 9 and n % 3 == 1]
    for job_id in first_page:
        await jobs.backfill(job_id, now_ms - 20 * 3_600_000, now_ms, limit=20)
    ledger = await jobs.get(LEDGER_JOB)
    assert ledger.spec.trigger.kind == "cron"
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
        await store.txn([], [Ops.put(keys.skip(LEDGER_JOB, first), skip)])
    return runs[-1]


async def timed(http: aiohttp.ClientSession, url: str, cookie: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        async with http.get(url, headers={"Cookie": f"etcdsched_ui={cookie}"}) as resp:
            body = await resp.read()
            assert resp.status == 200, (url, resp.status, body[:200])
        times.append((time.perf_counter() - started) * 1000)
    return times


async def measure(
    endpoint: str, args: argparse.Namespace, work: Path
) -> list[tuple[str, list[float]]]:
    store = await EtcdStore.connect(EtcdOptions(endpoints=(endpoint,)))
    keys, clock = Keys(PREFIX), SystemClock()
    now = clock.now_ms()
    await ensure_cluster(store, keys, PARTITIONS, now)
    jobs = JobService(store, keys, clock, PARTITIONS)
    started = time.perf_counter()
    await store_jobs(jobs, args.jobs)
    run_id = await store_history(jobs, store, keys, now)
    print(f"stored {args.jobs} jobs and their history in {time.perf_counter() - started:.1f} s")
    admin = await create_admin_token(store, keys)
    services = ApiServices(store, keys, clock, PARTITIONS, jobs, DirLogStore(work / "logs"))
    runner = web.AppRunner(make_app(services, Config()), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    base = f"http://{host}:{port}"
    pages = [
        ("jobs, every tenant (admin)", "/ui/jobs"),
        ("jobs of one tenant", "/ui/jobs?tenant=acme"),
        ("jobs filtered by label and state", "/ui/jobs?label=team%3Dteam-3&state=active"),
        ("job page: slot ledger (60 runs, 30 skips)", f"/ui/jobs/{LEDGER_JOB}"),
        ("run page", f"/ui/runs/{run_id}"),
        ("cluster (64 partitions)", "/ui/cluster"),
    ]
    results = []
    try:
        async with aiohttp.ClientSession() as http:
            for name, path in pages:
                await timed(http, base + path, admin, 3)  # warm: templates compiled, caches
                results.append((name, await timed(http, base + path, admin, args.requests)))
    finally:
        await runner.cleanup()
        await store.close()
    return results


def report(args: argparse.Namespace, results: list[tuple[str, list[float]]], etcd: str) -> None:
    machine = machine_info()
    print()
    print(
        f"Command: `.venv/bin/python scripts/ui_render_bench.py --jobs {args.jobs}"
        f" --requests {args.requests}`  "
    )
    print(
        f"Versions: etcdsched {importlib.metadata.version('etcdsched')}, Python"
        f" {sys.version.split()[0]}, aiohttp {importlib.metadata.version('aiohttp')}, Jinja2"
        f" {importlib.metadata.version('jinja2')}, etcd {etcd} (fsync on)  "
    )
    print(
        f"Machine: {machine['cpus']} CPUs ({machine['cpu_model']}), {machine['memory_gib']} GiB,"
        f" load {machine['load_average_at_start'][0]} at start"
    )
    print()
    print(f"| page ({args.jobs:,} jobs stored) | median ms | max ms | requests |")
    print("| --- | ---: | ---: | ---: |")
    for name, times in results:
        print(f"| {name} | {statistics.median(times):.1f} | {max(times):.1f} | {len(times)} |")


def main() -> None:
    args = options()
    tuning = EtcdTuning(compact_every=COMPACT_EVERY)
    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(Path(tmp), 1, tuning=tuning) as etcd:
        results = asyncio.run(measure(etcd.endpoints[0], args, Path(tmp)))
        version = asyncio.run(_etcd_version(etcd.endpoints[0]))
    report(args, results, version)


async def _etcd_version(endpoint: str) -> str:
    store = await EtcdStore.connect(EtcdOptions(endpoints=(endpoint,)))
    try:
        return await store.server_version()
    finally:
        await store.close()


if __name__ == "__main__":
    main()
