"""The firing brake end to end (ADR 0014): a scheduler whose placement has
not looked at enough of the runs it fired stops firing, keeps the rest of
the slots in the due index, and fires them once placement catches up."""

from __future__ import annotations

from etcdsched.model.states import RunState
from tests.support.e2e_jobs import spec, start_worker
from tests.support.eventually import assert_eventually
from tests.support.services import Services, full_id

JOBS = 40
LIMIT = 3


async def test_firing_holds_while_placement_is_behind_and_every_slot_runs_after(
    services: Services,
) -> None:
    services.config = services.config.model_copy(update={"fire_backlog": LIMIT})
    scheduler = services.start_scheduler("s1")
    assert scheduler.placement.brake.limit == LIMIT
    ids = [f"brake-{i}" for i in range(JOBS)]
    for job_id in ids:
        await services.jobs.create(spec({"kind": "now"}, ["true"]), job_id)

    # no worker yet: placement looks at nothing, so firing stops once the
    # limit is reached (it may pass it by the batches in flight when it was:
    # the brake is checked before each batch, two partitions fire at a time)
    async def held() -> list[str]:
        fired = [j for j in ids if await services.runs_of(j)]
        assert LIMIT <= len(fired) < JOBS and scheduler.placement.brake.engaged(), fired
        return fired

    fired = await assert_eventually(held, timeout=10)
    waiting = [j for j in ids if j not in fired]
    for job_id in waiting:  # the slots it holds back are still due, not lost
        assert await services.jobs.next_slot_of(full_id(job_id)) is not None

    start_worker(services, "w1")

    async def all_ran() -> None:
        for job_id in ids:
            runs = await services.runs_of(job_id)
            assert [r.state for r in runs] == [RunState.SUCCEEDED], (job_id, runs)

    await assert_eventually(all_ran, timeout=30)
    assert not scheduler.placement.brake.engaged()
