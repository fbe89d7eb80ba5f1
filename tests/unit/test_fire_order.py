"""The order a partition fires a backlog in (``scheduler/fire_order.py``):
earliest start (slot plus jitter offset) first, then highest priority,
read from the stored entry without decoding its whole spec."""

from __future__ import annotations

from datetime import timedelta

from etcdsched.model.codec import encode
from etcdsched.model.records import DueEntry
from etcdsched.model.spec import JobSpec
from etcdsched.model.triggers import jitter_offset_ms
from etcdsched.scheduler.fire_order import FireOrder
from etcdsched.store.kv import KV

SLOT = 1_800_000_000_000


def entry_kv(job: str, priority: int | None, jitter: str | None, revision: int = 1) -> KV:
    fields: dict[str, object] = {"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}}
    if priority is not None:
        fields["priority"] = priority
    if jitter is not None:
        fields["jitter"] = jitter
    spec = JobSpec.model_validate(fields)
    entry = DueEntry(
        job_id=job, slot_ms=SLOT, job_key_version=1, job_version=1, anchor_ms=0, spec=spec
    )
    return KV(f"due/000/{SLOT:014d}/{job}", encode(entry), revision, revision, 1)


def test_earliest_start_then_highest_priority_then_key() -> None:
    kvs = [
        entry_kv("default:low", 100, None),
        entry_kv("default:jittered", 900, "10m"),
        entry_kv("default:high", 900, None),
        entry_kv("default:default-priority", None, None),
        entry_kv("default:mid", 500, None),
    ]
    ordered = [kv.key.rsplit("/", 1)[1] for kv in FireOrder().first(kvs, 4)]
    assert ordered[:2] == ["default:high", "default:mid"]
    assert set(ordered[2:]) == {"default:low", "default:default-priority"}  # both priority 100
    offset = jitter_offset_ms(
        "default:jittered", SLOT, int(timedelta(minutes=10) / timedelta(milliseconds=1))
    )
    assert offset > 0  # so the jittered one, due later, is not among the first four


def test_an_entry_rewritten_is_read_again() -> None:
    order = FireOrder()
    first = entry_kv("default:a", 100, None)
    other = entry_kv("default:b", 500, None)
    assert order.first([first, other], 1) == [other]
    rewritten = entry_kv("default:a", 900, None, revision=2)
    assert order.first([rewritten, other], 1) == [rewritten]
