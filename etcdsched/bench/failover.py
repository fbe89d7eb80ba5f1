"""Scenario ``failover``: how long work stops when an agent dies (kill -9).

Scheduler: two schedulers share the partitions while jobs fire every
second; one is killed. Measured per round from the kill: *takeover* (every
partition it owned has a new owner) and *fires again* (every such partition
with jobs has a run created by another scheduler; the first and the last
partition). Worker: a long ``sleep`` runs on one of two workers (retries
allowed); that worker is killed. Measured: *lost* (the attempt is marked
lost) and *rerun started* (the second attempt's ``started_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from etcdsched.bench.context import BenchContext, BenchError
from etcdsched.bench.env import Fleet
from etcdsched.bench.load import job_rows, make_spec, write_jobs
from etcdsched.bench.measure import read_runs
from etcdsched.bench.progress import note
from etcdsched.bench.results import ScenarioResult, Table, Target
from etcdsched.bench.throughput import START_DELAY_MS, interval_rows
from etcdsched.config import Config
from etcdsched.model.errors import StoreUnavailable
from etcdsched.model.records import OwnerRecord, RunRecord
from etcdsched.store.keys import Keys, partition_of, run_id, run_seq

JOBS_PER_PARTITION = 4
SCHED_COLUMNS = ["round", "partitions lost", "taken over", "first fires again", "all fire again"]
WORKER_COLUMNS = [
    "round",
    "member key gone (lease expired)",
    "attempt marked lost",
    "rerun started",
]


def now_ms() -> int:
    return int(time.time() * 1000)


async def _owners(ctx: BenchContext, keys: Keys) -> dict[int, str]:
    """Owner of each partition; {} when etcd did not answer this time (a
    poll under load): the caller polls again."""
    try:
        page = await ctx.store.range(keys.owners_prefix())
    except StoreUnavailable:
        return {}
    return {keys.parse_owner(kv.key): kv.decode(OwnerRecord).value.scheduler for kv in page.kvs}


async def _wait_owners(
    ctx: BenchContext, keys: Keys, parts: set[int], not_by: str, timeout: float
) -> int:
    """Until every partition in ``parts`` is owned by someone other than ``not_by``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = await _owners(ctx, keys)
        if held and all(held.get(pp, not_by) != not_by for pp in parts):
            return now_ms()
        await asyncio.sleep(0.05)
    raise BenchError(f"partitions {sorted(parts)} not taken over within {timeout:g}s")


async def _scheduler_round(
    ctx: BenchContext, keys: Keys, fleet: Fleet, victim: str, jobs: dict[int, list[str]]
) -> dict[str, Any]:
    ttl = ctx.options.lease_ttl
    parts = {pp for pp, owner in (await _owners(ctx, keys)).items() if owner == victim}
    killed = now_ms()
    fleet.agents[victim].kill9()
    takeover = await _wait_owners(ctx, keys, parts, victim, ttl + 30)
    await asyncio.sleep(3.0)  # let the new owner fire, then read what it created
    firsts: dict[int, int] = {}
    for t in await read_runs(ctx.store, keys):
        pp = partition_of(t.job_id, ctx.options.partitions)
        if pp in parts and t.created_ms > killed and not t.created_by.startswith(victim + "/"):
            firsts[pp] = min(firsts.get(pp, t.created_ms), t.created_ms)
    with_jobs = [pp for pp in parts if jobs.get(pp)]
    missing = [pp for pp in with_jobs if pp not in firsts]
    return {
        "partitions": len(parts),
        "takeover_ms": takeover - killed,
        "first_fire_ms": min(firsts.values()) - killed if firsts else None,
        "all_fire_ms": max(firsts.values()) - killed if firsts and not missing else None,
    }


async def _schedulers(ctx: BenchContext) -> list[dict[str, Any]]:
    opts = ctx.options
    keys = ctx.new_keys("failover-scheduler")
    partitions = await ctx.init_cluster(keys)
    fleet = ctx.fleet(keys, "failover-scheduler")
    rounds = []
    try:
        names = ["sched-a", "sched-b"]
        for name in names:
            fleet.spawn(name, ("scheduler",))
        fleet.spawn("worker-0", ("worker",), executor="noop")
        await ctx.wait_ready(keys, fleet, partitions, 1)
        count = JOBS_PER_PARTITION * partitions
        t0 = now_ms() + START_DELAY_MS
        rows = interval_rows(keys, partitions, count, 1000, t0, t0 + 86_400_000, "beat")
        await write_jobs(ctx.store, keys, rows, count, "failover: jobs")
        jobs: dict[int, list[str]] = {}
        for row in rows:
            jobs.setdefault(partition_of(row.job_id, partitions), []).append(row.job_id)
        for n in range(opts.failover_rounds):
            await _wait_balanced(ctx, keys, partitions, set(names))
            await asyncio.sleep(max(0.0, (t0 - now_ms()) / 1000) + 2.0)
            note(f"failover: kill -9 scheduler {names[0]} (round {n + 1})")
            rounds.append(await _scheduler_round(ctx, keys, fleet, names[0], jobs))
            names = [names[1], f"sched-{n}"]
            fleet.spawn(names[1], ("scheduler",))
    finally:
        fleet.stop_all()
    await ctx.cleanup(keys)
    return rounds


async def _wait_balanced(
    ctx: BenchContext, keys: Keys, partitions: int, names: set[str], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = await _owners(ctx, keys)
        if len(held) == partitions and set(held.values()) == names:
            return
        await asyncio.sleep(0.2)
    raise BenchError(f"schedulers {sorted(names)} did not share the partitions in {timeout:g}s")


async def _run_of(ctx: BenchContext, keys: Keys, rid: str) -> RunRecord | None:
    try:
        kv = await ctx.store.get(keys.run(rid))
    except StoreUnavailable:
        return None  # polled again
    return kv.decode(RunRecord).value if kv else None


async def _poll_run(
    ctx: BenchContext, keys: Keys, rid: str, attempt: int, timeout: float
) -> RunRecord:
    """Until attempt number ``attempt`` of the run has started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = await _run_of(ctx, keys, rid)
        if run and len(run.attempts) >= attempt and run.attempts[attempt - 1].started_ms:
            return run
        await asyncio.sleep(0.05)
    raise BenchError(f"run {rid}: attempt {attempt} did not start within {timeout:g}s")


async def _gone(ctx: BenchContext, key: str, timeout: float) -> int:
    """When ``key`` disappeared (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(StoreUnavailable):
            if await ctx.store.get(key) is None:
                break
        await asyncio.sleep(0.02)
    return now_ms()


async def _worker_round(ctx: BenchContext, keys: Keys, fleet: Fleet, n: int) -> dict[str, Any]:
    ttl, partitions = ctx.options.lease_ttl, ctx.options.partitions
    retry = {"max_attempts": 3, "initial_delay": "0s", "jitter": 0}
    spec = make_spec({"kind": "now"}, ("sleep", "300"), retry=retry)
    anchor = now_ms()
    row = job_rows(keys, partitions, f"sleeper-{n}", spec, anchor)
    await write_jobs(ctx.store, keys, [row], 1, "failover: sleeper job")
    rid = run_id(row.job_id, run_seq(anchor))
    run = await _poll_run(ctx, keys, rid, 1, 60)
    victim = run.attempts[0].worker.split(".")[0]
    killed = now_ms()
    note(f"failover: kill -9 worker {victim} (round {n + 1})")
    fleet.agents[victim].kill9()
    expired = asyncio.create_task(_gone(ctx, keys.member("workers", victim), ttl + 60))
    rerun = await _poll_run(ctx, keys, rid, 2, ttl + 60)
    ended = rerun.attempts[0].ended_ms
    fleet.spawn(f"worker-r{n}", ("worker",), executor="process")
    return {
        "lease_expired_ms": await expired - killed,
        "lost_ms": ended - killed if ended else None,
        "rerun_started_ms": (rerun.attempts[1].started_ms or 0) - killed,
    }


async def _workers(ctx: BenchContext) -> list[dict[str, Any]]:
    keys = ctx.new_keys("failover-worker")
    partitions = await ctx.init_cluster(keys)
    fleet = ctx.fleet(keys, "failover-worker")
    rounds = []
    try:
        fleet.spawn("sched-0", ("scheduler",))
        for name in ("worker-a", "worker-b"):
            fleet.spawn(name, ("worker",), executor="process")
        await ctx.wait_ready(keys, fleet, partitions, 2)
        for n in range(ctx.options.failover_rounds):
            await ctx.wait_ready(keys, fleet, partitions, 2)
            rounds.append(await _worker_round(ctx, keys, fleet, n))
    finally:
        fleet.stop_all()
    await ctx.cleanup(keys)
    return rounds


def _worst(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds]
    return None if not values or None in values else float(max(values))


def _targets(ttl: int, sched: list[dict[str, Any]], workers: list[dict[str, Any]]) -> list[Target]:
    return [
        Target(
            f"scheduler fail-over (all its partitions fire again) <= TTL + 1 s = {ttl + 1} s, "
            "worst round",
            _worst(sched, "all_fire_ms"),
            (ttl + 1) * 1000.0,
            "lower",
            " ms",
        ),
        Target(
            f"worker loss -> rerun started <= TTL + 3 s = {ttl + 3} s, worst round",
            _worst(workers, "rerun_started_ms"),
            (ttl + 3) * 1000.0,
            "lower",
            " ms",
        ),
    ]


async def run(ctx: BenchContext) -> ScenarioResult:
    ttl = ctx.options.lease_ttl
    sched = await _schedulers(ctx)
    workers = await _workers(ctx)
    sched_rows = [
        [i + 1, r["partitions"], r["takeover_ms"], r["first_fire_ms"], r["all_fire_ms"]]
        for i, r in enumerate(sched)
    ]
    worker_rows = [
        [i + 1, r["lease_expired_ms"], r["lost_ms"], r["rerun_started_ms"]]
        for i, r in enumerate(workers)
    ]
    return ScenarioResult(
        name="failover",
        title="Fail-over after kill -9",
        params={
            "lease_ttl_s": ttl,
            "rounds": ctx.options.failover_rounds,
            "reconcile_every_s": Config.model_fields["reconcile_every"].default,
        },
        tables=[
            Table("scheduler killed (ms after the kill)", SCHED_COLUMNS, sched_rows),
            Table("worker killed (ms after the kill)", WORKER_COLUMNS, worker_rows),
        ],
        targets=_targets(ttl, sched, workers),
        series={"scheduler_rounds": sched, "worker_rounds": workers},
    )
