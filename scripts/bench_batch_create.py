"""How fast are jobs created through ``POST /v1/jobs:batch``, against one at
a time through ``POST /v1/jobs``? A side measurement, not part of
``etcdsched bench``.

Starts its own single-member etcd with fsync on (as ``etcdsched up`` runs
it) and ``--apis`` API-only agent processes (``python -m etcdsched.agent
api``: the API is stateless, any number may serve one cluster), then from
this process, with the Python client: ``--jobs`` one-off jobs (``at`` far
in the future, running ``true``) in batches of ``--batch``, spread over the
APIs with ``--in-flight`` requests at once to each, answered with the job
records and again with ids only (``Prefer: return=minimal``, as the CLI
asks); then ``--single`` jobs created one per request, one at a time and
``--single-in-flight`` at a time. Prints jobs/s and the CPU seconds etcd,
the APIs (together) and this client used for each.

Run: ``.venv/bin/python scripts/bench_batch_create.py [--jobs 50000] [--apis 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from etcdsched.api.auth import create_admin_token
from etcdsched.bench.env import cpu_seconds
from etcdsched.client import Client
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.embedded import COMPACT_EVERY, EtcdTuning, free_port
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.etcd_cluster import EtcdCluster
from etcdsched.store.keys import Keys

PREFIX = "/etcdsched/"
PARTITIONS = 64
SPEC = {"trigger": {"kind": "at", "at": "2100-01-01T00:00:00Z"}, "execution": {"argv": ["true"]}}


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50_000, help="created through the batch")
    parser.add_argument("--batch", type=int, default=1000, help="items per batch request")
    parser.add_argument("--apis", type=int, default=1, help="API processes")
    parser.add_argument("--in-flight", type=int, default=2, help="batch requests at once per API")
    parser.add_argument("--single", type=int, default=2000, help="created one per request")
    parser.add_argument("--single-in-flight", type=int, default=16)
    return parser.parse_args()


def start_api(endpoint: str, port: int, work: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "ETCDSCHED_ETCD": endpoint,
        "ETCDSCHED_PREFIX": PREFIX,
        "ETCDSCHED_API_PORT": str(port),
        "ETCDSCHED_LOG_DIR": str(work / "logs"),
        "ETCDSCHED_MEMBER_ID": f"bench-api-{port}",
    }
    log = (work / f"api-{port}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "etcdsched.agent", "api"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_listening(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def measured(
    label: str, count: int, pids: dict[str, list[int]], run: Callable[[], Awaitable[Any]]
) -> None:
    """Run ``run`` and print ``count`` jobs over its wall time, and the CPU
    seconds each group of processes used meanwhile."""

    def cpu() -> dict[str, float]:
        return {name: sum(cpu_seconds(pid) for pid in group) for name, group in pids.items()}

    before = cpu()
    started = time.perf_counter()
    await run()
    elapsed = time.perf_counter() - started
    after = cpu()
    used = ", ".join(f"{name} {after[name] - before[name]:.1f}" for name in pids)
    rate = count / elapsed
    print(f"{label:36s} {count:6d} jobs in {elapsed:6.2f} s: {rate:7.0f} jobs/s  (CPU s: {used})")


async def batches(
    clients: list[Client],
    prefix: str,
    total: int,
    size: int,
    in_flight: int,
    with_jobs: bool = True,
) -> None:
    """``total`` jobs in batches of ``size``, the batches dealt round the
    clients (one per API), ``in_flight`` requests at once to each."""
    gates = [asyncio.Semaphore(in_flight) for _ in clients]

    async def one(number: int, start: int) -> None:
        ids = range(start, min(start + size, total))
        items = [{"id": f"{prefix}-{i}", "spec": SPEC} for i in ids]
        async with gates[number % len(clients)]:
            results = await clients[number % len(clients)].create_jobs(items, with_jobs=with_jobs)
        failed = [r for r in results if r.status != 201]
        if failed:
            raise SystemExit(f"{len(failed)} items failed, e.g. {failed[0]}")

    await asyncio.gather(*(one(n, start) for n, start in enumerate(range(0, total, size))))


async def singles(client: Client, prefix: str, total: int, in_flight: int) -> None:
    gate = asyncio.Semaphore(in_flight)

    async def one(index: int) -> None:
        async with gate:
            await client.create_job(SPEC, job_id=f"{prefix}-{index}")

    await asyncio.gather(*(one(index) for index in range(total)))


async def bench(
    args: argparse.Namespace, urls: list[str], token: str, pids: dict[str, list[int]]
) -> None:
    clients = [Client(url, token, timeout=120) for url in urls]
    try:
        await batches(clients, "warm", 2000 * len(clients), args.batch, args.in_flight)
        where = f"{len(urls)} API{'s' if len(urls) > 1 else ''}, {args.in_flight} in flight each"
        await measured(
            f"batch of {args.batch}, {where}",
            args.jobs,
            pids,
            lambda: batches(clients, "b", args.jobs, args.batch, args.in_flight),
        )
        await measured(
            "  the same, Prefer: return=minimal",
            args.jobs,
            pids,
            lambda: batches(clients, "m", args.jobs, args.batch, args.in_flight, False),
        )
        for in_flight in (1, args.single_in_flight):
            await measured(
                f"single creates, {in_flight} in flight",
                args.single,
                pids,
                functools.partial(singles, clients[0], f"s{in_flight}", args.single, in_flight),
            )
    finally:
        for client in clients:
            await client.close()


async def prepare(endpoint: str) -> str:
    """The cluster's settings and an admin token, straight into etcd."""
    store = await EtcdStore.connect(EtcdOptions(endpoints=(endpoint,)))
    try:
        keys = Keys(PREFIX)
        await ensure_cluster(store, keys, PARTITIONS, SystemClock().now_ms())
        return await create_admin_token(store, keys)
    finally:
        await store.close()


def main() -> None:
    args = options()
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; etcd fsync on")
    tuning = EtcdTuning(compact_every=COMPACT_EVERY)
    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(Path(tmp), 1, tuning=tuning) as etcd:
        work, endpoint = Path(tmp), etcd.endpoints[0]
        token = asyncio.run(prepare(endpoint))
        ports = [free_port() for _ in range(args.apis)]
        apis = [start_api(endpoint, port, work) for port in ports]
        try:
            urls = [f"http://127.0.0.1:{port}" for port in ports]
            for url in urls:
                wait_listening(url)
            etcd_pid = etcd.member(0).pid
            assert etcd_pid is not None
            pids = {"etcd": [etcd_pid], "api": [api.pid for api in apis], "client": [os.getpid()]}
            asyncio.run(bench(args, urls, token, pids))
        finally:
            for api in apis:
                api.terminate()
                api.wait(15)


if __name__ == "__main__":
    main()
