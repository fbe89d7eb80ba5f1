"""A worker claims an assigned run without reading it first, and reads the
run in the claim's own transaction (ADR 0017). When it cannot (an
assignment written before claim hints existed, or a run changed since it
was assigned), it reads the run and claims it as before."""

from __future__ import annotations

import pytest

from etcdsched.model.records import Assignment, Claim, RunRecord
from etcdsched.model.states import RunState
from etcdsched.scheduler.assign_requests import assignment_ops
from etcdsched.store.kv import Cmp, Ops
from etcdsched.worker.executor import NoopExecutor
from etcdsched.worker.service import WorkerService
from tests.support.e2e_jobs import now_ms, only_run, spec, wait_state, workers_registered
from tests.support.services import Services

NOW = {"kind": "now"}
NEW_YEAR = {"kind": "cron", "expr": "0 0 1 1 *"}
"""A trigger that does not fire during a test: its runs are triggered by hand."""


def reads_of(worker: WorkerService) -> list[str]:
    """The keys ``worker`` reads with single-key gets from now on."""
    keys: list[str] = []
    read = worker.store.get

    async def get(key: str) -> object:
        keys.append(key)
        return await read(key)

    worker.store.get = get  # type: ignore[assignment,method-assign]
    return keys


async def assign_by_hand(
    services: Services, run: RunRecord, *, hinted: bool = True, touched: bool = False
) -> RunRecord:
    """``run`` assigned to ``w1`` as placement writes it, without its claim
    hint unless ``hinted``, and written once more after the assignment if
    ``touched`` (its mod revision is then past the assignment's)."""
    current = await services.jobs.runs.load(services.store, run.id)
    assigned, ops = assignment_ops(services.keys, current.value, "w1", now_ms())
    if not hinted:
        key = services.keys.assign("w1", run.id)
        ops[1] = Ops.put(key, _unhinted(ops[1].value))
    result = await services.store.txn([Cmp.mod(current.key, current.mod_revision)], ops)
    assert result.succeeded
    if touched:
        await services.store.txn([], [Ops.put(services.keys.run(run.id), assigned)])
    return assigned


def _unhinted(value: bytes) -> bytes:
    assignment = Assignment.model_validate_json(value)
    return assignment.model_copy(update={"claim_hint": None}).model_dump_json().encode()


async def test_a_run_fired_onto_a_worker_is_claimed_without_a_read(services: Services) -> None:
    services.start_scheduler("s1")
    reads = reads_of(services.start_worker("w1", NoopExecutor()))
    await workers_registered(services, 1)
    job = await services.jobs.create(spec(NOW, ["true"]), "unread")
    run = await wait_state(services, await only_run(services, job.id), RunState.SUCCEEDED)
    assert services.keys.run(run.id) not in reads
    assert run.attempts[0].exit_code == 0


async def test_a_run_is_read_first_when_its_assignment_has_no_hint_or_it_changed(
    services: Services,
) -> None:
    """No scheduler: the runs are assigned by hand before the worker starts,
    which then finds them in its first listing of its assignments."""
    await services.jobs.create(spec(NEW_YEAR, ["true"]), "by-hand")
    by_hand = "default:by-hand"
    old = await assign_by_hand(services, await services.jobs.trigger(by_hand), hinted=False)
    changed = await assign_by_hand(services, await services.jobs.trigger(by_hand), touched=True)
    reads = reads_of(services.start_worker("w1", NoopExecutor()))
    for run in (old, changed):
        done = await wait_state(services, run.id, RunState.SUCCEEDED)
        assert [a.state for a in done.attempts] == [RunState.SUCCEEDED]
        assert services.keys.run(run.id) in reads


@pytest.mark.parametrize("hinted", [True, False])
async def test_a_claim_of_ours_that_landed_late_is_taken_as_ours(
    services: Services, hinted: bool
) -> None:
    """A claim sent while etcd was unavailable can land after the worker
    looked for it. Its next try is refused (a claim is there), finds the
    claim byte for byte its own, and goes on with the attempt rather than
    retrying for as long as its session lasts."""
    await services.jobs.create(spec(NEW_YEAR, ["true"]), "late")
    worker = services.start_worker("w1", NoopExecutor())
    await workers_registered(services, 1)
    assert worker.session is not None
    lease = worker.session.lease_id
    run = await services.jobs.trigger("default:late")
    landed = Claim(run_id=run.id, worker="w1", attempt=1, lease=lease)
    claim_key = services.keys.claim(run.partition, run.id)
    await services.store.txn([], [Ops.put(claim_key, landed, lease=lease)])
    await assign_by_hand(services, run, hinted=hinted)
    done = await wait_state(services, run.id, RunState.SUCCEEDED)
    assert [a.state for a in done.attempts] == [RunState.SUCCEEDED]
    assert await services.store.get(claim_key) is None
