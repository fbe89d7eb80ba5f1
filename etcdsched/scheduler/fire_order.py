"""In what order a partition fires its ready due entries (issue 28).

Key order (slot, then job id) made a herd's fate depend on job names: at
midnight, 90,000 low-priority jobs named ``p100-…`` were all fired, and
held the firing brake, before 1,000 priority-900 ones due at the same
instant. Entries are fired earliest start first (the slot plus the job's
deterministic jitter offset, which is when its run may start), then
highest priority. Each entry is read for that once, and remembered by key
while it waits: from the entry's last stored field (``DueEntry.fire_order``,
found from the end of its bytes), or for an entry written before that
field, from just the fields it needs (``_OrderFields``). Decoding whole
entries and their specs for it took a million-job midnight twenty seconds
of the scheduler's one core, before the first one was fired.

The ready entries wait in a heap, so a pass takes the next few thousand in
``O(k log n)``: picking them afresh from every ready entry on every pass
(a million at midnight, 15,000 a partition) was a third of the
scheduler's CPU while the herd drained. Entries join the heap as the lead
reaches their slot (a heap of the slots not yet reached) or, when their
slot is already reached, as they are put in the due cache (its ``on_put``).
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from etcdsched.model.codec import decode
from etcdsched.model.spec import JobSpec, NonNegDuration
from etcdsched.model.triggers import jitter_offset_ms
from etcdsched.store.cache import PrefixCache
from etcdsched.store.keys import SLOT_WIDTH
from etcdsched.store.kv import KV


class _SpecOrderFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    priority: int = JobSpec.model_fields["priority"].default
    jitter: NonNegDuration = JobSpec.model_fields["jitter"].default


class _OrderFields(BaseModel):
    """The fields of a ``DueEntry`` its order needs; the rest is skipped."""

    model_config = ConfigDict(extra="ignore")
    job_id: str
    slot_ms: int
    spec: _SpecOrderFields


FIRE_ORDER_FIELD = b'"fire_order":['


def read_fire_order(kv: KV) -> tuple[int, int]:
    """(earliest start ms, priority) of a stored due entry: from its last
    field (``DueEntry.fire_order``), found from the end of the bytes, so
    the spec is never parsed; an entry written before that field, by its
    slot, jitter and priority (``_OrderFields``). The last field of the
    whole object is the one ``rfind`` meets first: a label or variable of
    the spec named alike comes before it."""
    data = kv.value
    at = data.rfind(FIRE_ORDER_FIELD)
    if at >= 0:
        start, _, priority = data[at + len(FIRE_ORDER_FIELD) : data.find(b"]", at)].partition(b",")
        with contextlib.suppress(ValueError):
            return int(start), int(priority)
    entry = decode(data, _OrderFields, kv.key)
    window_ms = int(entry.spec.jitter.total_seconds() * 1000)
    return entry.slot_ms + jitter_offset_ms(
        entry.job_id, entry.slot_ms, window_ms
    ), entry.spec.priority


class FireOrder:
    """The ready entries of one partition's due cache, earliest start, then
    highest priority, then key first."""

    def __init__(self, due: PrefixCache, slot_of: Callable[[str], str], first_slot: int) -> None:
        """``due`` is grouped by slot (``slot_of(key)``, the slot as in the
        key); slots before ``first_slot`` are never fired."""
        self._due = due
        self._slot_of = slot_of
        self._first = f"{first_slot:0{SLOT_WIDTH}d}"
        self._memo: dict[str, tuple[int, int, int]] = {}
        """Key -> (mod_revision, earliest start ms, -priority)."""
        self._heap: list[tuple[int, int, str, int]] = []
        """(start, -priority, key, mod_revision) of the ready entries; an
        item whose key is not in ``_queued`` at that revision is stale."""
        self._queued: dict[str, int] = {}
        self._reached = ""
        """Slots up to this one (as in the key) are in the heap."""
        self._slots: list[str] = []
        """A heap of the held slots past ``_reached``."""
        self._slot_set: set[str] = set()
        self._arrived: set[str] = set()
        """Keys put since the last pass whose slot was already reached."""
        self._relists = -1

    def on_put(self, key: str) -> None:
        """The due cache holds ``key`` anew (listed, watched or written)."""
        slot = self._slot_of(key)
        if slot < self._first:
            return
        if slot <= self._reached:
            self._arrived.add(key)
        elif slot not in self._slot_set:
            self._slot_set.add(slot)
            heapq.heappush(self._slots, slot)

    def take(self, until_ms: int, count: int) -> list[KV]:
        """The first ``count`` held entries due by ``until_ms``, in order;
        they stay queued until :meth:`forget` (fired) or found gone."""
        until = f"{until_ms:0{SLOT_WIDTH}d}"
        if self._due.relists != self._relists:
            self._restart()  # the cache was listed afresh
        while self._slots and self._slots[0] <= until:
            slot = heapq.heappop(self._slots)
            self._slot_set.discard(slot)
            for kv in list(self._due.group(slot).values()):
                self._push(kv)
        self._reached = max(self._reached, until)
        items = self._due.items
        for key in self._arrived:
            if (arrived := items.get(key)) is not None:
                self._push(arrived)
        self._arrived.clear()
        taken: list[tuple[int, int, str, int]] = []
        later: list[tuple[int, int, str, int]] = []
        while self._heap and len(taken) < count:
            item = heapq.heappop(self._heap)
            key, revision = item[2], item[3]
            if self._queued.get(key) != revision:
                continue  # superseded by a newer push, or forgotten
            held = items.get(key)
            if held is None or held.mod_revision != revision:
                del self._queued[key]  # gone (a newer revision arrives by on_put)
                continue
            # reached under a longer lead than now: stays queued, not fired yet
            (later if self._slot_of(key) > until else taken).append(item)
        for item in taken + later:
            heapq.heappush(self._heap, item)
        return [items[item[2]] for item in taken]

    def forget(self, key: str) -> None:
        """``key`` was fired: its heap item is stale from now on."""
        self._memo.pop(key, None)
        self._queued.pop(key, None)

    def _restart(self) -> None:
        self._heap, self._queued, self._arrived = [], {}, set()
        self._reached = ""
        self._slots = [slot for slot in self._due.group_names() if slot >= self._first]
        heapq.heapify(self._slots)
        self._slot_set = set(self._slots)
        self._relists = self._due.relists
        if len(self._memo) > 2 * len(self._due.items) + 64:  # entries deleted unfired
            self._memo = {k: v for k, v in self._memo.items() if k in self._due.items}

    def _push(self, kv: KV) -> None:
        if self._queued.get(kv.key) == kv.mod_revision:
            return
        known = self._memo.get(kv.key)
        if known is None or known[0] != kv.mod_revision:
            start, priority = read_fire_order(kv)
            known = (kv.mod_revision, start, -priority)
            self._memo[kv.key] = known
        self._queued[kv.key] = kv.mod_revision
        heapq.heappush(self._heap, (known[1], known[2], kv.key, kv.mod_revision))
