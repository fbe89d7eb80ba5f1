"""The overlap policy: what a job's active runs are, and what firing a new
slot does about them (``allow``, ``skip``, ``queue_one``,
``cancel_previous``)."""

from __future__ import annotations

from collections.abc import Callable

from etcdsched.model.records import ActivePointer, DueEntry, SkipRecord
from etcdsched.runtime.clock import Clock
from etcdsched.store.cache import PrefixCache
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Event, Store


class ActiveByJob(dict[str, list[ActivePointer]]):
    """Job id -> its active runs, filled on first lookup."""

    def __init__(self, load: Callable[[str], list[ActivePointer]]) -> None:
        super().__init__()
        self._load = load

    def __missing__(self, job_id: str) -> list[ActivePointer]:
        pointers = self[job_id] = self._load(job_id)
        return pointers


def active_runs_cache(
    store: Store,
    clock: Clock,
    keys: Keys,
    partition: int,
    on_event: Callable[[Event], None] | None = None,
) -> PrefixCache:
    """The active pointers of one partition, grouped by job: what the firer
    (overlap policy) and the placer (queue_one) ask about one job at a time."""

    def job_of(key: str) -> str:
        return keys.parse_active(key)[1].job_id

    return PrefixCache(
        store,
        clock,
        keys.active_prefix(partition),
        relist_every=15,
        on_event=on_event,
        group_by=job_of,
    )


def overlap_verdict(entry: DueEntry, active: list[ActivePointer]) -> str:
    """``create``, ``skip`` or ``cancel`` (create and cancel the others)."""
    policy = entry.spec.overlap
    if not active or policy == "allow":
        return "create"
    if policy == "skip":
        return "skip"
    if policy == "cancel_previous":
        return "cancel"
    waiting = [p for p in active if p.worker is None]
    return "skip" if waiting else "create"  # queue_one: at most one waits


def overlap_skip(entry: DueEntry, slot_ms: int, now_ms: int) -> SkipRecord:
    return SkipRecord(
        job_id=entry.job_id,
        first_slot_ms=slot_ms,
        last_slot_ms=slot_ms,
        count=1,
        reason="overlap",
        detail=f"overlap policy {entry.spec.overlap}: a previous run is still active",
        created_ms=now_ms,
    )
