"""History retention: finished runs beyond a job's ``retention.keep_last``,
or older than ``retention.max_age``, leave etcd, and so do their logs. Each
is first appended as a JSON line to the job's archive in the log store
(``<log dir>/<job>/archive.jsonl`` for a directory), which the store keeps
bounded (``etcdsched.logs.store.ARCHIVE_KEEP_BYTES``). A deleted job keeps
nothing, a grace after its delete (``DELETED_JOB_GRACE_MS``, an hour: its
runs can be looked at meanwhile): the delete marks it ``gone/<pp>/<job>``,
and :meth:`sweep_gone` removes every run, log and its archive, then the mark.

The partition owner learns which jobs just finished a run from deletions in
its active-pointer cache and trims only those jobs: no scan of the history
of every job. A run is deleted with a compare on its ``mod_revision``, so a
run that changed meanwhile (it cannot, once terminal, but the compare makes
that an invariant) is left alone.

Archive first, then the record, then the logs. Archive before the record:
a run is never lost between the two, but it can be archived twice (a sweep
cut off after archiving, or the old and the new owner of a partition both
sweeping during a hand-over); readers of an archive take the last line of
each run id. The record before the logs: a run the API still lists never
lacks its log (the other order would show an empty log for a run whose
delete failed its compare or whose scheduler died in between). What this
order risks is a log without a run: the logs are deleted from a queue, a
grace after the run ended (``LOG_DELETE_GRACE_MS``: its writer may still be
uploading), and retried at later sweeps while the store refuses; only a
scheduler that stops with some still queued leaves orphan logs behind
(invisible, and cleaned up by an age rule on the store, docs/operations.md
"Log store").
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from etcdsched.logs.store import LogStore
from etcdsched.model.errors import EtcdschedError
from etcdsched.model.records import RunRecord
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Cmp, Event, Ops, Store

log = logging.getLogger(__name__)
SLACK = 0.1  # trim only when 10% over keep_last: amortises the listing
LOG_DELETE_TIMEOUT = 5.0
"""The longest one run's log deletion may hold up a sweep (the sweep runs
in the partition's tend loop, beside recovery)."""
LOG_DELETE_GRACE_MS = 120_000
"""A run's logs are deleted no sooner than this after it ended: its writer
may still be uploading the last bytes (an object-store writer's close is
not awaited by every caller, and it retries for up to a minute), and a
deletion before that upload would leave the upload behind, orphaned. Runs
trimmed are mostly older than this; only a small ``keep_last`` on a busy
job makes its logs wait."""
DELETED_JOB_GRACE_MS = 3_600_000
"""How long a deleted job's history stays (its runs can still be listed,
read and their logs followed) before retention removes all of it."""
TRIMS_PER_SECOND = 200
"""At most this many jobs are trimmed a second (two reads each), the rest
stay dirty for later sweeps: a herd of a million one-off jobs ends a
thousand runs a second, each a job of its own, and trimming each as it
ended doubled the reads etcd served while the herd drained (issue 28)."""
MAX_PENDING_LOG_DELETES = 100_000
"""Run ids whose logs are still to delete, kept across sweeps while the log
store refuses; beyond this the oldest are given up (their logs stay)."""


class RetentionSweeper:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        logs: LogStore | None,
        log_delete_grace_ms: int = LOG_DELETE_GRACE_MS,
    ) -> None:
        self.store = store
        self.keys = keys
        self.logs = logs
        self.log_delete_grace_ms = log_delete_grace_ms
        self.dirty: set[str] = set()
        self.deleted = 0
        self._ended: dict[str, int] = {}
        """Runs of each job that ended since its last trim."""
        self._trim_after: dict[str, int] = {}
        """How many must end before the job is worth trimming again: a
        trim costs two reads, and a busy job ends runs every second."""
        self.deleted_job_grace_ms = DELETED_JOB_GRACE_MS
        self.log_deletes: deque[tuple[int, str]] = deque()
        """Runs whose records are gone and whose logs are not yet: when
        their logs may go (ms), and the run id."""
        self._trimming: set[str] = set()
        self._budget = (0, 0.0)
        """(when, trims allowed then): ``TRIMS_PER_SECOND``, a second's worth
        at most, refilled by the sweeps' own clock."""

    def _take_trim(self, now_ms: int) -> bool:
        """One trim off the budget, if there is one left."""
        then, left = self._budget
        left = min(float(TRIMS_PER_SECOND), left + (now_ms - then) * TRIMS_PER_SECOND / 1000)
        if left < 1:
            self._budget = (now_ms, left)
            return False
        self._budget = (now_ms, left - 1)
        return True

    def on_active_event(self, event: Event) -> None:
        """Active-pointer cache hook: a deleted pointer = a run just ended."""
        if event.kind == "delete":
            _, ref = self.keys.parse_active(event.kv.key)
            self.dirty.add(ref.job_id)
            self._ended[ref.job_id] = self._ended.get(ref.job_id, 0) + 1

    async def sweep_gone(self, partition: int, now_ms: int) -> None:
        """Deleted jobs of the partition (``gone/<pp>/<job>``, written by the
        delete with its instant): ``deleted_job_grace_ms`` after the delete,
        trim each to nothing, whether or not a run of it ends again; once
        no run of it is left, its archive goes and so does the marker. A
        run still going keeps the marker until a later sweep. Compare on
        the marker's delete: none needed (only this owner removes it, and a
        second delete is harmless)."""
        page = await self.store.range(self.keys.gone_prefix(partition))
        for kv in page.kvs:
            job_id = self.keys.parse_gone(kv.key)
            deleted_ms = int(kv.value) if kv.value.isdigit() else 0
            if job_id in self._trimming or now_ms < deleted_ms + self.deleted_job_grace_ms:
                continue
            self._trimming.add(job_id)
            try:
                await self._forget(job_id, kv.key, now_ms)
            except EtcdschedError as exc:
                log.warning("retention of deleted %s failed: %s", job_id, exc)
            finally:
                self._trimming.discard(job_id)

    async def _forget(self, job_id: str, marker: str, now_ms: int) -> None:
        ops = [Ops.delete(marker)]  # (a job made again of that id: its own)
        if await self.store.get(self.keys.job(job_id)) is None:
            self.deleted += await self.trim(job_id, now_ms, keep_none=True)
            left = await self.store.range(self.keys.runs_prefix(job_id), count_only=True)
            if left.count:
                return
            if self.logs is not None:
                await asyncio.wait_for(self.logs.forget_job(job_id), LOG_DELETE_TIMEOUT)
            # what no run took along: the deliveries of its skipped slots
            ops.append(Ops.delete_prefix(self.keys.job_deliveries_prefix(job_id)))
        await self.store.txn([], ops)

    async def sweep(self, now_ms: int) -> int:
        """Trim the dirty jobs, then delete queued logs. Every partition's
        tend loop sweeps this one sweeper, so sweeps overlap: a job that
        another sweep is trimming waits for the next sweep (two trims of one
        job would each count its runs before the other deleted some, and
        together keep fewer than ``keep_last``). At most
        ``TRIMS_PER_SECOND`` jobs are trimmed a second."""
        removed = 0
        busy = set()
        while self.dirty:
            job_id = self.dirty.pop()
            if job_id in self._trimming:
                busy.add(job_id)
                continue
            if self._ended.get(job_id, 0) < self._trim_after.get(job_id, 1):
                continue
            if not self._take_trim(now_ms):
                busy.add(job_id)  # over the budget: a later sweep
                break
            self._trimming.add(job_id)
            try:
                removed += await self.trim(job_id, now_ms)
            except EtcdschedError as exc:
                log.warning("retention of %s failed: %s", job_id, exc)
            finally:
                self._trimming.discard(job_id)
        self.dirty |= busy
        await self.delete_logs(now_ms)
        self.deleted += removed
        return removed

    async def trim(self, job_id: str, now_ms: int, keep_none: bool = False) -> int:
        """Archive and delete the job's runs over its retention; their logs
        are queued for :meth:`delete_logs`. Returns how many runs went.
        ``keep_none``: a job deleted a grace ago, whose every finished run
        goes, unarchived (its archive goes too)."""
        prefix = self.keys.runs_prefix(job_id)
        self._ended[job_id] = 0
        counted = await self.store.range(prefix, count_only=True)
        page = await self.store.range(prefix, limit=1, descending=True)
        if not page.kvs:
            return 0
        retention = page.kvs[0].decode(RunRecord).value.spec.retention
        keep = 0 if keep_none else retention.keep_last
        slack = max(1, int(keep * SLACK))
        self._trim_after[job_id] = 1 if retention.max_age is not None else slack
        over = counted.count - keep
        if retention.max_age is None and over <= keep * SLACK:
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
        if self.logs is not None and not keep_none:  # a deleted job's archive goes too
            await self.logs.archive(job_id, [run.model_dump_json() for _, run in victims])
        return await self._delete_runs(victims)

    async def _delete_runs(self, victims: list[tuple[KV, RunRecord]]) -> int:
        """Each record with its compare, and its ended webhook deliveries in
        the same transaction; the logs of those deleted are queued."""
        removed = 0
        for kv, run in victims:
            gone = [Ops.delete(kv.key), Ops.delete_prefix(self.keys.deliveries_prefix(run.id))]
            result = await self.store.txn([Cmp.mod(kv.key, kv.mod_revision)], gone)
            if result.succeeded:
                removed += 1
                if self.logs is not None:
                    self.log_deletes.append((run.updated_ms + self.log_delete_grace_ms, run.id))
        overflow = len(self.log_deletes) - MAX_PENDING_LOG_DELETES
        if overflow > 0:
            log.warning("retention gives up deleting the logs of %d runs", overflow)
            for _ in range(overflow):
                self.log_deletes.popleft()
        return removed

    async def delete_logs(self, now_ms: int) -> None:
        """Delete the queued runs' logs (every attempt) whose grace is over,
        in queue order. The first failure ends this round and the rest wait
        for the next sweep: a log store that is down costs a sweep one
        ``LOG_DELETE_TIMEOUT``."""
        if self.logs is None:
            self.log_deletes.clear()
            return
        while self.log_deletes and self.log_deletes[0][0] <= now_ms:
            due = self.log_deletes.popleft()  # taken: an overlapping sweep takes the next
            try:
                await asyncio.wait_for(self.logs.delete(due[1]), LOG_DELETE_TIMEOUT)
            except (EtcdschedError, OSError, TimeoutError) as exc:
                log.warning("logs of %s not deleted yet: %s", due[1], exc)
                self.log_deletes.appendleft(due)
                return
