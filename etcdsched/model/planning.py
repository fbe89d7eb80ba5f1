"""Pure firing decisions: given a job's due entry and ``now``, which runs to
create, which slots to record as skipped (and why), and the next due entry.

Misfire: a slot fired more than ``misfire.grace`` after its instant was
missed (every scheduler was down). Slots older than the catch-up window are
always skipped (at most 10,000 slots of a window are listed); within it the
policy decides: ``skip`` none run, ``run_once``
the latest runs and the rest are coalesced into it, ``run_all`` the latest
``max_catch_up`` run. Every missed slot ends up in a run or a skip record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etcdsched.model.records import DueEntry, SkipRecord
from etcdsched.model.triggers import AfterTrigger, count_slots_between, next_slot, slots_between

LIST_CAP = 10_000
COUNT_CAP = 10**9


@dataclass(frozen=True)
class PlannedRun:
    slot_ms: int
    coalesced: int = 0
    reason: str = ""


@dataclass(frozen=True)
class FirePlan:
    runs: list[PlannedRun] = field(default_factory=list)
    skips: list[SkipRecord] = field(default_factory=list)
    next_entry: DueEntry | None = None


def plan_fire(entry: DueEntry, now_ms: int) -> FirePlan:
    """What firing ``entry`` at ``now_ms`` does (``entry.slot_ms <= now_ms``,
    or slightly after it when firing ahead)."""
    spec = entry.spec
    skips: list[SkipRecord] = []
    if isinstance(spec.trigger, AfterTrigger):
        # an event, not an instant: armed late (every scheduler down) it still runs
        run = PlannedRun(entry.slot_ms, reason=entry.armed_by)
        return FirePlan([run], [], _advance(entry, entry.slot_ms, 1))
    if now_ms - entry.slot_ms <= spec.misfire.grace.total_seconds() * 1000:
        runs, last = [PlannedRun(entry.slot_ms)], entry.slot_ms
    else:
        runs, skips, last = _plan_misfire(entry, now_ms)
    return FirePlan(runs, skips, _advance(entry, last, len(runs)))


def _advance(entry: DueEntry, last_ms: int, fired_now: int) -> DueEntry | None:
    trigger = entry.spec.trigger
    fired = entry.fired + fired_now
    if trigger.max_runs is not None and fired >= trigger.max_runs:
        return None
    slot = next_slot(trigger, last_ms, entry.anchor_ms)
    if slot is None:
        return None
    update = {"slot_ms": slot, "fired": fired, "last_slot_ms": last_ms, "armed_by": ""}
    return entry.model_copy(update=update)


def _plan_misfire(entry: DueEntry, now_ms: int) -> tuple[list[PlannedRun], list[SkipRecord], int]:
    spec, trigger, anchor = entry.spec, entry.spec.trigger, entry.anchor_ms
    policy = spec.misfire
    missed = count_slots_between(trigger, entry.slot_ms - 1, now_ms, anchor, COUNT_CAP)
    window_ms = int(policy.catch_up_window.total_seconds() * 1000)
    window_after = max(entry.slot_ms - 1, now_ms - window_ms)
    recent = slots_between(trigger, window_after, now_ms, anchor, LIST_CAP)
    last_missed = recent[-1] if recent else now_ms
    if policy.policy == "skip" or not recent:
        detail = "misfire policy skip" if recent else "outside the catch-up window"
        return [], [_skip(entry, entry.slot_ms, last_missed, missed, detail, now_ms)], last_missed
    if policy.policy == "run_once":
        reason = f"misfire: {missed} slot(s) missed, ran the latest once"
        chosen = [PlannedRun(last_missed, coalesced=missed - 1, reason=reason)]
    else:
        picked = recent[-policy.max_catch_up :]
        chosen = [PlannedRun(s, reason="misfire: caught up") for s in picked]
    skipped = missed - len(chosen)
    skips = []
    if skipped > 0:
        detail = f"misfire policy {policy.policy}: {len(chosen)} run(s) instead"
        skips.append(_skip(entry, entry.slot_ms, chosen[0].slot_ms - 1, skipped, detail, now_ms))
    return chosen, skips, last_missed


def _skip(
    entry: DueEntry, first: int, last: int, count: int, detail: str, now_ms: int
) -> SkipRecord:
    return SkipRecord(
        job_id=entry.job_id,
        first_slot_ms=first,
        last_slot_ms=max(first, last),
        count=count,
        reason="misfire",
        detail=detail,
        created_ms=now_ms,
    )
