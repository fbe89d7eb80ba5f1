"""In what order a partition fires its ready due entries when there are
more than one batch of them (issue 28).

Key order (slot, then job id) made a herd's fate depend on job names: at
midnight, 90,000 low-priority jobs named ``p100-…`` were all fired, and
held the firing brake, before 1,000 priority-900 ones due at the same
instant. Entries are fired earliest start first (the slot plus the job's
deterministic jitter offset, which is when its run may start), then
highest priority. Each entry is read for that once, and remembered by key
while it waits; read as just those fields (``_OrderFields``), a tenth of
the cost of decoding the whole entry and its spec, which a herd of a
million would pay once for ordering and again for firing.
"""

from __future__ import annotations

import heapq

from pydantic import BaseModel, ConfigDict

from etcdsched.model.codec import decode
from etcdsched.model.spec import JobSpec, NonNegDuration
from etcdsched.model.triggers import jitter_offset_ms
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
            entry = decode(kv.value, _OrderFields, kv.key)
            window_ms = int(entry.spec.jitter.total_seconds() * 1000)
            start = entry.slot_ms + jitter_offset_ms(entry.job_id, entry.slot_ms, window_ms)
            known = (kv.mod_revision, start, -entry.spec.priority)
            self._memo[kv.key] = known
        return known[1], known[2], kv.key
