"""In what order a partition fires its ready due entries when there are
more than one batch of them (issue 28).

Key order (slot, then job id) made a herd's fate depend on job names: at
midnight, 90,000 low-priority jobs named ``p100-…`` were all fired, and
held the firing brake, before 1,000 priority-900 ones due at the same
instant. Entries are fired earliest start first (the slot plus the job's
deterministic jitter offset, which is when its run may start), then
highest priority. Each entry is decoded for that once and remembered by
key while it waits.
"""

from __future__ import annotations

import heapq

from etcdsched.model.records import DueEntry
from etcdsched.model.triggers import jitter_offset_ms
from etcdsched.store.kv import KV


class FireOrder:
    """Remembers each waiting entry's (start, -priority)."""

    def __init__(self) -> None:
        self._memo: dict[str, tuple[int, int, int]] = {}
        """Key -> (mod_revision, earliest start ms, -priority)."""

    def first(self, ready: list[KV], count: int) -> list[KV]:
        """The first ``count`` of ``ready`` in order."""
        return heapq.nsmallest(count, ready, key=self._order)

    def forget(self, key: str) -> None:
        self._memo.pop(key, None)

    def prune(self, keep: dict[str, KV]) -> None:
        """Drop what the due cache no longer holds (deleted unfired)."""
        if len(self._memo) > 2 * len(keep) + 64:
            self._memo = {k: v for k, v in self._memo.items() if k in keep}

    def _order(self, kv: KV) -> tuple[int, int, str]:
        known = self._memo.get(kv.key)
        if known is None or known[0] != kv.mod_revision:
            entry = kv.decode(DueEntry).value
            window_ms = int(entry.spec.jitter.total_seconds() * 1000)
            start = entry.slot_ms + jitter_offset_ms(entry.job_id, entry.slot_ms, window_ms)
            known = (kv.mod_revision, start, -entry.spec.priority)
            self._memo[kv.key] = known
        return known[1], known[2], kv.key
