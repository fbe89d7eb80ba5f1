"""Scenario ``batch``: how fast jobs are created through ``POST /v1/jobs:batch``,
against one at a time through ``POST /v1/jobs`` (issue 28: batch creation
at 10,000 jobs/s or more).

The APIs are agent processes with the API role alone (``python -m
etcdsched.agent api``: the API is stateless, any number may serve one
cluster) on loopback ports; this process is the client. It speaks HTTP
with aiohttp as ``etcdsched.client`` does (that module is a sibling layer
the bench may not import): a JSON body, the bearer token of an admin, the
answer read whole and parsed into the API's own response models.

Measured, each from the same empty cluster (the jobs of the configuration
before are deleted, etcd's history compacted and etcd left to go idle):
``batch_jobs`` one-off jobs (``at`` in 2100, running ``true``) in batches
of ``batch_size``, dealt round 1 and then ``batch_apis`` API processes
with ``batch_in_flight`` requests at once to each, answered with the job
records and again with ids only (``Prefer: return=minimal``, as the CLI
asks); then ``batch_single`` jobs created one per request through one API,
one at a time and ``batch_single_in_flight`` at a time. A warm-up batch
per API before the first configuration is not counted.

For each: jobs/s over the wall time of the configuration, and the CPU
(user + system, from /proc) that etcd, the APIs in use (together) and this
process spent per job: on two cores the sum says whether the CPU or the
waiting sets the rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from etcdsched.api.auth import create_admin_token
from etcdsched.api.schemas import JobBatchResults
from etcdsched.bench.context import BenchContext, BenchError
from etcdsched.bench.cpu import etcd_settled, machine_busy_s, others_cores, per_unit_ms, sample
from etcdsched.bench.env import Agent, Fleet
from etcdsched.bench.options import BenchOptions
from etcdsched.bench.progress import note
from etcdsched.bench.results import ScenarioResult, Table, Target
from etcdsched.model.records import JobRecord
from etcdsched.store.embedded import free_port
from etcdsched.store.keys import Keys
from etcdsched.store.kv import MAX_TXN_OPS, Op, Ops

SPEC = {"trigger": {"kind": "at", "at": "2100-01-01T00:00:00Z"}, "execution": {"argv": ["true"]}}
BATCH_PATH = "/v1/jobs:batch"
SINGLE_PATH = "/v1/jobs"
TARGET_JOBS_PER_S = 10_000.0
HTTP_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 60.0
SETTLE_MAX_S = 60.0
TABLE_TITLE = "jobs created through the API, each configuration from an empty cluster"
COLUMNS = ["how", "APIs", "in flight per API", "answer", "jobs", "seconds", "jobs/s",
           "etcd µs/job", "APIs µs/job", "client µs/job", "total µs/job",
           "cores busy", "other processes' cores"]  # fmt: skip


@dataclass(frozen=True)
class Setup:
    """One measured configuration."""

    batch: bool
    apis: int
    in_flight: int
    minimal: bool
    jobs: int

    def how(self, size: int) -> str:
        return f"batch of {size:,}" if self.batch else "one per request"

    @property
    def answer(self) -> str:
        return "ids only" if self.minimal else "job records"


@dataclass
class Api:
    """One API process and this client's HTTP session to it."""

    agent: Agent
    url: str
    http: aiohttp.ClientSession


def setups(opts: BenchOptions) -> list[Setup]:
    """The configurations, in the order they run: batches through 1 and
    ``batch_apis`` APIs (records, then ids only), then single creates."""
    out = [
        Setup(True, apis, opts.batch_in_flight, minimal, opts.batch_jobs)
        for apis in sorted({1, opts.batch_apis})
        for minimal in (False, True)
    ]
    for in_flight in sorted({1, opts.batch_single_in_flight}):
        out.append(Setup(False, 1, in_flight, False, opts.batch_single))
    return out


async def _start_apis(fleet: Fleet, token: str, count: int) -> list[Api]:
    """``count`` API-only agents, each on a free loopback port, once each answers /healthz."""
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    apis = []
    for n in range(count):
        port = free_port()
        agent = fleet.spawn(f"api-{n}", ("api",), api_host="127.0.0.1", api_port=port)
        http = aiohttp.ClientSession(headers=headers, timeout=timeout)
        apis.append(Api(agent, f"http://127.0.0.1:{port}", http))
    for api in apis:
        await _wait_listening(api)
    return apis


async def _wait_listening(api: Api) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with api.http.get(api.url + "/healthz") as resp:
                if resp.status == 200:
                    return
        if not api.agent.alive or time.monotonic() > deadline:
            raise BenchError(f"{api.agent.name} did not come up:\n{api.agent.log_tail()}")
        await asyncio.sleep(0.2)


async def _post(api: Api, path: str, body: Any, headers: dict[str, str] | None) -> bytes:
    async with api.http.post(api.url + path, json=body, headers=headers) as resp:
        text = await resp.read()
        if resp.status >= 400:
            raise BenchError(f"POST {path}: {resp.status} {text[:300]!r}")
    return text


async def _batches(
    apis: Sequence[Api], prefix: str, total: int, size: int, in_flight: int, minimal: bool
) -> None:
    """``total`` jobs in batches of ``size``, the batches dealt round the
    APIs, ``in_flight`` requests at once to each."""
    gates = [asyncio.Semaphore(in_flight) for _ in apis]
    headers = {"Prefer": "return=minimal"} if minimal else None

    async def one(number: int, start: int) -> None:
        ids = range(start, min(start + size, total))
        items = [{"id": f"{prefix}-{i}", "spec": SPEC} for i in ids]
        async with gates[number % len(apis)]:
            text = await _post(apis[number % len(apis)], BATCH_PATH, {"items": items}, headers)
        failed = [r for r in JobBatchResults.model_validate_json(text).results if r.status != 201]
        if failed:
            raise BenchError(f"{len(failed)} items of a batch failed, e.g. {failed[0]}")

    async with asyncio.TaskGroup() as group:
        for number, start in enumerate(range(0, total, size)):
            group.create_task(one(number, start))


async def _singles(api: Api, prefix: str, total: int, in_flight: int) -> None:
    gate = asyncio.Semaphore(in_flight)

    async def one(index: int) -> None:
        async with gate:
            text = await _post(api, SINGLE_PATH, {"id": f"{prefix}-{index}", "spec": SPEC}, None)
        JobRecord.model_validate_json(text)

    async with asyncio.TaskGroup() as group:
        for index in range(total):
            group.create_task(one(index))


@dataclass(frozen=True)
class Measured:
    setup: Setup
    how: str
    seconds: float
    cpu_us: dict[str, float]
    """Microseconds of CPU per job by group (etcd, APIs, client) and their total."""
    cores: float
    """Cores busy on average, the three groups together."""
    others: float
    """Cores busy on average with every other process of the machine: on a
    shared machine, what the configuration competed with."""

    @property
    def rate(self) -> float:
        return self.setup.jobs / self.seconds

    def row(self) -> list[Any]:
        s, cpu = self.setup, self.cpu_us
        return [self.how, s.apis, s.in_flight, s.answer, s.jobs, self.seconds, self.rate,
                cpu["etcd"], cpu["APIs"], cpu["client"], cpu["total"], self.cores,
                self.others]  # fmt: skip


async def _measure(ctx: BenchContext, apis: list[Api], setup: Setup, prefix: str) -> Measured:
    """Create the jobs of ``setup``, timed, with the CPU each group spent."""
    size = ctx.options.batch_size
    used = apis[: setup.apis]
    groups = {"etcd": [ctx.etcd_pid], "APIs": [a.agent.pid for a in used],
              "client": [os.getpid()]}  # fmt: skip
    before, machine_before = sample(groups), machine_busy_s()
    if setup.batch:
        await _batches(used, prefix, setup.jobs, size, setup.in_flight, setup.minimal)
    else:
        await _singles(used[0], prefix, setup.jobs, setup.in_flight)
    after, machine_after = sample(groups), machine_busy_s()
    shares = per_unit_ms(before, after, setup.jobs)
    cpu_us = {group: shares[group] * 1000 for group in (*groups, "total")}
    others = others_cores(before, after, machine_after - machine_before)
    wall = after.wall_s - before.wall_s
    return Measured(setup, setup.how(size), wall, cpu_us, shares["cores"], others)


async def _forget_jobs(ctx: BenchContext, keys: Keys, partitions: int) -> None:
    """Delete what the creates wrote (job records, due pointers, due
    entries), compact etcd's history and wait for etcd to go idle, so the
    next configuration starts from the same empty cluster and is not
    charged for cleaning up after this one."""
    ops: list[Op] = [Ops.delete_prefix(keys.jobs_prefix()), Ops.delete_prefix(keys.due_pointer(""))]
    ops += [Ops.delete_prefix(keys.due_prefix(pp)) for pp in range(partitions)]
    for start in range(0, len(ops), MAX_TXN_OPS):
        await ctx.store.txn([], ops[start : start + MAX_TXN_OPS])
    revision = (await ctx.store.range("\0", count_only=True)).revision
    await ctx.store.compact(revision)
    await etcd_settled(ctx.etcd_pid, SETTLE_MAX_S)


async def _measure_all(ctx: BenchContext, keys: Keys, partitions: int) -> list[Measured]:
    opts = ctx.options
    token = await create_admin_token(ctx.store, keys)
    fleet = ctx.fleet(keys, "batch")
    apis: list[Api] = []
    try:
        apis = await _start_apis(fleet, token, opts.batch_apis)
        await _batches(apis, "warm", opts.batch_size * len(apis), opts.batch_size, 1, False)
        measured = []
        for number, setup in enumerate(setups(opts)):
            await _forget_jobs(ctx, keys, partitions)
            what = f"{setup.how(opts.batch_size)}, {setup.apis} API(s), {setup.answer}"
            note(f"batch: {setup.jobs:,} jobs, {what}, {setup.in_flight} in flight")
            measured.append(await _measure(ctx, apis, setup, f"c{number}"))
            note(f"batch: {measured[-1].rate:,.0f} jobs/s")
        return measured
    finally:
        for api in apis:
            await api.http.close()
        fleet.stop_all()


def _target(measured: list[Measured]) -> Target:
    """The fastest batch configuration against issue 28's 10,000 jobs/s."""
    best = max((m for m in measured if m.setup.batch), key=lambda m: m.rate)
    apis = best.setup.apis
    where = f"{apis} API process{'es' if apis > 1 else ''}, {best.setup.answer}"
    name = f"batch creation >= {TARGET_JOBS_PER_S:,.0f} jobs/s (fastest: {where})"
    return Target(name, best.rate, TARGET_JOBS_PER_S, "higher", " jobs/s")


def _label(m: Measured) -> str:
    s = m.setup
    return f"{m.how}, {s.apis} API, {s.in_flight} in flight, {s.answer}"


async def run(ctx: BenchContext) -> ScenarioResult:
    opts = ctx.options
    keys = ctx.new_keys("batch")
    partitions = await ctx.init_cluster(keys)
    try:
        measured = await _measure_all(ctx, keys, partitions)
    finally:
        await ctx.cleanup(keys)
    params = {"jobs per batch configuration": opts.batch_jobs, "batch size": opts.batch_size,
              "API processes": opts.batch_apis, "batch requests in flight per API":
              opts.batch_in_flight, "single creates": opts.batch_single}  # fmt: skip
    return ScenarioResult(
        name="batch",
        title="Job creation: POST /v1/jobs:batch against one job per request",
        params=params,
        tables=[Table(TABLE_TITLE, COLUMNS, [m.row() for m in measured])],
        targets=[_target(measured)],
        metrics={"jobs_per_s": {_label(m): m.rate for m in measured}},
        notes=[
            "API-only agent processes (`python -m etcdsched.agent api`) on loopback; the"
            " benchmark process is the client (aiohttp, answers parsed into the API's"
            " models, as `etcdsched.client` does). One-off jobs in the far future, so"
            " nothing fires while they are created.",
            "jobs/s is jobs over the wall time of the configuration; CPU is user + system"
            " time from /proc of etcd, of the APIs in use (together) and of this process,"
            " per job. 'cores busy' is the three together over the wall time: near 2 on"
            " this 2-core machine, the CPU sets the rate, not the waiting. 'Other"
            " processes' cores' is the rest of the machine's busy time (/proc/stat) over"
            " the same time: on a shared machine, what the configuration competed with.",
            "Between configurations the jobs are deleted, etcd's history compacted and etcd"
            " left to go idle; a warm-up batch per API before the first is not counted."
            " That makes the rows comparable, and is the best case: in a cluster already"
            " holding many jobs, with their history not yet compacted, etcd spends more"
            " per job created.",
        ],
    )
