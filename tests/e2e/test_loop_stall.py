"""A worker whose event loop stalls while its lease is known good keeps its
jobs (issue 29, fencing verdicts; ADR 0021): the watchdog fences on the
lease's safe deadline, not on seconds of event-loop silence. A job with a
timeout is still killed by the watchdog before its hang deadline, whatever
the loop does."""

from __future__ import annotations

import time

from etcdsched.model.states import RunState
from tests.support.e2e_jobs import spec
from tests.support.eventually import assert_eventually
from tests.support.ledgerfile import pid_alive
from tests.support.services import Services


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
