"""Reserved workers end to end (issue 29; docs/design.md, "Placement"): a
worker started with ``worker_reserved`` takes only runs whose selector its
labels match. Runs without a selector wait, saying why, until an open worker
comes, and never land on the reserved one: neither from the queue nor fired
straight onto a worker (ADR 0016)."""

from __future__ import annotations

from etcdsched.model.records import RunRecord
from etcdsched.model.states import RunState
from tests.support.e2e_jobs import (
    every_second,
    spec,
    start_worker,
    terminal,
    wait_runs,
    workers_registered,
)
from tests.support.eventually import assert_eventually
from tests.support.services import Services

NOW = {"kind": "now"}
GPU = {"pool": "gpu"}


async def test_a_reserved_worker_takes_only_runs_that_select_it(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "reserved", worker_labels=GPU, worker_reserved=True, worker_slots=8)
    await workers_registered(services, 1)
    plain = await services.jobs.create(spec(NOW, ["true"]), "plain")
    chosen = await services.jobs.create(spec(NOW, ["true"], selector=GPU), "chosen")

    [run] = await wait_runs(services, chosen.id, lambda rs: len(rs) == 1 and terminal(rs))
    assert run.state is RunState.SUCCEEDED and run.attempts[0].worker == "reserved"

    async def waiting() -> str:
        [run] = await services.runs_of(plain.id)
        assert run.state is RunState.PENDING and "reserved" in run.reason, run
        return run.reason

    reason = await assert_eventually(waiting, timeout=5)
    assert "pool=gpu" in reason and "no selector" in reason, reason

    start_worker(services, "open", worker_slots=2)
    [run] = await wait_runs(services, plain.id, lambda rs: len(rs) == 1 and terminal(rs))
    assert run.state is RunState.SUCCEEDED and run.attempts[0].worker == "open"

    ticking = await services.jobs.create(spec(every_second(), ["true"]), "ticking")

    def four_done(runs: list[RunRecord]) -> bool:
        return sum(r.state is RunState.SUCCEEDED for r in runs) >= 4

    runs = await wait_runs(services, ticking.id, four_done, timeout=15)
    workers = {a.worker for r in runs for a in r.attempts}
    assert workers == {"open"}, "a run without a selector landed on the reserved worker"
