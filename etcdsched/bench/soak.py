"""Scenario ``soak``: history retention holds disk and etcd flat (issue 30).

``soak_jobs`` jobs every ``soak_interval`` (1 s) with ``retention:
{keep_last: soak_keep}`` (3), each run a real process (the process
executor: ``printf`` of five lines, so every run writes a log), until
``soak_runs`` runs (10,000) have been due; one scheduler and one worker
process, the directory log store. Several jobs rather than one because an
interval is at least 1 s: one job would take 2.8 hours to run 10,000 times;
ten take 17 minutes, and retention works per job either way.

Every ``soak_sample`` seconds it samples: the run logs on disk (``du``-style
bytes, files, run directories; the busiest job's directories), the jobs'
archives, the run records in etcd (all, and the busiest job's), and etcd's
database file and the part of it in use. After the load, etcd's history is
compacted and its size read again. Each series is judged by the rule in
:mod:`etcdsched.bench.soak_measure` after a warm-up of the log delete grace
plus :data:`WARM_UP_EXTRA_S`: a trimmed run's logs are kept that long after
it ended, so until then the logs on disk grow by design. The archives are
reported, not judged: each grows until its bound (8 MiB kept, cut past 16).

The directory store only: an object-store soak would need the bench to start
its own SeaweedFS (``weed``), which it does not do.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etcdsched.bench.context import BenchContext, BenchError
from etcdsched.bench.env import Fleet
from etcdsched.bench.etcd_ops import DB_SIZE, compacted_db, read_counters
from etcdsched.bench.load import job_rows, make_spec, write_jobs
from etcdsched.bench.measure import count_keys
from etcdsched.bench.options import BenchOptions
from etcdsched.bench.progress import Progress, note
from etcdsched.bench.results import ScenarioResult, Table, Target
from etcdsched.bench.soak_measure import FLAT_RATIO, ArchiveLines, disk_usage, flatness
from etcdsched.bench.throughput import START_DELAY_MS, expected_slots
from etcdsched.config import Config
from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.errors import EtcdschedError, StoreUnavailable
from etcdsched.model.records import DueEntry
from etcdsched.scheduler.retention import LOG_DELETE_GRACE_MS
from etcdsched.store.keys import Keys

ARGV = ("printf", "soak: line %s of 5\\n", "1", "2", "3", "4", "5")
"""Five lines of output: every run writes a log of about 80 bytes."""
GRACE_SETTING = "retention_log_delete_grace_ms"
"""The scheduler setting ``--soak-log-grace`` sets (``ETCDSCHED_RETENTION_
LOG_DELETE_GRACE_MS``), where this version of :class:`Config` has it."""
WARM_UP_EXTRA_S = 15.0
"""Beyond the log delete grace: a sweep of each partition every 5 s
(``reconcile_every``), the 2 s lookahead, and the run itself."""
SERIES = (  # key, label, MiB (else a count), judged, a target
    ("log_bytes", "run logs on disk (du)", True, True, True),
    ("log_files", "log files", False, True, True),
    ("run_dirs", "run log directories", False, True, False),
    ("run_dirs_job_max", "run log directories, busiest job", False, True, False),
    ("records", "run records in etcd", False, True, True),
    ("records_job_max", "run records in etcd, busiest job", False, True, False),
    ("db_bytes", "etcd DB file", True, True, True),
    ("db_in_use", "etcd DB in use", True, True, False),
    ("archive_bytes", "archives (bounded; not judged)", True, False, False),
)


def grace_ms(opts: BenchOptions) -> tuple[int, str]:
    """The log delete grace the scheduler runs with, and why."""
    if opts.soak_log_grace is None:
        return LOG_DELETE_GRACE_MS, "the scheduler's default"
    if GRACE_SETTING in Config.model_fields:
        return int(opts.soak_log_grace * 1000), "set by --soak-log-grace"
    return LOG_DELETE_GRACE_MS, (
        f"--soak-log-grace ignored: this version has no `{GRACE_SETTING}` setting,"
        " so the scheduler's fixed default applied"
    )


def warm_up_s(grace: int) -> float:
    return grace / 1000 + WARM_UP_EXTRA_S


@dataclass
class Sampler:
    """Takes the samples into ``series`` (one list per key, plus ``t_s``,
    seconds since the first slot, and ``runs``, runs ended so far)."""

    ctx: BenchContext
    keys: Keys
    root: Path
    job_ids: list[str]
    t0_ms: int
    slots_per_job: list[int] | None = None
    """Each job's slots in all, as ``expected_slots`` counts them."""

    def __post_init__(self) -> None:
        self.archived = ArchiveLines()
        self.series: dict[str, list[float]] = {"t_s": [], "runs": []}
        self.records_max = 0

    async def _fired(self) -> int:
        """Slots fired so far (each job's due pointer counts them; a job
        whose last slot fired has none): the count of runs ended with any
        log store, where counting archive lines needs them on this disk."""
        fired = 0
        totals = self.slots_per_job or [0] * len(self.job_ids)
        for job_id, total in zip(self.job_ids, totals, strict=True):
            kv = await self.ctx.store.get(self.keys.due_pointer(job_id))
            fired += kv.decode(DueEntry).value.fired if kv is not None else total
        return fired

    async def take(self) -> tuple[int, int]:
        """One sample; returns (runs ended, runs not ended)."""
        store = self.ctx.store
        active = await count_keys(store, f"{self.keys.prefix}active/")
        records = await count_keys(store, self.keys.runs_prefix())
        per_job = [await count_keys(store, self.keys.runs_prefix(j)) for j in self.job_ids]
        db = await read_counters(self.ctx.endpoints[0], DB_SIZE)
        disk = await asyncio.to_thread(disk_usage, self.root)
        archived = await asyncio.to_thread(self.archived.count, self.root)
        ended = max(archived + max(0, records - active), await self._fired() - active)
        row = {
            "t_s": (time.time() * 1000 - self.t0_ms) / 1000,
            "runs": ended,
            "log_bytes": disk.log_bytes,
            "log_files": disk.log_files,
            "run_dirs": disk.run_dirs,
            "run_dirs_job_max": max(disk.run_dirs_per_job.values(), default=0),
            "records": records,
            "records_job_max": max(per_job, default=0),
            "db_bytes": db.get("db bytes", math.nan),
            "db_in_use": db.get("db bytes in use", math.nan),
            "archive_bytes": disk.archive_bytes,
        }
        for key, value in row.items():
            self.series.setdefault(key, []).append(float(value))
        self.records_max = max(self.records_max, *per_job, 0)
        return ended, active


def soak_rows(
    keys: Keys, partitions: int, opts: BenchOptions, t0_ms: int, end_ms: int
) -> list[Any]:
    """The jobs, their first slots spread over one interval. ``run_all``
    misfires: a slot fired late on a busy machine still runs, so the runs
    counted are the slots due."""
    every_ms = int(opts.soak_interval * 1000)
    misfire = {"policy": "run_all", "grace": "1h", "max_catch_up": 1000}
    now, rows = int(time.time() * 1000), []
    for i in range(opts.soak_jobs):
        start = ms_to_utc(t0_ms + i * every_ms // opts.soak_jobs)
        trigger = {"kind": "interval", "every": f"{every_ms}ms", "start": start,
                   "end_at": ms_to_utc(end_ms)}  # fmt: skip
        retention = {"keep_last": opts.soak_keep}
        spec = make_spec(trigger, ARGV, retention=retention, misfire=misfire)
        rows.append(job_rows(keys, partitions, f"soak-{i:03d}", spec, now))
    return rows


@dataclass
class SoakRun:
    sampler: Sampler
    expected: int
    drained: bool
    kept_lease: bool
    grace_ms: int


async def _load(ctx: BenchContext, sampler: Sampler, end_ms: int, total: int) -> bool:
    """Sample until the last slot is due and every run ended (or the drain
    timeout passed: False). Every run: none active is not enough, as on a
    busy machine the last slot may not be fired yet when it is due."""
    progress = Progress("soak: runs ended", total, " runs")
    deadline = end_ms / 1000 + ctx.options.drain_timeout
    while True:
        began = time.time()
        try:
            ended, active = await sampler.take()
        except StoreUnavailable:  # an overloaded etcd: this sample is lost, the soak goes on
            ended, active = 0, 1
        records = sampler.series["records"][-1:] or [0.0]
        progress.update(ended, f"records {records[0]:,.0f}")
        if began * 1000 > end_ms and active == 0 and ended >= total:
            progress.done(f"({ended:,} runs)")
            return True
        if began > deadline:
            progress.done("(drain timeout)")
            return False
        await asyncio.sleep(max(0.0, ctx.options.soak_sample - (time.time() - began)))


def _spawn(fleet: Fleet, opts: BenchOptions, grace: int) -> None:
    sched_env = {GRACE_SETTING: grace} if opts.soak_log_grace is not None else {}
    fleet.spawn("sched-0", ("scheduler",), **sched_env)
    fleet.spawn("worker-0", ("worker",), executor="process")


async def _soak(ctx: BenchContext, keys: Keys) -> SoakRun:
    opts = ctx.options
    partitions = await ctx.init_cluster(keys)
    fleet = ctx.fleet(keys, "soak")
    grace, _ = grace_ms(opts)
    try:
        _spawn(fleet, opts, grace)
        await ctx.wait_ready(keys, fleet, partitions, 1)
        every_ms = int(opts.soak_interval * 1000)
        t0 = int(time.time() * 1000) + START_DELAY_MS
        end = t0 + math.ceil(opts.soak_runs / opts.soak_jobs) * every_ms - 1
        rows = soak_rows(keys, partitions, opts, t0, end)
        await write_jobs(ctx.store, keys, rows, len(rows), "soak: jobs")
        expected = expected_slots(opts.soak_jobs, every_ms, t0, end)
        job_ids = [r.job_id for r in rows]
        jobs = len(job_ids)
        per_job = [expected_slots(1, every_ms, t0 + i * every_ms // jobs, end) for i in range(jobs)]
        sampler = Sampler(ctx, keys, fleet.log_dir / "runlogs", job_ids, t0, per_job)
        drained = await _load(ctx, sampler, end, expected)
        kept = not fleet.crashed() and await ctx.workers_kept_lease(keys, 1)
    finally:
        fleet.stop_all()
    return SoakRun(sampler, expected, drained, kept, grace)


def _mib(value: float | None, mib: bool) -> float | None:
    return None if value is None else (value / 2**20 if mib else value)


def judge(series: dict[str, list[float]], warm_up: float) -> tuple[Table, list[Target]]:
    """The table of every series after the warm-up, and the targets."""
    rows: list[list[Any]] = []
    targets = []
    for key, label, mib, judged, target in SERIES:
        flat = flatness(series["t_s"], series["runs"], series[key], warm_up)
        unit = "MiB" if mib else ""
        if flat is None:  # the whole soak's last and max, unjudged
            values = series[key] or [0.0]
            whole = [None, _mib(values[-1], mib), _mib(max(values), mib)]
            rows.append([label, unit, *whole, *[None] * 4, "too short to judge"])
            if target:
                why = f"fewer than 8 samples after the {warm_up:.0f} s warm-up"
                targets.append(Target(_target_name(label), None, FLAT_RATIO, "lower", "", why))
            continue
        cells = [flat.first, flat.last, flat.peak, flat.q2_max, flat.q4_max]
        verdict = ("yes" if flat.flat else "**NO**") if judged else "not judged"
        rows.append([label, unit, *[_mib(c, mib) for c in cells], flat.ratio,
                     _mib(flat.per_1000_runs, mib), verdict])  # fmt: skip
        if target:
            targets.append(Target(_target_name(label), flat.ratio, FLAT_RATIO, "lower", "x"))
    columns = ["series", "unit", "first", "last", "max", "max 2nd quarter", "max 4th quarter",
               "4th/2nd", "growth per 1,000 runs", "flat"]  # fmt: skip
    title = f"after the warm-up (first {warm_up:.0f} s): flat if 4th/2nd <= {FLAT_RATIO:g}"
    return Table(title, columns, rows), targets


def _target_name(label: str) -> str:
    return f"soak: {label} flat (max of last quarter <= {FLAT_RATIO:g}x second's)"


def _whole_table(run: SoakRun, compacted: dict[str, float], keep: int) -> Table:
    s = run.sampler.series
    ended = int(s["runs"][-1]) if s["runs"] else 0
    cut = " (an archive was cut: at least)" if run.sampler.archived.cut else ""
    archive = s["archive_bytes"][-1] if s["archive_bytes"] else 0.0
    db_max = max(s["db_bytes"], default=0.0)
    row = [f"{ended:,}/{run.expected:,}{cut}", keep, run.sampler.records_max,
           run.grace_ms / 1000, archive / 2**20, archive / max(ended, 1), db_max / 2**20,
           compacted.get("db bytes", 0.0) / 2**20, compacted.get("db bytes in use", 0.0) / 2**20,
           "yes" if run.drained else "NO", "yes" if run.kept_lease else "NO"]  # fmt: skip
    columns = ["runs ended", "keep_last", "max records of one job", "log delete grace s",
               "archives at end MiB", "archive bytes per run", "etcd DB max MiB",
               "etcd DB after compaction MiB", "in use after compaction MiB", "all ended",
               "worker kept its lease"]  # fmt: skip
    return Table("the soak as a whole", columns, [row])


async def run(ctx: BenchContext) -> ScenarioResult:
    opts = ctx.options
    grace, why = grace_ms(opts)
    params = {"runs": opts.soak_runs, "jobs": opts.soak_jobs, "interval_s": opts.soak_interval,
              "keep_last": opts.soak_keep, "sample_s": opts.soak_sample,
              "log_delete_grace_s": grace / 1000}  # fmt: skip
    title = f"Soak: {opts.soak_runs:,} runs of jobs with keep_last {opts.soak_keep}"
    result = ScenarioResult(name="soak", title=title, params=params)
    keys = ctx.new_keys("soak")
    note(f"soak: {opts.soak_jobs} jobs every {opts.soak_interval:g}s; log grace {grace} ms ({why})")
    try:
        soak = await _soak(ctx, keys)
    except (EtcdschedError, BenchError) as exc:
        result.notes.append(f"the run failed: {exc!r}")
        return result
    compacted = await compacted_db(ctx.store, ctx.endpoints[0])
    await ctx.cleanup(keys)
    series, warm_up = soak.sampler.series, warm_up_s(grace)
    table, result.targets = judge(series, warm_up)
    result.tables += [table, _whole_table(soak, compacted, opts.soak_keep)]
    result.series = {**series, "warm_up_s": warm_up}
    result.metrics = {"records_job_max": soak.sampler.records_max, "grace_ms": grace,
                      "expected": soak.expected}  # fmt: skip
    result.notes += _notes(opts, grace, why)
    return result


def _notes(opts: BenchOptions, grace: int, why: str) -> list[str]:
    return [
        f"One scheduler and one worker process (process executor: each run is `{ARGV[0]}` of"
        f" five lines), the directory log store, fsync as in the setup; sampled every"
        f" {opts.soak_sample:g} s. Log delete grace {grace / 1000:g} s ({why}): a trimmed"
        " run's logs stay that long after it ended, so the logs on disk plateau at about"
        " jobs x grace / interval run directories.",
        "Disk is `du`-style (allocated blocks, directories included). The archives grow"
        " until their bound (8 MiB kept per job, cut back past 16 MiB) and are not judged."
        " No object store: the bench does not start one (the S3 store's deletes are covered"
        " by tests/e2e/test_retention.py against SeaweedFS).",
    ]
