"""A partition's queue bookkeeping (pure: the caches are fed events by
hand, as their watch would): order, deadlines from the queue entries, and
entries this scheduler placed are hidden only until the watch deletes them
— a relist that misses the delete must not hide a re-queued run."""

from __future__ import annotations

from typing import cast

from etcdsched.model.codec import encode
from etcdsched.model.records import QueueEntry, RunRecord
from etcdsched.runtime.clock import FakeClock
from etcdsched.scheduler.assigner import Assigner
from etcdsched.scheduler.ownership import Ownership
from etcdsched.scheduler.placement_loop import GATHER_S, gather_wait_s
from etcdsched.scheduler.placer import FIRED_MEMO, PartitionPlacer
from etcdsched.store.cache import PrefixCache
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Event, Store, Versioned

K = Keys("/t/")


def placer() -> PartitionPlacer:
    store, clock = cast(Store, None), FakeClock(0)
    active = PrefixCache(store, clock, K.active_prefix(3))
    return PartitionPlacer(3, store, K, clock, cast(Ownership, None), active, Assigner(store, K))


def queued(
    p: PartitionPlacer, rid: str, not_before: int, revision: int, deadline: int | None = None
) -> str:
    key = K.queue(3, 0, not_before, rid)
    kv = KV(key, encode(QueueEntry(run_id=rid, deadline_ms=deadline)), revision, revision, 1)
    p.queue.items[key] = kv
    p._on_queue_event(Event("put", kv))
    return key


def test_ready_keys_come_in_queue_order_within_the_limit() -> None:
    p = placer()
    late = queued(p, "j@00000000000300", 300, 1)
    early = queued(p, "j@00000000000100", 100, 2)
    future = queued(p, "j@00000000009000", 9000, 3)
    assert [k for _, _, k in p.ready_keys(1000)] == [early, late]
    assert p.earliest_after(1000) == 9000 and future in p.queue.items


def test_deadlines_come_from_the_queue_entries() -> None:
    p = placer()
    soon = queued(p, "a@00000000000100", 100, 1, deadline=500)
    queued(p, "b@00000000000100", 100, 2)
    assert p.deadline_keys(now_ms=400, limit_ms=1000) == []
    assert p.deadline_keys(now_ms=600, limit_ms=1000) == [soon]


def test_a_placed_entry_is_hidden_until_deleted_but_a_requeue_shows_again() -> None:
    p = placer()
    key = queued(p, "j@00000000000100", 100, 5)
    p._mark_gone(key)  # placed by us; the watch has not delivered the delete yet
    assert list(p.ready_keys(1000)) == []
    # a relist that happened after a hand-back re-queued the same key: new revision
    kv = KV(key, p.queue.items[key].value, 9, 9, 1)
    p.queue.items[key] = kv
    p._on_queue_event(Event("put", kv))
    assert [k for _, _, k in p.ready_keys(1000)] == [key]
    p._on_queue_event(Event("delete", kv))
    p.queue.items.pop(key)
    assert list(p.ready_keys(1000)) == [] and p.earliest_after(0) is None


def fired(p: PartitionPlacer, queue_key: str, rid: str) -> Versioned[RunRecord]:
    run = RunRecord.model_validate(
        {
            "id": rid,
            "job_id": "j",
            "tenant": "default",
            "partition": 3,
            "slot_ms": 100,
            "not_before_ms": 100,
            "spec": {"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}},
            "job_version": 1,
            "created_ms": 0,
            "updated_ms": 0,
            "queue_key": queue_key,
        }
    )
    current = Versioned(K.run(rid), run, 7, 7, 1)
    p.remember_fired(current)
    return current


def test_a_fired_run_is_handed_to_placement_once() -> None:
    p = placer()
    key = queued(p, "j@00000000000100", 100, 7)
    current = fired(p, key, "j@00000000000100")
    assert p.take_fired(key) is current
    assert p.take_fired(key) is None  # a second look reads it from etcd


def test_a_fired_run_is_forgotten_when_its_queue_entry_goes() -> None:
    p = placer()
    key = queued(p, "j@00000000000100", 100, 7)
    fired(p, key, "j@00000000000100")
    p._on_queue_event(Event("delete", KV(key, b"", 0, 8, 0)))
    assert p.take_fired(key) is None


def test_fired_runs_whose_entries_never_showed_are_swept() -> None:
    p = placer()
    keys = [K.queue(3, 0, 100, f"j{i}@00000000000100") for i in range(FIRED_MEMO)]
    for i, key in enumerate(keys):
        fired(p, key, f"j{i}@00000000000100")  # put and delete both missed by the cache
    list(p.ready_keys(1000))
    assert p.take_fired(keys[0]) is None and len(p._fired) == 0


def test_the_fired_memo_is_bounded() -> None:
    p = placer()
    keys = [queued(p, f"j{i}@00000000000100", 100, i + 1) for i in range(FIRED_MEMO + 10)]
    for i, key in enumerate(keys):
        fired(p, key, f"j{i}@00000000000100")
    assert len(p._fired) == FIRED_MEMO  # the rest are read when their turn comes
    assert p.take_fired(keys[-1]) is None and p.take_fired(keys[0]) is not None


def test_the_placement_loop_gathers_unless_a_new_run_is_due_soon() -> None:
    p = placer()
    assert p.take_soonest_new() is None
    queued(p, "j@00000000005000", 5000, 1)
    queued(p, "j@00000000003000", 3000, 2)
    assert p.take_soonest_new() == 3000
    assert p.take_soonest_new() is None  # taken: only runs queued since count
    assert gather_wait_s(None, 0) == GATHER_S  # a wake without new runs
    assert gather_wait_s(3000, 0) == GATHER_S  # fired ahead, as slots are
    assert gather_wait_s(3000, 2500) == 0.0  # due within URGENT_MS: no wait
    assert gather_wait_s(-5, 0) == 0.0  # run now


def test_a_run_being_written_is_out_of_the_walk_until_its_batch_is_decided() -> None:
    p = placer()
    first = queued(p, "a@00000000000100", 100, 1)
    second = queued(p, "b@00000000000200", 200, 2)
    p._hold(first)  # handed to its worker's batcher
    assert [k for _, _, k in p.ready_keys(1000)] == [second]
    p._release(first, placed=False)  # e.g. the worker was full: look again
    assert [k for _, _, k in p.ready_keys(1000)] == [first, second]
    p._hold(second)
    p._release(second, placed=True)  # its delete is on its way: not walked meanwhile
    assert [k for _, _, k in p.ready_keys(1000)] == [first]
