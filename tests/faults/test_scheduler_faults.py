"""Scheduler processes under kill -9 and SIGSTOP, on a real etcd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from etcdsched.model.records import OwnerRecord, RunRecord
from etcdsched.model.spec import JobSpec
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys, partition_of
from etcdsched.store.ledger import account
from tests.support.eventually import assert_eventually
from tests.support.procs import AgentProcess, agent_env
from tests.support.services import full_id

pytestmark = pytest.mark.slow
P = 8
TTL = 2


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for agent in started:
        agent.terminate()


def every_second(**extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {"trigger": {"kind": "interval", "every": "1s"}, "execution": {"argv": ["true"]}, **extra}
    )


async def owners(store: EtcdStore, keys: Keys) -> dict[int, str]:
    page = await store.range(keys.owners_prefix())
    return {keys.parse_owner(kv.key): kv.decode(OwnerRecord).value.scheduler for kv in page.kvs}


async def runs_of(store: EtcdStore, keys: Keys, job_id: str) -> list[RunRecord]:
    page = await store.range(keys.runs_prefix(full_id(job_id)))
    return [kv.decode(RunRecord).value for kv in page.kvs]


def spawn(agents: list[AgentProcess], name: str, env: dict[str, str], tmp: Path) -> AgentProcess:
    agent = AgentProcess(name, ["scheduler"], env, tmp).start()
    agents.append(agent)
    return agent


async def test_kill9_scheduler_partitions_fire_again_and_misfires_are_explained(
    store: EtcdStore,
    keys: Keys,
    etcd_endpoints: list[str],
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    clock = SystemClock()
    await ensure_cluster(store, keys, P, clock.now_ms())
    env = agent_env(etcd_endpoints, keys.prefix, tmp_path)
    for name in ("s1", "s2", "s3"):
        spawn(agents, name, env, tmp_path)

    async def balanced() -> None:
        held = await owners(store, keys)
        assert len(held) == P and set(held.values()) == {"s1", "s2", "s3"}, held

    await assert_eventually(balanced, timeout=20)
    jobs = JobService(store, keys, clock, P)
    misfire = {"policy": "run_once", "grace": "500ms"}
    ids = [f"default:tick-{i}" for i in range(16)]  # full ids: partition_of hashes them
    for job_id in ids:
        await jobs.create(every_second(misfire=misfire), job_id)
    held = await owners(store, keys)
    victim_parts = {pp for pp, owner in held.items() if owner == "s1"}
    victim_jobs = [j for j in ids if partition_of(j, P) in victim_parts]
    assert victim_jobs, "s1 owns no partition with a job"
    await assert_eventually(lambda: _all_fired(store, keys, ids), timeout=10)

    agents[0].kill9()
    killed_at = clock.now_ms()

    async def fired_again() -> None:
        for job_id in victim_jobs:
            runs = await runs_of(store, keys, job_id)
            assert any(r.created_ms > killed_at for r in runs), job_id

    await assert_eventually(fired_again, timeout=TTL + 8)
    firsts = []
    for job_id in victim_jobs:
        runs = await runs_of(store, keys, job_id)
        firsts.append(min(r.created_ms for r in runs if r.created_ms > killed_at))
    recovered_at = min(firsts)
    print(f"scheduler kill -9 -> partitions fire again after {recovered_at - killed_at} ms")
    assert recovered_at - killed_at <= (TTL + 2) * 1000
    misfired = []
    for job_id in victim_jobs:
        runs = await runs_of(store, keys, job_id)
        misfired += [r for r in runs if r.fired_note.startswith("misfire")]
    assert misfired, "the outage was longer than the misfire grace: some slot must have misfired"
    assert all(r.kind == "scheduled" for r in misfired)
    for job_id in ids:
        report = await account(store, keys, full_id(job_id))
        assert report.ok, report


async def _all_fired(store: EtcdStore, keys: Keys, ids: list[str]) -> None:
    for job_id in ids:
        assert await runs_of(store, keys, job_id), job_id


async def test_stalled_former_owner_cannot_write(
    store: EtcdStore,
    keys: Keys,
    etcd_endpoints: list[str],
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    clock = SystemClock()
    await ensure_cluster(store, keys, P, clock.now_ms())
    env = agent_env(etcd_endpoints, keys.prefix, tmp_path)
    stalled = spawn(agents, "old", env, tmp_path)

    async def owns_all() -> None:
        assert set((await owners(store, keys)).values()) == {"old"}

    await assert_eventually(owns_all, timeout=15)
    jobs = JobService(store, keys, clock, P)
    ids = [f"busy-{i}" for i in range(8)]
    for job_id in ids:
        await jobs.create(every_second(), job_id)
    await assert_eventually(lambda: _all_fired(store, keys, ids), timeout=10)
    old_signatures = {r.created_by for j in ids for r in await runs_of(store, keys, j)}

    stalled.stop_signal()
    stopped_at = clock.now_ms()
    spawn(agents, "new", env, tmp_path)

    async def new_owns_all() -> None:
        assert set((await owners(store, keys)).values()) == {"new"}

    await assert_eventually(new_owns_all, timeout=TTL + 10)
    stalled.cont_signal()
    resumed_at = clock.now_ms()  # the stalled process resumes with stale state
    await assert_eventually(lambda: _fired_after(store, keys, ids, resumed_at + 2000), timeout=10)
    for job_id in ids:
        for run in await runs_of(store, keys, job_id):
            stale = run.created_by in old_signatures and run.created_ms > stopped_at
            assert not stale, f"stalled owner wrote {run.id} after SIGSTOP"
        report = await account(store, keys, full_id(job_id))
        assert report.ok, report


async def _fired_after(store: EtcdStore, keys: Keys, ids: list[str], after_ms: int) -> None:
    for job_id in ids:
        runs = await runs_of(store, keys, job_id)
        assert any(r.slot_ms >= after_ms for r in runs), job_id
