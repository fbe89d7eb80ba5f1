"""Worker capacity bookkeeping (pure): the index keeps each worker's total
as assignments come, change and go, views carry totals instead of
summing thousands of runs, and a worker's batcher keeps the total of the
requests it has not decided yet."""

from __future__ import annotations

import asyncio
from typing import cast

from etcdsched.model.codec import encode
from etcdsched.model.placement import NOTHING, WorkerView
from etcdsched.model.records import Assignment, RunRecord, WorkerMember
from etcdsched.model.spec import Capacity, Resources
from etcdsched.scheduler.assign_requests import ASSIGN_OPS, ASSIGNED, AssignRequest
from etcdsched.scheduler.assigner import WorkerBatcher
from etcdsched.scheduler.capacity import CapacityIndex
from etcdsched.store.keys import Keys, run_id
from etcdsched.store.kv import KV, MAX_TXN_OPS, Cmp, Event, Store, Versioned

K = Keys("/t/")


def assignment_event(kind: str, worker: str, rid: str, slots: int, revision: int) -> Event:
    need = Resources(slots=slots)
    value = encode(Assignment(run_id=rid, attempt=1, not_before_ms=0, resources=need))
    kv = KV(K.assign(worker, rid), value, revision, revision, 1)
    return Event("put" if kind == "put" else "delete", kv)


def member(slots: int) -> WorkerMember:
    return WorkerMember(id="w1", capacity=Capacity(slots=slots), started_ms=0)


def test_the_index_keeps_each_workers_total_through_put_replace_and_delete() -> None:
    index = CapacityIndex(K)
    a, b = run_id("job-a", "00000000000001"), run_id("job-b", "00000000000001")
    index.on_event(assignment_event("put", "w1", a, 2, 10))
    index.on_event(assignment_event("put", "w1", b, 1, 11))
    assert index.used("w1").slots == 3
    index.on_event(assignment_event("put", "w1", a, 1, 12))  # same run, new value
    assert index.used("w1").slots == 2
    index.on_event(assignment_event("delete", "w1", a, 1, 13))
    index.on_event(assignment_event("delete", "w1", a, 1, 14))  # a repeated delete
    assert index.used("w1").slots == 1 and set(index.runs("w1")) == {b}
    assert index.used("w2").slots == 0


def test_a_view_uses_its_carried_total_and_with_run_adds_to_it() -> None:
    runs = {f"r{i}": Resources(slots=1) for i in range(3)}
    summed = WorkerView(member(10), runs, 5)
    carried = WorkerView(member(10), runs, 5, Resources(slots=7))
    assert summed.free().slots == 7 and carried.free().slots == 3
    assert carried.with_run("r9", Resources(slots=2)).free().slots == 1
    assert carried.free().slots == 3  # with_run leaves the original alone


def request_for(rid: str, slots: int, queued: bool = True) -> AssignRequest:
    run = RunRecord.model_validate(
        {
            "id": rid,
            "job_id": "j",
            "tenant": "default",
            "partition": 0,
            "slot_ms": 1,
            "not_before_ms": 1,
            "spec": {
                "trigger": {"kind": "now"},
                "execution": {"argv": ["true"]},
                "resources": {"slots": slots},
            },
            "job_version": 1,
            "created_ms": 0,
            "updated_ms": 0,
            "queue_key": f"/t/queue/{rid}" if queued else None,
        }
    )
    return AssignRequest(0, Cmp.exists("/t/owner"), 0, current=Versioned(K.run(rid), run, 1, 1, 1))


async def test_a_batcher_counts_undecided_requests_as_placed_until_decided() -> None:
    batcher = WorkerBatcher(cast(Store, None), K, WorkerView(member(10), {}, 5, NOTHING))
    one, two = request_for(run_id("j", f"{1:014d}"), 2), request_for(run_id("j", f"{2:014d}"), 3)
    for request in (one, two):
        batcher._count_undecided(request)
    assert batcher.planned().free().slots == 5
    one.resolve(ASSIGNED)
    await asyncio.sleep(0)  # decided: counted no more (the view counts it once placed)
    assert batcher.planned().free().slots == 7  # only the second one left
    two.done.cancel()
    await asyncio.sleep(0)
    assert batcher.planned() is batcher.view


async def test_a_batch_stops_at_the_transaction_limit_and_the_rest_keep_their_order() -> None:
    batcher = WorkerBatcher(cast(Store, None), K, WorkerView(member(10), {}, 5, NOTHING))
    rids = [run_id("j", f"{i:014d}") for i in range(40)]
    batcher.pending = [request_for(rid, 1) for rid in rids]
    batch = batcher._take()
    per_run = ASSIGN_OPS + 1  # with its queue entry's delete
    assert len(batch) == (MAX_TXN_OPS - 1) // per_run  # the epoch touch takes one op
    assert [r.current.key for r in batch + batcher.pending] == [K.run(rid) for rid in rids]
