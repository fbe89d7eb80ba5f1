"""Issue 30, "Run it on many hosts": the deployment of docs/operations.md
from plain processes (3 etcd members, 2 schedulers, 1 API, 2 workers, each
agent with a private directory, as on hosts of its own) and run logs in an
S3 bucket (a real SeaweedFS). Nothing but etcd and the bucket is shared,
so what the API serves about a job on a worker it can only have from
there.

The scenario: a job prints a numbered line every 0.2 s; its log is followed
live through the API while it runs; its worker is killed -9. The attempt
must end ``lost`` (fenced), every line followed before the kill must still
be readable (it had been uploaded: the log outlives its worker), and the
retry must run on the other worker with a complete log. No worker's local
log directory may hold any of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from etcdsched.api.auth import create_admin_token
from etcdsched.client import Client
from etcdsched.logs.s3 import S3LogStore
from etcdsched.logs.s3_writer import FLUSH_SECONDS
from etcdsched.model.records import Attempt, RunRecord
from etcdsched.model.states import RunState
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.etcd_cluster import EtcdCluster
from etcdsched.store.keys import Keys
from tests.support.eventually import assert_eventually
from tests.support.seaweed import SeaweedS3
from tests.support.topology import Host, Topology

pytestmark = pytest.mark.slow  # the suite's mark for multi-process tests

LINES = 30
SCRIPT = f'for i in $(seq 1 {LINES}); do echo "line $i $(date +%s%3N)"; sleep 0.2; done'
"""About 6 s of output; each line carries its number and when it was printed (epoch ms)."""
RETRY = {"max_attempts": 2, "initial_delay": "0s", "jitter": 0}
FOLLOW_BOUND_MS = FLUSH_SECONDS * 1000 + 3000
"""A followed line may lag its printing by the writer's flush delay, plus an
upload, the API's poll and a loaded 2-core machine's scheduling."""


# -- fixtures ------------------------------------------------------------------------
@pytest.fixture
def s3_log_env(seaweed_s3: SeaweedS3, s3_prefix: str) -> dict[str, str]:
    """The log store settings every agent gets, as an operator writes them:
    the bucket and this test's prefix in one URL, keys in files."""
    return {
        "ETCDSCHED_LOG_STORE": f"s3://{seaweed_s3.bucket}/{s3_prefix}",
        "ETCDSCHED_LOG_S3_ENDPOINT_URL": seaweed_s3.endpoint_url,
        "ETCDSCHED_LOG_S3_REGION": seaweed_s3.options().region or "",
        "ETCDSCHED_LOG_S3_ACCESS_KEY_FILE": str(seaweed_s3.access_key_file),
        "ETCDSCHED_LOG_S3_SECRET_KEY_FILE": str(seaweed_s3.secret_key_file),
        "ETCDSCHED_LOG_S3_ADDRESSING_STYLE": "path",
    }


@pytest.fixture
def topology(
    tmp_path: Path, healthy_cluster3: EtcdCluster, key_prefix: str, s3_log_env: dict[str, str]
) -> Iterator[Topology]:
    hosts = Topology(tmp_path / "hosts", healthy_cluster3.endpoints, key_prefix, s3_log_env)
    try:
        hosts.start()
        yield hosts
    finally:
        hosts.close()
        print(hosts.tails())  # shown with a failure's captured teardown output


@pytest_asyncio.fixture(loop_scope="session")
async def admin(
    topology: Topology, healthy_cluster3: EtcdCluster, key_prefix: str
) -> AsyncIterator[Client]:
    """A client of the API process with an admin token made straight in
    etcd (separate agents have no ``up`` to make one: ``token bootstrap``),
    once every agent has registered and every partition has an owner."""
    options = EtcdOptions(endpoints=tuple(healthy_cluster3.endpoints))
    store = await EtcdStore.connect(options)
    try:
        token = await create_admin_token(store, Keys(key_prefix))
    finally:
        await store.close()
    await assert_eventually(topology.api_ready, timeout=30, interval=0.1, message="no API")
    async with Client(topology.url, token) as client:

        async def everyone_in() -> None:
            if topology.dead():
                raise RuntimeError(f"agents exited: {topology.dead()}\n{topology.tails()}")
            view = await client.cluster()
            assert (len(view.schedulers), len(view.workers), view.unowned) == (2, 2, []), view

        await assert_eventually(everyone_in, timeout=30, interval=0.2)
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def bucket_logs(seaweed_s3: SeaweedS3, s3_prefix: str) -> AsyncIterator[S3LogStore]:
    """The agents' log store, seen straight in the bucket."""
    store = S3LogStore(seaweed_s3.bucket, s3_prefix, seaweed_s3.options())
    try:
        yield store
    finally:
        await store.aclose()


# -- helpers -------------------------------------------------------------------------
@dataclass
class Follower:
    """One ``GET /v1/runs/{id}/log?follow=true`` stream, split into lines,
    each stamped with when it arrived (epoch ms, the clock the job prints)."""

    lines: list[str] = field(default_factory=list)
    arrived_ms: list[int] = field(default_factory=list)

    async def follow(self, client: Client, run_id: str, attempt: int) -> None:
        pending = b""
        async for data in client.follow_log(run_id, attempt):
            *whole, pending = (pending + data).split(b"\n")
            now = wall_ms()
            for line in whole:
                self.lines.append(line.decode())
                self.arrived_ms.append(now)

    def delays_ms(self) -> list[int]:
        """How late each line arrived after the job printed it."""
        return [
            at - int(line.split()[2]) for line, at in zip(self.lines, self.arrived_ms, strict=True)
        ]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def numbers(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines]


async def running_job(client: Client, job_id: str) -> RunRecord:
    spec = {
        "trigger": {"kind": "now"},
        "execution": {"argv": ["sh", "-c", SCRIPT]},
        "retry": RETRY,
    }
    await client.create_job(spec, job_id)

    async def running() -> RunRecord:
        page = await client.list_runs(job_id)
        assert [r.state for r in page.items] == [RunState.RUNNING], page.items
        return page.items[0]

    run: RunRecord = await assert_eventually(running, timeout=20, interval=0.1)
    return run


async def read_all(client: Client, run_id: str, attempt: int) -> tuple[list[str], bool]:
    """An attempt's whole log through the API (page by page) and whether it is complete."""
    data, offset = b"", 0
    while True:
        chunk = await client.read_log(run_id, attempt, offset)
        data += chunk.data
        if not chunk.data or chunk.complete:
            return data.decode().splitlines(), chunk.complete
        offset = chunk.next_offset


async def complete_log(client: Client, run_id: str, attempt: int) -> list[str]:
    """The log once its writer closed it: the worker's report waits for the
    last upload only so long (``ACLOSE_WAIT``), so a loaded host may lag."""
    lines, complete = await read_all(client, run_id, attempt)
    assert complete, f"attempt {attempt}'s log is not complete yet: {len(lines)} lines"
    return lines


async def attempt_ended(client: Client, run_id: str, number: int) -> Attempt:
    run = await client.get_run(run_id)
    assert len(run.attempts) >= number, run
    attempt = run.attempts[number - 1]
    assert attempt.ended_ms is not None, attempt
    return attempt


# -- the test ------------------------------------------------------------------------
async def follow_then_kill(
    topology: Topology, admin: Client, run: RunRecord
) -> tuple[Follower, list[str], int]:
    """Follow attempt 1 live, kill its worker -9 once lines have arrived
    while it runs, and let the follow end by itself (the attempt is over).
    Returns the follower, the lines it had before the kill, and the kill's time."""
    victim = topology.worker_running(run.attempts[0].worker)
    follower = Follower()
    following = asyncio.create_task(follower.follow(admin, run.id, 1))
    try:
        await assert_eventually(lambda: len(follower.lines) >= 3, timeout=10, interval=0.05)
        during = await admin.get_run(run.id)
        assert (during.state, during.attempt) == (RunState.RUNNING, 1), "lines came too late"
        before_kill, killed_ms = list(follower.lines), wall_ms()
        victim.process.kill9()
        await asyncio.wait_for(following, timeout=15)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
    return follower, before_kill, killed_ms


async def test_a_killed_workers_log_outlives_it_and_the_retry_runs_on_the_other_host(
    topology: Topology, admin: Client, bucket_logs: S3LogStore
) -> None:
    """What a multi-host deployment promises about logs and crashes, shown
    through the API alone, as an operator on yet another host sees it."""
    run = await running_job(admin, "counter")
    victim = topology.worker_running(run.attempts[0].worker)
    follower, before_kill, killed_ms = await follow_then_kill(topology, admin, run)
    delays = follower.delays_ms()
    assert numbers(before_kill) == list(range(1, len(before_kill) + 1))
    assert max(delays) < FOLLOW_BOUND_MS, delays

    lost = await assert_eventually(lambda: attempt_ended(admin, run.id, 1), timeout=15)
    assert (lost.state, lost.worker) == (RunState.LOST, run.attempts[0].worker), lost
    assert lost.reason.startswith("fenced:"), lost.reason
    first_log, first_complete = await read_all(admin, run.id, 1)
    assert first_log[: len(before_kill)] == before_kill, "a followed line is gone"
    assert follower.lines == first_log and not first_complete

    second = await assert_eventually(lambda: attempt_ended(admin, run.id, 2), timeout=30)
    survivor = next(host for host in topology.by_role("worker") if host is not victim)
    assert second.state is RunState.SUCCEEDED and survivor.runs_as(second.worker), second
    assert (await admin.get_run(run.id)).state is RunState.SUCCEEDED
    second_log = await assert_eventually(lambda: complete_log(admin, run.id, 2), timeout=10)
    assert numbers(second_log) == list(range(1, LINES + 1))

    assert await bucket_logs.attempts(run.id) == [1, 2]
    assert no_local_logs(topology.hosts) == {}
    assert second.started_ms is not None and lost.ended_ms is not None
    print(
        f"follow delay ms: min {min(delays)} max {max(delays)} over {len(delays)} lines;"
        f" kill -> attempt 1 lost: {lost.ended_ms - killed_ms} ms;"
        f" kill -> attempt 2 started: {second.started_ms - killed_ms} ms"
    )


def no_local_logs(hosts: list[Host]) -> dict[str, list[Path]]:
    """Files any host keeps under its local log directory (the bucket has the logs)."""
    return {host.name: files for host in hosts if (files := host.local_files())}
