"""Scenario ``throughput``: slots fired, placed, started and finished per
second under a sustained offered load.

Load: ``rate`` interval jobs, each every 1 s, their first slots spread
evenly over one second, so ``rate`` slots come due every second for
``duration``. The misfire grace is an hour, so a scheduler that falls behind
still fires every slot (late) instead of skipping: the rates then show the
ceiling. Counts come from the run records, bucketed per second; the
sustained rate is the mean over the window after a warm-up.

Run once per executor: ``noop`` (starts nothing, succeeds at once: it
measures etcdsched alone and is labelled so) and ``process`` (a real
``true`` subprocess per run).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from etcdsched.bench.context import BenchContext
from etcdsched.bench.cpu import CpuSample, fleet_groups, per_unit_ms, sample
from etcdsched.bench.etcd_ops import COUNTERS, read_counters
from etcdsched.bench.etcd_ops import per_unit as ops_per_unit
from etcdsched.bench.load import job_rows, make_spec, write_jobs
from etcdsched.bench.measure import (
    STAGES,
    RunTimes,
    lags,
    per_second,
    quantile_curve,
    read_runs,
    stage_gaps,
    summary,
    window_rate,
)
from etcdsched.bench.options import BenchOptions, offered_rate, worker_slots_for
from etcdsched.bench.progress import note
from etcdsched.bench.results import ScenarioResult, Table, Target
from etcdsched.model.cronwall import ms_to_utc
from etcdsched.store.keys import Keys

START_DELAY_MS = 5000
EXECUTOR_LABEL = {"noop": "noop executor (starts nothing)", "process": "real subprocess `true`"}


def interval_rows(
    keys: Keys, partitions: int, count: int, every_ms: int, t0_ms: int, end_ms: int, name: str
) -> list[Any]:
    """``count`` interval jobs whose first slots are spread over one period."""
    now = int(time.time() * 1000)
    rows = []
    for i in range(count):
        trigger = {
            "kind": "interval",
            "every": f"{every_ms}ms",
            "start": ms_to_utc(t0_ms + i * every_ms // count),
            "end_at": ms_to_utc(end_ms),
        }
        spec = make_spec(
            trigger, misfire={"policy": "run_all", "grace": "1h", "max_catch_up": 1000}
        )
        rows.append(job_rows(keys, partitions, f"{name}-{i:06d}", spec, now))
    return rows


def expected_slots(count: int, every_ms: int, t0_ms: int, end_ms: int) -> int:
    starts = (t0_ms + i * every_ms // count for i in range(count))
    return sum((end_ms - s) // every_ms + 1 for s in starts if s <= end_ms)


@dataclass(frozen=True)
class LoadRun:
    """One load run: the rate offered, the run records, the load's first
    slot, the runs expected, and the CPU used while slots were coming due."""

    rate: int
    times: list[RunTimes]
    t0_ms: int
    expected: int
    cpu: tuple[CpuSample, CpuSample]
    etcd_counters: tuple[dict[str, float], dict[str, float]]
    cpu_window_ms: tuple[int, int]

    def finished_in_window(self) -> int:
        start, end = self.cpu_window_ms
        return sum(1 for t in self.times if t.ended_ms and start <= t.ended_ms < end)

    def cpu_per_run_ms(self) -> dict[str, float]:
        """CPU per run finished while it was measured, by process group."""
        return per_unit_ms(*self.cpu, self.finished_in_window())

    def etcd_per_run(self) -> dict[str, float]:
        """etcd's operations per run finished while they were counted."""
        return ops_per_unit(*self.etcd_counters, self.finished_in_window())


async def _variant(ctx: BenchContext, executor: str) -> LoadRun:
    """One load run, from an empty prefix to every expected run read back."""
    opts = ctx.options
    rate = offered_rate(opts, executor)
    note(f"throughput: {EXECUTOR_LABEL[executor]}, {rate}/s for {opts.duration:g}s")
    keys = ctx.new_keys(f"throughput-{executor}")
    partitions = await ctx.init_cluster(keys)
    slots = worker_slots_for(opts, executor)
    fleet = ctx.fleet(keys, f"throughput-{executor}", worker_slots=slots)
    try:
        for i in range(opts.schedulers):
            fleet.spawn(f"sched-{i}", ("scheduler",))
        for i in range(opts.workers):
            fleet.spawn(f"worker-{i}", ("worker",), executor=executor)
        await ctx.wait_ready(keys, fleet, partitions, opts.workers)
        t0 = int(time.time() * 1000) + START_DELAY_MS
        end = t0 + int(opts.duration * 1000) - 1
        rows = interval_rows(keys, partitions, rate, 1000, t0, end, "tick")
        await write_jobs(ctx.store, keys, rows, len(rows), f"throughput[{executor}]: jobs")
        expected = expected_slots(rate, 1000, t0, end)
        groups = fleet_groups(ctx.etcd_pid, fleet)
        counted = await read_counters(ctx.endpoints[0])
        before, from_ms = sample(groups), int(time.time() * 1000)
        wait = (end - from_ms) / 1000
        await ctx.sleep_with_progress(wait, f"throughput[{executor}]: load", keys)
        after, to_ms = sample(groups), int(time.time() * 1000)
        counters = (counted, await read_counters(ctx.endpoints[0]))
        await ctx.wait_drained(keys, expected, f"throughput[{executor}]: drain")
    finally:
        fleet.stop_all()
    times = await read_runs(ctx.store, keys)
    await ctx.cleanup(keys)
    return LoadRun(rate, times, t0, expected, (before, after), counters, (from_ms, to_ms))


def _analyse(executor: str, load: LoadRun, ctx: BenchContext) -> tuple[list[Any], dict[str, Any]]:
    opts = ctx.options
    times, t0, expected = load.times, load.t0_ms, load.expected
    last = max((t.ended_ms or t.created_ms for t in times), default=t0)
    seconds = max(1, (last - t0) // 1000 + 1)
    series = per_second(times, t0, seconds)
    warmup = min(5, int(opts.duration) // 4)
    window = (warmup, int(opts.duration))
    rates = {stage: window_rate(series[stage], *window) for stage in STAGES}
    lag = summary(lags(times))
    raw = ctx.results.get("raw")
    put64 = raw.metrics.get("put64_per_s") if raw and not raw.error else None
    ratio = rates["finished"] / put64 if put64 else None
    saturated = rates["finished"] < 0.95 * load.rate
    row = [
        EXECUTOR_LABEL[executor], load.rate, *(rates[s] for s in STAGES),
        ratio, lag.get("p50"), lag.get("p99"), f"{len(times):,}/{expected:,}",
        "yes" if saturated else "no (raise --rate / --process-rate)",
    ]  # fmt: skip
    data = {
        "per_second": series,
        "window": list(window),
        "lag_curve": quantile_curve(lags(times)),
        "rates": rates,
        "ratio": ratio,
        "stage_gaps": stage_gaps(times),
        "cpu_per_run_ms": load.cpu_per_run_ms(),
        "etcd_per_run": load.etcd_per_run(),
    }
    return row, data


def _stage_table(executors: tuple[str, ...], series: dict[str, Any]) -> Table:
    """Where each run's time went: the stage that grows under load is the
    one that limits throughput."""
    rows = []
    for executor in executors:
        for stage, gap in series[executor]["stage_gaps"].items():
            rows.append([EXECUTOR_LABEL[executor], stage, gap.get("p50"), gap.get("p99")])
    columns = ["executor", "stage", "p50 ms", "p99 ms"]
    return Table("time per stage (first attempt)", columns, rows)


async def run(ctx: BenchContext) -> ScenarioResult:
    opts = ctx.options
    result = ScenarioResult(
        name="throughput",
        title="Sustained throughput",
        params={
            "offered_per_s": _per_executor(opts, offered_rate),
            "duration_s": opts.duration,
            "schedulers": opts.schedulers,
            "workers": opts.workers,
            "worker_slots": _per_executor(opts, worker_slots_for),
            "partitions": opts.partitions,
            "lookahead_ms": opts.lookahead_ms,
        },
    )
    rows = []
    for executor in opts.executors:
        row, data = _analyse(executor, await _variant(ctx, executor), ctx)
        rows.append(row)
        result.series[executor] = data
        result.metrics[f"{executor}_finished_per_s"] = data["rates"]["finished"]
    columns = ["executor", "offered/s", *(f"{s}/s" for s in STAGES), "finished ÷ raw put64",
               "lag p50 ms", "lag p99 ms", "runs/expected", "saturated"]  # fmt: skip
    result.tables.append(Table("rates over the steady window", columns, rows))
    result.tables.append(_stage_table(opts.executors, result.series))
    result.tables.append(_cpu_table(opts.executors, result.series))
    result.tables.append(_etcd_table(opts.executors, result.series))
    result.targets.append(_target(ctx, result))
    result.notes.append(_cpu_budget(ctx, result))
    result.notes.append(
        "Rates are means over the window after a warm-up; 'saturated: no' means the "
        "offered load was carried in full and the ceiling is higher than shown. Runs "
        "are fired up to the lookahead before their slot, so 'fired' leads the others."
    )
    return result


CPU_GROUPS = ("etcd", "scheduler", "worker", "benchmark")


def _cpu_table(executors: tuple[str, ...], series: dict[str, Any]) -> Table:
    """Milliseconds of CPU per finished run, by process, while slots came
    due: the sum against the machine's cores bounds the rate."""
    rows = []
    for executor in executors:
        cpu = series[executor]["cpu_per_run_ms"]
        shares = [cpu.get(group) for group in CPU_GROUPS]
        rows.append([EXECUTOR_LABEL[executor], *shares, cpu["total"], cpu["cores"]])
    columns = ["executor", *(f"{g} ms" for g in CPU_GROUPS), "total ms", "cores busy"]
    return Table("CPU per finished run (user + system, during the load)", columns, rows)


def _etcd_table(executors: tuple[str, ...], series: dict[str, Any]) -> Table:
    """etcd's own counters per finished run: how many operations a run is."""
    rows = []
    for executor in executors:
        ops = series[executor].get("etcd_per_run", {})
        rows.append([EXECUTOR_LABEL[executor], *(ops.get(name) for name in COUNTERS)])
    return Table("etcd work per finished run (etcd's counters, during the load)",
                 ["executor", *COUNTERS], rows)  # fmt: skip


def _cpu_budget(ctx: BenchContext, result: ScenarioResult) -> str:
    """What the target leaves per run, against what a run took."""
    raw = ctx.results.get("raw")
    put64 = raw.metrics.get("put64_per_s") if raw and not raw.error else None
    noop = result.series.get("noop")
    cores = os.cpu_count() or 1
    if not put64 or noop is None:
        return "CPU budget: needs --scenario raw and the noop executor in the same run."
    budget = cores * 1000 / (0.5 * put64)
    cpu = noop["cpu_per_run_ms"]
    return (
        f"CPU budget: 0.5 x put64 is {0.5 * put64:,.0f} runs/s; {cores} cores then allow "
        f"{budget:.2f} ms of CPU per run for every process together. A no-op run took "
        f"{cpu['total']:.2f} ms ({cpu['etcd']:.2f} in etcd, {cpu.get('scheduler', 0):.2f} "
        f"in the scheduler, {cpu.get('worker', 0):.2f} in the worker, "
        f"{cpu['benchmark']:.2f} in this benchmark's counting). Job processes "
        "(real subprocesses) are not included."
    )


def _target(ctx: BenchContext, result: ScenarioResult) -> Target:
    raw = ctx.results.get("raw")
    put64 = raw.metrics.get("put64_per_s") if raw and not raw.error else None
    noop = result.metrics.get("noop_finished_per_s")
    name = "noop throughput (finished/s) >= 0.5 x raw 64-in-flight put rate"
    if put64 is None or noop is None:
        why = "needs --scenario raw and the noop executor in the same run"
        return Target(name, None, 0.0, "higher", "/s", why)
    return Target(name, noop, 0.5 * put64, "higher", "/s")


def _per_executor(opts: BenchOptions, setting: Callable[[BenchOptions, str], int]) -> str:
    """A per-executor setting as a report parameter, e.g. ``2,000 (noop), 600 (process)``."""
    return ", ".join(f"{setting(opts, e):,} ({e})" for e in opts.executors)
