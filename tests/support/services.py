"""In-process schedulers and workers on the real test etcd."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest_asyncio

from etcdsched.config import Config
from etcdsched.logs.store import DirLogStore
from etcdsched.model.records import RunRecord
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.service import SchedulerService, ensure_cluster
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.worker.executor import Executor, ProcessExecutor
from etcdsched.worker.sandbox import Sandbox
from etcdsched.worker.service import WorkerService
from etcdsched.worker.starter import ThreadStarter

PARTITIONS = 4
SUITE_TENANT = "default"
"""The tenant of the suite's jobs (their specs leave it out)."""


def full_id(job_or_run_id: str) -> str:
    """A job or run id as stored: the suite may name its jobs bare."""
    if ":" in job_or_run_id.partition("@")[0]:
        return job_or_run_id
    return f"{SUITE_TENANT}:{job_or_run_id}"


@dataclass
class Services:
    store: EtcdStore
    keys: Keys
    config: Config
    jobs: JobService
    logs: DirLogStore
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    schedulers: dict[str, SchedulerService] = field(default_factory=dict)
    workers: dict[str, WorkerService] = field(default_factory=dict)

    def start_scheduler(self, name: str) -> SchedulerService:
        cfg = self.config.model_copy(update={"member_id": name})
        service = SchedulerService(cfg, self.store, self.keys, SystemClock(), self.logs)
        self.schedulers[name] = service
        self.tasks[name] = asyncio.create_task(service.run(), name=name)
        return service

    def start_worker(
        self, name: str, executor: Executor | None = None, **overrides: object
    ) -> WorkerService:
        cfg = self.config.model_copy(update={"member_id": name, **overrides})
        service = WorkerService(
            cfg,
            self.store,
            self.keys,
            SystemClock(),
            executor or ProcessExecutor(Sandbox.from_config(cfg)),
            self.logs,
            starter=ThreadStarter(),
        )
        self.workers[name] = service
        self.tasks[name] = asyncio.create_task(service.run(), name=name)
        return service

    async def stop(self, name: str) -> None:
        task = self.tasks.pop(name)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def run_of(self, run_id: str) -> RunRecord:
        return (await self.jobs.runs.load(self.store, full_id(run_id))).value

    async def runs_of(self, job_id: str) -> list[RunRecord]:
        page = await self.store.range(self.keys.runs_prefix(full_id(job_id)))
        return [kv.decode(RunRecord).value for kv in page.kvs]


@pytest_asyncio.fixture(loop_scope="session")
async def services(
    store: EtcdStore, keys: Keys, etcd_endpoints: list[str], tmp_path: Path
) -> AsyncIterator[Services]:
    config = Config(
        etcd=",".join(etcd_endpoints),
        prefix=keys.prefix,
        partitions=PARTITIONS,
        lease_ttl=2,
        lookahead_ms=300,
        reconcile_every=0.5,
        log_dir=tmp_path / "logs",
        shutdown_grace=1.0,
        worker_run_as={"*": str(os.geteuid())},  # jobs write ledgers in tmp_path
        worker_tenants=["*"],
        scratch_dir=tmp_path / "scratch",
    )
    clock = SystemClock()
    await ensure_cluster(store, keys, PARTITIONS, clock.now_ms())
    logs = DirLogStore(config.log_dir)
    svc = Services(store, keys, config, JobService(store, keys, clock, PARTITIONS), logs)
    try:
        yield svc
    finally:
        for name in list(svc.tasks):
            await svc.stop(name)
