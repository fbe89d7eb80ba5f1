"""History retention: finished runs beyond a job's ``retention.keep_last``,
or older than ``retention.max_age``, leave etcd; each is first appended as a
JSON line to ``<log dir>/<job>/archive.jsonl`` beside the logs.

The partition owner learns which jobs just finished a run from deletions in
its active-pointer cache and trims only those jobs: no scan of the history
of every job. A run is deleted with a compare on its ``mod_revision``, so a
run that changed meanwhile (it cannot, once terminal, but the compare makes
that an invariant) is left alone.

Archive first, delete second: a run is never lost between the two, but it
can be archived twice (a sweep cut off after archiving, or the old and the
new owner of a partition both sweeping during a hand-over). Readers of an
archive take the last line of each run id.
"""

from __future__ import annotations

import logging

from etcdsched.logs.store import LogStore
from etcdsched.model.errors import EtcdschedError
from etcdsched.model.records import RunRecord
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Cmp, Event, Ops, Store

log = logging.getLogger(__name__)
SLACK = 0.1  # trim only when 10% over keep_last: amortises the listing


class RetentionSweeper:
    def __init__(self, store: Store, keys: Keys, logs: LogStore | None) -> None:
        self.store = store
        self.keys = keys
        self.logs = logs
        self.dirty: set[str] = set()
        self.deleted = 0
        self._ended: dict[str, int] = {}
        """Runs of each job that ended since its last trim."""
        self._trim_after: dict[str, int] = {}
        """How many must end before the job is worth trimming again: a
        trim costs two reads, and a busy job ends runs every second."""

    def on_active_event(self, event: Event) -> None:
        """Active-pointer cache hook: a deleted pointer = a run just ended."""
        if event.kind == "delete":
            _, ref = self.keys.parse_active(event.kv.key)
            self.dirty.add(ref.job_id)
            self._ended[ref.job_id] = self._ended.get(ref.job_id, 0) + 1

    async def sweep(self, now_ms: int) -> int:
        removed = 0
        while self.dirty:
            job_id = self.dirty.pop()
            if self._ended.get(job_id, 0) < self._trim_after.get(job_id, 1):
                continue
            try:
                removed += await self.trim(job_id, now_ms)
            except EtcdschedError as exc:
                log.warning("retention of %s failed: %s", job_id, exc)
        self.deleted += removed
        return removed

    async def trim(self, job_id: str, now_ms: int) -> int:
        prefix = self.keys.runs_prefix(job_id)
        self._ended[job_id] = 0
        counted = await self.store.range(prefix, count_only=True)
        page = await self.store.range(prefix, limit=1, descending=True)
        if not page.kvs:
            return 0
        retention = page.kvs[0].decode(RunRecord).value.spec.retention
        slack = max(1, int(retention.keep_last * SLACK))
        self._trim_after[job_id] = 1 if retention.max_age is not None else slack
        over = counted.count - retention.keep_last
        if retention.max_age is None and over <= retention.keep_last * SLACK:
            return 0
        oldest = await self.store.range(prefix, limit=max(over, 0) or counted.count)
        cutoff = now_ms - retention.max_age.total_seconds() * 1000 if retention.max_age else None
        victims = []
        for index, kv in enumerate(oldest.kvs):
            run = kv.decode(RunRecord).value
            too_many = index < over
            too_old = cutoff is not None and run.updated_ms < cutoff
            if run.state.terminal and (too_many or too_old):
                victims.append((kv, run))
        if not victims:
            return 0
        if self.logs is not None:
            await self.logs.archive(job_id, [run.model_dump_json() for _, run in victims])
        for kv, _ in victims:
            await self.store.txn([Cmp.mod(kv.key, kv.mod_revision)], [Ops.delete(kv.key)])
        return len(victims)
