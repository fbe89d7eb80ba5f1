"""Firing a run straight onto a worker with room (ADR 0016), against real
etcd: which runs skip the queue, which wait in it, and the switch that
turns it off."""

from __future__ import annotations

from etcdsched.model.states import RunState
from etcdsched.worker.executor import NoopExecutor
from tests.support.e2e_jobs import (
    only_run,
    spec,
    terminal,
    wait_runs,
    wait_state,
    workers_registered,
)
from tests.support.eventually import assert_eventually
from tests.support.services import Services

NOW = {"kind": "now"}


def fired_direct(services: Services) -> int:
    return sum(t.firer.stats.direct for s in services.schedulers.values() for t in s.owned.values())


def placed_from_queue(services: Services) -> int:
    return sum(t.placer.placed for s in services.schedulers.values() for t in s.owned.values())


async def test_a_run_fired_while_a_worker_has_room_never_enters_the_queue(
    services: Services,
) -> None:
    services.start_scheduler("s1")
    services.start_worker("w1", NoopExecutor())
    await workers_registered(services, 1)
    job = await services.jobs.create(spec(NOW, ["true"]), "direct")
    run = await wait_state(services, await only_run(services, job.id), RunState.SUCCEEDED)
    assert [(a.number, a.worker) for a in run.attempts] == [(1, "w1")]
    assert (fired_direct(services), placed_from_queue(services)) == (1, 0)
    page = await services.store.range(f"{services.keys.prefix}queue/")
    assert page.kvs == []


async def test_with_every_worker_full_a_fired_run_waits_in_the_queue(services: Services) -> None:
    """The first run takes the worker's only slot; the second is fired into
    the queue and placed once the first has ended."""
    services.start_scheduler("s1")
    services.start_worker("w1", worker_slots=1)
    await workers_registered(services, 1)
    first = await services.jobs.create(spec(NOW, ["sleep", "1"]), "first")
    await wait_state(services, await only_run(services, first.id), RunState.RUNNING)
    second = await services.jobs.create(spec(NOW, ["true"]), "second")
    waiting = await wait_state(services, await only_run(services, second.id), RunState.PENDING)
    assert waiting.queue_key
    await wait_state(services, waiting.id, RunState.SUCCEEDED)
    assert (fired_direct(services), placed_from_queue(services)) == (1, 1)


async def test_jobs_with_dependencies_or_overlap_rules_go_through_the_queue(
    services: Services,
) -> None:
    """Only a lone run of an ``allow`` job with no upstream is placed at
    firing: the overlap and dependency checks stay with placement."""
    services.start_scheduler("s1")
    services.start_worker("w1", NoopExecutor())
    await workers_registered(services, 1)
    await services.jobs.create(spec(NOW, ["true"], overlap="skip"), "skipper")
    await services.jobs.create(spec(NOW, ["true"], overlap="queue_one"), "one-at-a-time")
    for job_id in ("skipper", "one-at-a-time"):
        await wait_runs(services, job_id, lambda rs: len(rs) == 1 and terminal(rs))
    assert (fired_direct(services), placed_from_queue(services)) == (0, 2)


async def test_fire_onto_workers_off_queues_every_run(services: Services) -> None:
    services.config = services.config.model_copy(update={"fire_onto_workers": False})
    services.start_scheduler("s1")
    services.start_worker("w1", NoopExecutor())
    await workers_registered(services, 1)
    job = await services.jobs.create(spec({"kind": "interval", "every": "1s"}, ["true"]), "tick")

    async def three_done() -> None:
        runs = await services.runs_of(job.id)
        assert sum(r.state is RunState.SUCCEEDED for r in runs) >= 3

    await assert_eventually(three_done, timeout=10)
    assert fired_direct(services) == 0 and placed_from_queue(services) >= 3
