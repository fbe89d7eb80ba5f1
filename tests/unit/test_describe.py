"""Schedules in words and the upcoming slots with their DST marks
(``etcdsched.model.describe``), as the dashboard shows them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from etcdsched.model.cronwall import utc_to_ms
from etcdsched.model.describe import describe_cron, describe_schedule, upcoming_slots
from etcdsched.model.triggers import TRIGGER_ADAPTER, Trigger, slots_between


def trigger(**data: Any) -> Trigger:
    return TRIGGER_ADAPTER.validate_python(data)


def ms(*parts: int) -> int:
    return utc_to_ms(datetime(*parts, tzinfo=UTC))  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (
            {"kind": "cron", "expr": "0 3 * * *", "tz": "Europe/Berlin"},
            "every day at 03:00 Europe/Berlin",
        ),
        ({"kind": "cron", "expr": "*/5 * * * *"}, "every 5 minutes"),
        ({"kind": "cron", "expr": "* * * * *"}, "every minute"),
        ({"kind": "cron", "expr": "15 * * * *"}, "every hour at minute 15"),
        ({"kind": "cron", "expr": "0 */5 * * * *"}, "every 5 minutes"),
        ({"kind": "cron", "expr": "*/10 * * * * *"}, "every 10 seconds"),
        ({"kind": "cron", "expr": "@daily", "tz": "Asia/Tokyo"}, "every day at 00:00 Asia/Tokyo"),
        ({"kind": "cron", "expr": "@weekly"}, "every Sunday at 00:00 UTC"),
        (
            {"kind": "cron", "expr": "30 6 * * mon-fri", "tz": "America/New_York"},
            "every weekday (Monday to Friday) at 06:30 America/New_York",
        ),
        ({"kind": "cron", "expr": "0 4 1 * *"}, "on day 1 of every month at 04:00 UTC"),
        ({"kind": "cron", "expr": "0 */6 * * *"}, "every 6 hours at minute 0 (UTC hours)"),
        ({"kind": "interval", "every": "5m"}, "every 5 minutes"),
        ({"kind": "interval", "every": "1h30m"}, "every 1 hour 30 minutes"),
        ({"kind": "interval", "every": "24h"}, "every day"),
        ({"kind": "interval", "every": "1s"}, "every second"),
        ({"kind": "at", "at": "2026-12-02T10:00:00+01:00"}, "once at 2026-12-02 09:00 UTC"),
        ({"kind": "now"}, "once, when created"),
        ({"kind": "after", "jobs": ["extract"]}, "after extract succeeds"),
        (
            {"kind": "after", "jobs": ["a", "b", "c"], "on": "completion"},
            "after a, b and c end (any outcome)",
        ),
    ],
)
def test_common_schedules_read_as_sentences(data: dict[str, Any], words: str) -> None:
    assert describe_schedule(trigger(**data)) == words


def test_bounds_follow_the_sentence() -> None:
    text = describe_schedule(
        trigger(kind="interval", every="1h", start_at="2027-01-01T00:00:00Z", max_runs=1)
    )
    assert text == "every hour (from 2027-01-01 00:00 UTC, at most 1 run)"


@pytest.mark.parametrize("expr", ["17 */3 1-7 * 1", "0 3 * 6 *", "5 4 * * 1,3", "30 15 10 * * *"])
def test_an_unusual_cron_is_shown_as_it_is(expr: str) -> None:
    assert describe_cron(expr, "Europe/Paris") == f"cron {expr!r} in Europe/Paris"


def test_upcoming_slots_are_the_trigger_codes_own() -> None:
    every = trigger(kind="cron", expr="*/7 * * * *", tz="Europe/Berlin")
    after = ms(2026, 12, 7, 10, 3)
    shown = [slot.slot_ms for slot in upcoming_slots(every, after, 0, 10)]
    assert shown == slots_between(every, after, after + 10**10, 0, 10)
    assert all(slot.mark == "" for slot in upcoming_slots(every, after, 0, 10))


def test_a_spring_forward_slot_is_marked_as_moved_out_of_the_gap() -> None:
    nightly = trigger(kind="cron", expr="30 2 * * *", tz="Europe/Berlin")
    slots = upcoming_slots(nightly, ms(2027, 3, 26), 0, 4)
    assert [slot.mark for slot in slots] == ["", "", "gap", ""]
    assert slots[2].local == "2027-03-28 03:00:00 +02:00 Europe/Berlin"
    assert "does not exist" in slots[2].note


def test_a_fall_back_slot_is_marked_first_and_second() -> None:
    both = trigger(kind="cron", expr="30 2 * * *", tz="Europe/Berlin", dst={"fold": "both"})
    slots = upcoming_slots(both, ms(2026, 10, 24, 12), 0, 3)
    assert [slot.mark for slot in slots] == ["fold", "fold", ""]
    assert "first time" in slots[0].note and "second time" in slots[1].note
    assert slots[1].slot_ms - slots[0].slot_ms == 3_600_000


def test_a_skipped_gap_shows_as_an_offset_change() -> None:
    skip = trigger(kind="cron", expr="30 2 * * *", tz="Europe/Berlin", dst={"gap": "skip"})
    slots = upcoming_slots(skip, ms(2027, 3, 26), 0, 3)
    assert [slot.local[:10] for slot in slots] == ["2027-03-26", "2027-03-27", "2027-03-29"]
    assert slots[2].mark == "offset" and "skipped" in slots[2].note


def test_after_jobs_and_past_one_offs_have_no_upcoming_slots() -> None:
    assert upcoming_slots(trigger(kind="after", jobs=["x"]), 0, 0) == []
    once = trigger(kind="at", at="2026-01-01T00:00:00Z")
    assert upcoming_slots(once, ms(2026, 6, 1), 0) == []
    assert upcoming_slots(once, ms(2025, 6, 1), 0)[0].local == "2026-01-01 00:00:00 +00:00 UTC"
