"""A worker whose event loop stalls while its lease is known good keeps its
jobs (issue 29, fencing verdicts; ADR 0021): the watchdog fences on the
lease's safe deadline, not on seconds of event-loop silence. A job with a
timeout is still killed by the watchdog before its hang deadline, whatever
the loop does. A worker agent frozen past its lease is fenced, and its
attempt recorded ``lost`` with the fenced verdict."""

from __future__ import annotations

import time
from pathlib import Path

from etcdsched.model.records import RunRecord
from etcdsched.model.states import RunState
from tests.support.e2e_jobs import spec
from tests.support.eventually import assert_eventually
from tests.support.ledgerfile import job_argv, pid_alive, read_ledger
from tests.support.procs import AgentProcess, agent_env
from tests.support.services import Services

TTL_FROZEN = 2
"""The frozen agent's lease TTL (``agent_env``'s)."""


async def running_pid(services: Services, job_id: str) -> int:
    runs = await services.runs_of(job_id)
    assert runs and runs[0].state is RunState.RUNNING and runs[0].current, runs
    assert runs[0].current.pid is not None
    return runs[0].current.pid


async def test_a_job_survives_a_stalled_event_loop_while_the_lease_holds(
    services: Services,
) -> None:
    services.config = services.config.model_copy(update={"lease_ttl": 30})
    services.start_scheduler("s1")
    services.start_worker("w1")
    job = await services.jobs.create(spec({"kind": "now"}, ["sleep", "7"]), "stalled")

    pid = await assert_eventually(lambda: running_pid(services, job.id), timeout=10)
    time.sleep(4.5)  # the whole loop (worker, scheduler, this test) stalls
    assert pid_alive(pid), "the watchdog killed a job while the lease was good"

    async def succeeded() -> None:
        runs = await services.runs_of(job.id)
        assert runs and runs[0].state is RunState.SUCCEEDED, runs

    await assert_eventually(succeeded, timeout=15)
    run = (await services.runs_of(job.id))[0]
    assert [a.state for a in run.attempts] == [RunState.SUCCEEDED]


async def test_a_stalled_loop_cannot_keep_a_timed_out_job_past_its_hang_deadline(
    services: Services,
) -> None:
    services.config = services.config.model_copy(update={"lease_ttl": 30})
    services.start_scheduler("s1")
    services.start_worker("w1")
    limits = {"timeout": "1s", "kill_grace": "0s"}
    job = await services.jobs.create(spec({"kind": "now"}, ["sleep", "60"], **limits), "hangs")

    pid = await assert_eventually(lambda: running_pid(services, job.id), timeout=10)
    began = time.monotonic()
    time.sleep(5.5)  # past timeout + 5 s slack - 2 s margin: the watchdog's own deadline
    assert not pid_alive(pid), "the job outlived its hang deadline with the loop stalled"
    assert time.monotonic() - began < 6


async def test_a_stopped_worker_agent_past_its_ttl_is_fenced_and_its_attempt_lost(
    services: Services, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """A worker agent process frozen (SIGSTOP) past its lease: its watchdog
    kills the job before the lease can expire, recovery records the attempt
    ``lost`` with the fenced verdict and retries it elsewhere, and the agent,
    let go again, says at WARNING that it was fenced."""
    services.start_scheduler("s1")
    env = agent_env(etcd_endpoints, services.keys.prefix, tmp_path, worker_slots=1)
    agent = AgentProcess("frozen", ["worker"], env, tmp_path).start()
    try:
        await fenced_and_lost(services, agent, tmp_path / "ledger.jsonl")
    finally:
        agent.terminate()


async def fenced_and_lost(services: Services, agent: AgentProcess, ledger: Path) -> None:
    retried = {"max_attempts": 2, "initial_delay": "0s", "jitter": 0}
    job = await services.jobs.create(
        spec({"kind": "now"}, job_argv(ledger, 60), retry=retried), "fenced"
    )

    async def started() -> dict[str, object]:
        starts = (
            [e for e in read_ledger(ledger) if e["event"] == "start"] if ledger.exists() else []
        )
        assert starts and starts[0]["worker"] == "frozen", starts
        return starts[0]

    first = await assert_eventually(started, timeout=20)
    agent.stop_signal()
    services.start_worker("w2", lease_ttl=5)

    async def lost_then_retried() -> RunRecord:
        [run] = await services.runs_of(job.id)
        assert len(run.attempts) == 2 and run.attempts[1].worker == "w2", run
        return run

    run = await assert_eventually(lost_then_retried, timeout=TTL_FROZEN + 15)
    assert not pid_alive(int(str(first["pid"]))), "the watchdog kills the frozen worker's job"
    lost = run.attempts[0]
    assert lost.state is RunState.LOST and lost.worker == "frozen", lost
    assert lost.reason.startswith("fenced: the worker could not prove its lease"), lost.reason
    assert "worker frozen's lease expired" in lost.reason, lost.reason
    agent.cont_signal()

    async def said_fenced() -> None:
        said = [line for line in agent.log_tail(200).splitlines() if "WARNING" in line]
        assert any("worker frozen fenced" in line for line in said), agent.log_tail()

    await assert_eventually(said_fenced, timeout=10)
