"""Worker processes under kill -9 and SIGSTOP: reruns, self-fencing, refused reports."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from etcdsched.model.records import RunRecord, WorkerMember
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from tests.support.eventually import assert_eventually
from tests.support.ledgerfile import job_argv, pid_alive, read_ledger
from tests.support.procs import AgentProcess, agent_env

pytestmark = pytest.mark.slow
P = 8
TTL = 2


async def start_cluster(
    store: EtcdStore, keys: Keys, endpoints: list[str], tmp: Path, agents: dict[str, AgentProcess]
) -> JobService:
    clock = SystemClock()
    await ensure_cluster(store, keys, P, clock.now_ms())
    env = agent_env(endpoints, keys.prefix, tmp, worker_slots=1)
    agents["s1"] = AgentProcess("s1", ["scheduler"], env, tmp).start()
    for name in ("w1", "w2"):
        agents[name] = AgentProcess(name, ["worker"], env, tmp).start()

    async def workers_up() -> None:
        page = await store.range(keys.members_prefix("workers"))
        assert len(page.kvs) == 2

    await assert_eventually(workers_up, timeout=20)
    return JobService(store, keys, clock, P)


async def run_of(store: EtcdStore, keys: Keys, rid: str) -> RunRecord:
    kv = await store.get(keys.run(rid))
    assert kv is not None
    return kv.decode(RunRecord).value


def long_job(ledger: Path, seconds: float) -> JobSpec:
    return JobSpec.model_validate(
        {
            "trigger": {"kind": "now"},
            "execution": {"argv": job_argv(ledger, seconds)},
            "retry": {"max_attempts": 3, "initial_delay": "0s", "jitter": 0},
        }
    )


async def started_on(ledger: Path) -> dict[str, object]:
    starts = [e for e in read_ledger(ledger) if e["event"] == "start"]
    assert starts
    return starts[0]


async def test_kill9_worker_mid_run_is_rerun_elsewhere(
    store: EtcdStore,
    keys: Keys,
    etcd_endpoints: list[str],
    tmp_path: Path,
    agents: dict[str, AgentProcess],
) -> None:
    jobs = await start_cluster(store, keys, etcd_endpoints, tmp_path, agents)
    ledger = tmp_path / "ledger.jsonl"
    job = await jobs.create(long_job(ledger, 4), "victim")
    first = await assert_eventually(lambda: started_on(ledger), timeout=15)
    victim = str(first["worker"])
    rid = str(first["run"])
    agents[victim].kill9()
    killed = time.monotonic()

    async def child_dead() -> None:
        assert not pid_alive(int(str(first["pid"])))

    await assert_eventually(child_dead, timeout=3)  # the watchdog saw EOF and killed the group

    async def rerun_started() -> dict[str, object]:
        starts = [e for e in read_ledger(ledger) if e["event"] == "start" and e["attempt"] == 2]
        assert starts
        return starts[0]

    second = await assert_eventually(rerun_started, timeout=TTL + 8)
    delay = float(str(second["mono"])) - killed
    print(f"worker kill -9 -> rerun started after {delay:.2f} s")
    assert delay <= TTL + 3
    assert second["worker"] != victim

    async def succeeded() -> None:
        run = await run_of(store, keys, rid)
        assert run.state is RunState.SUCCEEDED, run.state

    await assert_eventually(succeeded, timeout=10)
    run = await run_of(store, keys, rid)
    assert [a.state for a in run.attempts] == [RunState.LOST, RunState.SUCCEEDED]
    assert run.job_id == job.id


async def test_sigstopped_worker_is_fenced_and_its_report_refused(
    store: EtcdStore,
    keys: Keys,
    etcd_endpoints: list[str],
    tmp_path: Path,
    agents: dict[str, AgentProcess],
) -> None:
    jobs = await start_cluster(store, keys, etcd_endpoints, tmp_path, agents)
    ledger = tmp_path / "ledger.jsonl"
    await jobs.create(long_job(ledger, 3), "frozen")
    first = await assert_eventually(lambda: started_on(ledger), timeout=15)
    victim, rid, pid = str(first["worker"]), str(first["run"]), int(str(first["pid"]))
    agents[victim].stop_signal()
    stopped = time.monotonic()

    async def fenced() -> None:
        assert not pid_alive(pid)

    await assert_eventually(fenced, timeout=TTL + 1)
    fenced_after = time.monotonic() - stopped
    print(f"SIGSTOP -> child killed by the watchdog after {fenced_after:.2f} s (TTL {TTL} s)")
    assert fenced_after < TTL  # before the lease could expire on the server

    async def rerun_done() -> None:
        run = await run_of(store, keys, rid)
        assert run.state is RunState.SUCCEEDED, run.state

    await assert_eventually(rerun_done, timeout=TTL + 15)
    agents[victim].cont_signal()

    async def victim_back_as_new_member() -> None:
        page = await store.range(keys.members_prefix("workers"))
        names = [kv.decode(WorkerMember).value.id for kv in page.kvs]
        assert any(n.startswith(f"{victim}.") for n in names), names

    await assert_eventually(victim_back_as_new_member, timeout=10)
    run = await run_of(store, keys, rid)
    assert [a.state for a in run.attempts] == [RunState.LOST, RunState.SUCCEEDED]
    assert run.attempts[1].worker != victim
    ends = [e for e in read_ledger(ledger) if e["event"] == "end"]
    assert [e["attempt"] for e in ends] == [2], "the fenced attempt must never finish"


async def test_sigterm_drains_the_worker(
    store: EtcdStore,
    keys: Keys,
    etcd_endpoints: list[str],
    tmp_path: Path,
    agents: dict[str, AgentProcess],
) -> None:
    jobs = await start_cluster(store, keys, etcd_endpoints, tmp_path, agents)
    agents.pop("w2").terminate()
    ledger = tmp_path / "ledger.jsonl"
    await jobs.create(long_job(ledger, 2), "finishing")
    first = await assert_eventually(lambda: started_on(ledger), timeout=15)
    assert first["worker"] == "w1"
    w1 = agents["w1"]
    assert w1.proc is not None
    w1.proc.terminate()  # SIGTERM: take nothing new, let the running attempt finish
    assert w1.proc.wait(timeout=20) == 0
    run = await run_of(store, keys, str(first["run"]))
    assert run.state is RunState.SUCCEEDED and len(run.attempts) == 1
    ends = [e for e in read_ledger(ledger) if e["event"] == "end"]
    assert len(ends) == 1
