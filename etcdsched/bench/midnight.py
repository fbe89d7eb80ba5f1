"""Scenario ``midnight``: N one-off jobs due at one instant, in three
classes, on workers that cannot hold them all (issue 28).

The classes: 1% priority 900, 9% priority 500, 90% priority 100 with a
start tolerance (``jitter``, 10 min by default) that spreads them over
that window deterministically. Everything else is the default a user
gets: fsync on, the 2 s lookahead (adaptive staging does the rest), one
scheduler and one worker process whose slots are a fraction of N (noop
executor: the bookkeeping only). The jobs are written straight to etcd
``midnight_lead`` ahead (the rows ``JobService.create`` writes).

Reported per class: start lag (start - not-before, which includes the
jitter offset) p50/p99/max and when the last one started; overall: the
peak of runs staged at once (active runs, sampled every second), etcd's
database size at its peak and after compaction, the agents' peak RSS, and
the ledger check: every job exactly one run, none twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from etcdsched.bench.context import BenchContext, BenchError
from etcdsched.bench.env import Agent
from etcdsched.bench.etcd_ops import DB_SIZE, compacted_db, read_counters
from etcdsched.bench.load import make_spec, templated_rows, write_jobs
from etcdsched.bench.measure import RunTimes, count_keys, lags, read_runs, summary
from etcdsched.bench.progress import Progress, note
from etcdsched.bench.results import ScenarioResult, Table, Target
from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.errors import EtcdschedError
from etcdsched.store.keys import Keys

CLASSES = (("priority 900", 900, 0.01, False), ("priority 500", 500, 0.09, False),
           ("priority 100, jitter", 100, 0.90, True))  # fmt: skip
"""(name, priority, share of N, spread by the jitter)."""
TARGET_P99_MS = {"priority 900": 1000.0, "priority 500": 10_000.0}


@dataclass
class Samples:
    """What is sampled every second while the herd runs."""

    staged: int = 0
    db_bytes: float = 0.0
    rss_mb: dict[str, float] = field(default_factory=dict)

    def take(self, staged: int, db: dict[str, float], agents: dict[str, Agent]) -> None:
        self.staged = max(self.staged, staged)
        self.db_bytes = max(self.db_bytes, db.get("db bytes", 0.0))
        for role, agent in agents.items():
            rss = (agent.rss_kb()[0] or 0) / 1024 if agent.alive else 0.0
            self.rss_mb[role] = max(self.rss_mb.get(role, 0.0), rss)


def _id_prefix(name: str) -> str:
    """The job ids of class ``name`` start with this."""
    return f"midnight-{name.split(',')[0].replace(' ', '')}-"


def _job_ids(name: str, count: int) -> list[str]:
    return [f"{_id_prefix(name)}{i:07d}" for i in range(count)]


async def _write_herd(ctx: BenchContext, keys: Keys, partitions: int, at_ms: int) -> float:
    opts = ctx.options
    took = 0.0
    for name, priority, share, jittered in CLASSES:
        jitter = f"{opts.midnight_jitter:g}s" if jittered else "0s"
        spec = make_spec({"kind": "at", "at": ms_to_utc(at_ms)}, priority=priority, jitter=jitter)
        ids = _job_ids(name, max(1, round(opts.midnight_jobs * share)))
        rows = templated_rows(keys, partitions, ids, spec, int(time.time() * 1000))
        took += await write_jobs(ctx.store, keys, rows, len(ids), f"midnight: {name}")
    return took


async def _sample_until_drained(
    ctx: BenchContext, keys: Keys, agents: dict[str, Agent], total: int
) -> tuple[Samples, bool]:
    samples = Samples()
    deadline = time.monotonic() + ctx.options.midnight_jitter + ctx.options.drain_timeout
    progress = Progress("midnight: until all ended", total, " runs")
    while True:
        active = await count_keys(ctx.store, f"{keys.prefix}active/")
        ended = await count_keys(ctx.store, keys.runs_prefix()) - active
        samples.take(active, await read_counters(ctx.endpoints[0], DB_SIZE), agents)
        progress.update(ended)
        if ended >= total:
            progress.done()
            return samples, True
        if time.monotonic() > deadline:
            progress.done("(timed out)")
            return samples, False
        await asyncio.sleep(1.0)


def _class_rows(times: list[RunTimes], at_ms: int) -> list[list[Any]]:
    rows = []
    for name, *_ in CLASSES:
        prefix = _id_prefix(name)
        mine = [t for t in times if t.job_id.split(":", 1)[-1].startswith(prefix)]
        lag = summary(lags(mine))
        starts = [t.started_ms for t in mine if t.started_ms is not None]
        last = (max(starts) - at_ms) / 1000 if starts else None
        started = f"{len(starts):,}/{len(mine):,}"
        rows.append([name, started, lag.get("p50"), lag.get("p99"), lag.get("max"), last])
    return rows


def _ledger(times: list[RunTimes], expected: int) -> str:
    """Every job one run, none twice (one-off jobs: one slot each)."""
    per_job = Counter(t.job_id for t in times)
    twice = sum(1 for n in per_job.values() if n > 1)
    missing = expected - len(per_job)
    return "ok" if not twice and not missing else f"{missing} jobs without a run, {twice} twice"


@dataclass
class HerdRun:
    """What one midnight run measured, before its runs are read."""

    at_ms: int
    submit_s: float
    samples: Samples
    drained: bool
    kept_lease: bool


async def _run_herd(ctx: BenchContext, keys: Keys, slots: int) -> HerdRun:
    """A scheduler and a worker with ``slots``, the herd, until it ended."""
    opts = ctx.options
    partitions = await ctx.init_cluster(keys)
    fleet = ctx.fleet(keys, "midnight", lookahead_ms=2000, worker_slots=slots)
    try:
        agents = {
            "scheduler": fleet.spawn("sched-0", ("scheduler",)),
            "worker": fleet.spawn("worker-0", ("worker",), executor="noop"),
        }
        await ctx.wait_ready(keys, fleet, partitions, 1)
        at_ms = int((time.time() + opts.midnight_lead + opts.midnight_jobs / 5000) * 1000)
        submit_s = await _write_herd(ctx, keys, partitions, at_ms)
        note(f"midnight: written in {submit_s:.1f} s; T in {at_ms / 1000 - time.time():.0f} s")
        samples, drained = await _sample_until_drained(ctx, keys, agents, opts.midnight_jobs)
        kept = not fleet.crashed() and await ctx.workers_kept_lease(keys, 1)
    finally:
        fleet.stop_all()
    return HerdRun(at_ms, submit_s, samples, drained, kept)


def _herd_table(herd: HerdRun, compacted: dict[str, float], ledger: str) -> Table:
    samples = herd.samples
    row = [
        f"{samples.staged:,}",
        samples.db_bytes / 2**20,
        compacted.get("db bytes in use", 0.0) / 2**20,
        samples.rss_mb.get("scheduler"),
        samples.rss_mb.get("worker"),
        ledger,
        "yes" if herd.drained else "NO",
        "yes" if herd.kept_lease else "NO",
    ]
    columns = ["peak runs staged", "etcd DB peak MiB", "etcd DB in use after compaction MiB",
               "scheduler RSS MB", "worker RSS MB", "ledger", "all ended",
               "worker kept its lease"]  # fmt: skip
    return Table("the herd as a whole", columns, [row])


async def run_midnight(ctx: BenchContext) -> ScenarioResult:
    opts = ctx.options
    n, slots = opts.midnight_jobs, max(1, int(opts.midnight_jobs * opts.midnight_capacity))
    params = {"jobs": n, "worker_slots": slots, "jitter_s": opts.midnight_jitter}
    result = ScenarioResult(
        name="midnight",
        title=f"Midnight: {n:,} one-off jobs due at one instant, three priority classes",
        params={**params, "lead_s": opts.midnight_lead},
    )
    keys = ctx.new_keys("midnight")
    try:
        herd = await _run_herd(ctx, keys, slots)
    except (EtcdschedError, BenchError) as exc:
        result.notes.append(f"the run failed: {exc!r}")
        return result
    times = await read_runs(ctx.store, keys)
    compacted = await compacted_db(ctx.store, ctx.endpoints[0])
    await ctx.cleanup(keys)
    rows = _class_rows(times, herd.at_ms)
    columns = ["class", "started", "lag p50 ms", "lag p99 ms", "lag max ms", "last start after T s"]
    result.tables.append(Table("start lag by class (lag = start - not-before)", columns, rows))
    result.tables.append(_herd_table(herd, compacted, _ledger(times, n)))
    for row in rows:
        if row[0] in TARGET_P99_MS:
            limit = TARGET_P99_MS[row[0]]
            name = f"midnight {row[0]}: lag p99 <= {limit / 1000:g} s"
            result.targets.append(Target(name, row[3], limit, "lower", " ms"))
    result.notes.append(
        f"One scheduler and one worker process with {slots:,} slots (noop executor), fsync on, the"
        f" default 2 s lookahead with adaptive staging; the jobs were written straight to etcd in"
        f" {herd.submit_s:.1f} s, {opts.midnight_lead:g} s + N/5000 s before T."
    )
    return result
