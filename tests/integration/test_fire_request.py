"""A run fired straight onto a worker through its batcher (ADR 0016),
against real etcd: what it writes, and each way it can fail."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from etcdsched.model.placement import WorkerView
from etcdsched.model.records import ActivePointer, Assignment, RunRecord, WorkerMember
from etcdsched.model.spec import Capacity, JobSpec
from etcdsched.model.states import RunState
from etcdsched.scheduler.assign_requests import ASSIGNED, CONFLICT, GONE, FireRequest
from etcdsched.scheduler.assigner import WorkerBatcher
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Cmp, Compare, Op, Ops
from etcdsched.store.runs import RunOrigin, new_run

SLOT_MS = 1_800_000_000_000
SPEC = JobSpec.model_validate({"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}})


async def write(store: EtcdStore, *ops: Op) -> None:
    await store.txn([], list(ops))


async def put(store: EtcdStore, key: str, value: bytes) -> None:
    await write(store, Ops.put(key, value))


@dataclass
class Cluster:
    store: EtcdStore
    keys: Keys
    batcher: WorkerBatcher
    guard: Compare


async def cluster(store: EtcdStore, keys: Keys) -> Cluster:
    """Partition 0 owned, worker w1 alive with ten slots, nothing on it."""
    await put(store, keys.owner(0), b"s1")
    owner = await store.get(keys.owner(0))
    assert owner is not None
    await put(store, keys.assign_epoch("w1"), b"")
    revision = (await store.range(keys.assign_prefix("w1"))).revision
    member = WorkerMember(id="w1", capacity=Capacity(slots=10), started_ms=0)
    batcher = WorkerBatcher(store, keys, WorkerView(member, {}, revision))
    return Cluster(store, keys, batcher, Cmp.created(keys.owner(0), owner.create_revision))


async def fire_request(c: Cluster, job_id: str) -> FireRequest:
    """A due entry of ``job_id`` and the request that fires its one run."""
    await put(c.store, c.keys.job(job_id), b"{}")
    due_key = c.keys.due(0, SLOT_MS, job_id)
    await put(c.store, due_key, b"{}")
    due = await c.store.get(due_key)
    assert due is not None
    run = new_run(RunOrigin(job_id, SPEC, 1), SLOT_MS, SLOT_MS - 2000, 1)
    return FireRequest(
        0,
        c.guard,
        SLOT_MS - 2000,
        pending=run,
        run_key=c.keys.run(run.id),
        due=due,
        firing=[  # as the firer builds them
            Cmp.mod(due_key, due.mod_revision),
            Compare(c.keys.job(job_id), "version", "==", 1),
            Cmp.absent(c.keys.run(run.id)),
        ],
        entry_ops=[Ops.delete(due_key)],
    )


async def fired(store: EtcdStore, keys: Keys) -> tuple[Cluster, FireRequest]:
    """A cluster, and the request that fired job ``j``'s run onto w1."""
    c = await cluster(store, keys)
    request = await fire_request(c, "j")
    assert await c.batcher.assign(request) == ASSIGNED
    return c, request


async def test_a_fired_run_is_created_assigned_with_its_assignment_and_pointer(
    store: EtcdStore, keys: Keys
) -> None:
    _, request = await fired(store, keys)
    stored = await store.get(request.run_key)
    assert stored is not None and stored.version == 1 and request.revision == stored.mod_revision
    run = stored.decode(RunRecord).value
    assert run == request.stored
    assert (run.state, run.attempt, run.worker, run.queue_key) == (RunState.ASSIGNED, 1, "w1", None)
    assignment = await store.get(keys.assign("w1", run.id))
    assert assignment is not None and assignment.decode(Assignment).value.attempt == 1
    pointer = await store.get(keys.active(0, run.id))
    assert pointer is not None
    assert pointer.decode(ActivePointer).value == ActivePointer(
        run_id=run.id, worker="w1", attempt=1
    )
    assert await store.get(request.due.key) is None


async def test_the_same_entry_fired_again_is_a_conflict_and_writes_nothing(
    store: EtcdStore, keys: Keys
) -> None:
    c, first = await fired(store, keys)
    again = dataclasses.replace(first)  # a new request, same entry
    assert await c.batcher.assign(again) == CONFLICT
    stored = await store.get(first.run_key)
    assert stored is not None and stored.version == 1


async def test_a_job_changed_since_its_entry_was_computed_is_a_conflict(
    store: EtcdStore, keys: Keys
) -> None:
    c = await cluster(store, keys)
    request = await fire_request(c, "j")
    await put(store, keys.job("j"), b'{"changed": true}')
    assert await c.batcher.assign(request) == CONFLICT
    assert await store.get(request.run_key) is None
    assert await store.get(request.due.key) is not None


async def test_a_worker_gone_before_the_write_leaves_the_entry_to_fire_into_the_queue(
    store: EtcdStore, keys: Keys
) -> None:
    c = await cluster(store, keys)
    request = await fire_request(c, "j")
    await write(store, Ops.delete(keys.assign_epoch("w1")))
    assert await c.batcher.assign(request) == GONE
    assert await store.get(request.run_key) is None
    assert await store.get(request.due.key) is not None


async def test_a_lost_partition_is_a_conflict(store: EtcdStore, keys: Keys) -> None:
    c = await cluster(store, keys)
    request = await fire_request(c, "j")
    await write(store, Ops.delete(keys.owner(0)))
    await put(store, keys.owner(0), b"s2")
    assert await c.batcher.assign(request) == CONFLICT
    assert await store.get(request.run_key) is None
