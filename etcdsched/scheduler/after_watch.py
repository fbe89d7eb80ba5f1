"""``after`` triggers: a job that runs each time its upstream jobs have ended
as asked (docs/dependencies.md).

Such a job's due entry waits at :data:`~etcdsched.model.triggers.WATCH_SLOT`
(the epoch), where the firer never fires it. Once a second the partition's
owner looks at each one: when every upstream has a run that ended as asked
(``on: success`` succeeded, ``on: completion`` any end) since the job's
last run, the entry moves to *now*, naming those runs, and from there the
firer fires it like any slot: the run is created with the run-key-absent
compare of every slot, so the ledger holds exactly one run per arming, and
its next entry goes back to the watch slot with ``last_slot_ms`` = the
slot it fired, from which the next round counts.
"""

from __future__ import annotations

import logging

from etcdsched.model.codec import encode
from etcdsched.model.errors import EtcdschedError
from etcdsched.model.records import DueEntry, RunRecord
from etcdsched.model.states import RunState
from etcdsched.model.triggers import AfterTrigger
from etcdsched.runtime.clock import Clock
from etcdsched.scheduler.firing import PartitionFirer
from etcdsched.scheduler.ownership import Ownership
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Compare, Ops, Store
from etcdsched.store.upstream_runs import runs_ended_since

log = logging.getLogger(__name__)
CHECK_EVERY_MS = 1000
"""How often the upstream runs of each waiting ``after`` job are read."""


def qualifies(run: RunRecord, on: str) -> bool:
    """Whether ``run`` ended as an ``after`` trigger's ``on`` asks."""
    return run.state is RunState.SUCCEEDED if on == "success" else run.state.terminal


class AfterWatch:
    """Arms the partition's ``after`` jobs whose upstream runs have ended."""

    def __init__(
        self,
        firer: PartitionFirer,
        store: Store,
        keys: Keys,
        clock: Clock,
        ownership: Ownership,
    ) -> None:
        self.firer = firer
        self.store = store
        self.keys = keys
        self.clock = clock
        self.ownership = ownership
        self._next_check_ms = 0
        self._decoded: dict[str, tuple[int, DueEntry]] = {}

    async def check(self) -> None:
        """Look at every waiting ``after`` job, at most once a second. One
        job's failed read or lost race waits for the next look."""
        now_ms = self.clock.now_ms()
        if now_ms < self._next_check_ms:
            return
        self._next_check_ms = now_ms + CHECK_EVERY_MS
        watching = self.firer.watch_entries()
        held = self._decoded
        self._decoded = {kv.key: held[kv.key] for kv in watching if kv.key in held}
        for kv in watching:
            try:
                await self._check_one(kv)
            except EtcdschedError as exc:
                log.info("after-watch of %s: %s", kv.key, exc)

    async def _check_one(self, kv: KV) -> None:
        entry = self._entry(kv)
        trigger = entry.spec.trigger
        if not isinstance(trigger, AfterTrigger):
            return
        since = entry.anchor_ms if entry.last_slot_ms is None else entry.last_slot_ms + 1
        window_ms = int(entry.spec.dependency_window.total_seconds() * 1000)
        latest: list[RunRecord] = []
        for upstream in trigger.jobs:
            ended = await runs_ended_since(self.store, self.keys, upstream, since, window_ms)
            matching = [run for run in ended if qualifies(run, trigger.on)]
            if not matching:
                return
            latest.append(max(matching, key=lambda run: run.updated_ms))
        await self._arm(kv, entry, latest)

    def _entry(self, kv: KV) -> DueEntry:
        held = self._decoded.get(kv.key)
        if held is not None and held[0] == kv.mod_revision:
            return held[1]
        entry = kv.decode(DueEntry).value
        self._decoded[kv.key] = (kv.mod_revision, entry)
        return entry

    async def _arm(self, kv: KV, entry: DueEntry, upstream_runs: list[RunRecord]) -> None:
        """Move the entry from the watch slot to now (never before the last
        counted run ended: the next round counts from just after it).
        Compares: owner token, the watch entry unchanged, the job unchanged
        since the entry was computed."""
        slot_ms = max(self.clock.now_ms(), *(run.updated_ms for run in upstream_runs))
        named = ", ".join(f"{run.id} ({run.state.value})" for run in upstream_runs)
        armed = entry.model_copy(update={"slot_ms": slot_ms, "armed_by": f"after {named}"})
        data = encode(armed)
        compares = [
            self.ownership.guard(self.firer.partition),
            Compare(kv.key, "mod", "==", kv.mod_revision),
            Compare(self.keys.job(entry.job_id), "version", "==", entry.job_key_version),
        ]
        ops = [
            Ops.delete(kv.key),
            Ops.put(self.keys.due(self.firer.partition, slot_ms, entry.job_id), data),
            Ops.put(self.keys.due_pointer(entry.job_id), data),
        ]
        result = await self.store.txn(compares, ops)
        if result.succeeded:
            log.debug("armed %s: %s", entry.job_id, named)
