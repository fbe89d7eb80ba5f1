"""The order a partition fires a backlog in (``scheduler/fire_order.py``):
earliest start (slot plus jitter offset) first, then highest priority,
read from the stored entry without decoding its whole spec."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import cast

from etcdsched.model.codec import encode
from etcdsched.model.records import DueEntry
from etcdsched.model.spec import JobSpec
from etcdsched.model.triggers import jitter_offset_ms
from etcdsched.runtime.clock import FakeClock
from etcdsched.scheduler.fire_order import FireOrder, read_fire_order
from etcdsched.store.cache import PrefixCache
from etcdsched.store.kv import KV, Store

SLOT = 1_800_000_000_000


def entry_kv(
    job: str, priority: int | None, jitter: str | None, revision: int = 1, slot: int = SLOT
) -> KV:
    fields: dict[str, object] = {"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}}
    if priority is not None:
        fields["priority"] = priority
    if jitter is not None:
        fields["jitter"] = jitter
    spec = JobSpec.model_validate(fields)
    entry = DueEntry(
        job_id=job, slot_ms=slot, job_key_version=1, job_version=1, anchor_ms=0, spec=spec
    )
    return KV(f"due/000/{slot:014d}/{job}", encode(entry), revision, revision, 1)


def slot_of(key: str) -> str:
    return key.split("/")[2]


def held(*kvs: KV) -> tuple[PrefixCache, FireOrder]:
    """A due cache grouped by slot holding ``kvs``, and its order."""
    due = PrefixCache(cast(Store, None), FakeClock(0), "due/000/", group_by=slot_of)
    order = FireOrder(due, slot_of, first_slot=1)
    due.on_put = order.on_put
    for kv in kvs:
        due.put_item(kv)
    return due, order


def jobs(kvs: list[KV]) -> list[str]:
    return [kv.key.rsplit("/", 1)[1] for kv in kvs]


def test_earliest_start_then_highest_priority_then_key() -> None:
    _, order = held(
        entry_kv("default:low", 100, None),
        entry_kv("default:jittered", 900, "10m"),
        entry_kv("default:high", 900, None),
        entry_kv("default:default-priority", None, None),
        entry_kv("default:mid", 500, None),
    )
    window_ms = int(timedelta(minutes=10) / timedelta(milliseconds=1))
    assert jitter_offset_ms("default:jittered", SLOT, window_ms) > 0  # it starts later
    ordered = jobs(order.take(SLOT, 4))
    assert ordered[:2] == ["default:high", "default:mid"]
    assert set(ordered[2:]) == {"default:low", "default:default-priority"}  # both priority 100
    assert jobs(order.take(SLOT, 10))[-1] == "default:jittered"


def test_taken_entries_stay_queued_until_fired_and_a_rewrite_is_read_again() -> None:
    first, other = entry_kv("default:a", 100, None), entry_kv("default:b", 500, None)
    due, order = held(first, other)
    assert order.take(SLOT, 1) == [other]
    assert order.take(SLOT, 1) == [other]  # not fired: still first
    due.discard(other.key)
    order.forget(other.key)
    assert order.take(SLOT, 5) == [first]
    rewritten = entry_kv("default:a", 900, None, revision=2)
    due.put_item(rewritten)
    assert order.take(SLOT, 5) == [rewritten]


def test_entries_join_as_the_lead_reaches_their_slot_and_wait_when_it_shrinks() -> None:
    now, later = (
        entry_kv("default:now", 100, None),
        entry_kv("default:later", 900, None, slot=SLOT + 5000),
    )
    due, order = held(now, later)
    assert order.take(SLOT, 10) == [now]
    arrived = entry_kv("default:arrived", 500, None)  # put after its slot was reached
    due.put_item(arrived)
    assert jobs(order.take(SLOT + 5000, 10)) == ["default:arrived", "default:now", "default:later"]
    assert jobs(order.take(SLOT + 1000, 10)) == ["default:arrived", "default:now"]  # lead shrank


def test_a_whole_listing_rebuilds_the_queue() -> None:
    due, order = held(entry_kv("default:a", 100, None))
    assert len(order.take(SLOT, 10)) == 1
    fresh = entry_kv("default:b", 100, None)
    due.items = {fresh.key: fresh}  # what a re-list does
    due._regroup()
    due.relists += 1
    assert order.take(SLOT, 10) == [fresh]


def test_the_order_is_read_from_the_last_field_and_agrees_with_decoding() -> None:
    spec = JobSpec.model_validate(
        {
            "trigger": {"kind": "now"},
            "execution": {"argv": ["true"], "env": {"fire_order": "[1,2]"}},
            "labels": {"fire_order": "[3,4]"},  # named alike, and before the real one
            "jitter": "10m",
            "priority": 640,
        }
    )
    entry = DueEntry(
        job_id="default:j", slot_ms=SLOT, job_key_version=1, job_version=1, anchor_ms=0, spec=spec
    )
    stored = encode(entry)
    assert stored.endswith(b"]}") and b'"fire_order":[' in stored
    assert read_fire_order(KV("k", stored, 1, 1, 1)) == entry.fire_order
    assert entry.fire_order[1] == 640 and entry.fire_order[0] > SLOT
    # an entry stored before the field existed is read the slow way, alike
    older = json.loads(stored)
    del older["fire_order"]
    assert read_fire_order(KV("k", json.dumps(older).encode(), 1, 1, 1)) == entry.fire_order
