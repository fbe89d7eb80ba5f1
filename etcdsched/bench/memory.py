"""Scenario ``memory``: resident memory of a scheduler and a worker process
(``VmRSS``/``VmHWM`` from /proc/<pid>/status) with no stored jobs and with
``memory_jobs`` stored jobs, each under the same small due load
(``memory_due_jobs`` jobs every second, noop executor).

The stored jobs are the far-future ones of ``scan`` (loaded once per run):
a scheduler keeps only due entries up to its horizon in memory, so its
footprint should not follow the number of stored jobs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from etcdsched.bench.context import BenchContext
from etcdsched.bench.env import Agent
from etcdsched.bench.load import write_jobs
from etcdsched.bench.progress import Progress, note
from etcdsched.bench.results import ScenarioResult, Table, Target
from etcdsched.bench.scan import ensure_stored
from etcdsched.bench.throughput import START_DELAY_MS, interval_rows
from etcdsched.store.keys import Keys

SCHEDULER_LIMIT_MB = 300.0


def _sample(agent: Agent) -> list[float]:
    rss, hwm, tree = agent.rss_kb()
    return [(rss or 0) / 1024, (hwm or 0) / 1024, tree / 1024]


async def _phase(ctx: BenchContext, keys: Keys, label: str) -> dict[str, Any]:
    """Start a scheduler and a worker on ``keys``, add the due load, sample RSS."""
    opts = ctx.options
    fleet = ctx.fleet(keys, f"memory-{label}")
    samples: dict[str, list[list[float]]] = {"scheduler": [], "worker": []}
    try:
        agents = {
            "scheduler": fleet.spawn("sched-0", ("scheduler",)),
            "worker": fleet.spawn("worker-0", ("worker",), executor="noop"),
        }
        await ctx.wait_ready(keys, fleet, opts.partitions, 1, timeout=180)
        t0 = int(time.time() * 1000) + START_DELAY_MS
        end = t0 + int((opts.memory_settle + 10) * 1000)
        if opts.memory_due_jobs:
            rows = interval_rows(
                keys, opts.partitions, opts.memory_due_jobs, 1000, t0, end, f"mem-{label}"
            )
            await write_jobs(ctx.store, keys, rows, len(rows), f"memory[{label}]: due load")
        await asyncio.sleep(max(0.0, (t0 - time.time() * 1000) / 1000))
        progress = Progress(f"memory[{label}]: sampling", opts.memory_settle, "s")
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < opts.memory_settle:
            for role, agent in agents.items():
                samples[role].append([elapsed, *_sample(agent)])
            progress.update(elapsed)
            await asyncio.sleep(1.0)
        progress.done()
    finally:
        fleet.stop_all()
    return samples


def _row(label: str, role: str, samples: list[list[float]]) -> list[Any]:
    if not samples:
        return [label, role, None, None, None, None]
    return [
        label,
        role,
        max(s[1] for s in samples),
        samples[-1][1],
        max(s[2] for s in samples),
        max(s[3] for s in samples),
    ]


async def run(ctx: BenchContext) -> ScenarioResult:
    opts = ctx.options
    empty = ctx.new_keys("memory-empty")
    await ctx.init_cluster(empty)
    note("memory: scheduler + worker with no stored jobs")
    phases = {"0": await _phase(ctx, empty, "0")}
    await ctx.cleanup(empty)
    stored = await ensure_stored(ctx, opts.memory_jobs)
    label = f"{stored.count}"
    note(f"memory: scheduler + worker with {stored.count:,} stored jobs")
    phases[label] = await _phase(ctx, stored.keys, label)
    rows = [_row(f"{int(n):,}", role, s) for n, p in phases.items() for role, s in p.items()]
    sched = phases[label]["scheduler"]
    peak = max((s[1] for s in sched), default=None)
    columns = ["stored jobs", "process", "VmRSS max MB", "VmRSS last MB", "VmHWM MB",
               "with children MB"]  # fmt: skip
    return ScenarioResult(
        name="memory",
        title="Resident memory of the agents",
        params={
            "stored_jobs": stored.count,
            "due_jobs_every_1s": opts.memory_due_jobs,
            "settle_s": opts.memory_settle,
            "partitions": opts.partitions,
        },
        tables=[Table("agent memory", columns, rows)],
        targets=[
            Target(
                f"scheduler RSS < {SCHEDULER_LIMIT_MB:g} MB at {stored.count:,} stored jobs",
                peak,
                SCHEDULER_LIMIT_MB,
                "lower",
                " MB",
            )
        ],
        series={"samples": phases},
        notes=[
            "'with children' adds the worker's watchdog process (and any job processes; "
            "none with the noop executor).",
        ],
    )
