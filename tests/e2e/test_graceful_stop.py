"""Stopping ``etcdsched up`` with jobs running, as a user does: Ctrl-C once
waits for them (and says so), twice stops them; a stopped attempt is
``interrupted``, never ``lost``, and rerun at once by the next start."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etcdsched.client import Client
from etcdsched.model.records import RunRecord
from etcdsched.model.states import RunState
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.keys import Keys
from tests.support.eventually import assert_eventually
from tests.support.procs import AS_THIS_USER
from tests.support.up_process import Tour

pytestmark = pytest.mark.slow


@pytest.fixture
def tour(tmp_path: Path) -> Iterator[Tour]:
    t = Tour(tmp_path)
    yield t
    t.close()


def client_of(tour: Tour) -> Client:
    """A client of the tour's ``up``, with the admin token its first start wrote."""
    token = (tour.workdir / ".etcdsched" / "admin.token").read_text().strip()
    return Client(f"http://127.0.0.1:{tour.api_port}", token)


async def start_up(tour: Tour, *args: str, env: dict[str, str] | None = None) -> Any:
    up = tour.spawn("up", "--port", str(tour.api_port), *args, env=env, stderr_apart=True)
    await assert_eventually(tour.ready, timeout=30, interval=0.1, message="up is not ready")
    return up


async def a_running_run(client: Client, job_id: str, argv: list[str], **spec: Any) -> RunRecord:
    body = {"trigger": {"kind": "now"}, "execution": {"argv": argv}, **spec}
    await client.create_job(body, job_id)

    async def running() -> RunRecord:
        page = await client.list_runs(job_id)
        assert [r.state for r in page.items] == [RunState.RUNNING], page.items
        return page.items[0]

    return await assert_eventually(running, timeout=20, interval=0.1)


def exits_within(proc: subprocess.Popen[bytes], seconds: float) -> int:
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"up did not exit within {seconds} s")


async def test_ctrl_c_twice_interrupts_the_job_and_the_next_up_reruns_it_at_once(
    tour: Tour,
) -> None:
    up = await start_up(tour)
    # a retry 30 s after a failure: only "at once" reruns it within the test
    retry = {"max_attempts": 3, "initial_delay": "30s", "jitter": 0}
    async with client_of(tour) as client:
        run = await a_running_run(client, "sleepy", ["sleep", "60"], retry=retry)

    up.send_signal(signal.SIGINT)
    waiting = "stopping: waiting for 1 running job, up to 30 s; press Ctrl-C again to stop them now"
    await assert_eventually(lambda: waiting in tour.stderr(up), timeout=5)
    assert up.poll() is None, "the first Ctrl-C waits for the running job"

    up.send_signal(signal.SIGINT)
    assert exits_within(up, 10) == 0
    assert "Traceback" not in tour.stderr(up), tour.stderr(up)

    restarted_ms = int(time.time() * 1000)
    await start_up(tour)

    async with client_of(tour) as client:

        async def rerun() -> RunRecord:
            again = await client.get_run(run.id)
            assert [a.state for a in again.attempts] == [RunState.INTERRUPTED, RunState.RUNNING]
            return again

        again = await assert_eventually(rerun, timeout=10, interval=0.1)
    first, second = again.attempts
    assert first.reason == "interrupted by shutdown" and first.ended_ms is not None
    assert second.started_ms is not None and second.started_ms - restarted_ms < 10_000


async def test_a_job_that_ends_within_the_grace_succeeds_and_up_exits_when_it_does(
    tour: Tour, store: EtcdStore, keys: Keys, etcd_endpoints: list[str]
) -> None:
    """One SIGTERM: the running job finishes and reports ``succeeded``; up
    exits then, not after its 20 s grace. Read from the etcd up used."""
    env = {
        "ETCDSCHED_PREFIX": keys.prefix,
        "ETCDSCHED_SHUTDOWN_GRACE": "20",
        "ETCDSCHED_WORKER_RUN_AS": AS_THIS_USER,  # the job looks for a file in tmp_path
    }
    up = await start_up(tour, "--etcd", ",".join(etcd_endpoints), env=env)
    async with client_of(tour) as client:
        marker = tour.workdir / "go"
        argv = ["sh", "-c", f"while [ ! -e {marker} ]; do sleep 0.05; done"]
        run = await a_running_run(client, "short", argv)

    up.send_signal(signal.SIGTERM)
    hint = "up to 20 s; send SIGTERM again to stop them now"
    await assert_eventually(lambda: hint in tour.stderr(up), timeout=5)
    stopped = time.monotonic()
    marker.touch()  # the job may end now (its worker no longer answers the API)
    assert exits_within(up, 10) == 0
    assert time.monotonic() - stopped < 10, "up waited out its grace"

    kv = await store.get(keys.run(run.id))
    assert kv is not None
    ended = kv.decode(RunRecord).value
    assert ended.state is RunState.SUCCEEDED, ended
    assert [a.state for a in ended.attempts] == [RunState.SUCCEEDED]
    # every lease revoked at the stop, none left to expire: the partitions
    # are free for another scheduler at once, and recovery has nothing to judge
    for prefix in (keys.members_prefix("workers"), keys.owners_prefix(), keys.claims_prefix()):
        assert (await store.range(prefix)).kvs == [], prefix


async def test_when_the_grace_runs_out_the_job_is_stopped_and_queued_again_at_once(
    tour: Tour, store: EtcdStore, keys: Keys, etcd_endpoints: list[str]
) -> None:
    """One SIGTERM and a job that would run on: after the 1 s grace it is
    stopped, its attempt ``interrupted`` and the run waits for placement
    with no backoff, written by the worker itself (never ``lost``)."""
    env = {"ETCDSCHED_PREFIX": keys.prefix, "ETCDSCHED_SHUTDOWN_GRACE": "1"}
    up = await start_up(tour, "--etcd", ",".join(etcd_endpoints), env=env)
    retry = {"max_attempts": 2, "initial_delay": "1h"}
    async with client_of(tour) as client:
        run = await a_running_run(client, "long", ["sleep", "60"], retry=retry)

    stopped_ms = int(time.time() * 1000)
    up.send_signal(signal.SIGTERM)
    assert exits_within(up, 10) == 0
    kv = await store.get(keys.run(run.id))
    assert kv is not None
    after = kv.decode(RunRecord).value
    assert after.state is RunState.RETRY_WAIT, after
    assert after.retry_at_ms is not None and after.retry_at_ms - stopped_ms < 10_000
    [attempt] = after.attempts
    assert attempt.state is RunState.INTERRUPTED and attempt.reason == "interrupted by shutdown"
    assert (await store.range(keys.queue_prefix(after.partition))).kvs, "queued again"


async def test_up_says_where_everything_is_once_the_api_answers(tour: Tour) -> None:
    up = await start_up(tour, "--host", "127.0.0.1")

    def banner() -> str:
        out = tour.stdout(up)
        assert "etcdsched is up" in out, out
        return out

    out = await assert_eventually(banner, timeout=5)
    assert f"API          http://127.0.0.1:{tour.api_port}" in out
    assert "admin token  .etcdsched/admin.token" in out
    assert "data         .etcdsched" in out
    assert "etcdsched is up" not in tour.stderr(up)
