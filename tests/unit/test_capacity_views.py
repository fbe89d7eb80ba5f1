"""Worker capacity bookkeeping (pure): the index keeps each worker's total
as assignments come, change and go, and views carry totals instead of
summing thousands of runs."""

from __future__ import annotations

from etcdsched.assigner import CapacityIndex
from etcdsched.codec import encode
from etcdsched.keys import Keys, run_id
from etcdsched.models import Assignment, WorkerMember
from etcdsched.placement import WorkerView
from etcdsched.spec import Capacity, Resources
from etcdsched.store import KV, Event

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
