"""A run past timeout + grace whose worker still holds the claim is hung:
the partition owner revokes the claim and records ``timed_out``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from etcdsched.logs.store import LogWriter
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState
from etcdsched.worker.executor import Prepared
from etcdsched.worker.process_group import ExitStatus
from tests.support.eventually import assert_eventually
from tests.support.services import Services


class StuckProcess:
    """A job whose process can neither be waited for nor stopped (a worker
    wedged in the kernel, an unkillable container CLI...)."""

    pid = None
    pgid = None

    async def wait(self) -> ExitStatus:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def stop(self, grace: float) -> None:
        await asyncio.Event().wait()

    def ended(self) -> ExitStatus | None:
        return None

    def kill_now(self) -> None:
        pass


class StuckExecutor:
    holds_processes = False

    async def prepare(
        self,
        run: RunRecord,
        attempt: int,
        worker_id: str,
        log: LogWriter,
        guard: Callable[[int], None] | None = None,
    ) -> Prepared:
        return Prepared(StuckProcess())


async def test_hung_run_is_timed_out_by_the_owner(services: Services) -> None:
    services.start_scheduler("s1")
    services.start_worker("w1", executor=StuckExecutor())
    spec = JobSpec.model_validate(
        {
            "trigger": {"kind": "now"},
            "execution": {"argv": ["true"]},
            "timeout": "1s",
            "kill_grace": "0s",
        }
    )
    job = await services.jobs.create(spec, "wedged")

    async def hung() -> None:
        runs = await services.runs_of(job.id)
        assert runs and runs[0].state is RunState.TIMED_OUT, runs

    await assert_eventually(hung, timeout=20)
    run = (await services.runs_of(job.id))[0]
    assert run.attempts[0].reason.startswith("hung")
    claims = await services.store.range(services.keys.claims_prefix())
    assert claims.kvs == []
