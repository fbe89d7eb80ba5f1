"""Pausing a job after ``pause_after_failures`` failed runs in a row
(docs/webhooks.md, ``job.paused``).

A run that ends failed, timed out, lost or interrupted, of a job with the
setting, writes a *pause check* to the outbox in its ending transaction
(``etcdsched.model.notify_events.pause_check``): only the partition's
owner reads the job's last runs, never the worker reporting. The owner's
delivery loop hands each check here: if the job's newest finished runs up
to that one are the whole streak and the job is still active, it is
paused (``JobService.pause``: the due entry leaves the index, fired runs
are withdrawn) with its ``job.paused`` events in the *same* transaction.
A pause that finds the job paused already writes nothing, so one pause
sends one event per webhook, however many checks ask.

The pausing transaction also deletes the check, comparing that it is
unchanged and that the partition is still ours: a check is acted on at
most once. Without that, a check whose own removal failed (a crash, a
hand-over, an unknown outcome) would run again later, still see its
streak, and pause a job that a user had resumed meanwhile.
"""

from __future__ import annotations

import logging

from etcdsched.model.errors import Conflict, NotFound
from etcdsched.model.notify_events import failure_streak
from etcdsched.model.notify_records import Delivery
from etcdsched.model.records import RunRecord
from etcdsched.runtime.clock import Clock
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Cmp, Compare, Ops, Store
from etcdsched.store.outbox import Outbox

log = logging.getLogger(__name__)
LOOKBACK_SLACK = 20
"""Runs read beyond the streak: cancelled and skipped ones do not count."""


class FailurePause:
    def __init__(
        self, store: Store, keys: Keys, clock: Clock, jobs: JobService, outbox: Outbox
    ) -> None:
        self.store = store
        self.keys = keys
        self.clock = clock
        self.jobs = jobs
        self.outbox = outbox

    async def check(self, check: Delivery, kv: KV, partition: int, fence: Compare) -> bool:
        """Pause the job if ``check`` (read as ``kv``) completes a streak;
        whether it did. ``fence``: the partition is still ours."""
        count = int(check.body.get("pause_after_failures") or 0)
        if count < 1 or not await self._streak(check, count):
            return False
        try:
            job = await self.jobs.get(check.job_id)
        except NotFound:
            return False
        if job.state == "paused" or job.spec.pause_after_failures is None:
            return False
        events = self.outbox.paused_ops(check, job.spec, partition, self.clock.now_ms())
        try:
            paused = await self.jobs.pause(
                check.job_id,
                also=[*events, Ops.delete(kv.key)],
                provided=[fence, Cmp.mod(kv.key, kv.mod_revision)],
            )
        except Conflict:
            if await self._check_unchanged(kv):
                raise  # the job kept changing: try the check again later
            return False  # acted on already, or no longer ours to act on
        log.warning(
            "job %s paused after %d failed runs in a row (the last %s)",
            check.job_id,
            count,
            check.run_id,
        )
        return paused.state == "paused"

    async def _check_unchanged(self, kv: KV) -> bool:
        now = await self.store.get(kv.key)
        return now is not None and now.mod_revision == kv.mod_revision

    async def _streak(self, check: Delivery, count: int) -> bool:
        """The job's runs up to the check's, newest first, end a streak."""
        start = self.keys.runs_prefix(check.job_id)
        end = self.keys.run(check.run_id) + "\0"
        page = await self.store.range(start, end, limit=count + LOOKBACK_SLACK, descending=True)
        return failure_streak((kv.decode(RunRecord).value for kv in page.kvs), count)
