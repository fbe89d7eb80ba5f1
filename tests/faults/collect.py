"""Quiescing and reading back a fault-injection run.

The harness may read whole prefixes (it is a test tool, not a scheduler):
jobs, runs, skip records and due pointers, paged at one etcd revision.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from etcdsched.model.errors import EtcdschedError
from etcdsched.model.records import DueEntry, JobRecord, RunRecord, SkipRecord, WorkerMember
from etcdsched.store.cache import list_all
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Store, prefix_end
from tests.faults.checker import History
from tests.support.ledgerfile import pid_alive, read_ledger_tolerant

log = logging.getLogger(__name__)
T = TypeVar("T")


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout: float, interval: float = 0.25
) -> bool:
    """Poll ``check`` until it is true (etcd errors count as "not yet")."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():
                return True
        except EtcdschedError as exc:
            log.info("waiting: %s", exc)
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)


async def retrying(make: Callable[[], Awaitable[T]], attempts: int = 20) -> T:
    """Retry an etcd call through fail-over blips and write conflicts."""
    for attempt in range(attempts):
        try:
            return await make()
        except EtcdschedError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.25)
    raise AssertionError("unreachable")


async def read_all(store: Store, prefix: str) -> list[KV]:
    """Every key under ``prefix``, in key order, all at one revision (a
    listing that a compaction overtakes starts over)."""
    items, _ = await list_all(store, prefix, prefix_end(prefix))
    return list(items.values())


async def pause_all(store: Store, keys: Keys, jobs: JobService) -> int:
    """Pause every job so no slot comes due; returns the quiesce instant."""
    records = await retrying(lambda: read_all(store, keys.jobs_prefix()))
    for kv in records:
        job_id = kv.decode(JobRecord).value.id
        await retrying(functools.partial(jobs.pause, job_id))
    log.info("paused %d jobs", len(records))
    return jobs.clock.now_ms()


def archived_runs(log_dir: Path | None) -> list[RunRecord]:
    """Runs that history retention moved out of etcd (``<log dir>/<job>/archive.jsonl``).

    Retention archives first and deletes second, so a run can be archived
    twice (a sweep cut off between the two, or the old and the new owner of
    a partition sweeping during a hand-over): one record per run id, the last."""
    if log_dir is None:
        return []
    by_id = {}
    for archive in sorted(log_dir.glob("*/archive.jsonl")):
        for line in archive.read_text().splitlines():
            if line.strip():
                run = RunRecord.model_validate_json(line)
                by_id[run.id] = run
    return list(by_id.values())


async def collect_history(
    store: Store, keys: Keys, ledger: Path, quiesce_ms: int, log_dir: Path | None = None
) -> tuple[History, int]:
    """Everything the checker needs (archived runs included), and how many
    ledger lines were torn."""
    p = keys.prefix
    jobs = [
        kv.decode(JobRecord).value for kv in await retrying(lambda: read_all(store, f"{p}jobs/"))
    ]
    stored = [
        kv.decode(RunRecord).value for kv in await retrying(lambda: read_all(store, f"{p}runs/"))
    ]
    in_etcd = {run.id for run in stored}
    runs = stored + [run for run in archived_runs(log_dir) if run.id not in in_etcd]
    skips = [
        kv.decode(SkipRecord).value for kv in await retrying(lambda: read_all(store, f"{p}skips/"))
    ]
    dues = [
        kv.decode(DueEntry).value for kv in await retrying(lambda: read_all(store, f"{p}nextdue/"))
    ]
    lines, torn = read_ledger_tolerant(ledger)
    loads = await retrying(lambda: live_worker_loads(store, keys))
    history = History(
        jobs=jobs,
        runs=runs,
        skips=skips,
        until_ms={due.job_id: due.slot_ms for due in dues},
        quiesce_ms=quiesce_ms,
        ledger=lines,
        alive_pids=alive_job_pids(ledger),
        worker_loads=loads,
    )
    return history, torn


async def live_worker_loads(store: Store, keys: Keys) -> dict[str, list[str]]:
    """Run ids assigned to (the used capacity of) every live worker."""
    members = await read_all(store, keys.members_prefix("workers"))
    loads: dict[str, list[str]] = {}
    for kv in members:
        worker = kv.decode(WorkerMember).value.id
        assigned = await read_all(store, keys.assign_prefix(worker))
        runs = sorted(keys.parse_assign(a.key)[1] for a in assigned)
        if runs:
            loads[worker] = runs
    return loads


def dump_history(history: History, path: Path) -> None:
    """The records as JSON lines (one object per line, ``type`` first), for
    digging into a violation after the processes are gone."""
    with path.open("w") as out:
        for kind, records in (
            ("job", history.jobs),
            ("run", history.runs),
            ("skip", history.skips),
        ):
            for record in records:
                out.write(f'{{"type": "{kind}", "record": {record.model_dump_json()}}}\n')
        until = json.dumps({"until_ms": dict(history.until_ms), "quiesce_ms": history.quiesce_ms})
        out.write(f'{{"type": "window", "record": {until}}}\n')


def alive_job_pids(ledger: Path) -> frozenset[int]:
    """Job processes (their argv names the ledger) still running."""
    needle = str(ledger).encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and pid_alive(int(entry.name)):
            found.add(int(entry.name))
    return frozenset(found)
