"""The explained ledger: every slot of a job between its creation and its
next pending slot is accounted for by exactly one run or one skip record.

:func:`check_slots` is pure; :func:`account` reads one job's runs and skip
records (its own keys only) and checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etcdsched.model.records import DueEntry, JobRecord, RunRecord, SkipRecord
from etcdsched.model.triggers import Trigger, slots_between
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Store

MAX_SLOTS = 100_000


@dataclass
class LedgerReport:
    job_id: str
    expected: int = 0
    by_run: int = 0
    by_skip: int = 0
    unexplained: list[int] = field(default_factory=list)
    doubly_explained: list[int] = field(default_factory=list)
    skip_count_mismatches: list[SkipRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.unexplained or self.doubly_explained or self.skip_count_mismatches)


def check_slots(
    job_id: str,
    trigger: Trigger,
    anchor_ms: int,
    until_ms: int,
    run_slots: set[int],
    skips: list[SkipRecord],
    backfilled: frozenset[int] | set[int] = frozenset(),
) -> LedgerReport:
    """Account every slot in [anchor, until) against runs and skip ranges.

    ``backfilled`` are slots a client backfilled. A backfill run has the id
    the scheduled run of its slot would have, so the scheduler never creates
    a second run for it: it explains a slot the scheduler had not fired yet,
    and on a skipped slot it is the client's remedy, not a double account."""
    report = LedgerReport(job_id)
    expected = slots_between(trigger, anchor_ms - 1, until_ms - 1, anchor_ms, MAX_SLOTS)
    report.expected = len(expected)
    for skip in skips:
        inside = [s for s in expected if skip.first_slot_ms <= s <= skip.last_slot_ms]
        if len(inside) != skip.count:
            report.skip_count_mismatches.append(skip)
    for slot in expected:
        skipped = any(s.first_slot_ms <= slot <= s.last_slot_ms for s in skips)
        ran = slot in run_slots
        if ran and skipped:
            report.doubly_explained.append(slot)
        elif ran or (slot in backfilled and not skipped):
            report.by_run += 1
        elif skipped:
            report.by_skip += 1
        else:
            report.unexplained.append(slot)
    return report


async def account(
    store: Store, keys: Keys, job_id: str, until_ms: int | None = None
) -> LedgerReport:
    """Check a job's ledger up to ``until_ms`` (default: its next pending slot)."""
    job_kv = await store.get(keys.job(job_id))
    if job_kv is None:
        raise ValueError(f"job {job_id} not found")
    job = job_kv.decode(JobRecord).value
    if until_ms is None:
        due_kv = await store.get(keys.due_pointer(job_id))
        until_ms = due_kv.decode(DueEntry).value.slot_ms if due_kv else until_ms
    page = await store.range(keys.runs_prefix(job_id))
    runs = [kv.decode(RunRecord).value for kv in page.kvs]
    run_slots = {r.slot_ms for r in runs if r.kind == "scheduled"}
    backfilled = {r.slot_ms for r in runs if r.kind == "backfill"}
    skip_kvs = await store.range(keys.skips_prefix(job_id))
    skips = [kv.decode(SkipRecord).value for kv in skip_kvs.kvs]
    if until_ms is None:  # no slot left: everything up to the last run or skip counts
        last_skipped = {s.last_slot_ms for s in skips}
        until_ms = max(run_slots | backfilled | last_skipped, default=job.anchor_ms) + 1
    trigger, anchor = job.spec.trigger, job.anchor_ms
    return check_slots(job_id, trigger, anchor, until_ms, run_slots, skips, backfilled)
