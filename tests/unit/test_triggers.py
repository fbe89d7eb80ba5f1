"""Trigger models and slot computation (everything except DST edges: test_dst.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from etcdsched.model.triggers import (
    TRIGGER_ADAPTER,
    AtTrigger,
    CronTrigger,
    DstPolicy,
    IntervalTrigger,
    NowTrigger,
    Trigger,
    count_slots_between,
    describe,
    jitter_offset_ms,
    next_slot,
    slots_between,
)

SECOND = 1000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms(text: str) -> int:
    """RFC 3339 text -> epoch milliseconds."""
    return (datetime.fromisoformat(text) - EPOCH) // timedelta(milliseconds=1)


ANCHOR = ms("2026-06-01T12:00:00Z")


def parse(data: dict[str, Any]) -> Trigger:
    return TRIGGER_ADAPTER.validate_python(data)


def error_text(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        parse(data)
    return str(info.value)


# --- models -----------------------------------------------------------------------------


def test_discriminated_union_picks_the_kind() -> None:
    assert isinstance(parse({"kind": "now"}), NowTrigger)
    assert isinstance(parse({"kind": "at", "at": "2026-12-02T10:00:00Z"}), AtTrigger)
    assert isinstance(parse({"kind": "interval", "every": "5m"}), IntervalTrigger)
    assert isinstance(parse({"kind": "cron", "expr": "*/5 * * * *"}), CronTrigger)
    assert "kind" in error_text({"kind": "sometimes"})


def test_models_forbid_extra_fields_and_are_frozen() -> None:
    assert "extra" in error_text({"kind": "now", "color": "blue"}).lower()
    assert "extra" in error_text({"kind": "cron", "expr": "@daily", "dst": {"gap": "skip", "x": 1}})
    trigger = IntervalTrigger(every=timedelta(minutes=5))
    with pytest.raises(ValidationError):
        trigger.every = timedelta(minutes=1)


@pytest.mark.parametrize("field", ["at", "start_at", "end_at"])
def test_naive_datetimes_are_rejected_naming_the_field(field: str) -> None:
    data: dict[str, Any] = {"kind": "at", "at": "2026-12-02T10:00:00Z"}
    data[field] = "2026-12-02T10:00:00"
    assert f"{field} must include a UTC offset" in error_text(data)


def test_naive_interval_start_is_rejected() -> None:
    text = error_text({"kind": "interval", "every": "5m", "start": datetime(2026, 1, 1)})
    assert "start must include a UTC offset" in text


@pytest.mark.parametrize("value", [1_780_000_000, 1_780_000_000_000, "1780000000", "tomorrow"])
def test_numbers_and_free_text_are_not_datetimes(value: object) -> None:
    assert "at must be an RFC 3339 date-time" in error_text({"kind": "at", "at": value})


def test_at_accepts_any_offset() -> None:
    zulu = AtTrigger(at=datetime(2026, 12, 2, 10, tzinfo=UTC))
    plus_one = parse({"kind": "at", "at": "2026-12-02T11:00:00+01:00"})
    assert isinstance(plus_one, AtTrigger)
    assert zulu.at_ms == plus_one.at_ms == ms("2026-12-02T10:00:00Z")


def test_bounds_validation_and_max_runs() -> None:
    text = error_text(
        {"kind": "now", "start_at": "2026-01-02T00:00:00Z", "end_at": "2026-01-01T00:00:00Z"}
    )
    assert "end_at" in text and "must be after start_at" in text
    assert "max_runs" in error_text({"kind": "now", "max_runs": 0})
    assert "max_runs" in error_text({"kind": "now", "max_runs": True})
    trigger = parse({"kind": "interval", "every": "1m", "max_runs": 3})
    assert trigger.max_runs == 3
    assert NowTrigger().max_runs is None


@pytest.mark.parametrize(
    ("every", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("PT5M", timedelta(minutes=5)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("1h30m", timedelta(minutes=90)),
        ("1500ms", timedelta(milliseconds=1500)),
        (30, timedelta(seconds=30)),
        (1.5, timedelta(milliseconds=1500)),
        ("366d", timedelta(days=366)),
    ],
)
def test_interval_every_accepts(every: object, expected: timedelta) -> None:
    trigger = parse({"kind": "interval", "every": every})
    assert isinstance(trigger, IntervalTrigger)
    assert trigger.every == expected


@pytest.mark.parametrize(
    ("every", "message"),
    [
        ("250ms", "every must be at least 1s, got 250ms"),
        (0, "every must be at least 1s, got 0s"),
        ("367d", "every must be at most 366d, got 367d"),
        ("1s500us", "every must be a whole number of milliseconds"),
        ("soon", "invalid duration 'soon'"),
        (-5, "must not be negative"),
    ],
)
def test_interval_every_rejects(every: object, message: str) -> None:
    text = error_text({"kind": "interval", "every": every})
    assert message in text
    assert "every" in text


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "now", "max_runs": 1},
        {"kind": "at", "at": "2026-12-02T11:00:00+01:00", "end_at": "2027-01-01T00:00:00Z"},
        {"kind": "interval", "every": "PT5M", "start": "2026-01-01T00:00:00Z"},
        {"kind": "interval", "every": "1h30m250ms"},
        {"kind": "cron", "expr": "0 */5 * * * *", "tz": "Europe/Berlin", "dst": {"gap": "skip"}},
    ],
)
def test_json_round_trip(data: dict[str, Any]) -> None:
    trigger = parse(data)
    dumped = trigger.model_dump(mode="json")
    assert parse(dumped) == trigger
    assert parse(trigger.model_dump()) == trigger
    assert TRIGGER_ADAPTER.validate_json(TRIGGER_ADAPTER.dump_json(trigger)) == trigger


def test_every_serialises_as_compact_duration() -> None:
    trigger = parse({"kind": "interval", "every": "PT5M"})
    assert trigger.model_dump(mode="json")["every"] == "5m"
    assert parse({"kind": "interval", "every": 90}).model_dump(mode="json")["every"] == "1m30s"
    assert trigger.model_dump()["every"] == timedelta(minutes=5)


def test_cron_defaults() -> None:
    trigger = CronTrigger(expr="  */5   *  * * * ")
    assert trigger.expr == "*/5 * * * *"
    assert trigger.tz == "UTC"
    assert trigger.dst == DstPolicy(gap="shift", fold="first")


# --- now / at ------------------------------------------------------------------------------


def test_now_fires_once_at_the_anchor() -> None:
    trigger = NowTrigger()
    assert next_slot(trigger, ANCHOR - 1, ANCHOR) == ANCHOR
    assert next_slot(trigger, ANCHOR, ANCHOR) is None
    assert slots_between(trigger, ANCHOR - 1, ANCHOR + DAY, ANCHOR, 10) == [ANCHOR]
    assert slots_between(trigger, ANCHOR - 1, ANCHOR - 1, ANCHOR, 10) == []
    assert count_slots_between(trigger, ANCHOR - 1, ANCHOR, ANCHOR, 10) == 1


def test_at_fires_once() -> None:
    at = ms("2026-12-02T10:00:00Z")
    trigger = AtTrigger(at=datetime(2026, 12, 2, 10, tzinfo=UTC))
    assert next_slot(trigger, ANCHOR, ANCHOR) == at
    assert next_slot(trigger, at - 1, ANCHOR) == at
    assert next_slot(trigger, at, ANCHOR) is None
    assert slots_between(trigger, at - 1, at, ANCHOR, 5) == [at]
    assert slots_between(trigger, at - 1, at - 1, ANCHOR, 5) == []
    assert count_slots_between(trigger, 0, at, ANCHOR, 5) == 1


def test_one_shots_respect_bounds() -> None:
    later = datetime(2026, 6, 2, tzinfo=UTC)
    assert next_slot(NowTrigger(start_at=later), ANCHOR - 1, ANCHOR) is None
    earlier = datetime(2026, 5, 1, tzinfo=UTC)
    assert next_slot(NowTrigger(end_at=earlier), ANCHOR - 1, ANCHOR) is None
    at = AtTrigger(at=datetime(2026, 12, 2, 10, tzinfo=UTC), end_at=later)
    assert next_slot(at, ANCHOR, ANCHOR) is None
    exact = AtTrigger(at=later, start_at=later, end_at=later + timedelta(seconds=1))
    assert next_slot(exact, 0, ANCHOR) == ms("2026-06-02T00:00:00Z")


# --- interval ------------------------------------------------------------------------------


def test_interval_counts_from_the_anchor() -> None:
    trigger = IntervalTrigger(every=timedelta(minutes=5))
    assert next_slot(trigger, ANCHOR - 1, ANCHOR) == ANCHOR
    assert next_slot(trigger, ANCHOR, ANCHOR) == ANCHOR + 5 * MINUTE
    assert next_slot(trigger, ANCHOR + 7 * MINUTE, ANCHOR) == ANCHOR + 10 * MINUTE
    assert next_slot(trigger, 0, ANCHOR) == ANCHOR  # no slot before the k = 0 slot
    assert slots_between(trigger, ANCHOR - 1, ANCHOR + 12 * MINUTE, ANCHOR, 10) == [
        ANCHOR,
        ANCHOR + 5 * MINUTE,
        ANCHOR + 10 * MINUTE,
    ]
    assert slots_between(trigger, ANCHOR - 1, ANCHOR + DAY, ANCHOR, 2) == [
        ANCHOR,
        ANCHOR + 5 * MINUTE,
    ]
    assert slots_between(trigger, ANCHOR - 1, ANCHOR + DAY, ANCHOR, 0) == []
    assert count_slots_between(trigger, ANCHOR - 1, ANCHOR + DAY, ANCHOR, 10**6) == 289
    assert count_slots_between(trigger, ANCHOR - 1, ANCHOR + DAY, ANCHOR, 7) == 7


def test_interval_with_explicit_start_far_in_the_past_is_arithmetic() -> None:
    start = datetime(2000, 1, 1, tzinfo=UTC)
    trigger = IntervalTrigger(every=timedelta(seconds=1), start=start)
    after = ms("2026-06-01T12:00:00.500Z")
    assert next_slot(trigger, after, ANCHOR) == ms("2026-06-01T12:00:01Z")
    # ~10^12 slots in the window: counting must not iterate.
    assert (
        count_slots_between(trigger, 0, after, ANCHOR, 10**15)
        == (after - ms("2000-01-01T00:00:00Z")) // 1000 + 1
    )


def test_interval_bounds() -> None:
    trigger = IntervalTrigger(
        every=timedelta(hours=1),
        start_at=datetime(2026, 6, 1, 14, 30, tzinfo=UTC),
        end_at=datetime(2026, 6, 1, 17, tzinfo=UTC),
    )
    assert slots_between(trigger, 0, ANCHOR + DAY, ANCHOR, 10) == [
        ms("2026-06-01T15:00:00Z"),
        ms("2026-06-01T16:00:00Z"),
        ms("2026-06-01T17:00:00Z"),
    ]
    assert next_slot(trigger, ms("2026-06-01T17:00:00Z"), ANCHOR) is None
    assert count_slots_between(trigger, 0, ANCHOR + DAY, ANCHOR, 100) == 3


def test_start_at_with_sub_millisecond_part_rounds_up() -> None:
    start_at = datetime(2026, 6, 1, 12, 0, 0, 500, tzinfo=UTC)  # 0.5 ms past the anchor
    trigger = IntervalTrigger(every=timedelta(seconds=1), start_at=start_at)
    assert next_slot(trigger, ANCHOR - 1, ANCHOR) == ANCHOR + SECOND


def test_limit_and_cap_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="limit"):
        slots_between(NowTrigger(), 0, 1, 0, -1)
    with pytest.raises(ValueError, match="cap"):
        count_slots_between(NowTrigger(), 0, 1, 0, -1)


@settings(max_examples=300, deadline=None)
@given(
    every_ms=st.integers(min_value=1000, max_value=7 * DAY),
    start_offset=st.integers(min_value=-30 * DAY, max_value=30 * DAY),
    after_offset=st.integers(min_value=-30 * DAY, max_value=30 * DAY),
    width=st.integers(min_value=0, max_value=60 * DAY),
    bounds=st.tuples(
        st.none() | st.integers(min_value=-30 * DAY, max_value=30 * DAY),
        st.none() | st.integers(min_value=1, max_value=30 * DAY),
    ),
    cap=st.integers(min_value=0, max_value=50),
)
def test_interval_slots_and_count_agree(
    every_ms: int,
    start_offset: int,
    after_offset: int,
    width: int,
    bounds: tuple[int | None, int | None],
    cap: int,
) -> None:
    def at(offset: int) -> datetime:
        return datetime.fromtimestamp((ANCHOR + offset) / 1000, UTC)

    start_at_off, length = bounds
    trigger = IntervalTrigger(
        every=timedelta(milliseconds=every_ms),
        start=at(start_offset),
        start_at=None if start_at_off is None else at(start_at_off),
        end_at=None if start_at_off is None or length is None else at(start_at_off + length),
    )
    after, until = ANCHOR + after_offset, ANCHOR + after_offset + width
    slots = slots_between(trigger, after, until, ANCHOR, cap)
    assert count_slots_between(trigger, after, until, ANCHOR, cap) == len(slots)
    assert slots == sorted(set(slots))
    assert all(after < s <= until and (s - (ANCHOR + start_offset)) % every_ms == 0 for s in slots)
    first = next_slot(trigger, after, ANCHOR)
    if cap > 0:
        assert slots[:1] == ([first] if first is not None and first <= until else [])


# --- cron basics ---------------------------------------------------------------------------


def test_five_field_cron_in_utc() -> None:
    trigger = CronTrigger(expr="*/5 * * * *")
    after = ms("2026-06-01T12:02:30Z")
    assert slots_between(trigger, after, after + 10 * MINUTE, ANCHOR, 10) == [
        ms("2026-06-01T12:05:00Z"),
        ms("2026-06-01T12:10:00Z"),
    ]
    assert next_slot(trigger, ms("2026-06-01T12:05:00Z"), ANCHOR) == ms("2026-06-01T12:10:00Z")
    assert count_slots_between(trigger, after, after + DAY, ANCHOR, 1000) == 288


def test_six_field_cron_has_seconds_first() -> None:
    every_20s = CronTrigger(expr="*/20 * * * * *")
    after = ms("2026-06-01T12:00:00Z")
    assert slots_between(every_20s, after, after + MINUTE, ANCHOR, 10) == [
        after + 20 * SECOND,
        after + 40 * SECOND,
        after + 60 * SECOND,
    ]
    noon_and_30s = CronTrigger(expr="30 0 12 * * *")  # second minute hour ...
    assert next_slot(noon_and_30s, after, ANCHOR) == ms("2026-06-01T12:00:30Z")
    assert next_slot(noon_and_30s, after + MINUTE, ANCHOR) == ms("2026-06-02T12:00:30Z")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("@yearly", "2027-01-01T00:00:00Z"),
        ("@annually", "2027-01-01T00:00:00Z"),
        ("@monthly", "2026-07-01T00:00:00Z"),
        ("@weekly", "2026-06-07T00:00:00Z"),  # Sunday
        ("@daily", "2026-06-02T00:00:00Z"),
        ("@midnight", "2026-06-02T00:00:00Z"),
        ("@hourly", "2026-06-01T13:00:00Z"),
        ("@DAILY", "2026-06-02T00:00:00Z"),
    ],
)
def test_cron_macros(expr: str, expected: str) -> None:
    assert next_slot(CronTrigger(expr=expr), ANCHOR, ANCHOR) == ms(expected)


def test_cron_in_a_zone_without_dst_and_sparse_expressions() -> None:
    kolkata = CronTrigger(expr="0 9 * * *", tz="Asia/Kolkata")
    assert next_slot(kolkata, ANCHOR, ANCHOR) == ms("2026-06-02T03:30:00Z")
    leap_day = CronTrigger(expr="0 0 29 2 *")
    assert next_slot(leap_day, ANCHOR, ANCHOR) == ms("2028-02-29T00:00:00Z")
    day_or = CronTrigger(expr="0 0 13 * 5")  # the 13th OR a Friday (Vixie cron)
    assert next_slot(day_or, ANCHOR, ANCHOR) == ms("2026-06-05T00:00:00Z")


def test_cron_bounds_and_limits() -> None:
    trigger = CronTrigger(
        expr="0 * * * *",
        start_at=datetime(2026, 6, 1, 14, tzinfo=UTC),
        end_at=datetime(2026, 6, 1, 16, 30, tzinfo=UTC),
    )
    assert slots_between(trigger, 0, ANCHOR + DAY, ANCHOR, 10) == [
        ms("2026-06-01T14:00:00Z"),
        ms("2026-06-01T15:00:00Z"),
        ms("2026-06-01T16:00:00Z"),
    ]
    assert count_slots_between(trigger, 0, ANCHOR + DAY, ANCHOR, 10) == 3
    assert count_slots_between(trigger, 0, ANCHOR + DAY, ANCHOR, 2) == 2
    assert next_slot(trigger, ms("2026-06-01T16:00:00Z"), ANCHOR) is None


def test_per_second_cron_is_cheap_when_limited() -> None:
    trigger = CronTrigger(expr="* * * * * *")
    after = ms("2026-06-01T12:00:00Z")
    year = 365 * DAY
    assert slots_between(trigger, after, after + year, ANCHOR, 3) == [
        after + SECOND,
        after + 2 * SECOND,
        after + 3 * SECOND,
    ]
    assert count_slots_between(trigger, after, after + year, ANCHOR, 50) == 50


def test_cron_past_the_end_of_the_calendar_has_no_slot() -> None:
    assert next_slot(CronTrigger(expr="@yearly"), ms("9999-06-01T00:00:00Z"), 0) is None


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "expr '61 * * * *' is not a valid cron expression"),
        ("* * * *", "has 4 fields"),
        ("* * * * * * *", "has 7 fields"),
        ("", "has 0 fields"),
        ("0 0 31 2 *", "is not a valid cron expression"),
        ("H * * * *", "is not a valid cron expression"),
        ("R * * * *", "random field"),
        ("@reboot", "expr '@reboot' is not supported"),
        ("@every 5m", "is not a known macro"),
    ],
)
def test_invalid_cron_expressions_name_the_field(expr: str, message: str) -> None:
    text = error_text({"kind": "cron", "expr": expr})
    assert message in text
    assert "expr" in text


def test_weekday_names_are_not_mistaken_for_random_fields() -> None:
    assert CronTrigger(expr="0 9 * * FRI").expr == "0 9 * * FRI"
    assert CronTrigger(expr="0 9 1 MAR,APR *").expr == "0 9 1 MAR,APR *"


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "../etc/passwd", "", "Europe", "localtime"])
def test_unknown_zones_are_rejected_naming_the_field(tz: str) -> None:
    text = error_text({"kind": "cron", "expr": "@daily", "tz": tz})
    assert f"tz {tz!r} is not" in text


# --- describe / jitter ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "text"),
    [
        ({"kind": "now"}, "now"),
        ({"kind": "at", "at": "2026-12-02T10:00:00Z"}, "at 2026-12-02T10:00:00Z"),
        ({"kind": "at", "at": "2026-12-02T11:00:00+01:00"}, "at 2026-12-02T11:00:00+01:00"),
        ({"kind": "interval", "every": "PT5M"}, "every 5m"),
        (
            {"kind": "interval", "every": "1h", "start": "2026-01-01T00:00:00Z"},
            "every 1h from 2026-01-01T00:00:00Z",
        ),
        (
            {"kind": "cron", "expr": "*/5 * * * *", "tz": "Europe/Berlin"},
            "cron '*/5 * * * *' in Europe/Berlin",
        ),
        (
            {"kind": "now", "start_at": "2026-01-01T00:00:00Z", "max_runs": 1},
            "now (not before 2026-01-01T00:00:00Z, at most 1 run)",
        ),
        (
            {"kind": "interval", "every": "30s", "end_at": "2026-01-01T00:00:00Z", "max_runs": 5},
            "every 30s (not after 2026-01-01T00:00:00Z, at most 5 runs)",
        ),
    ],
)
def test_describe(data: dict[str, Any], text: str) -> None:
    assert describe(parse(data)) == text


def test_jitter_is_stable_across_processes() -> None:
    # Golden values: a salted hash() would differ from run to run.
    assert jitter_offset_ms("job-1", 1_780_000_000_000, 60_000) == 46166
    assert jitter_offset_ms("job-1", 1_780_000_060_000, 60_000) == 8696
    assert jitter_offset_ms("job-2", 1_780_000_000_000, 60_000) == 27527


@given(
    job_id=st.text(max_size=40),
    slot_ms=st.integers(min_value=-(2**62), max_value=2**62),
    window_ms=st.integers(min_value=1, max_value=10**9),
)
def test_jitter_is_in_range_and_deterministic(job_id: str, slot_ms: int, window_ms: int) -> None:
    offset = jitter_offset_ms(job_id, slot_ms, window_ms)
    assert 0 <= offset < window_ms
    assert jitter_offset_ms(job_id, slot_ms, window_ms) == offset
    assert jitter_offset_ms(job_id, slot_ms, 0) == 0


def test_jitter_spreads_slots_over_the_window() -> None:
    offsets = {jitter_offset_ms("job", ANCHOR + k * MINUTE, 1000) for k in range(200)}
    assert len(offsets) > 150
    with pytest.raises(ValueError, match="window_ms"):
        jitter_offset_ms("job", ANCHOR, -1)
