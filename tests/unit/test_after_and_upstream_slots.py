"""The pure parts of dependencies (docs/dependencies.md): which slot of an
upstream schedule a downstream slot waits for, and how an ``after``
trigger's due entry moves between the watch slot and its runs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from etcdsched.model.planning import plan_fire
from etcdsched.model.records import DueEntry
from etcdsched.model.spec import JobSpec
from etcdsched.model.triggers import (
    TRIGGER_ADAPTER,
    WATCH_SLOT,
    AfterTrigger,
    describe,
    latest_slot_at_or_before,
    next_slot,
    slots_between,
)

DAY_MS = 86_400_000
T0 = int(datetime(2026, 12, 7, tzinfo=UTC).timestamp() * 1000)


def trigger(**data: object) -> object:
    return TRIGGER_ADAPTER.validate_python(data)


@pytest.mark.parametrize(
    ("upstream", "at_ms", "expected"),
    [
        ({"kind": "interval", "every": "1s"}, T0 + 1500, T0 + 1000),
        ({"kind": "interval", "every": "1s"}, T0 + 1000, T0 + 1000),  # at or before
        ({"kind": "cron", "expr": "0 0 * * *"}, T0 + 5 * 3_600_000, T0),
        ({"kind": "cron", "expr": "0 0 * * *"}, T0 - 1, T0 - DAY_MS),
        ({"kind": "cron", "expr": "0 0 1 1 *"}, T0, None),  # a year back: outside one day
        ({"kind": "at", "at": "2026-12-07T00:00:30Z"}, T0 + 60_000, T0 + 30_000),
        ({"kind": "at", "at": "2026-12-07T00:00:30Z"}, T0 + 10_000, None),  # not yet
        ({"kind": "after", "jobs": ["a"]}, T0, None),
    ],
)
def test_the_upstream_slot_a_downstream_slot_waits_for(
    upstream: dict[str, object], at_ms: int, expected: int | None
) -> None:
    found = latest_slot_at_or_before(trigger(**upstream), at_ms, T0, DAY_MS)  # type: ignore[arg-type]
    assert found == expected


def test_a_per_second_schedule_is_answered_from_its_last_seconds() -> None:
    """The widening search lists about two slots, not a day's 86,400."""
    every = trigger(kind="cron", expr="* * * * * *")
    assert latest_slot_at_or_before(every, T0 + 999, T0, DAY_MS) == T0  # type: ignore[arg-type]


def test_an_after_trigger_has_no_instants_but_waits_at_the_watch_slot() -> None:
    after = AfterTrigger(jobs=["extract", "load"], on="completion")
    assert next_slot(after, T0, T0) == WATCH_SLOT
    assert slots_between(after, T0, T0 + DAY_MS, T0, 100) == []
    ended = after.model_copy(update={"end_at": datetime(2026, 12, 7, 1, tzinfo=UTC)})
    assert next_slot(ended, T0 + 2 * 3_600_000, T0) is None, "past end_at: no more rounds"
    assert describe(after) == "after extract, load (on completion)"


@pytest.mark.parametrize("jobs", [[], ["bad name"], ["a"] * 33])
def test_an_after_trigger_names_one_to_32_jobs(jobs: list[str]) -> None:
    with pytest.raises(ValidationError):
        AfterTrigger(jobs=jobs)


def _entry(**update: object) -> DueEntry:
    spec = JobSpec.model_validate(
        {"trigger": {"kind": "after", "jobs": ["a"]}, "execution": {"argv": ["true"]}}
    )
    entry = DueEntry(
        job_id="default:b",
        slot_ms=WATCH_SLOT,
        job_key_version=1,
        job_version=1,
        anchor_ms=T0,
        spec=spec,
    )
    return entry.model_copy(update=update)


def test_an_armed_after_entry_fires_one_run_even_late_and_goes_back_to_watching() -> None:
    armed = _entry(slot_ms=T0 + 5000, armed_by="after default:a@x (succeeded)")
    plan = plan_fire(armed, now_ms=T0 + 3_600_000)  # an hour late: every scheduler was down
    [run] = plan.runs
    assert (run.slot_ms, run.reason) == (T0 + 5000, "after default:a@x (succeeded)")
    assert plan.skips == []
    assert plan.next_entry is not None
    assert (plan.next_entry.slot_ms, plan.next_entry.last_slot_ms) == (WATCH_SLOT, T0 + 5000)
    assert plan.next_entry.armed_by == "" and plan.next_entry.fired == 1


def test_an_after_job_with_max_runs_stops_watching_after_its_last() -> None:
    spec = _entry().spec
    capped = spec.model_copy(update={"trigger": spec.trigger.model_copy(update={"max_runs": 1})})
    plan = plan_fire(_entry(slot_ms=T0, spec=capped), now_ms=T0)
    assert len(plan.runs) == 1 and plan.next_entry is None
